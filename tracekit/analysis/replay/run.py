"""One replay of a request sample, and how it compares with the record (for ``replay.py``).

:class:`Loops` groups a sample's requests by service (one event loop each) and computes what
every replay of that sample shares, once: their arrivals (``_replay_arrivals``) and whether
the service's recorded loop slices overlap (several event loops in one service, which the
model is not). :func:`simulate` runs one replay of the sample from the programs it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay.arrivals import Arrivals, arrivals
from tracekit.analysis.replay.fixes import PROCESSES, THREADS
from tracekit.analysis.replay.host import Host, host_of, quantile_range
from tracekit.analysis.replay.sim import Node, Simulation
from tracekit.analysis.stats.loop_windows import LoopCpu

# Slices of different requests overlapping for more than this share of the loop time means
# the trace mixes several event loops (worker processes), which the one-loop model is not.
_MULTI_LOOP_SHARE = 0.05


@dataclass
class Run:
    """One replay: simulated latency, first step and end of every replayed request (ms),
    by index in the replayed sample, and the services whose trace mixes several loops."""

    latency: dict[int, float]
    arrival: dict[int, float]
    end: dict[int, float]
    multi_loop: list[str]


@dataclass
class _Loop:
    indexes: list[int]  # the service's requests, as indexes into the replayed sample
    plan: Arrivals
    mixed: bool
    host: Host

    @property
    def mode(self) -> str:
        """``"closed"`` when the requests replay as closed-loop clients, else ``"open"``."""
        return "closed" if self.plan.chains else "open"

    @property
    def clients(self) -> int:
        """Closed loop: the clients (a client's first request is the one not chained)."""
        return len(self.plan.ready)


class Loops:
    """The replayed sample per service, with its arrivals and its multi-loop check.

    Args:
        reqs: the replayed requests, sorted by start.
        mode / gap_ms / min_fraction: arrival options (``ReplayConfig``).
        cores / thread_pool_size: the configured host (``None``: per service, from the trace;
            :func:`~tracekit.analysis.replay.host.host_of`).
        loop_cpu: per service, what its loop threads got of the host's CPU (the host's other
            load is read from it), where the trace measured it.

    Cost: O(requests + loop slices, log) once; every replay of the sample reuses it.
    """

    def __init__(self, reqs: list[RequestRecord], mode: str, gap_ms: float, min_fraction: float,
                 cores: int | None = None, thread_pool_size: int | None = None,
                 loop_cpu: Mapping[str, LoopCpu] | None = None) -> None:  # fmt: skip
        self.reqs = reqs
        self.t0 = min((r.start_ns for r in reqs), default=0)
        by_service: dict[str, list[int]] = {}
        for i, req in enumerate(reqs):
            by_service.setdefault(req.service, []).append(i)
        self.services: dict[str, _Loop] = {}
        for service, indexes in by_service.items():
            group = [reqs[i] for i in indexes]
            plan = arrivals(group, self.t0, mode, gap_ms, min_fraction)
            host = host_of(group, cores, thread_pool_size, (loop_cpu or {}).get(service))
            self.services[service] = _Loop(indexes, plan, mixes_loops(group), host)


def simulate(
    loops: Loops,
    program: Callable[[RequestRecord, Host], list[Node]],
    capacities: dict[str, int | None],
) -> Run:
    """Replay ``loops``' requests, each as ``program(request)``, one simulation per service.

    Args:
        loops: the sample, grouped, with each service's host (cores, thread pool).
        program: the program of a request (as recorded, or with a fix) on its service's host.
        capacities: slots per HOLD resource; the pools' (:data:`THREADS`,
            :data:`PROCESSES`) default to the service's host when absent or ``None``.

    Returns:
        The :class:`Run`.
    """
    run = Run({}, {}, {}, [])
    for service, loop in loops.services.items():
        if loop.mixed:
            run.multi_loop.append(service)
        host = loop.host
        programs = [program(loops.reqs[i], host) for i in loop.indexes]
        caps = {**capacities, THREADS: capacities.get(THREADS) or host.thread_pool_size,
                PROCESSES: capacities.get(PROCESSES) or host.cores}  # fmt: skip
        sim = Simulation(host.cores, caps, frozenset((THREADS, PROCESSES)), host.others)
        opens = [loop.plan.ready.get(local) for local in range(len(loop.indexes))]
        ends = sim.run(programs, opens, _Chainer(sim, loop.plan.chains))
        for local, index in enumerate(loop.indexes):
            first = sim.first_run[local]
            if not math.isnan(ends[local]) and not math.isnan(first):
                run.arrival[index] = first
                run.end[index] = ends[local]
                run.latency[index] = ends[local] - first
    return run


@dataclass
class _Chainer:
    """Closed-loop arrivals: when a request ends, its chained successor becomes ready after
    the recorded idle time between them."""

    sim: Simulation
    chains: dict[int, tuple[int, float]]

    def __call__(self, local: int, at: float) -> None:
        chained = self.chains.get(local)
        if chained is not None:
            self.sim.start(chained[0], at + chained[1])  # a new request: arrives as I/O


def errors(reqs: list[RequestRecord], run: Run, route: str) -> tuple[float, float]:
    """(p50, p95) relative errors of ``route``'s simulated latency vs the measured one."""
    measured = [r.wall_ms for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    simulated = [run.latency[i] for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    if not measured:
        return (math.inf, math.inf)
    return (
        _relative(percentile(simulated, 0.5), percentile(measured, 0.5)),
        _relative(percentile(simulated, 0.95), percentile(measured, 0.95)),
    )


def reproduced(reqs: list[RequestRecord], run: Run, route: str, tolerance: float) -> bool:
    """Whether ``run`` reproduced ``route``: its simulated p50 and p95 each within
    ``tolerance`` of the measured one, or inside the measured quantile's 95% interval (order
    statistics). The interval is what the measurement itself says: a route whose requests
    fall in two groups (streamed and not: 90-120 and 235-260 ms in a new user's run) has its
    p50 in the gap, where one request more on either side moves it by tens of percent."""
    measured = [r.wall_ms for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    simulated = [run.latency[i] for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    if not measured:
        return False
    for q in (0.5, 0.95):
        value, truth = percentile(simulated, q), percentile(measured, q)
        low, high = quantile_range(measured, q)
        if abs(_relative(value, truth)) > tolerance and not low <= value <= high:
            return False
    return True


def _relative(simulated: float, measured: float) -> float:
    if measured <= 0:
        return 0.0 if simulated <= 0 else math.inf
    return simulated / measured - 1.0


def measured(reqs: list[RequestRecord], run: Run, route: str) -> dict[str, float]:
    """``route``'s recorded p50, p95 (ms) and throughput (requests/s), over the requests
    ``run`` replayed (as :func:`figures` reads a replay)."""
    on = [r for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    span_s = (max(r.end_ns for r in on) - min(r.start_ns for r in on)) / 1e9
    return {
        "p50_ms": percentile([r.wall_ms for r in on], 0.5),
        "p95_ms": percentile([r.wall_ms for r in on], 0.95),
        "throughput_rps": len(on) / span_s if span_s > 0 else 0.0,
    }


def latencies(reqs: list[RequestRecord], run: Run, route: str) -> list[float]:
    """``route``'s simulated latencies in ``run`` (ms)."""
    return [run.latency[i] for i, r in enumerate(reqs) if r.route == route and i in run.latency]


def figures(reqs: list[RequestRecord], run: Run, route: str) -> dict[str, float]:
    """``route``'s simulated p50, p95 (ms) and throughput (requests/s) in ``run``."""
    indexes = [i for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    latencies = [run.latency[i] for i in indexes]
    first = min(run.arrival[i] for i in indexes)
    last = max(run.end[i] for i in indexes)
    span_s = (last - first) / 1000.0
    throughput = len(indexes) / span_s if span_s > 0 else 0.0
    return {
        "p50_ms": round(percentile(latencies, 0.5), 3),
        "p95_ms": round(percentile(latencies, 0.95), 3),
        "throughput_rps": round(throughput, 3),
    }


def mixes_loops(group: list[RequestRecord]) -> bool:
    """Whether loop slices of different requests overlap (several event loops)."""
    slices = sorted(
        (a, b, i)
        for i, req in enumerate(group)
        for a, b in [*req.loop_slices, *(s for st in req.stages for s in st.loop_slices)]
    )
    total = sum(b - a for a, b, _ in slices)
    if total <= 0:
        return False
    shared = 0
    reach, owner = slices[0][1], slices[0][2]
    for a, b, i in slices[1:]:
        if a < reach and i != owner:
            shared += min(b, reach) - a
        if b > reach:
            reach, owner = b, i
    return shared > _MULTI_LOOP_SHARE * total


def multi_loop_reason(services: list[str]) -> str:
    """The validation's reason when traces mix several event loops."""
    names = ", ".join(sorted(services))
    return (
        f"loop slices of different requests overlap in {names}: the trace mixes several "
        f"event loops (worker processes), which the one-loop replay does not model"
    )
