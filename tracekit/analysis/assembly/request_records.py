"""Requests from the spans of one trace: the span tree and the ``tracekit.*`` attributes.

:func:`requests_of_trace` finds the request heads of a trace (each SERVER span, else the
top-most spans) and walks each head's descendants down to, not into, the next SERVER span;
:func:`stage_record` and :func:`request_record` decode the ``tracekit.*`` attributes into
record fields. Assembly (:mod:`tracekit.analysis.assembly.grouping`) calls these when it flushes a
trace. Every span of the input passes through here once, so the common well-formed values
are read inline and only unusual ones go through the helpers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter
from typing import Any

import orjson
from msgspec.structs import replace

from tracekit import semconv
from tracekit.analysis.assembly.blocked_sites import blocked_site
from tracekit.analysis.model import RequestRecord, ServerTiming, Span, StageRecord

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
_INF = math.inf
_KINDS: dict[Any, str] = {kind: kind for kind in semconv.STAGE_KINDS}
_SHAPES: dict[Any, str] = {shape: shape for shape in semconv.STAGE_SHAPES}
# Strings up to this length are shared (a prompt in an attribute is not); the table of shared
# strings is bounded and cleared when full (sys.intern's table never shrinks).
_SHARE_MAX_CHARS = 200
#: The table of shared strings (see :func:`share`, which fills and bounds it).
SHARED: dict[str, str] = {}
_SHARED_MAX = 8192
#: The shared string equal to a text, or ``None``: ``shared(text) or share(text)`` is
#: :func:`share` with its common case (a hit) inline. (Clearing keeps the same dict.)
shared = SHARED.get
_BY_START = attrgetter("start_ns", "span_id")
# Spans of other instrumentation that do a stage's work, by name: their stage kind (a plain
# span's kind is otherwise its span kind). FastAPI's response serialization is serialize work.
_FOREIGN_KINDS: dict[str, str] = {semconv.FASTAPI_SERIALIZATION: semconv.KIND_SERIALIZE}

#: Attributes whose values assembly decodes into record fields (see :func:`compact`).
DECODED_KEYS = frozenset(
    {
        semconv.STAGE, semconv.STAGE_KIND, semconv.STAGE_SHAPE, semconv.WALL_MS, semconv.CPU_MS,
        semconv.WAIT_MS, semconv.LOOP_WAIT_MS, semconv.CHILDREN_MS, semconv.MAX_BLOCK_MS, semconv.ON_LOOP,
        semconv.BLOCKED_AT, semconv.CODE_FUNCTION, semconv.CODE_NAMESPACE,
        semconv.LOOP_SLICES_US, semconv.LOOP_WAITS_US, semconv.MODEL_WAIT_MS,
        semconv.IO_WAIT_MS, semconv.OVERHEAD_MS, semconv.TTFB_MS, semconv.TTFT_MS,
        semconv.ITL_P50_MS, semconv.ITL_P95_MS, semconv.ITL_MAX_MS, semconv.TPOT_MS,
        semconv.CHUNKS, semconv.INFLIGHT,
    }
)  # fmt: skip


def requests_of_trace(spans: list[Span], *, late: bool = False) -> list[RequestRecord]:
    """Build the requests of one trace (or trace fragment).

    Args:
        spans: the spans of one trace, in any order.
        late: the spans are a fragment that arrived after the trace was flushed: only SERVER
            spans become requests.

    Returns:
        The requests, in the order of their spans' start times; none for a trace (not a late
        fragment) with no SERVER span whose top-most spans are all tracekit stages under a
        parent it lacks: stages whose request span is missing are not requests (the window
        counts them, and the report says so in one warning).

    Cost: linear in the spans, plus sorting each request's stages.
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
            siblings = children.get(parent)
            if siblings is None:
                children[parent] = [span]
            else:
                siblings.append(span)
    # A model server's own span is never a request: under a call of this trace it is part of
    # that call; without one (a client probing the model server directly, a call whose trace
    # went elsewhere or was flushed) it has no call to join.
    heads = [s for s in by_id.values() if s.kind == "server" and not model_server_span(s)]
    if not heads and not late:
        # A loop window (tracekit.loop) is not a request (the pipeline counts it apart).
        if loop_trace(by_id.values()) or model_server_trace(by_id.values()):
            return []
        roots = [root for root in roots if not model_server_span(root)]
        if roots and all(_orphan_stage(root, by_id) for root in roots):
            # Stages under a span the input lacks (tracekit's, FastAPI's operation spans):
            # their request span went to another exporter, was dropped, or was cut off at
            # the file's end. Not requests; the caller counts them.
            return []
        # Pure cycles have no root at all: the earliest span stands in for one.
        others = (s for s in by_id.values() if not model_server_span(s))
        heads = roots or [min(others, key=_BY_START)]
    if len(heads) > 1:
        heads.sort(key=_BY_START)
    return [_request(head, children) for head in heads]


