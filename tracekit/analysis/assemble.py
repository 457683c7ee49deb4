"""Assembly: group a stream of spans into requests, in bounded memory.

Spans of one trace arrive close together but in no guaranteed order (exporters write spans
as they end, so children usually come before their parent). :func:`assemble` keeps a window
of at most ``max_open_traces`` traces, least recently touched first; when a span of a new
trace arrives and the window is full, the trace untouched for longest is *flushed*: its
requests are built and yielded. The rest is flushed when the input ends.

A request is each SERVER span, or, in a trace with no SERVER span, each top-most span (a
root, or a span whose parent is not in the input, like the OTLP specification's example).
Its stages are its descendants down to, not into, the next SERVER span (a downstream service's
SERVER span is a request of its own). Spans that arrive after their trace was flushed form a
*late fragment*: only their SERVER spans become requests, because a top-most span of a
fragment is not a real request root.

Hostile input never hangs or crashes assembly: duplicate span ids keep the first span, a
span that is its own parent is a root, cycles in parent links are cut by a visited set in
iterative walks, negative durations are clamped to zero, and malformed ``tracekit.*`` values
are ignored (the component becomes ``None``).
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, Span, StageRecord
from tracekit.errors import ConfigurationError

# Every tracekit attribute name in semconv (they share the prefix of tracekit.stage): a
# request carrying any of them is instrumented. A set lookup, not a prefix scan per key.
_TRACEKIT_PREFIX = semconv.STAGE.partition(".")[0] + "."
_TRACEKIT_KEYS = frozenset(
    value
    for value in vars(semconv).values()
    if isinstance(value, str) and value.startswith(_TRACEKIT_PREFIX)
)
# At most this many (offset, duration) pairs are decoded per span: the core writes <= 32,
# hostile input may write millions.
_MAX_PAIRS = 64
# Remembered ids of flushed traces (to recognise late fragments), as a multiple of the window.
_FLUSHED_MEMORY = 4
_INF = math.inf
_KINDS: dict[Any, str] = {kind: kind for kind in semconv.STAGE_KINDS}
# Strings up to this length are interned (a prompt in an attribute is not).
_INTERN_MAX = 200


def assemble(
    spans: Iterable[Span], *, max_open_traces: int = 10_000, flush_after: int = 10_000
) -> Iterator[RequestRecord]:
    """Group spans into requests, yielding each request when its trace is flushed.

    Args:
        spans: spans in any order (a reader's output).
        max_open_traces: how many traces are held open at once; memory is bounded by this
            times the spans per trace. A trace whose spans are spread further apart in the
            input than this many other traces is split (its late spans form a fragment).
        flush_after: a trace whose root span (no parent) has arrived is flushed once this
            many more spans have been read. Exporters write a span when it ends and a root
            ends last, so its trace is then complete; the delay leaves room for spans that
            other processes export later. Keeps the window small on long inputs.

    Returns:
        An iterator of :class:`RequestRecord`, in flush order (roughly the input's order),
        each with its stages sorted by start time.

    Raises:
        ConfigurationError: ``max_open_traces`` or ``flush_after`` is less than 1.
    """
    if max_open_traces < 1:
        raise ConfigurationError(f"max_open_traces must be >= 1, not {max_open_traces}")
    if flush_after < 1:
        raise ConfigurationError(f"flush_after must be >= 1, not {flush_after}")
    return _assemble(spans, max_open_traces, flush_after)


def _assemble(spans: Iterable[Span], window: int, flush_after: int) -> Iterator[RequestRecord]:
    # OrderedDicts, not dicts: popping the oldest entry of a plain dict again and again scans
    # the deleted slots at its front (quadratic; measured 9 s on 200,000 spans).
    open_traces: OrderedDict[str, list[Span]] = OrderedDict()
    flushed: OrderedDict[str, None] = OrderedDict()
    rooted: deque[tuple[int, str]] = deque()  # (spans read when the root came, trace id)
    for n, span in enumerate(spans, start=1):
        trace_id = span.trace_id
        group = open_traces.get(trace_id)
        if group is None:
            if len(open_traces) >= window:
                old_id, old = open_traces.popitem(last=False)
                yield from _flush(old_id, old, flushed, window)
            open_traces[trace_id] = [span]
        else:
            group.append(span)
            open_traces.move_to_end(trace_id)  # least recently touched first (LRU eviction)
        if span.parent_id is None:
            rooted.append((n + flush_after, trace_id))
        while rooted and rooted[0][0] <= n:
            done = open_traces.pop(rooted.popleft()[1], None)
            if done is not None:
                yield from _flush(done[0].trace_id, done, flushed, window)
    for trace_id, group in open_traces.items():
        yield from _flush(trace_id, group, flushed, window)


def _flush(
    trace_id: str, group: list[Span], flushed: OrderedDict[str, None], window: int
) -> Iterator[RequestRecord]:
    late = trace_id in flushed
    flushed[trace_id] = None
    if len(flushed) > _FLUSHED_MEMORY * window:
        flushed.popitem(last=False)
    return iter(requests_of_trace(group, late=late))


def requests_of_trace(spans: list[Span], *, late: bool = False) -> list[RequestRecord]:
    """Build the requests of one trace (or trace fragment).

    Args:
        spans: the spans of one trace, in any order.
        late: the spans are a fragment that arrived after the trace was flushed: only SERVER
            spans become requests.

    Returns:
        The requests, in the order of their spans' start times.
    """
    by_id: dict[str, Span] = {}
    for span in spans:
        by_id.setdefault(span.span_id, span)
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for span in by_id.values():
        parent = span.parent_id
        if parent is None or parent == span.span_id or parent not in by_id:
            roots.append(span)
        else:
            children.setdefault(parent, []).append(span)
    heads = [s for s in by_id.values() if s.kind == "server"]
    if not heads and not late:
        # Pure cycles have no root at all: the earliest span stands in for one.
        heads = roots or [min(by_id.values(), key=lambda s: (s.start_ns, s.span_id))]
    heads.sort(key=lambda s: (s.start_ns, s.span_id))
    return [_request(head, children) for head in heads]


def _request(head: Span, children: dict[str, list[Span]]) -> RequestRecord:
    stages: list[StageRecord] = []
    visited = {head.span_id}
    stack = list(children.get(head.span_id, ()))
    while stack:
        span = stack.pop()
        if span.span_id in visited or span.kind == "server":
            continue
        visited.add(span.span_id)
        stages.append(stage_record(span))
        stack.extend(children.get(span.span_id, ()))
    stages.sort(key=lambda s: (s.start_ns, s.span_id))
    return request_record(head, stages)


def stage_record(span: Span) -> StageRecord:
    """Convert one descendant span of a request into a :class:`StageRecord`.

    Args:
        span: a tracekit stage span (``tracekit.stage`` present) or any plain span.

    Returns:
        For a stage span: name and kind from ``tracekit.stage``/``tracekit.stage.kind``, the
        components and loop slices/waits from its ``tracekit.*`` attributes. For a plain span:
        name = span name, kind = span kind, components ``None``.
    """
    a = span.attributes
    get = a.get
    start = span.start_ns
    end_ns = span.end_ns if span.end_ns > start else start
    stage_name = get(semconv.STAGE)
    if stage_name is None:
        return StageRecord(
            _intern(span.name), span.kind, span.span_id, span.parent_id, start, end_ns, span.kind,
            (end_ns - start) / 1e6,
            code_function=_text(get(semconv.CODE_FUNCTION)),
            code_namespace=_text(get(semconv.CODE_NAMESPACE)),
            attributes=a,
        )  # fmt: skip
    name = _intern(stage_name if type(stage_name) is str else str(stage_name))
    # The semconv constant itself, so that every record shares one string object.
    kind = get(semconv.STAGE_KIND)
    kind = (
        (_KINDS.get(kind) if type(kind) is str else None) or _KINDS.get(name) or semconv.KIND_OTHER
    )
    # Hot path (one call per stage span): the common well-formed float is taken inline,
    # anything else goes through _ms.
    v = get(semconv.WALL_MS)
    wall = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.CPU_MS)
    cpu = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.WAIT_MS)
    wait = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.LOOP_WAIT_MS)
    loop_wait = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.CHILDREN_MS)
    children = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.MAX_BLOCK_MS)
    max_block = v if type(v) is float and 0.0 <= v < _INF else _ms(v)
    v = get(semconv.ON_LOOP)
    on_loop = v if type(v) is bool else _flag(v)
    v = get(semconv.LOOP_SLICES_US)
    slices = decode_pairs(v, start) if v is not None else []
    v = get(semconv.LOOP_WAITS_US)
    waits = decode_pairs(v, start) if v is not None else []
    return StageRecord(
        name, kind, span.span_id, span.parent_id, start, end_ns, span.kind,
        (end_ns - start) / 1e6 if wall is None else wall,
        cpu, wait, loop_wait, children, max_block, on_loop,
        _text(get(semconv.BLOCKED_AT)),
        _text(get(semconv.CODE_FUNCTION)),
        _text(get(semconv.CODE_NAMESPACE)),
        slices, waits, a,
    )  # fmt: skip


def request_record(span: Span, stages: list[StageRecord]) -> RequestRecord:
    """Convert a request's head span and its stages into a :class:`RequestRecord`.

    Args:
        span: the SERVER (or top-most) span.
        stages: its stages, as :func:`stage_record` made them.

    Returns:
        The record; ``instrumented`` is true when the span or any stage carries ``tracekit.*``
        attributes.
    """
    a = span.attributes
    get = a.get
    instrumented = not _TRACEKIT_KEYS.isdisjoint(a) or any(
        s.cpu_ms is not None or s.wait_ms is not None for s in stages
    )
    status = _status(a)
    start = span.start_ns
    v = get(semconv.LOOP_SLICES_US)
    slices = decode_pairs(v, start) if v is not None else []
    v = get(semconv.LOOP_WAITS_US)
    waits = decode_pairs(v, start) if v is not None else []
    return RequestRecord(
        trace_id=span.trace_id,
        span_id=span.span_id,
        service=span.service,
        route=_intern(route_of(span)),
        start_ns=start,
        end_ns=span.end_ns if span.end_ns > start else start,
        status_code=status,
        error=span.error or (status is not None and status >= 500),
        instrumented=instrumented,
        cpu_ms=_ms(get(semconv.CPU_MS)),
        loop_wait_ms=_ms(get(semconv.LOOP_WAIT_MS)),
        model_wait_ms=_ms(get(semconv.MODEL_WAIT_MS)),
        io_wait_ms=_ms(get(semconv.IO_WAIT_MS)),
        overhead_ms=_ms(get(semconv.OVERHEAD_MS)),
        max_block_ms=_ms(get(semconv.MAX_BLOCK_MS)),
        blocked_at=_text(get(semconv.BLOCKED_AT)),
        ttfb_ms=_ms(get(semconv.TTFB_MS)),
        ttft_ms=_ms(get(semconv.TTFT_MS)),
        itl_p50_ms=_ms(get(semconv.ITL_P50_MS)),
        itl_p95_ms=_ms(get(semconv.ITL_P95_MS)),
        itl_max_ms=_ms(get(semconv.ITL_MAX_MS)),
        tpot_ms=_ms(get(semconv.TPOT_MS)),
        chunks=_count(get(semconv.CHUNKS)),
        inflight=_count(get(semconv.INFLIGHT)),
        loop_slices=slices,
        loop_waits=waits,
        stages=stages,
        attributes=a,
    )


#: Attributes whose values assembly decodes into record fields (see :func:`compact`).
DECODED_KEYS = frozenset(
    {
        semconv.STAGE, semconv.STAGE_KIND, semconv.WALL_MS, semconv.CPU_MS, semconv.WAIT_MS,
        semconv.LOOP_WAIT_MS, semconv.CHILDREN_MS, semconv.MAX_BLOCK_MS, semconv.ON_LOOP,
        semconv.BLOCKED_AT, semconv.CODE_FUNCTION, semconv.CODE_NAMESPACE,
        semconv.LOOP_SLICES_US, semconv.LOOP_WAITS_US, semconv.MODEL_WAIT_MS,
        semconv.IO_WAIT_MS, semconv.OVERHEAD_MS, semconv.TTFB_MS, semconv.TTFT_MS,
        semconv.ITL_P50_MS, semconv.ITL_P95_MS, semconv.ITL_MAX_MS, semconv.TPOT_MS,
        semconv.CHUNKS, semconv.INFLIGHT,
    }
)  # fmt: skip


def compact(req: RequestRecord) -> RequestRecord:
    """Drop the attributes already decoded into fields, in place, to keep a record cheaply.

    A stage span's attribute map is mostly ``tracekit.*`` values that assembly has already
    decoded; a kept request sample (20,000 requests) would otherwise hold them all twice.

    Args:
        req: a record made by assembly.

    Returns:
        ``req``, whose and whose stages' ``attributes`` now hold only the other attributes.
    """
    req.attributes = _kept(req.attributes)
    for stage in req.stages:
        stage.attributes = _kept(stage.attributes)
    return req


def _kept(attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _intern(v) if type(v) is str else v
        for k, v in attributes.items()
        if k not in DECODED_KEYS
    }


def route_of(span: Span) -> str:
    """The route a request span belongs to.

    Args:
        span: a request's head span.

    Returns:
        ``"METHOD /route"`` from ``http.route`` and the request method (new or old attribute
        name); the span name when it already ends with the route (``POST /api`` named spans
        without a method attribute); the bare route; else the span name.
    """
    a = span.attributes
    route = a.get(semconv.HTTP_ROUTE)
    if not isinstance(route, str) or not route:
        return span.name
    method = a.get(semconv.HTTP_REQUEST_METHOD) or a.get(semconv.HTTP_METHOD_OLD)
    if isinstance(method, str) and method:
        return f"{method} {route}"
    return span.name if span.name.endswith(route) else route


def decode_pairs(value: Any, base_ns: int) -> list[tuple[int, int]]:
    """Decode a ``[offset_us, duration_us, ...]`` array into absolute ``(start_ns, end_ns)``.

    Args:
        value: the attribute value: a list of ints, or its JSON text (Jaeger stringifies
            arrays); anything else decodes to nothing.
        base_ns: the span's start, which the offsets are relative to.

    Returns:
        At most 64 intervals; pairs with a non-integer or negative member are skipped.
    """
    if isinstance(value, str) and value.startswith("["):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return []
    if not isinstance(value, (list, tuple)):
        return []
    out: list[tuple[int, int]] = []
    for i in range(0, min(len(value) - 1, 2 * _MAX_PAIRS), 2):
        offset, duration = value[i], value[i + 1]
        if type(offset) is not int or type(duration) is not int or offset < 0 or duration < 0:
            continue
        start = base_ns + offset * 1000
        out.append((start, start + duration * 1000))
    return out


def _ms(value: Any) -> float | None:
    if value is None:
        return None
    # Only real numbers (bools are ints in Python); numeric text is accepted because some
    # Jaeger exports type every tag as a string. NaN/inf are corrupt input: unknown.
    if type(value) is float or type(value) is int:
        number = float(value)
    elif isinstance(value, str) and 0 < len(value) <= 32:
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return max(number, 0.0) if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    return None


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value == "true" or value == "false":  # Jaeger exports with every tag typed string
        return bool(value == "true")
    return None


def _text(value: Any) -> str | None:
    return _intern(value) if type(value) is str and value else None


def _intern(text: str) -> str:
    # Names, kinds and code locations repeat on every request: one shared string each
    # instead of one per span keeps the 20,000-request sample small (~1 kB per request).
    return sys.intern(text) if len(text) <= _INTERN_MAX else text


def _status(a: dict[str, Any]) -> int | None:
    value = a.get(semconv.HTTP_RESPONSE_STATUS_CODE, a.get(semconv.HTTP_STATUS_CODE_OLD))
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 3:
        return int(value)
    return None
