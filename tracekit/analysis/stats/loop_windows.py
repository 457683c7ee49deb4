"""The loop view: what each event loop ran per window (``tracekit.loop`` spans), in bounded memory.

The recorder exports one root ``tracekit.loop`` span per event loop per ~1 s window (its own
trace; attributes ``tracekit.loop.*``, ``docs/attributes.md``). Assembly hands every trace that
makes no request to :meth:`LoopWindows.offer` (:class:`tracekit.analysis.pipeline.Pipeline`),
which keeps, per loop -- (service, loop thread name) --

- counters: windows, their wall time, the loop thread's CPU and its split (requests, GC,
  tracekit, background), GC pause wall time, collections per generation, the longest pause
  and its generation, probes, the most tasks and requests in flight seen;
- percentiles over windows (:class:`~tracekit.analysis.stats.quantiles.Quantiles`) of the busy
  ratio and of each window's lag p50 and p95;
- the earliest :data:`MAX_KEPT` windows of all loops whole (:class:`LoopWindow`), for the rules,
  which compare them with the request sample (the earliest requests, so the same period).

Like the route statistics, everything is independent of the order windows come in and two
collectors :meth:`~LoopWindows.merge` exactly into what one fed everything holds (the parallel
reader merges one per byte range): sums are integers (ns), ties are broken by ids.

Worker processes of one service name their loop threads alike (``MainThread``): their windows
land on one loop key. They overlap in time, so :func:`processes` counts them as the most
windows of a key that cover one instant.

How lag is combined over windows (a window carries its probes' p50, p95 and max, not the
probes): the report's lag p50 is the median of the windows' p50, its p95 the 95th percentile
of the windows' p95 (the lag that one window in twenty exceeded for 5% of its probes; not the
pooled p95 of all probes, which the windows do not carry), its max the largest window max.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from msgspec import Struct

from tracekit import semconv
from tracekit.analysis.assembly.request_records import ms_value
from tracekit.analysis.model import Span
from tracekit.analysis.stats.quantiles import Quantiles

__all__ = ["HOST_SHORT_SHARE", "MAX_KEPT", "MAX_LOOPS", "OTHER_LOOPS", "LoopCpu", "LoopStats",
           "LoopWindow", "LoopWindows", "is_loop_window", "processes", "window_of"]  # fmt: skip

#: Windows kept whole for the rules: the earliest ones of all loops (~5.5 hours of one loop
#: at a window a second; ~300 bytes each).
MAX_KEPT = 20_000
#: Distinct loops tracked before new ones are pooled (hostile input could name millions).
MAX_LOOPS = 256
#: The thread name of the pooled loops.
OTHER_LOOPS = "(other loops)"
#: GC generations of ``tracekit.loop.gc_counts``.
GENERATIONS = 3
_NS = 1e6  # ns per ms
_SUMMARY = ("p50", "p95", "max")


#: The share of the loop's time waiting for a CPU (run-queue delay) from which the host is
#: short of CPU (the report says so; ``loop-saturated`` names it as the cause): a tenth of the
#: time, enough to move every wait and step it holds.
HOST_SHORT_SHARE = 0.10
#: Background task names counted per loop (the recorder exports 8 a window), and reported.
MAX_TASK_NAMES = 256
TASKS_SHOWN = 5
#: Processes a loop's windows are summed for apart (worker processes; more are left out).
MAX_PROCESSES = 64


@dataclass(frozen=True)
class LoopCpu:
    """A service's loop threads and the host's CPU, from the windows that measured the
    run-queue delay (Linux).

    Attributes:
        share: the share of a CPU the loop threads got while ready to run: their CPU over
            that CPU plus their run-queue delay.
        waited: their run-queue delay over the windows' wall time; from
            :data:`HOST_SHORT_SHARE` on, the host is short of CPU.
    """

    share: float
    waited: float

    @property
    def host_short(self) -> bool:
        """Whether the host was short of CPU (the report says so)."""
        return self.waited >= HOST_SHORT_SHARE


class LoopWindow(Struct, array_like=True):
    """One window of one event loop, decoded from a ``tracekit.loop`` span (times in ns, ms
    elsewhere; ``None``: the attribute was absent or malformed)."""

    service: str
    thread: str
    start_ns: int
    end_ns: int
    trace_id: str
    span_id: str
    busy_ratio: float
    cpu_ms: float
    requests_cpu_ms: float
    gc_cpu_ms: float
    tracekit_cpu_ms: float
    background_cpu_ms: float
    gc_ms: float
    gc_counts: tuple[int, int, int]
    gc_max_ms: float | None
    gc_max_generation: int | None
    lag_p50_ms: float | None
    lag_p95_ms: float | None
    lag_max_ms: float | None
    probes: int
    inflight: int | None
    tasks: int | None
    #: A pyinstrument profile of the window (tracekit.integrations.pyinstrument), taken
    #: after a saturated or blocked one: ``(sampled ms, hot, tree, reason)``.
    profile: tuple[float, str, str, str] | None = None
    #: The CPU of the longest collection (``gc_max_ms`` is its wall time; None in traces
    #: recorded before tracekit wrote it).
    gc_max_cpu_ms: float | None = None
    #: The time the loop thread waited for a CPU (run-queue delay; None where not measured).
    runqueue_ms: float | None = None
    #: The tasks of no request that took the most background CPU: (coroutine, ms).
    background_tasks: tuple[tuple[str, float], ...] = ()
    #: The process the loop ran in (None in traces recorded before tracekit wrote it).
    pid: int | None = None

    @property
    def wall_ms(self) -> float:
        """The window's length in ms."""
        return max(0, self.end_ns - self.start_ns) / _NS

    @property
    def key(self) -> tuple[int, str, str]:
        """Its order among kept windows: start, then ids."""
        return (self.start_ns, self.trace_id, self.span_id)


