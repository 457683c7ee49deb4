"""Aggregation: per-route and per-stage statistics of a stream of requests, in bounded memory.

:class:`Aggregator` takes requests one at a time (``add``) and keeps, per route and per
(route, stage name), counters and :class:`~tracekit.analysis.quantiles.Quantiles` (exact up to
2,048 values, then a 1%-relative-error log histogram). Memory is bounded by routes x stages:
at most ``max_routes`` routes (later new routes are pooled as ``(other routes)``) and
``max_stages`` stage names per route (later ones pooled as ``(other stages)``), so a
high-cardinality span name cannot grow it without bound.

Besides the statistics it keeps a **sample** of whole requests for the rules and the replay:
the ``sample_size`` earliest requests by start time (a contiguous window of real concurrency,
which the replay needs; a random sample would thin out the overlap), plus the slowest
request for the report's waterfall. Kept requests are :func:`~tracekit.analysis.assemble.compact`-ed
in place: attributes already decoded into record fields are dropped from their maps.

Breakdown of a request (DESIGN §4), in ms, for instrumented requests only:

- ``cpu_on_loop``: CPU of stages that ran on the event-loop thread (``on_loop`` true or
  unknown), plus the request's own code: request CPU minus all stages' CPU (the request span's
  ``tracekit.cpu_ms`` is request-wide), which runs on the loop.
- ``cpu_off_loop``: CPU of stages with ``on_loop`` false (worker threads).
- ``model_wait``: ``tracekit.model_wait_ms`` of the request, else the wait of its model stages.
- ``io_wait``: ``tracekit.io_wait_ms``, else the wait of its other stages.
- ``loop_wait``: ``tracekit.loop_wait_ms``, else the sum of its stages' loop waits.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from tracekit import semconv
from tracekit.analysis.assemble import compact
from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.quantiles import Quantiles
from tracekit.analysis.slo import SLO, request_tpot_ms

OTHER_ROUTES = "(other routes)"
OTHER_STAGES = "(other stages)"
BREAKDOWN_KEYS = ("cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait")
LATENCY_KEYS = ("p50", "p90", "p95", "p99", "max")
STREAM_KEYS = ("p50", "p90", "p95", "p99")
STAGE_KEYS = ("p50", "p95")


def breakdown(req: RequestRecord) -> tuple[float, float, float, float, float] | None:
    """The DESIGN §4 breakdown of one request (see the module docstring).

    Args:
        req: an assembled request.

    Returns:
        ``(cpu_on_loop, cpu_off_loop, model_wait, io_wait, loop_wait)`` in ms, or ``None``
        for an uninstrumented request.
    """
    if not req.instrumented:
        return None
    on = off = stage_cpu = model = io = loop = 0.0
    for stage in req.stages:
        if stage.cpu_ms is not None:
            stage_cpu += stage.cpu_ms
            if stage.on_loop is False:
                off += stage.cpu_ms
            else:
                on += stage.cpu_ms
        if stage.wait_ms is not None:
            if stage.kind == semconv.KIND_MODEL:
                model += stage.wait_ms
            else:
                io += stage.wait_ms
        if stage.loop_wait_ms is not None:
            loop += stage.loop_wait_ms
    if req.cpu_ms is not None:
        on += max(0.0, req.cpu_ms - stage_cpu)
    return (
        on,
        off,
        model if req.model_wait_ms is None else req.model_wait_ms,
        io if req.io_wait_ms is None else req.io_wait_ms,
        loop if req.loop_wait_ms is None else req.loop_wait_ms,
    )


def function_of(stage: StageRecord) -> str | None:
    """``code.namespace.code.function`` of a stage, or whichever part is known."""
    if stage.code_function and stage.code_namespace:
        return f"{stage.code_namespace}.{stage.code_function}"
    return stage.code_function or stage.code_namespace


@dataclass(slots=True)
class StageStats:
    """Statistics of one stage name within one route (per stage instance, not per request)."""

    stage: str
    kind: str
    count: int = 0
    wall: Quantiles = field(default_factory=Quantiles)
    cpu: Quantiles = field(default_factory=Quantiles)
    wait: Quantiles = field(default_factory=Quantiles)
    loop_wait: Quantiles = field(default_factory=Quantiles)
    on_loop_known: int = 0
    on_loop_true: int = 0
    max_block_ms: float | None = None
    blocked_at: str | None = None
    function: str | None = None

    def add(self, stage: StageRecord) -> None:
        """Record one instance of the stage."""
        self.count += 1
        self.wall.add(stage.wall_ms)
        if stage.cpu_ms is not None:
            self.cpu.add(stage.cpu_ms)
        if stage.wait_ms is not None:
            self.wait.add(stage.wait_ms)
        if stage.loop_wait_ms is not None:
            self.loop_wait.add(stage.loop_wait_ms)
        if stage.on_loop is not None:
            self.on_loop_known += 1
            self.on_loop_true += stage.on_loop
        block = stage.max_block_ms
        if block is not None and (self.max_block_ms is None or block > self.max_block_ms):
            self.max_block_ms = block
            if stage.blocked_at:
                self.blocked_at = stage.blocked_at
        if self.function is None:
            self.function = function_of(stage)

    def to_dict(self) -> dict[str, Any]:
        """The report's stage object (report contract ``routes[].stages[]``)."""
        on_loop = None
        if self.on_loop_known:
            # Majority vote: a stage that usually runs on the loop is an on-loop stage.
            on_loop = 2 * self.on_loop_true >= self.on_loop_known
        return {
            "stage": self.stage,
            "kind": self.kind,
            "count": self.count,
            "wall_ms": self.wall.summary(STAGE_KEYS),
            "cpu_ms": self.cpu.summary(STAGE_KEYS),
            "wait_ms": self.wait.summary(STAGE_KEYS),
            "loop_wait_ms": self.loop_wait.summary(STAGE_KEYS),
            "on_loop": on_loop,
            "max_block_ms": self.max_block_ms,
            "blocked_at": self.blocked_at,
            "function": self.function,
        }


