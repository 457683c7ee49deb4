"""Per-route and per-stage statistics (the parts of :class:`~tracekit.analysis.stats.aggregate.Aggregator`).

Both classes give the same result whatever the order requests are added in, and two of
them :meth:`merge` into what one fed everything would hold (see ``aggregate``). Values are
buffered in lists and folded into the percentile structures in batches, which is a third of
the cost of adding them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import (
    RequestRecord,
    StageRecord,
    after_response,
    after_response_cpu,
    model_wait_split,
    own_cpu_split,
    stage_cpu_split,
)
from tracekit.analysis.slo import SLO, request_itl_ms, request_tpot_ms
from tracekit.analysis.stats.confidence import MIN_RATE_REQUESTS
from tracekit.analysis.stats.intervals import qualified_name
from tracekit.analysis.stats.quantiles import Quantiles

OTHER_ROUTES = "(other routes)"
OTHER_STAGES = "(other stages)"
# gc and queue_wait (issue 13): the request span's tracekit.gc_ms and tracekit.queue_wait_ms,
# which the recorder writes only when not zero (absent: 0).
BREAKDOWN_KEYS = ("cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait", "gc", "queue_wait")
LATENCY_KEYS = ("p50", "p90", "p95", "p99", "max")
STREAM_KEYS = ("p50", "p90", "p95", "p99")
STAGE_KEYS = ("p50", "p95")
# The model wait of calls the model server's own span joined (model.model_wait_split).
SPLIT_KEYS = ("network", "queue", "prefill", "decode")


def breakdown(req: RequestRecord) -> tuple[float, float, float, float, float, float, float] | None:
    """The DESIGN §4 breakdown of one request (see the module docstring).

    Args:
        req: an assembled request.

    Returns:
        ``(cpu_on_loop, cpu_off_loop, model_wait, io_wait, loop_wait, gc, queue_wait)`` in
        ms, or ``None`` for an uninstrumented request.
    """
    if not req.instrumented:
        return None
    return _breakdown(req, [_STAGE_ROW(stage) for stage in req.stages])


def _breakdown(
    req: RequestRecord, rows: list[tuple[Any, ...]]
) -> tuple[float, float, float, float, float, float, float]:
    # rows: _STAGE_ROW of each of req.stages, in order (RouteStats.add has them already).
    on = off = stage_cpu = model = io = loop = 0.0
    for stage, row in zip(req.stages, rows, strict=True):
        if after_response(req, stage):  # its time is no part of the request's wall time
            continue
        cpu = row[1]
        if cpu is not None:
            stage_cpu += cpu
            stage_on, stage_off = stage_cpu_split(stage)
            on += stage_on
            off += stage_off
        wait = row[2]
        if wait is not None:
            if stage.kind == semconv.KIND_MODEL:
                model += wait
            else:
                io += wait
        if row[3] is not None:
            loop += row[3]
    own_on, own_off = own_cpu_split(req, stage_cpu, off)
    on += own_on
    off += own_off
    return (
        on,
        off,
        model if req.model_wait_ms is None else req.model_wait_ms,
        io if req.io_wait_ms is None else req.io_wait_ms,
        loop if req.loop_wait_ms is None else req.loop_wait_ms,
        _attribute_ms(req, semconv.GC_MS),
        _attribute_ms(req, semconv.QUEUE_WAIT_MS),
    )


def request_model_split(req: RequestRecord) -> tuple[float, float, float, float] | None:
    """The request's model wait as ``(network, queue, prefill, decode)`` ms, summed over
    its model calls that the model server's span joined; ``None`` when none did."""
    total: list[float] | None = None
    for stage in req.stages:
        if stage.server is None:
            continue
        split = model_wait_split(stage)
        if split is not None:
            total = list(split) if total is None else [a + b for a, b in zip(total, split, strict=True)]
    return None if total is None else (total[0], total[1], total[2], total[3])


def _attribute_ms(req: RequestRecord, key: str) -> float:
    # A request-span duration not decoded into a record field: 0 when absent or malformed.
    value = req.attributes.get(key)
    if (type(value) is float or type(value) is int) and 0 <= value < _FIXED_LIMIT:
        return float(value)
    return 0.0


#: Rows (one per stage instance or request) buffered before they are folded in one C pass.
_BATCH = 512
# Breakdown sums are kept in fixed point (units of 2**-32 ms) as integers: exact, so that
# they do not depend on the order requests are added in (the parallel reader merges them).
_FIXED = 2.0**32
_FIXED_LIMIT = 2.0**900  # beyond this, value * _FIXED would overflow a float
_NEVER = 2**64  # later than any start (times are at most 2**64 - 1 ns)
# A stage instance as a row: the fields StageStats folds, taken in one C call.
_STAGE_ROW = attrgetter(
    "wall_ms", "cpu_ms", "wait_ms", "loop_wait_ms", "on_loop", "max_block_ms", "blocked_at",
    "code_function", "code_namespace",
)  # fmt: skip