def loop_trace(spans: Iterable[Span]) -> bool:
    """Whether every span of a trace is an event-loop window (``tracekit.loop``), not a request."""
    return all(s.name == semconv.LOOP_SPAN and semconv.LOOP_THREAD in s.attributes for s in spans)


def model_server_trace(spans: Iterable[Span]) -> bool:
    """Whether every span of a trace is a model server's own (a client that called the model
    server directly, its own span not in the input): no request of the gateway's."""
    return all(model_server_span(s) for s in spans)


def _orphan_stage(span: Span, by_id: dict[str, Span]) -> bool:
    """A stage span whose parent is not in the trace: tracekit's, or one of FastAPI's
    operation spans (``fastapi.endpoint``: never a request of its own). Other spans whose
    parent is elsewhere (a job continuing a remote trace) stand for their request."""
    parent = span.parent_id
    stage = semconv.STAGE in span.attributes or (
        span.kind == "internal" and span.name.startswith(semconv.FASTAPI_SPAN_PREFIX))
    return stage and parent is not None and parent != span.span_id and parent not in by_id


def _request(head: Span, children: dict[str, list[Span]]) -> RequestRecord:
    stages: list[StageRecord] = []
    servers: list[Span] = []
    visited = {head.span_id}
    stack = list(children.get(head.span_id, ()))
    while stack:
        span = stack.pop()
        if span.span_id in visited:
            continue
        if span.kind == "server":
            if model_server_span(span):
                servers.append(span)
            continue
        if span.name == semconv.AFTER_RESPONSE_SPAN and span.parent_id == head.span_id:
            # The CPU after the response of a request whose server span another
            # instrumentation owned (it had ended): the request's, as if on its span.
            head = replace(head, attributes={**span.attributes, **head.attributes})
            visited.add(span.span_id)
            continue
        visited.add(span.span_id)
        stages.append(stage_record(span))
        below = children.get(span.span_id)
        if below:
            stack.extend(below)
    stages.sort(key=_BY_START)
    if servers:
        _join_model_server(servers, stages)
    return request_record(head, stages)


def model_server_span(span: Span) -> bool:
    """A model server's own request span (vLLM's ``llm_request``): a SERVER span with the
    server's time in queue (``gen_ai.latency.time_in_queue``)."""
    return span.kind == "server" and semconv.VLLM_LATENCY_TIME_IN_QUEUE in span.attributes


def server_timing(span: Span) -> ServerTiming | None:
    """The server's queue, prefill and decode (seconds in the span, ms here); ``None`` when
    its time in queue is malformed. A missing or malformed prefill or decode reads 0."""
    get = span.attributes.get
    queue = ms_value(get(semconv.VLLM_LATENCY_TIME_IN_QUEUE))
    if queue is None:
        return None
    e2e = ms_value(get(semconv.VLLM_LATENCY_E2E))
    return ServerTiming(
        queue * 1000, (ms_value(get(semconv.VLLM_LATENCY_TIME_IN_MODEL_PREFILL)) or 0.0) * 1000,
        (ms_value(get(semconv.VLLM_LATENCY_TIME_IN_MODEL_DECODE)) or 0.0) * 1000,
        None if e2e is None else e2e * 1000, span.start_ns, max(span.start_ns, span.end_ns),
    )  # fmt: skip


def _join_model_server(servers: list[Span], stages: list[StageRecord]) -> None:
    # Each server span's timing goes to the model call it answered: the nearest model stage
    # above it (its parent is the stage, or the client span inside the stage), else the
    # plain CLIENT span it is under, which then reads as a model call.
    by_id = {stage.span_id: stage for stage in stages}
    for span in servers:
        timing = server_timing(span)
        call = _model_call(span.parent_id, by_id)
        if timing is None or call is None:
            continue
        old = call.server
        if old is not None:  # a retried call: its attempts add up
            e2e = None if old.e2e_ms is None or timing.e2e_ms is None else old.e2e_ms + timing.e2e_ms
            timing = ServerTiming(
                old.queue_ms + timing.queue_ms, old.prefill_ms + timing.prefill_ms,
                old.decode_ms + timing.decode_ms, e2e, min(old.start_ns, timing.start_ns),
                max(old.end_ns, timing.end_ns), old.spans + 1,
            )  # fmt: skip
        call.server = timing


def _model_call(parent_id: str | None, by_id: dict[str, StageRecord]) -> StageRecord | None:
    parent = by_id.get(parent_id) if parent_id is not None else None
    first = parent
    seen: set[str] = set()
    while parent is not None and parent.span_id not in seen:
        if parent.kind == semconv.KIND_MODEL or (
            parent.cpu_ms is None and parent.wait_ms is None
            and semconv.GEN_AI_OPERATION_NAME in parent.attributes
        ):
            return parent
        seen.add(parent.span_id)
        parent = by_id.get(parent.parent_id) if parent.parent_id is not None else None
    if first is not None and first.span_kind == "client" and first.cpu_ms is None and first.wait_ms is None:
        first.kind = semconv.KIND_MODEL
        return first
    return None


