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
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, Span, StageRecord
from tracekit.errors import ConfigurationError

# Every tracekit attribute shares this prefix; derived from a semconv name so that the
# prefix cannot drift from the names.
_TRACEKIT_PREFIX = semconv.STAGE.partition(".")[0] + "."
# At most this many (offset, duration) pairs are decoded per span: the core writes <= 32,
# hostile input may write millions.
_MAX_PAIRS = 64
# Remembered ids of flushed traces (to recognise late fragments), as a multiple of the window.
_FLUSHED_MEMORY = 4


def assemble(spans: Iterable[Span], *, max_open_traces: int = 10_000) -> Iterator[RequestRecord]:
    """Group spans into requests, yielding each request when its trace is flushed.

    Args:
        spans: spans in any order (a reader's output).
        max_open_traces: how many traces are held open at once; memory is bounded by this
            times the spans per trace. A trace whose spans are spread further apart in the
            input than this many other traces is split (its late spans form a fragment).

    Returns:
        An iterator of :class:`RequestRecord`, in flush order (roughly the input's order),
        each with its stages sorted by start time.

    Raises:
        ConfigurationError: ``max_open_traces`` is less than 1.
    """
    if max_open_traces < 1:
        raise ConfigurationError(f"max_open_traces must be >= 1, not {max_open_traces}")
    return _assemble(spans, max_open_traces)


def _assemble(spans: Iterable[Span], window: int) -> Iterator[RequestRecord]:
    open_traces: dict[str, list[Span]] = {}
    flushed: dict[str, None] = {}
    for span in spans:
        trace_id = span.trace_id
        group = open_traces.pop(trace_id, None)
        if group is None:
            if len(open_traces) >= window:
                old_id = next(iter(open_traces))
                yield from _flush(old_id, open_traces.pop(old_id), flushed, window)
            group = [span]
        else:
            group.append(span)
        # Re-inserting keeps the dict in least-recently-touched order (LRU eviction).
        open_traces[trace_id] = group
    for trace_id, group in open_traces.items():
        yield from _flush(trace_id, group, flushed, window)


def _flush(
    trace_id: str, group: list[Span], flushed: dict[str, None], window: int
) -> Iterator[RequestRecord]:
    late = trace_id in flushed
    flushed[trace_id] = None
    if len(flushed) > _FLUSHED_MEMORY * window:
        del flushed[next(iter(flushed))]
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
    end_ns = max(span.end_ns, span.start_ns)
    stage_name = a.get(semconv.STAGE)
    if stage_name is None:
        return StageRecord(
            name=span.name,
            kind=span.kind,
            span_id=span.span_id,
            parent_id=span.parent_id,
            start_ns=span.start_ns,
            end_ns=end_ns,
            span_kind=span.kind,
            wall_ms=span.duration_ms,
            code_function=_text(a.get(semconv.CODE_FUNCTION)),
            code_namespace=_text(a.get(semconv.CODE_NAMESPACE)),
            attributes=a,
        )
    name = str(stage_name)
    kind = a.get(semconv.STAGE_KIND)
    if kind not in semconv.STAGE_KINDS:
        kind = name if name in semconv.STAGE_KINDS else semconv.KIND_OTHER
    wall = _ms(a.get(semconv.WALL_MS))
    return StageRecord(
        name=name,
        kind=str(kind),
        span_id=span.span_id,
        parent_id=span.parent_id,
        start_ns=span.start_ns,
        end_ns=end_ns,
        span_kind=span.kind,
        wall_ms=span.duration_ms if wall is None else wall,
        cpu_ms=_ms(a.get(semconv.CPU_MS)),
        wait_ms=_ms(a.get(semconv.WAIT_MS)),
        loop_wait_ms=_ms(a.get(semconv.LOOP_WAIT_MS)),
        children_ms=_ms(a.get(semconv.CHILDREN_MS)),
        max_block_ms=_ms(a.get(semconv.MAX_BLOCK_MS)),
        on_loop=_flag(a.get(semconv.ON_LOOP)),
        blocked_at=_text(a.get(semconv.BLOCKED_AT)),
        code_function=_text(a.get(semconv.CODE_FUNCTION)),
        code_namespace=_text(a.get(semconv.CODE_NAMESPACE)),
        loop_slices=decode_pairs(a.get(semconv.LOOP_SLICES_US), span.start_ns),
        loop_waits=decode_pairs(a.get(semconv.LOOP_WAITS_US), span.start_ns),
        attributes=a,
    )


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
    instrumented = any(k.startswith(_TRACEKIT_PREFIX) for k in a) or any(
        s.cpu_ms is not None or s.wait_ms is not None for s in stages
    )
    status = _status(a)
    chunks = _count(a.get(semconv.CHUNKS))
    return RequestRecord(
        trace_id=span.trace_id,
        span_id=span.span_id,
        service=span.service,
        route=route_of(span),
        start_ns=span.start_ns,
        end_ns=max(span.end_ns, span.start_ns),
        status_code=status,
        error=span.error or (status is not None and status >= 500),
        instrumented=instrumented,
        cpu_ms=_ms(a.get(semconv.CPU_MS)),
        loop_wait_ms=_ms(a.get(semconv.LOOP_WAIT_MS)),
        model_wait_ms=_ms(a.get(semconv.MODEL_WAIT_MS)),
        io_wait_ms=_ms(a.get(semconv.IO_WAIT_MS)),
        overhead_ms=_ms(a.get(semconv.OVERHEAD_MS)),
        max_block_ms=_ms(a.get(semconv.MAX_BLOCK_MS)),
        blocked_at=_text(a.get(semconv.BLOCKED_AT)),
        ttfb_ms=_ms(a.get(semconv.TTFB_MS)),
        ttft_ms=_ms(a.get(semconv.TTFT_MS)),
        itl_p50_ms=_ms(a.get(semconv.ITL_P50_MS)),
        itl_p95_ms=_ms(a.get(semconv.ITL_P95_MS)),
        itl_max_ms=_ms(a.get(semconv.ITL_MAX_MS)),
        tpot_ms=_ms(a.get(semconv.TPOT_MS)),
        chunks=chunks,
        inflight=_count(a.get(semconv.INFLIGHT)),
        loop_slices=decode_pairs(a.get(semconv.LOOP_SLICES_US), span.start_ns),
        loop_waits=decode_pairs(a.get(semconv.LOOP_WAITS_US), span.start_ns),
        stages=stages,
        attributes=a,
    )


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
    if value in ("true", "false"):  # Jaeger exports with every tag typed string
        return value == "true"
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _status(a: dict[str, Any]) -> int | None:
    value = a.get(semconv.HTTP_RESPONSE_STATUS_CODE, a.get(semconv.HTTP_STATUS_CODE_OLD))
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 3:
        return int(value)
    return None