def is_loop_window(span: Span) -> bool:
    """Whether ``span`` is a loop window (``tracekit.loop`` with its thread attribute)."""
    return span.name == semconv.LOOP_SPAN and semconv.LOOP_THREAD in span.attributes


def window_of(span: Span) -> LoopWindow | None:
    """Decode a loop window span; ``None`` when it is not one. Malformed values never raise:
    a duration becomes 0 (or ``None`` where optional), a count ``None``."""
    if not is_loop_window(span):
        return None
    a = span.attributes
    thread = a.get(semconv.LOOP_THREAD)
    thread = thread if isinstance(thread, str) and thread else "?"
    start = span.start_ns
    end = max(start, span.end_ns)
    cpu = ms_value(a.get(semconv.LOOP_CPU_MS)) or 0.0
    busy = ms_value(a.get(semconv.LOOP_BUSY_RATIO))
    if busy is None:
        busy = cpu * _NS / (end - start) if end > start else 0.0
    return LoopWindow(
        span.service, thread[:200], start, end, span.trace_id, span.span_id,
        min(1.0, busy), cpu,
        ms_value(a.get(semconv.LOOP_REQUESTS_CPU_MS)) or 0.0,
        ms_value(a.get(semconv.LOOP_GC_CPU_MS)) or 0.0,
        ms_value(a.get(semconv.LOOP_TRACEKIT_CPU_MS)) or 0.0,
        ms_value(a.get(semconv.LOOP_BACKGROUND_CPU_MS)) or 0.0,
        ms_value(a.get(semconv.LOOP_GC_MS)) or 0.0,
        _gc_counts(a.get(semconv.LOOP_GC_COUNTS)),
        ms_value(a.get(semconv.LOOP_GC_MAX_MS)),
        _generation(a.get(semconv.LOOP_GC_MAX_GENERATION)),
        ms_value(a.get(semconv.LOOP_LAG_P50_MS)),
        ms_value(a.get(semconv.LOOP_LAG_P95_MS)),
        ms_value(a.get(semconv.LOOP_LAG_MAX_MS)),
        _count(a.get(semconv.LOOP_PROBES)) or 0,
        _count(a.get(semconv.LOOP_INFLIGHT)),
        _count(a.get(semconv.LOOP_TASKS)),
        _profile(a),
        ms_value(a.get(semconv.LOOP_GC_MAX_CPU_MS)),
        ms_value(a.get(semconv.LOOP_RUNQUEUE_MS)),
        _tasks(a.get(semconv.LOOP_BACKGROUND_TASKS), a.get(semconv.LOOP_BACKGROUND_TASKS_CPU_MS)),
        _count(a.get(semconv.LOOP_PID)),
    )  # fmt: skip


