"""What the loop rules share: a service's loop windows over the sample's period, and the
queueing model their projections use.

:func:`loop_load` lines a service's kept ``tracekit.loop`` windows up with the request sample
(both are the earliest of the input): the windows that overlap the period the service's
sampled requests cover, their CPU split, busy ratio and lag, and the requests that started in
those windows, so that "per request" figures divide like by like.

**The queueing model** (:func:`queueing_projection`). The event loop is one server; a
request's recorded loop wait (``tracekit.loop_wait_ms``, ready to run but the loop busy) is
its queueing for it. In an M/M/1 queue the mean wait is ``rho / (1 - rho)`` service times, so
when a fix changes the loop's utilisation from ``rho`` to ``rho'`` (more worker processes
share the load: ``rho' = rho * N / N'``; work taken off the loop: ``rho' = rho - removed``)
each request's loop wait is scaled by ``[rho' / (1 - rho')] / [rho / (1 - rho)]`` and
everything else it did is kept; the projection is the route's p50 and p95 of those latencies.
Utilisations are capped at :data:`RHO_CAP` (the formula diverges at 1: a loop measured 100%
busy is read as 98%). Assumptions, stated with each projection: open arrivals (the same
requests arrive at the same times, so the throughput does not move), one CPU core per worker
process, the loop's own waiting is all a fix removes (CPU moved off the loop still runs
elsewhere, at the same wall time), and the M/M/1 shape (exponential arrivals and slices: for
many short slices of similar length the real wait is lower, down to half at the same
utilisation for constant slices, M/D/1).

**Closed loops** (:func:`closed_loop_projection`): where the replay reads the arrivals as
``N`` closed-loop clients, more workers raise the throughput and the loops fill again. The
service is then a closed queueing network solved by exact mean value analysis: the loop a
station (its CPU per request over the CPU share the loop thread got), the rest of each
client's cycle a delay, calibrated on the recorded time on the loop; ``N / W`` clients per
worker; each worker at the loop's share of a CPU (the point) or at what it gets beside every
other worker and the host's other cores busy (the range's far end). docs/analyzer-rules.md,
"The queueing model", has the details and measured checks.

**Queue waits** (``tracekit.queue_wait_ms``: locks, pools) scale with the loop waits in both
models: on a saturated loop their holders waited for the loop, and they fell with more workers
in every measured case (``bench/validate.py``'s loop-saturated case); the range reaches them
kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, queue_wait_ms
from tracekit.analysis.replay.host import quantile_range
from tracekit.analysis.replay.sim import fair_rates
from tracekit.analysis.rules.findings import RuleContext
from tracekit.analysis.rules.loop_index import loop_usage
from tracekit.analysis.stats.intervals import merge, overlap
from tracekit.analysis.stats.loop_windows import LoopWindow, processes

__all__ = [
    "RHO_CAP",
    "LoopLoad",
    "closed_loop_projection",
    "loop_load",
    "loop_loads",
    "queueing_projection",
    "utilisation_factor",
]

#: The highest utilisation the queueing model takes (see the module docstring).
RHO_CAP = 0.98
_NS = 1e6


@dataclass
class LoopLoad:
    """One service's loop windows over the sample's period (see :func:`loop_load`).

    Attributes:
        service: the service.
        windows: its windows overlapping the period (all its loop threads).
        requests: its sampled requests that started within those windows' span.
        processes: how many loops ran at once (worker processes sharing a thread name).
        wall_ms, cpu_ms, requests_cpu_ms, gc_cpu_ms, tracekit_cpu_ms, background_cpu_ms,
            gc_ms: the windows' sums.
        busy: each window's busy ratio while requests were in flight: its loop CPU over the
            part of it that the requests' intervals cover (a window that a burst of requests
            only begins or ends in reads as the busy loop it was, not as an idle one: in a
            short recording those edge windows are most of them).
        lag_p50, lag_p95: each window's lag p50 and p95, where the probe ran.
        runqueue_ms, runqueue_wall_ms: the loop thread's run-queue delay (waiting for a CPU)
            and the wall time of the windows that measured it (Linux).
    """

    service: str
    windows: list[LoopWindow]
    requests: list[RequestRecord]
    processes: int
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    requests_cpu_ms: float = 0.0
    gc_cpu_ms: float = 0.0
    tracekit_cpu_ms: float = 0.0
    background_cpu_ms: float = 0.0
    gc_ms: float = 0.0
    busy: list[float] = field(default_factory=list)
    lag_p50: list[float] = field(default_factory=list)
    lag_p95: list[float] = field(default_factory=list)
    runqueue_ms: float = 0.0
    runqueue_wall_ms: float = 0.0

    @property
    def cpu_wait_share(self) -> float | None:
        """The share of the time the loop thread waited for a CPU (``None``: not measured)."""
        return self.runqueue_ms / self.runqueue_wall_ms if self.runqueue_wall_ms > 0 else None

    @property
    def rho(self) -> float:
        """The loop's utilisation: its CPU over the windows' wall time (per process)."""
        return self.cpu_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    @property
    def busy_p50(self) -> float:
        """The median window's busy ratio."""
        return percentile(self.busy, 0.5) if self.busy else 0.0

    @property
    def lag_p50_ms(self) -> float | None:
        """The median window's lag p50 (``None``: no probe ran)."""
        return percentile(self.lag_p50, 0.5) if self.lag_p50 else None

    @property
    def lag_p95_ms(self) -> float | None:
        """The median window's lag p95 (``None``: no probe ran)."""
        return percentile(self.lag_p95, 0.5) if self.lag_p95 else None

    @property
    def untraced_cpu_ms(self) -> float:
        """Loop CPU that no traced request owns: background, tracekit's and GC's."""
        return self.background_cpu_ms + self.tracekit_cpu_ms + self.gc_cpu_ms

    def per_request(self, ms: float) -> float:
        """``ms`` (a sum over the windows) per request that started in them."""
        return ms / len(self.requests) if self.requests else 0.0

    def per_second(self, ms: float) -> float:
        """``ms`` (a sum over the windows) per second of loop time (per process)."""
        return ms / self.wall_ms * 1e3 if self.wall_ms > 0 else 0.0