@dataclass(slots=True)
class RouteStats:
    """Statistics of one route."""

    route: str
    max_stages: int
    requests: int = 0
    errors: int = 0
    first_start_ns: int | None = None
    last_end_ns: int | None = None
    latency: Quantiles = field(default_factory=Quantiles)
    instrumented: int = 0
    sums: list[float] = field(default_factory=lambda: [0.0] * len(BREAKDOWN_KEYS))
    ttft: Quantiles = field(default_factory=Quantiles)
    itl: Quantiles = field(default_factory=Quantiles)
    tpot: Quantiles = field(default_factory=Quantiles)
    good: int = 0
    stages: dict[str, StageStats] = field(default_factory=dict)

    def add(self, req: RequestRecord, slo: SLO | None) -> None:
        """Record one request of this route."""
        self.requests += 1
        self.errors += req.error
        if self.first_start_ns is None or req.start_ns < self.first_start_ns:
            self.first_start_ns = req.start_ns
        if self.last_end_ns is None or req.end_ns > self.last_end_ns:
            self.last_end_ns = req.end_ns
        self.latency.add(req.wall_ms)
        parts = breakdown(req)
        if parts is not None:
            self.instrumented += 1
            for i, value in enumerate(parts):
                self.sums[i] += value
        if req.chunks is not None and req.chunks > 1:
            self._add_stream(req)
        if slo is not None and slo.meets(req):
            self.good += 1
        for stage in req.stages:
            self._stage(stage).add(stage)

    def _add_stream(self, req: RequestRecord) -> None:
        if req.ttft_ms is not None:
            self.ttft.add(req.ttft_ms)
        itl = req.itl_p95_ms if req.itl_p95_ms is not None else req.itl_max_ms
        if itl is not None:
            self.itl.add(itl)
        tpot = request_tpot_ms(req)
        if tpot is not None:
            self.tpot.add(tpot)

    def _stage(self, stage: StageRecord) -> StageStats:
        stats = self.stages.get(stage.name)
        if stats is None:
            name = stage.name if len(self.stages) < self.max_stages else OTHER_STAGES
            stats = self.stages.get(name)
            if stats is None:
                stats = self.stages[name] = StageStats(name, stage.kind)
        return stats

    @property
    def window_s(self) -> float:
        """Seconds from the first request's start to the last request's end."""
        if self.first_start_ns is None or self.last_end_ns is None:
            return 0.0
        return (self.last_end_ns - self.first_start_ns) / 1e9

    def to_dict(self, slo: SLO | None) -> dict[str, Any]:
        """The report's route object (report contract ``routes[]``)."""
        window = self.window_s
        rps = self.requests / window if window > 0 else None
        breakdown_ms: dict[str, float | None] = dict.fromkeys(BREAKDOWN_KEYS)
        if self.instrumented:
            breakdown_ms = {
                key: total / self.instrumented
                for key, total in zip(BREAKDOWN_KEYS, self.sums, strict=True)
            }
        streaming = None
        if self.ttft.count or self.itl.count or self.tpot.count:
            streaming = {
                "ttft_ms": self.ttft.summary(STREAM_KEYS),
                "itl_ms": self.itl.summary(STREAM_KEYS),
                "tpot_ms": self.tpot.summary(STREAM_KEYS),
            }
        goodput = None
        if slo is not None:
            goodput = {
                "rps": self.good / window if window > 0 else None,
                "fraction": self.good / self.requests if self.requests else 0.0,
            }
        return {
            "route": self.route,
            "requests": self.requests,
            "errors": self.errors,
            "throughput_rps": rps,
            "latency_ms": self.latency.summary(LATENCY_KEYS),
            "breakdown_ms": breakdown_ms,
            "streaming": streaming,
            "goodput": goodput,
            "stages": [s.to_dict() for s in self.stages.values()],
        }