def _fixed(value: float) -> int:
    return int(value * _FIXED) if value < _FIXED_LIMIT else int(value) << 32


def _known(values: tuple[Any, ...]) -> list[Any]:
    return [v for v in values if v is not None]


@dataclass(slots=True)
class StageStats:
    """Statistics of one stage name within one route (per stage instance, not per request).

    Instances are buffered as rows and folded in batches; everything here is independent of
    the order they come in, and two statistics of the same stage :meth:`merge` into what
    adding every instance to one gives.
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
    #: Where the stage first appears: the earliest request's start, and the stage's index
    #: among that request's stages (the report lists stages in this order).
    first_start: int = _NEVER
    first_index: int = 0
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    #: The pyinstrument profile (tracekit.integrations.pyinstrument) that sampled the most
    #: time: ``(ms, hot, tree)``.
    profile: tuple[float, str, str] | None = None

    @property
    def first(self) -> tuple[int, int]:
        """``(first_start, first_index)``."""
        return (self.first_start, self.first_index)

    def add(self, stage: StageRecord) -> None:
        """Record one instance of the stage. Cost: one row built in C."""
        self.rows.append(_STAGE_ROW(stage))
        if semconv.PROFILE_TREE in stage.attributes:
            self._profiled(stage.attributes)
        if len(self.rows) >= _BATCH:
            self.fold()

    def fold(self) -> None:
        """Fold the buffered rows into the counters and the percentile structures."""
        rows = self.rows
        if not rows:
            return
        self.rows = []
        walls, cpus, waits, loop_waits, on_loops, blocks, locations, fns, nss = zip(*rows, strict=True)
        self.count += len(rows)
        self.wall.extend(walls)
        self.cpu.extend(_known(cpus))
        self.wait.extend(_known(waits))
        self.loop_wait.extend(_known(loop_waits))
        self.on_loop_known += len(rows) - on_loops.count(None)
        self.on_loop_true += on_loops.count(True)
        known = _known(blocks)
        if known:
            longest = max(known)
            if self.max_block_ms is None or longest > self.max_block_ms:
                self.max_block_ms = longest
            for block, where in zip(blocks, locations, strict=True):
                if where and block is not None:
                    self._located(block, where)
        for fn, ns in set(zip(fns, nss, strict=True)):
            self._function(qualified_name(fn, ns))

    def earliest(self, start: int, index: int, kind: str) -> None:
        """An instance at ``(start, index)`` of kind ``kind``: the stage's first appearance
        and its kind there are kept (on a tie, the smaller kind), so that neither depends on
        the order instances come in (a name can be a stage of one kind here, of another
        there)."""
        first = (start, index)
        if first < self.first or (first == self.first and kind < self.kind):
            self.first_start, self.first_index = first
            self.kind = kind

    def _located(self, block: float, where: str) -> None:
        # The location of the longest located block; the smaller text on a tie.
        if self.blocked_ms is None or block > self.blocked_ms or (
            block == self.blocked_ms and self.blocked_at is not None and where < self.blocked_at
        ):
            self.blocked_ms = block
            self.blocked_at = where

    def _profiled(self, attributes: dict[str, Any]) -> None:
        ms, hot, tree = (attributes.get(semconv.PROFILE_MS), attributes.get(semconv.PROFILE_HOT),
                         attributes.get(semconv.PROFILE_TREE))  # fmt: skip
        if isinstance(ms, (int, float)) and isinstance(hot, str) and isinstance(tree, str):
            self._keep_profile((float(ms), hot, tree))

    def _keep_profile(self, profile: tuple[float, str, str] | None) -> None:
        # The largest; the smaller text on a tie (independent of the order instances come in).
        if profile is not None and (self.profile is None or (-profile[0], profile[1:]) < (
                -self.profile[0], self.profile[1:])):  # fmt: skip
            self.profile = profile

    def _function(self, function: str | None) -> None:
        # One function per stage name as a rule; when there are several, the smallest name.
        if function is not None and (self.function is None or function < self.function):
            self.function = function

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
        self._keep_profile(other.profile)
        self.earliest(other.first_start, other.first_index, other.kind)

    def to_dict(self) -> dict[str, Any]:
        """The report's stage object (report contract ``routes[].stages[]``)."""
        self.fold()
        on_loop = None
        if self.on_loop_known:
            # Majority vote: a stage that usually runs on the loop is an on-loop stage.
            on_loop = 2 * self.on_loop_true >= self.on_loop_known
        out = {
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
        if self.profile is not None:  # only then: reports without profiles keep their form
            out["profile"] = {"sampled_ms": self.profile[0], "hot": self.profile[1],
                              "tree": self.profile[2]}  # fmt: skip
        return out


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
    rows: list[tuple[float, int, int]] = field(default_factory=list)
    #: (ttft_ms, itl_ms, tpot_ms) of each streamed request (slo.request_itl_ms, request_tpot_ms).
    streams: list[tuple[float | None, float | None, float | None]] = field(default_factory=list)
    #: Requests whose model calls the model server's span joined, and their split's sums
    #: (fixed point, in SPLIT_KEYS order).
    split_requests: int = 0
    split_sums: list[int] = field(default_factory=lambda: [0] * len(SPLIT_KEYS))
    #: CPU its requests' work used after their responses, on the loop and off it (fixed
    #: point; model.after_response_cpu): not in the breakdown, which adds up to the latency.
    after_sums: list[int] = field(default_factory=lambda: [0, 0])

    def add(self, req: RequestRecord, slo: SLO | None) -> None:
        """Record one request of this route. Cost: O(stages), a few operations each."""
        self.requests += 1
        start = req.start_ns
        end = req.end_ns
        rows = self.rows
        rows.append((max(0, end - start) / 1e6, start, end))
        if req.error:
            self.errors += 1
        stages = self.stages
        own_rows: list[tuple[Any, ...]] = []
        for stage in req.stages:
            stats = stages.get(stage.name) or self._stage(stage)
            row = _STAGE_ROW(stage)
            stats.rows.append(row)
            own_rows.append(row)
            if semconv.PROFILE_TREE in stage.attributes:
                stats._profiled(stage.attributes)
            if start <= stats.first_start:
                stats.earliest(start, req.stages.index(stage), stage.kind)
        if req.instrumented:
            self.instrumented += 1
            sums = self.sums
            for i, value in enumerate(_breakdown(req, own_rows)):
                sums[i] += _fixed(value)
            after_on, after_off = after_response_cpu(req)
            if after_on or after_off:
                on, off = self.after_sums
                self.after_sums = [on + _fixed(after_on), off + _fixed(after_off)]
        split = request_model_split(req)
        if split is not None:
            self.split_requests += 1
            self.split_sums = [a + _fixed(b) for a, b in zip(self.split_sums, split, strict=True)]
        chunks = req.chunks
        if chunks is not None and chunks > 1:
            self.streams.append((req.ttft_ms, request_itl_ms(req), request_tpot_ms(req)))
        if slo is not None and slo.meets(req):
            self.good += 1
        if len(rows) >= _BATCH:
            self.fold()

    def fold(self) -> None:
        """Fold the buffered rows (this route's and its stages') into the statistics."""
        rows = self.rows
        if rows:
            self.rows = []
            walls, starts, ends = zip(*rows, strict=True)
            self.latency.extend(walls)
            first = min(starts)
            if self.first_start_ns is None or first < self.first_start_ns:
                self.first_start_ns = first
            last = max(ends)
            if self.last_end_ns is None or last > self.last_end_ns:
                self.last_end_ns = last
        if self.streams:
            self._fold_streams()
        for stats in self.stages.values():
            stats.fold()

    def _fold_streams(self) -> None:
        # TTFT, ITL and TPOT of streamed requests, each where known.
        ttfts, itls, tpots = zip(*self.streams, strict=True)
        self.streams = []
        self.ttft.extend(_known(ttfts))
        self.itl.extend(_known(itls))
        self.tpot.extend(_known(tpots))

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
        self.split_requests += other.split_requests
        self.split_sums = [a + b for a, b in zip(self.split_sums, other.split_sums, strict=True)]
        self.after_sums = [a + b for a, b in zip(self.after_sums, other.after_sums, strict=True)]
        for name, stats in other.stages.items():
            if name not in self.stages and len(self.stages) >= self.max_stages:
                name = OTHER_STAGES
            mine = self.stages.get(name)
            if mine is None:
                self.stages[name] = mine = StageStats(name, stats.kind)
            mine.merge(stats)

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
        rated = window > 0 and self.requests >= MIN_RATE_REQUESTS
        rps = self.requests / window if rated else None
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
                "rps": self.good / window if rated else None,
                "fraction": self.good / self.requests if self.requests else 0.0,
            }
        stages = sorted(self.stages.values(), key=lambda s: (s.first, s.stage))
        out: dict[str, Any] = {
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
        if self.split_requests:
            # Only where a model server's span joined: reports without one keep their keys.
            split: dict[str, float | int] = {
                key: total / _FIXED / self.split_requests
                for key, total in zip(SPLIT_KEYS, self.split_sums, strict=True)
            }
            split["requests"] = self.split_requests
            out["model_wait_split_ms"] = split
        if any(self.after_sums) and self.instrumented:
            # Only where requests left work behind: reports without any keep their keys.
            on, off = (total / _FIXED / self.instrumented for total in self.after_sums)
            out["after_response_cpu_ms"] = {"cpu_on_loop": on, "cpu_off_loop": off}
        return out