def _tasks(names: Any, cpu: Any) -> tuple[tuple[str, float], ...]:
    # Parallel arrays (a list, or Jaeger's JSON text of one); malformed pairs are dropped.
    names, cpu = _array(names), _array(cpu)
    pairs = []
    for name, ms in zip(names[:MAX_TASK_NAMES], cpu, strict=False):
        value = ms_value(ms)
        if isinstance(name, str) and name and value is not None:
            pairs.append((name[:200], value))
    return tuple(pairs)


def _array(value: Any) -> list[Any]:
    if isinstance(value, str) and value.startswith("["):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return []
    return list(value) if isinstance(value, (list, tuple)) else []


def _profile(a: dict[str, Any]) -> tuple[float, str, str, str] | None:
    ms = ms_value(a.get(semconv.PROFILE_MS))
    hot, tree = a.get(semconv.PROFILE_HOT), a.get(semconv.PROFILE_TREE)
    if ms is None or not isinstance(hot, str) or not isinstance(tree, str):
        return None
    reason = a.get(semconv.PROFILE_REASON)
    return ms, hot, tree, reason if isinstance(reason, str) else ""


def larger_profile(a: tuple[float, str, str, str] | None,
                   b: tuple[float, str, str, str] | None) -> tuple[float, str, str, str] | None:  # fmt: skip
    """The profile that sampled more (the smaller text on a tie: order-independent)."""
    if a is None or b is None:
        return a or b
    return min(a, b, key=lambda p: (-p[0], p[1:]))