def loop_loads(requests: Sequence[RequestRecord], ctx: RuleContext) -> dict[str, LoopLoad]:
    """:func:`loop_load` of every service with loop windows (cached per sample in ``ctx``)."""
    cached = ctx.cache.get("loop_loads")
    if cached is not None and cached[0] is requests:
        loads: dict[str, LoopLoad] = cached[1]
        return loads
    loads = {}
    if ctx.loops is not None and ctx.loops.loops:
        by_service: dict[str, list[RequestRecord]] = {}
        for req in requests:
            by_service.setdefault(req.service, []).append(req)
        for service in sorted({service for service, _ in ctx.loops.loops}):
            load = loop_load(service, ctx.loops.windows(service), by_service.get(service, []))
            if load is not None:
                loads[service] = load
    ctx.cache["loop_loads"] = (requests, loads)
    return loads


def loop_load(
    service: str, windows: Sequence[LoopWindow], requests: Sequence[RequestRecord]
) -> LoopLoad | None:
    """A service's windows that overlap its sampled requests' period, and the requests that
    started within them; ``None`` when no window overlaps (or there are no requests)."""
    if not requests or not windows:
        return None
    lo = min(r.start_ns for r in requests)
    hi = max(r.end_ns for r in requests)
    inside = [w for w in windows if w.end_ns > lo and w.start_ns < hi]
    if not inside:
        return None
    first = min(w.start_ns for w in inside)
    last = max(w.end_ns for w in inside)
    load = LoopLoad(
        service,
        inside,
        [r for r in requests if first <= r.start_ns < last],
        max(1, processes(inside)),
    )
    serving = merge((r.start_ns, r.end_ns) for r in load.requests)
    for w in inside:
        load.wall_ms += w.wall_ms
        load.cpu_ms += w.cpu_ms
        load.requests_cpu_ms += w.requests_cpu_ms
        load.gc_cpu_ms += w.gc_cpu_ms
        load.tracekit_cpu_ms += w.tracekit_cpu_ms
        load.background_cpu_ms += w.background_cpu_ms
        load.gc_ms += w.gc_ms
        served_ms = overlap(w.start_ns, w.end_ns, serving) / _NS
        load.busy.append(min(1.0, w.cpu_ms / served_ms) if served_ms > 0 else w.busy_ratio)
        if w.runqueue_ms is not None:
            load.runqueue_ms += w.runqueue_ms
            load.runqueue_wall_ms += w.wall_ms
        if w.lag_p50_ms is not None:
            load.lag_p50.append(w.lag_p50_ms)
        if w.lag_p95_ms is not None:
            load.lag_p95.append(w.lag_p95_ms)
    return load


