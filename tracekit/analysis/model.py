"""The analyzer's data model: what readers produce and what rules and renderers consume.

Pipeline (STYLE §14)::

    readers (sources.py)      -> Iterator[Span]              one normalised span at a time
    assembly (assemble.py)    -> Iterator[RequestRecord]     one request (trace subtree) at a time
    aggregation, rules, replay-> Report                       bounded by routes x stages

Readers never hold a whole file: they yield :class:`Span` objects as they parse. Assembly
groups spans of one trace in a bounded window and yields a :class:`RequestRecord` per SERVER
span (or per root span when a trace has no SERVER span). Everything downstream of assembly
keeps per-route/per-stage state only, plus a bounded reservoir of requests for the replay.

Times are integer nanoseconds since the Unix epoch; derived durations are float
milliseconds, like the span attributes (DESIGN §2).

The classes are msgspec ``Struct`` types: keyword or positional construction, mutable
fields, equality by value, like slotted dataclasses, but made in C: the analyzer makes one
per span and one record per span, so their constructor is on the hot path.
"""

from __future__ import annotations

import math
from typing import Any

from msgspec import Struct, field

from tracekit.semconv import (
    AFTER_RESPONSE_CPU_MS,
    AFTER_RESPONSE_CPU_OFF_LOOP_MS,
    CPU_OFF_LOOP_MS,
    QUEUE_WAIT_MS,
)

#: Span kinds, normalised from OTLP integers (1..5) and Jaeger's ``span.kind`` tag.
SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")


class Event(Struct, array_like=True):
    """A span event (OTLP ``events[]``, Jaeger ``logs[]``)."""

    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


class Span(Struct, array_like=True):
    """One span, whatever format it came from.

    Attributes:
        trace_id: 32 lowercase hex characters, left-padded with zeros (Jaeger drops them).
        span_id: 16 lowercase hex characters, left-padded.
        parent_id: the parent's span id in the same form, or ``None`` for a root.
        name: the span (operation) name.
        kind: one of :data:`SPAN_KINDS`.
        start_ns / end_ns: epoch nanoseconds; ``end_ns >= start_ns`` is *not* guaranteed
            for hostile input: consumers clamp negative durations to zero.
        service: the resource's ``service.name`` (Jaeger: the process's serviceName), or "".
        attributes: flat attribute map with typed values (int, float, bool, str, list).
        error: the span's status is ERROR (OTLP status.code 2, Jaeger ``error`` tag).
        events: span events, in file order.
    """

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    error: bool = False
    events: list[Event] = field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        """Wall time in milliseconds, never negative."""
        return max(0, self.end_ns - self.start_ns) / 1e6


class ServerTiming(Struct, array_like=True):
    """What the model server said of one call: its own request span (vLLM's ``llm_request``,
    joined through ``traceparent``), its ``gen_ai.latency.*`` attributes in ms.

    Attributes:
        queue_ms: waiting in the server's scheduler queue (``time_in_queue``).
        prefill_ms: from leaving the queue to the first token (``time_in_model_prefill``).
        decode_ms: from the first token to the last (``time_in_model_decode``).
        e2e_ms: the server's arrival to its last token (``e2e``), or ``None``.
        start_ns / end_ns: the server span's times, on the server host's clock.
        spans: server spans folded in (a retried call has several).
    """

    queue_ms: float
    prefill_ms: float
    decode_ms: float
    e2e_ms: float | None
    start_ns: int
    end_ns: int
    spans: int = 1


class StageRecord(Struct, array_like=True):
    """One tracekit stage span (or, for uninstrumented traces, one CLIENT/INTERNAL child).

    The ``*_ms`` components are the stage's own (exclusive) share of its wall time, read from
    the ``tracekit.*`` attributes; they are ``None`` when the span has no tracekit attributes.
    """

    name: str
    kind: str  # a tracekit stage kind (semconv.STAGE_KINDS), or "client"/"internal" for plain OTel
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    span_kind: str = "internal"
    wall_ms: float = 0.0
    cpu_ms: float | None = None
    wait_ms: float | None = None
    loop_wait_ms: float | None = None
    children_ms: float | None = None
    max_block_ms: float | None = None
    on_loop: bool | None = None
    blocked_at: str | None = None
    code_function: str | None = None
    code_namespace: str | None = None
    #: (start_ns, end_ns) absolute, from ``tracekit.loop_slices_us`` (slices >= 1 ms).
    loop_slices: list[tuple[int, int]] = field(default_factory=list)
    #: (ready_ns, resumed_ns) absolute, from ``tracekit.loop_waits_us`` (waits >= 1 ms).
    loop_waits: list[tuple[int, int]] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    #: What the stage wraps (``tracekit.stage.shape``: one of ``semconv.STAGE_SHAPES``), or
    #: ``None`` (a plain span, or a trace older than the attribute).
    shape: str | None = None
    #: The library frames the watchdog caught running inside ``blocked_at`` (innermost
    #: first, one per line, paths shortened): what the blocking or CPU-bound call was.
    blocked_frames: str | None = None
    #: A model call's own timing on the model server, when the server's span joined the
    #: trace (:class:`ServerTiming`), else ``None``.
    server: ServerTiming | None = None
    #: The span's status is ERROR.
    error: bool = False