def stage_record(span: Span) -> StageRecord:
    """Convert one descendant span of a request into a :class:`StageRecord`.

    Args:
        span: a tracekit stage span (``tracekit.stage`` present) or any plain span.

    Returns:
        For a stage span: name and kind from ``tracekit.stage``/``tracekit.stage.kind``, the
        components and loop slices/waits from its ``tracekit.*`` attributes. For a plain span:
        name = span name, kind = span kind (``serialize`` for FastAPI's
        ``fastapi.serialization``), components ``None``.
    """
    a = span.attributes
    get = a.get
    start = span.start_ns
    end_ns = span.end_ns if span.end_ns > start else start
    stage_name = get(semconv.STAGE)
    if stage_name is None:
        return StageRecord(
            share(span.name), _FOREIGN_KINDS.get(span.name, span.kind), span.span_id,
            span.parent_id, start, end_ns, span.kind,
            (end_ns - start) / 1e6,
            code_function=_text(get(semconv.CODE_FUNCTION)),
            code_namespace=_text(get(semconv.CODE_NAMESPACE)),
            attributes=a,
            error=span.error,
        )  # fmt: skip
    if type(stage_name) is not str:
        stage_name = str(stage_name)
    name = shared(stage_name) or share(stage_name)
    # Hot path (one call per stage span): every value in one C-level pass over the keys,
    # the common well-formed float taken inline, anything else through the helpers.
    kind, wall, cpu, wait, loop_wait, children, max_block, on_loop, slices, waits, blocked_at, \
        function, namespace, shape = map(get, _STAGE_KEYS)  # fmt: skip
    # The semconv constant itself, so that every record shares one string object.
    kind = (
        (_KINDS.get(kind) if type(kind) is str else None) or _KINDS.get(name) or semconv.KIND_OTHER
    )
    if not (type(wall) is float and 0.0 <= wall < _INF):
        wall = ms_value(wall)
    if not (type(cpu) is float and 0.0 <= cpu < _INF):
        cpu = ms_value(cpu)
    if not (type(wait) is float and 0.0 <= wait < _INF):
        wait = ms_value(wait)
    if not (type(loop_wait) is float and 0.0 <= loop_wait < _INF):
        loop_wait = ms_value(loop_wait)
    if not (type(children) is float and 0.0 <= children < _INF):
        children = ms_value(children)
    if not (type(max_block) is float and 0.0 <= max_block < _INF):
        max_block = ms_value(max_block)
    if type(on_loop) is not bool:
        on_loop = _flag(on_loop)
    slices = decode_pairs(slices, start) if slices is not None else []
    waits = decode_pairs(waits, start) if waits is not None else []
    frames = None
    if blocked_at is not None or span.events:
        blocked_at, frames = _blocked(blocked_at, span)
    if type(function) is str and function:
        function = shared(function) or share(function)
    else:
        function = None
    if type(namespace) is str and namespace:
        namespace = shared(namespace) or share(namespace)
    else:
        namespace = None
    return StageRecord(
        name, kind, span.span_id, span.parent_id, start, end_ns, span.kind,
        (end_ns - start) / 1e6 if wall is None else wall,
        cpu, wait, loop_wait, children, max_block, on_loop, blocked_at, function, namespace,
        slices, waits, a, _SHAPES.get(shape) if type(shape) is str else None, frames,
        error=span.error,
    )  # fmt: skip


_STAGE_KEYS = (
    semconv.STAGE_KIND, semconv.WALL_MS, semconv.CPU_MS, semconv.WAIT_MS, semconv.LOOP_WAIT_MS,
    semconv.CHILDREN_MS, semconv.MAX_BLOCK_MS, semconv.ON_LOOP, semconv.LOOP_SLICES_US,
    semconv.LOOP_WAITS_US, semconv.BLOCKED_AT, semconv.CODE_FUNCTION, semconv.CODE_NAMESPACE,
    semconv.STAGE_SHAPE,
)  # fmt: skip