def utilisation_factor(rho: float, rho_after: float) -> float:
    """How much a loop wait scales when the loop's utilisation goes from ``rho`` to
    ``rho_after`` (M/M/1: ``rho / (1 - rho)`` service times of waiting; both capped at
    :data:`RHO_CAP`)."""
    rho = min(max(rho, 0.0), RHO_CAP)
    rho_after = min(max(rho_after, 0.0), RHO_CAP)
    if rho <= 0:
        return 1.0
    return (rho_after / (1 - rho_after)) / (rho / (1 - rho))


def queueing_projection(
    requests: Sequence[RequestRecord], route: str, factor: float, *, minus_ms: str | None = None
) -> dict[str, Any] | None:
    """Before and after of ``route``'s requests when each one's recorded loop wait, and its
    queue wait, are scaled by ``factor`` (and, with ``minus_ms``, the request-span attribute
    of that name, such as ``tracekit.gc_ms``, is taken off its latency); the range reaches
    the queue waits kept as they were.

    Returns:
        ``{"route": route, "p50_ms": [before, after], "p95_ms": [...], "throughput_rps":
        [rps, rps], "range": {...}, "model": {...}}``, or ``None`` without instrumented requests of the
        route.
    """
    reqs = [r for r in requests if r.route == route and r.instrumented]
    if not reqs:
        return None
    before, after, kept = [], [], []
    for r in reqs:
        wall = r.wall_ms
        cut = (r.loop_wait_ms or 0.0) * (1.0 - factor)
        if minus_ms is not None:
            value = r.attributes.get(minus_ms)
            if (type(value) is float or type(value) is int) and value > 0:
                cut += float(value)
        before.append(wall)
        after.append(max(0.0, wall - cut - queue_wait_ms(r) * (1.0 - factor)))
        kept.append(max(0.0, wall - cut))
    span_s = (max(r.end_ns for r in reqs) - min(r.start_ns for r in reqs)) / 1e9
    rps = len(reqs) / span_s if span_s > 0 else 0.0
    # The after's range: the percentiles' sampling error (the before is measured, so there is
    # no replay residual to carry), out to the queue waits kept; the model statement: this
    # module's docstring.
    return {
        "route": route,
        "p50_ms": [percentile(before, 0.5), percentile(after, 0.5)],
        "p95_ms": [percentile(before, 0.95), percentile(after, 0.95)],
        "throughput_rps": [rps, rps],
        "range": {"p50_ms": _spanning(after, kept, 0.5), "p95_ms": _spanning(after, kept, 0.95),
                  "throughput_rps": [rps, rps]},
        "model": {"method": "queueing", "arrivals": "open", "rate_rps": round(rps, 3),
                  "cores": 1, "cores_source": "one per worker process"},
    }  # fmt: skip


def _spanning(central: Sequence[float], far: Sequence[float], q: float) -> list[float]:
    # A quantile's range over two projections: both ends' sampling intervals together.
    low, high = quantile_range(central, q)
    far_low, far_high = quantile_range(far, q)
    return [min(low, far_low), max(high, far_high)]