class LoopStats:
    """The counters and percentiles of one loop (see the module docstring)."""

    __slots__ = ("busy", "first_ns", "gc_counts", "gc_max_generation", "gc_max_ms", "inflight_max",
                 "lag_max_ms", "lag_p50", "lag_p95", "last_ns", "ns", "per_process", "probes",
                 "profile", "runqueue_cpu_ns", "runqueue_ns", "runqueue_wall_ns", "service",
                 "task_cpu", "tasks_max", "thread", "windows")  # fmt: skip

    #: The integer sums of ``ns``, in this order.
    SUMS = ("wall", "cpu", "requests", "gc_cpu", "tracekit", "background", "gc")

    def __init__(self, service: str, thread: str) -> None:
        self.service = service
        self.thread = thread
        self.windows = 0
        self.ns = [0] * len(self.SUMS)
        self.busy = Quantiles()
        self.lag_p50 = Quantiles()
        self.lag_p95 = Quantiles()
        self.lag_max_ms: float | None = None
        self.probes = 0
        self.gc_counts = [0] * GENERATIONS
        self.gc_max_ms: float | None = None
        self.gc_max_generation: int | None = None
        self.tasks_max: int | None = None
        self.inflight_max: int | None = None
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.profile: tuple[float, str, str, str] | None = None
        # Run-queue delay, and the wall time and the loop's CPU of the windows that measured it.
        self.runqueue_ns = self.runqueue_wall_ns = self.runqueue_cpu_ns = 0
        self.task_cpu: dict[str, int] = {}  # background tasks' CPU by coroutine, ns
        # Per process (worker processes share a loop's key): [windows, wall ns, CPU ns].
        self.per_process: dict[int, list[int]] = {}

    def add(self, w: LoopWindow) -> None:
        """Count one window."""
        self.windows += 1
        values = (w.end_ns - w.start_ns, w.cpu_ms, w.requests_cpu_ms, w.gc_cpu_ms,
                  w.tracekit_cpu_ms, w.background_cpu_ms, w.gc_ms)  # fmt: skip
        ns = self.ns
        ns[0] += values[0]
        for i in range(1, len(values)):
            ns[i] += _to_ns(values[i])
        self.busy.add(w.busy_ratio)
        if w.lag_p50_ms is not None:
            self.lag_p50.add(w.lag_p50_ms)
        if w.lag_p95_ms is not None:
            self.lag_p95.add(w.lag_p95_ms)
        self.lag_max_ms = _max(self.lag_max_ms, w.lag_max_ms)
        self.probes += w.probes
        for g, n in enumerate(w.gc_counts):
            self.gc_counts[g] += n
        if w.gc_max_ms is not None:
            self._pause(w.gc_max_ms, w.gc_max_generation)
        self.tasks_max = _max(self.tasks_max, w.tasks)
        self.inflight_max = _max(self.inflight_max, w.inflight)
        self._span(w.start_ns, w.end_ns)
        if w.profile is not None:
            self.profile = larger_profile(self.profile, w.profile)
        if w.runqueue_ms is not None:
            self.runqueue_ns += _to_ns(w.runqueue_ms)
            self.runqueue_wall_ns += values[0]
            self.runqueue_cpu_ns += _to_ns(w.cpu_ms)
        for name, ms in w.background_tasks:
            self._task(name, _to_ns(ms))
        if w.pid is not None:
            self._process(w.pid, [1, values[0], _to_ns(w.cpu_ms)])

    def _process(self, pid: int, sums: list[int]) -> None:
        known = self.per_process.get(pid)
        if known is not None:
            self.per_process[pid] = [a + b for a, b in zip(known, sums, strict=True)]
        elif len(self.per_process) < MAX_PROCESSES:
            self.per_process[pid] = sums

    def by_process(self) -> list[dict[str, Any]]:
        """Each process's windows and busy share (its loop's CPU over its windows' wall time),
        the busiest first; empty unless the windows name two processes or more."""
        if len(self.per_process) < 2:
            return []
        rows = [{"pid": pid, "windows": n, "busy_mean": cpu / wall if wall > 0 else None}
                for pid, (n, wall, cpu) in self.per_process.items()]  # fmt: skip
        return sorted(rows, key=lambda r: (-(r["busy_mean"] or 0.0), r["pid"]))

    def _task(self, name: str, ns: int) -> None:
        tasks = self.task_cpu
        if name in tasks or len(tasks) < MAX_TASK_NAMES:
            tasks[name] = tasks.get(name, 0) + ns

    def tasks(self) -> list[tuple[str, float]]:
        """The background tasks that took the most CPU, ``(coroutine, ms)``, most first."""
        ranked = sorted(self.task_cpu.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(name, ns / _NS) for name, ns in ranked[:TASKS_SHOWN]]

    def _pause(self, ms: float, generation: int | None) -> None:
        # The longest pause; on a tie the older generation (a deterministic choice).
        if (
            self.gc_max_ms is None
            or ms > self.gc_max_ms
            or (ms == self.gc_max_ms and (generation or 0) > (self.gc_max_generation or 0))
        ):
            self.gc_max_ms = ms
            self.gc_max_generation = generation

    def _span(self, start: int | None, end: int | None) -> None:
        if start is not None and (self.first_ns is None or start < self.first_ns):
            self.first_ns = start
        if end is not None and (self.last_ns is None or end > self.last_ns):
            self.last_ns = end

    def merge(self, other: LoopStats) -> None:
        """Add what ``other`` (a loop of the same key) counted."""
        self.windows += other.windows
        self.ns = [a + b for a, b in zip(self.ns, other.ns, strict=True)]
        self.busy.merge(other.busy)
        self.lag_p50.merge(other.lag_p50)
        self.lag_p95.merge(other.lag_p95)
        self.lag_max_ms = _max(self.lag_max_ms, other.lag_max_ms)
        self.probes += other.probes
        self.gc_counts = [a + b for a, b in zip(self.gc_counts, other.gc_counts, strict=True)]
        if other.gc_max_ms is not None:
            self._pause(other.gc_max_ms, other.gc_max_generation)
        self.tasks_max = _max(self.tasks_max, other.tasks_max)
        self.inflight_max = _max(self.inflight_max, other.inflight_max)
        self._span(other.first_ns, other.last_ns)
        self.profile = larger_profile(self.profile, other.profile)
        self.runqueue_ns += other.runqueue_ns
        self.runqueue_wall_ns += other.runqueue_wall_ns
        self.runqueue_cpu_ns += other.runqueue_cpu_ns
        for name, ns in other.task_cpu.items():
            self._task(name, ns)
        for pid, sums in other.per_process.items():
            self._process(pid, sums)

    def ms(self, name: str) -> float:
        """One of :attr:`SUMS` in ms."""
        return self.ns[self.SUMS.index(name)] / _NS

    def to_dict(self, processes: int | None) -> dict[str, Any]:
        """The report's ``loop.loops[]`` item (``docs/analyzer.md``)."""
        cpu = self.ms("cpu")
        wall = self.ms("wall")
        split = {"requests": self.ms("requests"), "gc": self.ms("gc_cpu"),
                 "tracekit": self.ms("tracekit"), "background": self.ms("background")}  # fmt: skip
        gc_wall = self.ms("gc")
        lag = None
        if self.lag_p50.count or self.lag_p95.count or self.lag_max_ms is not None:
            lag = {"p50": self.lag_p50.quantile(0.5), "p95": self.lag_p95.quantile(0.95),
                   "max": self.lag_max_ms}  # fmt: skip
        out: dict[str, Any] = {
            "service": self.service,
            "thread": self.thread,
            "processes": processes,
            "windows": self.windows,
            "window_s": wall / 1e3,
            "busy": self.busy.summary(_SUMMARY),
            "busy_mean": cpu / wall if wall > 0 else None,
            "cpu_ms": {"total": cpu, **split},
            "cpu_share": {k: (v / cpu if cpu > 0 else None) for k, v in split.items()},
            "gc": {
                "counts": list(self.gc_counts),
                "pause_ms": gc_wall,
                "share": gc_wall / wall if wall > 0 else None,
                "max_ms": self.gc_max_ms,
                "max_generation": self.gc_max_generation,
            },
            "lag_ms": lag,
            "probes": self.probes,
            "tasks_max": self.tasks_max,
            "inflight_max": self.inflight_max,
        }
        if self.runqueue_wall_ns:  # only where measured: older reports keep their form
            out["cpu_wait"] = {"ms": self.runqueue_ns / _NS,
                               "share": self.runqueue_ns / self.runqueue_wall_ns}  # fmt: skip
        if self.task_cpu:  # only where named: older reports keep their form
            out["background_tasks"] = [{"task": name, "cpu_ms": ms} for name, ms in self.tasks()]
        by_process = self.by_process()
        if by_process:  # only with several processes: one process's report keeps its form
            out["by_process"] = by_process
        if self.profile is not None:  # only then: reports without profiles keep their form
            ms, hot, tree, reason = self.profile
            out["profile"] = {"sampled_ms": ms, "hot": hot, "tree": tree, "reason": reason}
        return out