def _blocked(value: Any, span: Span) -> tuple[str | None, str | None]:
    # The location (not an import on the first request) and the library frames inside it.
    where, frames = blocked_site(_text(value), span.events)
    return (
        (shared(where) or share(where)) if where else None,
        (shared(frames) or share(frames)) if frames else None,
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
    route = route_of(span)
    blocked_at, frames = _blocked(get(semconv.BLOCKED_AT), span) if span.events or \
        semconv.BLOCKED_AT in a else (None, None)  # fmt: skip
    # The durations: the well-formed float inline (as in stage_record), the rest via _ms.
    ms = [
        v if type(v) is float and 0.0 <= v < _INF else ms_value(v)
        for v in map(get, _REQUEST_MS)
    ]
    return RequestRecord(
        span.trace_id, span.span_id, span.service, shared(route) or share(route),
        start, span.end_ns if span.end_ns > start else start,
        status, span.error or (status is not None and status >= 500), instrumented,
        ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], blocked_at,
        ms[6], ms[7], ms[8], ms[9], ms[10], ms[11],
        _count(get(semconv.CHUNKS)), _count(get(semconv.INFLIGHT)),
        slices, waits, stages, a, frames,
    )  # fmt: skip


# The request's duration attributes, in RequestRecord's field order (around blocked_at).
_REQUEST_MS = (
    semconv.CPU_MS, semconv.LOOP_WAIT_MS, semconv.MODEL_WAIT_MS, semconv.IO_WAIT_MS,
    semconv.OVERHEAD_MS, semconv.MAX_BLOCK_MS,
    semconv.TTFB_MS, semconv.TTFT_MS, semconv.ITL_P50_MS, semconv.ITL_P95_MS,
    semconv.ITL_MAX_MS, semconv.TPOT_MS,
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


def reshare(req: RequestRecord) -> RequestRecord:
    """Share the repeated strings of a compacted record again, in place (after unpacking).

    A record rebuilt from bytes has its own copy of every name; sharing them again makes a
    kept sample as small as one assembly built (a third less memory).
    """
    req.route = share(req.route)
    req.service = share(req.service)
    if req.attributes:
        req.attributes = _kept(req.attributes)
    for stage in req.stages:
        stage.name = share(stage.name)
        stage.kind = share(stage.kind)
        stage.span_kind = share(stage.span_kind)
        if stage.code_function is not None:
            stage.code_function = share(stage.code_function)
        if stage.code_namespace is not None:
            stage.code_namespace = share(stage.code_namespace)
        if stage.blocked_at is not None:
            stage.blocked_at = share(stage.blocked_at)
        if stage.blocked_frames is not None:
            stage.blocked_frames = share(stage.blocked_frames)
        if stage.shape is not None:
            stage.shape = share(stage.shape)
        if stage.attributes:
            stage.attributes = _kept(stage.attributes)
    return req


def _kept(attributes: dict[str, Any]) -> dict[str, Any]:
    if attributes.keys() <= DECODED_KEYS:
        return {}  # a tracekit stage span: every attribute is a record field
    return {
        share(k): share(v) if type(v) is str else v
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


def route_matches(route: str, wanted: str) -> bool:
    """Whether a request's route (as :func:`route_of` names it) is the one ``wanted``.

    Args:
        route: the request's route, ``"METHOD /path"`` or a bare name.
        wanted: the route filter (``analyze(route=...)``, ``--route``): the full name
            (``"POST /v1/chat"``) or the path alone (``"/v1/chat"``, any method).
    """
    return route == wanted or route.partition(" ")[2] == wanted


def decode_pairs(value: Any, base_ns: int) -> list[tuple[int, int]]:
    """Decode a ``[offset_us, duration_us, ...]`` array into absolute ``(start_ns, end_ns)``.

    Args:
        value: the attribute value: a list of ints, or its JSON text (Jaeger stringifies
            arrays); anything else decodes to nothing.
        base_ns: the span's start, which the offsets are relative to.

    Returns:
        At most 64 intervals; pairs with a non-integer or negative member are skipped.
    """
    if type(value) is list and len(value) == 2:
        # The common case: one slice, as a list of two integers.
        offset, duration = value
        if type(offset) is int and type(duration) is int and offset >= 0 and duration >= 0:
            start = base_ns + offset * 1000
            return [(start, start + duration * 1000)]
        return []
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


def ms_value(value: Any) -> float | None:
    """A duration attribute in ms: a non-negative finite number, else None (unknown)."""
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
    return (shared(value) or share(value)) if type(value) is str and value else None


def share(text: str) -> str:
    """One shared string object per distinct short text (names, kinds, code locations).

    They repeat on every request: one shared string each instead of one per span keeps the
    20,000-request sample small (~1 kB per request). Cost: one dict lookup.
    """
    if len(text) > _SHARE_MAX_CHARS:
        return text
    hit = SHARED.get(text)
    if hit is None:
        if len(SHARED) >= _SHARED_MAX:
            SHARED.clear()
        hit = SHARED[text] = text
    return hit


def _status(a: dict[str, Any]) -> int | None:
    value = a.get(semconv.HTTP_RESPONSE_STATUS_CODE, a.get(semconv.HTTP_STATUS_CODE_OLD))
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 3:
        return int(value)
    return None