class Aggregator:
    """Streaming aggregation of requests into route and stage statistics plus a sample.

    Args:
        slo: targets for goodput, or ``None``.
        sample_size: how many of the earliest requests to keep whole for rules and replay.
        max_routes: distinct routes tracked before new ones are pooled as ``(other routes)``.
        max_stages: distinct stage names per route before new ones are pooled.

    Cost: O(stages) per request plus O(log sample_size) for the sample.
    """

    def __init__(
        self,
        *,
        slo: SLO | None = None,
        sample_size: int = 20_000,
        max_routes: int = 500,
        max_stages: int = 64,
    ) -> None:
        self.slo = slo
        self.sample_size = sample_size
        self.max_routes = max_routes
        self.max_stages = max_stages
        self.requests = 0
        self.instrumented = False
        self.slowest: RequestRecord | None = None
        self._routes: dict[str, RouteStats] = {}
        # Max-heap on start time (negated) holding the earliest requests; the counter breaks
        # ties so that records are never compared.
        self._sample: list[tuple[int, int, RequestRecord]] = []
        self._seq = itertools.count()

    def add(self, req: RequestRecord, *, counted: bool = True) -> None:
        """Record one request.

        Args:
            req: the request (kept ones are compacted in place).
            counted: ``False`` puts the request in the sample only, not in the statistics:
                for requests of other routes when analysing one route, which the replay
                still needs because every route shares the event loop.
        """
        if counted:
            self.requests += 1
            self.instrumented = self.instrumented or req.instrumented
            self._route(req.route).add(req, self.slo)
            if self.slowest is None or req.wall_ms > self.slowest.wall_ms:
                self.slowest = req
        if len(self._sample) < self.sample_size:
            heapq.heappush(self._sample, (-req.start_ns, next(self._seq), compact(req)))
        elif self._sample and req.start_ns < -self._sample[0][0]:
            heapq.heapreplace(self._sample, (-req.start_ns, next(self._seq), compact(req)))

    def _route(self, route: str) -> RouteStats:
        stats = self._routes.get(route)
        if stats is None:
            name = route if len(self._routes) < self.max_routes else OTHER_ROUTES
            stats = self._routes.get(name)
            if stats is None:
                stats = self._routes[name] = RouteStats(name, self.max_stages)
        return stats

    @property
    def route_stats(self) -> list[RouteStats]:
        """Routes, busiest first (then by name)."""
        return sorted(self._routes.values(), key=lambda r: (-r.requests, r.route))

    def routes(self) -> list[dict[str, Any]]:
        """The report's ``routes`` list."""
        return [r.to_dict(self.slo) for r in self.route_stats]

    def sample(self) -> list[RequestRecord]:
        """The kept requests, sorted by start time."""
        return [entry[2] for entry in sorted(self._sample, key=lambda e: (-e[0], e[1]))]
