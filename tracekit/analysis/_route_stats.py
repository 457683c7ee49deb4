"""Per-route and per-stage statistics (the parts of :class:`~tracekit.analysis.aggregate.Aggregator`).

Both classes give the same result whatever the order requests are added in, and two of
them :meth:`merge` into what one fed everything would hold (see ``aggregate``). Values are
buffered in lists and folded into the percentile structures in batches, which is a third of
the cost of adding them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracekit import semconv
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


#: Values buffered per statistic before they are folded into its Quantiles in one C pass.
_BATCH = 1024
# Breakdown sums are kept in fixed point (units of 2**-32 ms) as integers: exact, so that
# they do not depend on the order requests are added in (the parallel reader merges them).
_FIXED = 2.0**32
_FIXED_LIMIT = 2.0**900  # beyond this, value * _FIXED would overflow a float


def _fixed(value: float) -> int:
    return int(value * _FIXED) if value < _FIXED_LIMIT else int(value) << 32


@dataclass(slots=True)
class StageStats:
    """Statistics of one stage name within one route (per stage instance, not per request).

    Everything here is independent of the order the instances are added in, and two
    statistics of the same stage :meth:`merge` into what adding every instance to one gives.
    """

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
    blocked_ms: float | None = None  # the longest block that has a location
    blocked_at: str | None = None
    function: str | None = None
    #: Where the stage first appears: (request start, index among the request's stages).
    first: tuple[int, int] = (2**64, 0)
    _pending: tuple[list[float], list[float], list[float], list[float]] = field(
        default_factory=lambda: ([], [], [], [])
    )
    _fn: str | None = None
    _ns: str | None = None

    def add(self, stage: StageRecord) -> None:
        """Record one instance of the stage. Cost: a few appends and comparisons."""
        self.count += 1
        walls, cpus, waits, loop_waits = self._pending
        walls.append(stage.wall_ms)
        if stage.cpu_ms is not None:
            cpus.append(stage.cpu_ms)
        if stage.wait_ms is not None:
            waits.append(stage.wait_ms)
        if stage.loop_wait_ms is not None:
            loop_waits.append(stage.loop_wait_ms)
        if len(walls) >= _BATCH:
            self.fold()
        if stage.on_loop is not None:
            self.on_loop_known += 1
            self.on_loop_true += stage.on_loop
        block = stage.max_block_ms
        if block is not None:
            if self.max_block_ms is None or block > self.max_block_ms:
                self.max_block_ms = block
            if stage.blocked_at:
                self._located(block, stage.blocked_at)
        fn, ns = stage.code_function, stage.code_namespace
        if (fn is not None or ns is not None) and (fn is not self._fn or ns is not self._ns):
            self._fn, self._ns = fn, ns  # names are shared strings: usually the same objects
            self._function(function_of(stage))

    def _located(self, block: float, where: str) -> None:
        # The location of the longest located block; the smaller text on a tie.
        if self.blocked_ms is None or block > self.blocked_ms or (
            block == self.blocked_ms and self.blocked_at is not None and where < self.blocked_at
        ):
            self.blocked_ms = block
            self.blocked_at = where

    def _function(self, function: str | None) -> None:
        # One function per stage name as a rule; when there are several, the smallest name.
        if function is not None and (self.function is None or function < self.function):
            self.function = function

    def fold(self) -> None:
        """Move the buffered values into the percentile structures."""
        for values, quantiles in zip(
            self._pending, (self.wall, self.cpu, self.wait, self.loop_wait), strict=True
        ):
            if values:
                quantiles.extend(values)
                values.clear()

    def merge(self, other: StageStats) -> None:
        """Add the instances recorded by ``other`` (a statistic of the same stage)."""
        self.fold()
        other.fold()
        self.count += other.count
        self.wall.merge(other.wall)
        self.cpu.merge(other.cpu)
        self.wait.merge(other.wait)
        self.loop_wait.merge(other.loop_wait)
        self.on_loop_known += other.on_loop_known
        self.on_loop_true += other.on_loop_true
        if other.max_block_ms is not None and (
            self.max_block_ms is None or other.max_block_ms > self.max_block_ms
        ):
            self.max_block_ms = other.max_block_ms
        if other.blocked_ms is not None and other.blocked_at is not None:
            self._located(other.blocked_ms, other.blocked_at)
        self._function(other.function)
        self.first = min(self.first, other.first)

    def to_dict(self) -> dict[str, Any]:
        """The report's stage object (report contract ``routes[].stages[]``)."""
        self.fold()
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
    """Statistics of one route; independent of the order requests are added in (mergeable)."""

    route: str
    max_stages: int
    requests: int = 0
    errors: int = 0
    first_start_ns: int | None = None
    last_end_ns: int | None = None
    latency: Quantiles = field(default_factory=Quantiles)
    instrumented: int = 0
    #: Breakdown sums in fixed point (see _FIXED), in BREAKDOWN_KEYS order.
    sums: list[int] = field(default_factory=lambda: [0] * len(BREAKDOWN_KEYS))
    ttft: Quantiles = field(default_factory=Quantiles)
    itl: Quantiles = field(default_factory=Quantiles)
    tpot: Quantiles = field(default_factory=Quantiles)
    good: int = 0
    stages: dict[str, StageStats] = field(default_factory=dict)
    _latencies: list[float] = field(default_factory=list)

    def add(self, req: RequestRecord, slo: SLO | None) -> None:
        """Record one request of this route. Cost: O(stages)."""
        self.requests += 1
        self.errors += req.error
        start = req.start_ns
        if self.first_start_ns is None or start < self.first_start_ns:
            self.first_start_ns = start
        if self.last_end_ns is None or req.end_ns > self.last_end_ns:
            self.last_end_ns = req.end_ns
        latencies = self._latencies
        latencies.append(req.wall_ms)
        if len(latencies) >= _BATCH:
            self.fold()
        parts = breakdown(req)
        if parts is not None:
            self.instrumented += 1
            sums = self.sums
            for i, value in enumerate(parts):
                sums[i] += _fixed(value)
        if req.chunks is not None and req.chunks > 1:
            self._add_stream(req)
        if slo is not None and slo.meets(req):
            self.good += 1
        stages = self.stages
        for i, stage in enumerate(req.stages):
            stats = stages.get(stage.name) or self._stage(stage)
            stats.add(stage)
            if start < stats.first[0] or (start == stats.first[0] and i < stats.first[1]):
                stats.first = (start, i)

    def fold(self) -> None:
        """Move the buffered values into the percentile structures."""
        if self._latencies:
            self.latency.extend(self._latencies)
            self._latencies.clear()
        for stats in self.stages.values():
            stats.fold()

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
        name = stage.name if len(self.stages) < self.max_stages else OTHER_STAGES
        stats = self.stages.get(name)
        if stats is None:
            stats = self.stages[name] = StageStats(name, stage.kind)
        return stats

    def merge(self, other: RouteStats) -> None:
        """Add the requests recorded by ``other`` (a statistic of the same route)."""
        self.fold()
        other.fold()
        self.requests += other.requests
        self.errors += other.errors
        if other.first_start_ns is not None and (
            self.first_start_ns is None or other.first_start_ns < self.first_start_ns
        ):
            self.first_start_ns = other.first_start_ns
        if other.last_end_ns is not None and (
            self.last_end_ns is None or other.last_end_ns > self.last_end_ns
        ):
            self.last_end_ns = other.last_end_ns
        self.latency.merge(other.latency)
        self.instrumented += other.instrumented
        self.sums = [a + b for a, b in zip(self.sums, other.sums, strict=True)]
        self.ttft.merge(other.ttft)
        self.itl.merge(other.itl)
        self.tpot.merge(other.tpot)
        self.good += other.good
        for name, stats in other.stages.items():
            if name not in self.stages and len(self.stages) >= self.max_stages:
                name = OTHER_STAGES
            mine_stats = self.stages.get(name)
            if mine_stats is None:
                self.stages[name] = mine_stats = StageStats(name, stats.kind)
            mine_stats.merge(stats)

    @property
    def window_s(self) -> float:
        """Seconds from the first request's start to the last request's end."""
        if self.first_start_ns is None or self.last_end_ns is None:
            return 0.0
        return (self.last_end_ns - self.first_start_ns) / 1e9

    def to_dict(self, slo: SLO | None) -> dict[str, Any]:
        """The report's route object (report contract ``routes[]``)."""
        self.fold()
        window = self.window_s
        rps = self.requests / window if window > 0 else None
        breakdown_ms: dict[str, float | None] = dict.fromkeys(BREAKDOWN_KEYS)
        if self.instrumented:
            breakdown_ms = {
                key: total / _FIXED / self.instrumented
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
        stages = sorted(self.stages.values(), key=lambda s: (s.first, s.stage))
        return {
            "route": self.route,
            "requests": self.requests,
            "errors": self.errors,
            "throughput_rps": rps,
            "latency_ms": self.latency.summary(LATENCY_KEYS),
            "breakdown_ms": breakdown_ms,
            "streaming": streaming,
            "goodput": goodput,
            "stages": [s.to_dict() for s in stages],
        }