class RequestRecord(Struct, array_like=True):
    """One request: a SERVER span (or a root span) with its stages and other descendants.

    ``instrumented`` is true when the request span carries tracekit attributes; then the
    request-level components are the span's ``tracekit.*`` values. For plain OpenTelemetry
    traces only ``route``, times, status and ``stages`` (its CLIENT/INTERNAL descendants) are
    known.
    """

    trace_id: str
    span_id: str
    service: str
    route: str
    start_ns: int
    end_ns: int
    status_code: int | None = None
    error: bool = False
    instrumented: bool = False
    cpu_ms: float | None = None
    loop_wait_ms: float | None = None
    model_wait_ms: float | None = None
    io_wait_ms: float | None = None
    overhead_ms: float | None = None
    max_block_ms: float | None = None
    blocked_at: str | None = None
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_max_ms: float | None = None
    tpot_ms: float | None = None
    chunks: int | None = None
    inflight: int | None = None
    #: The request's own code outside any stage (handler, framework): slices and waits as above.
    loop_slices: list[tuple[int, int]] = field(default_factory=list)
    loop_waits: list[tuple[int, int]] = field(default_factory=list)
    stages: list[StageRecord] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    #: As :attr:`StageRecord.blocked_frames`, for the request's own code.
    blocked_frames: str | None = None

    @property
    def wall_ms(self) -> float:
        """End-to-end latency in milliseconds, never negative."""
        return max(0, self.end_ns - self.start_ns) / 1e6


def _duration(attributes: dict[str, Any], key: str) -> float | None:
    value = attributes.get(key)
    if (type(value) is float or type(value) is int) and 0 <= value < math.inf:
        return float(value)
    return None


def stage_cpu_split(stage: StageRecord) -> tuple[float, float]:
    """A stage's CPU as ``(on the loop, off it)`` in ms (0, 0 when unknown).

    Traces of this version say how much ran off the loop
    (``tracekit.cpu_off_loop_ms``: a sync stage in a worker thread, work handed to thread
    and process pools); older ones only whether the stage ran on it (``tracekit.on_loop``).
    """
    cpu = stage.cpu_ms
    if cpu is None:
        return 0.0, 0.0
    off = _duration(stage.attributes, CPU_OFF_LOOP_MS)
    if off is None:
        off = cpu if stage.on_loop is False else 0.0
    off = min(off, cpu)
    return cpu - off, off


def own_cpu_split(req: RequestRecord, stage_cpu: float, stage_off: float,
                  after: bool = False) -> tuple[float, float]:  # fmt: skip
    """The request's own CPU (outside its stages) as ``(on the loop, off it)`` in ms, given
    its stages' CPU and the part of it off the loop: the request span's figures are totals.

    ``after``: with the CPU it used after its response (:func:`after_response_cpu`), and
    ``stage_cpu``/``stage_off`` are then of all its stages, those run after the response
    included; else they are of the stages that began before its end.
    """
    if req.cpu_ms is None:
        return 0.0, 0.0
    total, total_off = req.cpu_ms, _duration(req.attributes, CPU_OFF_LOOP_MS)
    if after:
        after_on, after_off = after_response_cpu(req)
        total += after_on + after_off
        total_off = (total_off or 0.0) + after_off
    own = max(0.0, total - stage_cpu)
    off = min(own, max(0.0, total_off - stage_off)) if total_off is not None else 0.0
    return own - off, off


def after_response_cpu(req: RequestRecord) -> tuple[float, float]:
    """CPU the request's work used after its response was complete (its code, the tasks it
    spawned, the stages they ran: background tasks, spend logging), as ``(on the loop, off
    it)`` in ms; not in its ``cpu_ms``: the span ended (``tracekit.after_response_cpu_ms``).
    """
    total = _duration(req.attributes, AFTER_RESPONSE_CPU_MS) or 0.0
    off = min(total, _duration(req.attributes, AFTER_RESPONSE_CPU_OFF_LOOP_MS) or 0.0)
    return total - off, off


def queue_wait_ms(req: RequestRecord) -> float:
    """The request's time waiting on locks and pools (``tracekit.queue_wait_ms``), 0 if none."""
    return _duration(req.attributes, QUEUE_WAIT_MS) or 0.0


def after_response(req: RequestRecord, stage: StageRecord) -> bool:
    """Whether ``stage`` began once ``req``'s response was complete: its time is no part
    of the request's (its span is its own)."""
    return stage.start_ns >= req.end_ns > req.start_ns


def model_wait_split(stage: StageRecord) -> tuple[float, float, float, float] | None:
    """A model call's wait as ``(network, queue, prefill, decode)`` in ms, when the model
    server's span joined it, else ``None``.

    The wait is the stage's ``wait_ms`` (a plain span's wall time). The server's queue,
    prefill and decode are taken from it and *network* is the rest: the network, HTTP and
    what the server did outside its engine (its API layer, tokenizing the prompt). When the
    server's parts exceed the wait (its e2e includes time the answer waited for the
    gateway's busy loop, which is loop wait here), they are scaled down to fit and network
    is 0, so the four always add up to the wait.
    """
    server = stage.server
    if server is None:
        return None
    wait = stage.wait_ms if stage.wait_ms is not None else stage.wall_ms
    parts = server.queue_ms + server.prefill_ms + server.decode_ms
    if parts <= wait:
        return wait - parts, server.queue_ms, server.prefill_ms, server.decode_ms
    scale = wait / parts
    return 0.0, server.queue_ms * scale, server.prefill_ms * scale, server.decode_ms * scale