class LoopWindows:
    """Every loop window of an analysis: per-loop :class:`LoopStats` and the earliest
    :data:`MAX_KEPT` windows whole.

    Args:
        max_kept: windows kept whole (for the rules).
        max_loops: loops tracked before new ones are pooled as :data:`OTHER_LOOPS`.
    """

    def __init__(self, max_kept: int = MAX_KEPT, max_loops: int = MAX_LOOPS) -> None:
        self.max_kept = max_kept
        self.max_loops = max_loops
        self.loops: dict[tuple[str, str], LoopStats] = {}
        # A heap whose top is the latest kept window; id() separates exact duplicates (equal
        # windows), so that windows are never compared.
        self._kept: list[tuple[_Later, int, LoopWindow]] = []

    def __len__(self) -> int:
        return sum(s.windows for s in self.loops.values())

    def offer(self, spans: Iterable[Span]) -> int:
        """Count the loop windows among ``spans`` (a trace that made no request).

        Returns:
            How many of them were loop windows.
        """
        n = 0
        for span in spans:
            window = window_of(span)
            if window is not None:
                self.add(window)
                n += 1
        return n

    def add(self, window: LoopWindow) -> None:
        """Count one window and offer it to the kept ones."""
        self._stats(window.service, window.thread).add(window)
        self._keep(window)

    def _stats(self, service: str, thread: str) -> LoopStats:
        key = (service, thread)
        stats = self.loops.get(key)
        if stats is None:
            if len(self.loops) >= self.max_loops:
                key = (service, OTHER_LOOPS)
            stats = self.loops.get(key)
            if stats is None:
                stats = self.loops[key] = LoopStats(*key)
        return stats

    def _keep(self, window: LoopWindow) -> None:
        # The earliest are kept: the heap's top is the latest kept one (_Later reverses).
        entry = (_Later(window.key), id(window), window)
        if len(self._kept) < self.max_kept:
            heapq.heappush(self._kept, entry)
        elif entry[0] > self._kept[0][0]:
            heapq.heapreplace(self._kept, entry)

    def merge(self, other: LoopWindows) -> None:
        """Add what ``other`` collected (the parallel reader's byte ranges)."""
        for (service, thread), stats in other.loops.items():
            key = (service, thread)
            if key not in self.loops and len(self.loops) >= self.max_loops:
                key = (service, OTHER_LOOPS)
            mine = self.loops.get(key)
            if mine is None:
                mine = self.loops[key] = LoopStats(*key)
            mine.merge(stats)
        for _, _, window in other._kept:
            self._keep(window)

    def windows(self, service: str | None = None) -> list[LoopWindow]:
        """The kept windows (of ``service`` when given), by start time."""
        kept = sorted((w for _, _, w in self._kept), key=lambda w: w.key)
        return [w for w in kept if service is None or w.service == service]

    def loop_cpu(self) -> dict[str, LoopCpu]:
        """Per service, its loop threads' :class:`LoopCpu`, summed over the windows that
        measured the run-queue delay (Linux); services without such windows are left out.
        The replay reads the host's other load from it (:mod:`tracekit.analysis.replay.host`)."""
        sums: dict[str, list[int]] = {}
        for stats in self.loops.values():
            if stats.runqueue_wall_ns:
                row = sums.setdefault(stats.service, [0, 0, 0])
                row[0] += stats.runqueue_cpu_ns
                row[1] += stats.runqueue_ns
                row[2] += stats.runqueue_wall_ns
        return {service: LoopCpu(cpu / (cpu + queued), queued / wall)
                for service, (cpu, queued, wall) in sums.items() if cpu > 0}  # fmt: skip

    def to_dict(self, route_cpu: Sequence[tuple[str, str, float]] = ()) -> dict[str, Any] | None:
        """The report's ``loop`` section, or ``None`` when there were no loop windows.

        Args:
            route_cpu: (route, service, the route's total on-loop request CPU in ms) of each
                route, for its share of its service's loop CPU.
        """
        if not self.loops:
            return None
        kept = self.windows()
        loops = sorted(self.loops.values(), key=lambda s: (s.service, s.thread))
        cpu_of_service: dict[str, float] = {}
        for s in loops:
            cpu_of_service[s.service] = cpu_of_service.get(s.service, 0.0) + s.ms("cpu")
        routes = []
        for route, service, cpu in route_cpu:
            loop_cpu = cpu_of_service.get(service)
            if loop_cpu is None:
                continue
            routes.append({"route": route, "service": service, "cpu_on_loop_ms": cpu,
                           "loop_cpu_share": cpu / loop_cpu if loop_cpu > 0 else None})  # fmt: skip
        return {
            "windows": len(self),
            "loops": [
                s.to_dict(
                    processes([w for w in kept if (w.service, w.thread) == (s.service, s.thread)]) or None
                )
                for s in loops
            ],
            "routes": routes,
        }