def closed_loop_projection(
    load: LoopLoad, route: str, *, clients: int, workers: int, cores: int, others: float,
    share: float, cores_free: bool = False,
) -> dict[str, Any] | None:  # fmt: skip
    """``route``'s before and after when a closed loop of ``clients`` is served by
    ``workers`` processes instead of ``load.processes`` (the module docstring, "Closed
    loops").

    Args:
        load: the service's loop windows and the requests that started in them.
        route: the route whose figures the projection gives.
        clients: the closed loop's clients (the replay's reading of the arrivals).
        workers: the worker processes after the fix.
        cores / others: the gateway host's cores and its other runnable threads on average
            (:class:`~tracekit.analysis.replay.host.Host`).
        share: the share of a CPU the loop thread got while ready to run (1: not measured).
        cores_free: ``cores`` are the ones free for the gateway (``--cores``): the other
            threads are ``others`` at the far end too.

    Returns:
        The projection (as :func:`queueing_projection`'s), or ``None`` without instrumented
        requests of the route or a measured cycle to read the clients' own time from.
    """
    reqs = [r for r in load.requests if r.instrumented]
    mine = [r for r in reqs if r.route == route]
    if not mine or clients < 1:
        return None
    span_ms = (max(r.end_ns for r in reqs) - min(r.start_ns for r in reqs)) / _NS
    share = min(max(share, 0.05), 1.0)
    own = {id(r): sum(u.cpu_ms for u in loop_usage(r).values()) for r in reqs}
    # A saturated loop's waits: for the loop, and on locks and pools whose holders waited for
    # it (both fell with more workers in every measured case; the range keeps queue waits).
    waits = {id(r): (r.loop_wait_ms or 0.0) + queue_wait_ms(r) for r in reqs}
    waited = sum(waits.values()) / len(reqs)
    cpu = sum(own.values()) / len(reqs)
    held = cpu / share + waited  # a request's time on the loop, its CPU stretched by the host
    demand = load.cpu_ms / max(1, len(load.requests))  # all the loop's CPU, per request
    if span_ms <= 0 or demand <= 0 or held <= 0:
        return None
    # Everything in a client's cycle but the loop: its own time, the model, other waits.
    outside = max(0.0, clients * span_ms / len(reqs) - held)
    before_model = _residence(clients / load.processes, demand / share, outside)
    calibration = held / before_model if before_model > 0 else 1.0
    # The shares a worker gets: what the loop got (a core each, where free), or less with
    # every other worker runnable beside the host's other threads. The loop's wait for a CPU
    # measured those on its own core only: the other cores may have been busy (a load
    # generator, the model server, which work harder when the gateway gets faster) without
    # delaying it, so the far end takes them as busy as they can have been.
    crowded = fair_rates(cores, 1, workers - 1, others if cores_free else max(others, cores - 1.0))[0]
    shares = sorted({share, min(share, crowded)}, reverse=True)
    befores = [r.wall_ms for r in mine]
    outcomes = []
    for worker_share, queues_fall in ((shares[0], True), (shares[-1], False)):
        after_held = calibration * _residence(clients / workers, demand / worker_share, outside)
        stretched = cpu / worker_share
        scale = max(0.0, after_held - stretched) / waited if waited > 0 else 1.0
        afters = [
            max(0.0, r.wall_ms + own[id(r)] * (1 / worker_share - 1 / share)
                - (waits[id(r)] if queues_fall else r.loop_wait_ms or 0.0) * (1.0 - scale))
            for r in mine
        ]  # fmt: skip
        outcomes.append((afters, (outside + held) / (outside + after_held)))
    rps = len(mine) / span_ms * 1e3
    (central, speedup), (far, far_speedup) = outcomes
    return {
        "route": route,
        "p50_ms": [percentile(befores, 0.5), percentile(central, 0.5)],
        "p95_ms": [percentile(befores, 0.95), percentile(central, 0.95)],
        "throughput_rps": [rps, rps * speedup],
        "range": {"p50_ms": _spanning(central, far, 0.5), "p95_ms": _spanning(central, far, 0.95),
                  "throughput_rps": sorted([rps * far_speedup, rps * speedup])},
        "model": {"method": "queueing", "arrivals": "closed", "clients": clients,
                  "workers": workers, "cores": cores, "host_others": round(others, 2),
                  "loop_cpu_share": round(share, 3),
                  "worker_cpu_share": [round(shares[-1], 3), round(shares[0], 3)]},
    }  # fmt: skip


def _residence(clients: float, demand: float, outside: float) -> float:
    """Mean time a request spends at one queueing station (service ``demand`` ms a visit)
    with ``clients`` circulating, each ``outside`` ms away between visits: exact mean value
    analysis (the recursion over 1..N clients), linear between the two whole numbers around
    a fractional count (clients split over workers). Cost: O(clients)."""
    if clients <= 1:
        return demand
    whole = math.floor(clients)
    residences = [demand]  # with 1, 2, ... whole + 1 clients
    queue = demand / (demand + outside)
    for n in range(2, whole + 2):
        residences.append(demand * (1 + queue))
        queue = n * residences[-1] / (residences[-1] + outside)
    low, high = residences[whole - 1], residences[whole]
    return low + (clients - whole) * (high - low)