def processes(windows: Sequence[LoopWindow]) -> int:
    """The most windows of ``windows`` that cover one instant: the processes whose loops
    share a key (0 for none). Cost: O(n log n)."""
    events = sorted([(w.start_ns, 1) for w in windows] + [(w.end_ns, -1) for w in windows])
    best = now = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        best = max(best, now)
    return best


class _Later:
    """A window key ordered the other way round (the heap's top is the latest window)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, str, str]) -> None:
        self.key = key

    def __lt__(self, other: _Later) -> bool:
        return self.key > other.key

    def __gt__(self, other: _Later) -> bool:
        return self.key < other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Later) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _to_ns(ms: float) -> int:
    return round(ms * _NS) if ms < 1e12 else int(1e18)


def _max(a: Any, b: Any) -> Any:
    if b is None:
        return a
    return b if a is None or b > a else a


def _count(value: Any) -> int | None:
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.isdigit() and len(value) <= 18:
        return int(value)
    return None


def _generation(value: Any) -> int | None:
    n = _count(value)
    return n if n is not None and n < GENERATIONS else None


def _gc_counts(value: Any) -> tuple[int, int, int]:
    if isinstance(value, str) and value.startswith("["):  # Jaeger stringifies arrays
        import orjson

        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            value = None
    counts = [0] * GENERATIONS
    if isinstance(value, (list, tuple)):
        for g, n in enumerate(value[:GENERATIONS]):
            counts[g] = _count(n) or 0
    return (counts[0], counts[1], counts[2])
