"""Projections: replay the recorded requests through a model of the gateway, before and after a fix.

The model (``docs/analyzer-rules.md``, "The projection model"): each service is one process
with **one event-loop thread** (a single server with a FIFO ready queue; the request's own
code and every on-loop stage slice run there), a **thread pool** of ``thread_pool_size``
workers, a **process pool**, and **the GIL**: CPU that holds the GIL (the loop's slices,
pure-Python work on worker threads) progresses one thread at a time, GIL-free CPU (native code
that releases it, a process pool) runs in parallel up to ``cores``. Waits for I/O and for the
model are delays that hold nothing, except where a one-at-a-time model server (or a lock) is
part of the fix being modelled. Each recorded request becomes a program
(:mod:`tracekit.analysis._replay_build`) started at its recorded arrival time, or, when the
trace comes from closed-loop clients (a request starts right after another ends), right
after its predecessor ends in the replay.

:func:`validate` replays the trace **as recorded** and compares the simulated p50/p95 latency
of every route with the measured ones: the model is trusted on a trace only when both are
within ``tolerance`` (±15%). :func:`project` replays it again with a :class:`Fix` applied and
returns before/after figures, or ``None`` and a note saying why there is no projection: too
few requests, an uninstrumented route, or a failed validation (with its errors). It never
returns figures from a replay that did not reproduce the trace.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit.analysis._intervals import percentile
from tracekit.analysis._model_calls import model_calls
from tracekit.analysis._replay_arrivals import arrivals
from tracekit.analysis._replay_build import PROCESSES, THREADS, ModelCall, ProgramBuilder
from tracekit.analysis._replay_sim import Node, Simulation
from tracekit.analysis.findings import Fix, default_thread_pool_size
from tracekit.analysis.model import RequestRecord
from tracekit.errors import ConfigurationError

_MS = 1e6
# Slices of different requests overlapping for more than this share of the loop time means
# the trace mixes several event loops (worker processes), which the one-loop model is not.
_MULTI_LOOP_SHARE = 0.05


@dataclass(frozen=True)
class ReplayConfig:
    """Parameters of the replay model.

    Attributes:
        thread_pool_size: workers of the default executor; asyncio's default
            ``min(32, os.cpu_count() + 4)``.
        cores: CPU cores of the gateway host (GIL-free work runs on up to this many).
        process_pool_size: workers of a ``ProcessPoolExecutor`` fix; ``None``: ``cores``.
        tolerance: validation passes when the simulated p50 and p95 of every validated
            route are within this relative error of the measured ones.
        min_requests: routes with fewer instrumented requests are not validated (and get no
            projection).
        arrivals: ``"open"`` (every request starts at its recorded time), ``"closed"``
            (requests that started right after another ended are chained to it), or
            ``"auto"``: closed when at least ``closed_loop_fraction`` of the requests can be
            chained.
        closed_loop_gap_ms: the most idle loop time between a request's end and the start of
            the request chained to it (``tracekit.analysis._replay_arrivals``).
        closed_loop_fraction: see ``arrivals``.
        max_requests: at most this many requests (the earliest) are replayed.
    """

    thread_pool_size: int = field(default_factory=default_thread_pool_size)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    process_pool_size: int | None = None
    tolerance: float = 0.15
    min_requests: int = 20
    arrivals: str = "auto"
    closed_loop_gap_ms: float = 2.0
    closed_loop_fraction: float = 0.6
    max_requests: int = 20_000

    def __post_init__(self) -> None:
        if self.thread_pool_size < 1 or self.cores < 1:
            raise ConfigurationError("thread_pool_size and cores must be >= 1")
        if self.process_pool_size is not None and self.process_pool_size < 1:
            raise ConfigurationError("process_pool_size must be >= 1")
        if self.arrivals not in ("open", "closed", "auto"):
            raise ConfigurationError(
                f"arrivals must be 'open', 'closed' or 'auto', not {self.arrivals!r}"
            )
        if not 0 < self.tolerance < 1:
            raise ConfigurationError(f"tolerance must be within (0, 1), not {self.tolerance}")
        if self.min_requests < 1 or self.max_requests < 1:
            raise ConfigurationError("min_requests and max_requests must be >= 1")


@dataclass
class Validation:
    """The replay's self-check on one trace.

    Attributes:
        ok: every validated route's simulated p50 and p95 are within tolerance.
        p50_error: the worst route's relative p50 error, signed (simulated / measured - 1).
        p95_error: the same for p95.
        reason: why it is not ok (or ``None``).
        routes: route -> (p50_error, p95_error), for every validated route.
    """

    ok: bool
    p50_error: float | None
    p95_error: float | None
    reason: str | None
    routes: dict[str, tuple[float, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report's ``validation`` object."""
        return {
            "ok": self.ok,
            "p50_error": None if self.p50_error is None else round(self.p50_error, 4),
            "p95_error": None if self.p95_error is None else round(self.p95_error, 4),
            "reason": self.reason,
        }


@dataclass
class _Run:
    """One replay: simulated latency and arrival of every replayed request."""

    latency: dict[int, float]
    arrival: dict[int, float]
    end: dict[int, float]
    multi_loop: list[str]


class Replayer:
    """Validates and projects on request samples, caching the as-recorded replays.

    Args:
        config: the model's parameters (defaults: :class:`ReplayConfig`).

    Cost: one replay is O(segments x log) events, plus O(concurrent CPU bursts) per event;
    about 1-2 s for 20,000 requests of a few stages each.
    """

    def __init__(self, config: ReplayConfig | None = None) -> None:
        self.config = config or ReplayConfig()
        self._cache: dict[Any, tuple[Sequence[RequestRecord], _Run]] = {}
        # Programs of requests a fix does not change, for the sample in ``_sample`` (held so
        # that the ids used as keys stay valid).
        self._sample: Sequence[RequestRecord] | None = None
        self._programs: dict[tuple[int, Any, int], list[Node]] = {}

    def validate(self, requests: Sequence[RequestRecord]) -> Validation:
        """Replay ``requests`` as recorded and compare with the measured latencies.

        Args:
            requests: the request sample (any routes and services, sorted or not).

        Returns:
            The validation; ``ok`` is false with a reason when no route has enough
            instrumented requests, when the trace mixes several event loops, or when a
            route's simulated p50 or p95 is off by more than the tolerance.
        """
        reqs = self._replayable(requests)
        counts: dict[str, int] = {}
        for req in reqs:
            counts[req.route] = counts.get(req.route, 0) + 1
        routes = [r for r, n in counts.items() if n >= self.config.min_requests]
        if not routes:
            most = max(counts.values(), default=0)
            return Validation(
                False,
                None,
                None,
                f"too few instrumented requests to validate the replay "
                f"({most} on the busiest route, {self.config.min_requests} needed)",
            )
        run = self._baseline(requests, reqs, None)
        errors = {r: _errors(reqs, run, r) for r in routes}
        worst = max(routes, key=lambda r: max(abs(errors[r][0]), abs(errors[r][1])))
        p50_error, p95_error = errors[worst]
        tol = self.config.tolerance
        reason: str | None = None
        if run.multi_loop:
            reason = _multi_loop_reason(run.multi_loop)
        elif abs(p50_error) > tol or abs(p95_error) > tol:
            reason = (
                f"route {worst}: simulated p50 off by {p50_error:+.0%}, p95 by {p95_error:+.0%} "
                f"(tolerance ±{tol:.0%})"
            )
        return Validation(reason is None, p50_error, p95_error, reason, errors)

    def project(
        self, requests: Sequence[RequestRecord], fix: Fix
    ) -> tuple[dict[str, list[float]] | None, str | None]:
        """Replay ``requests`` with ``fix`` applied, after validating the matching baseline.

        Args:
            requests: the request sample (all routes: they share the event loop).
            fix: the change to model; the before/after figures are for
                ``fix.measured_route``.

        Returns:
            ``({"p50_ms": [before, after], "p95_ms": [...], "throughput_rps": [...]}, None)``,
            or ``(None, note)`` saying why there is no projection.
        """
        reqs = self._replayable(requests)
        route = fix.measured_route
        on_route = [r for r in reqs if r.route == route]
        if not on_route:
            return None, (
                "uninstrumented: this route's requests carry no tracekit attributes, so there "
                "are no CPU, wait and loop components to replay"
            )
        if len(on_route) < self.config.min_requests:
            return None, (
                f"too few requests on this route to validate the replay "
                f"({len(on_route)} < {self.config.min_requests})"
            )
        calls = self._model_calls(reqs, fix)
        if fix.action == "model_overlap" and not calls:
            return None, f"no calls of model stage {fix.stage!r} to replay"
        before = self._baseline(requests, reqs, fix if calls else None, calls)
        if before.multi_loop:
            return None, _multi_loop_reason(before.multi_loop) + "; no projection"
        p50_error, p95_error = _errors(reqs, before, route)
        tol = self.config.tolerance
        if abs(p50_error) > tol or abs(p95_error) > tol:
            measured = [r.wall_ms for r in on_route]
            simulated = [before.latency[i] for i, r in enumerate(reqs) if r.route == route]
            return None, (
                f"the replay could not reproduce this route as recorded "
                f"(simulated p50 {percentile(simulated, 0.5):.1f} ms vs measured "
                f"{percentile(measured, 0.5):.1f} ms, {p50_error:+.0%}; p95 "
                f"{percentile(simulated, 0.95):.1f} vs {percentile(measured, 0.95):.1f} ms, "
                f"{p95_error:+.0%}; tolerance ±{tol:.0%}), so no projection is shown"
            )
        capacities = self._capacities(calls, fix)
        after = self._run(reqs, fix, calls, capacities, (fix.stage, fix.queue) if calls else None)
        b, a = _figures(reqs, before, route), _figures(reqs, after, route)
        return {key: [b[key], a[key]] for key in ("p50_ms", "p95_ms", "throughput_rps")}, None

    # --- internals ------------------------------------------------------------------------
    def _replayable(self, requests: Sequence[RequestRecord]) -> list[RequestRecord]:
        if self._sample is not requests:
            self._sample = requests
            self._programs = {}
        reqs = sorted((r for r in requests if r.instrumented), key=lambda r: r.start_ns)
        return reqs[: self.config.max_requests]

    def _model_calls(self, reqs: list[RequestRecord], fix: Fix) -> dict[str, ModelCall]:
        if fix.action != "model_overlap" or fix.stage is None:
            return {}
        services = {r.service for r in reqs if r.route == fix.route}
        out: dict[str, ModelCall] = {}
        for service in services:
            key = f"model:{service}:{fix.stage}"
            for call in model_calls(reqs, service, fix.stage):
                outside = max(0, min(call.queue_ns, call.stage.start_ns - call.submit_ns))
                out[call.stage.span_id] = ModelCall(
                    key=key,
                    queue_out_ms=outside / _MS,
                    queue_in_ms=(call.queue_ns - outside) / _MS,
                    wrap_stage=fix.queue == "outside",
                )
        return out

    def _capacities(self, calls: dict[str, ModelCall], fix: Fix | None) -> dict[str, int | None]:
        config = self.config
        caps: dict[str, int | None] = {
            THREADS: config.thread_pool_size,
            PROCESSES: config.process_pool_size or config.cores,
        }
        for call in calls.values():
            caps[call.key] = 1 if fix is None else fix.capacity
        return caps

    def _baseline(
        self,
        requests: Sequence[RequestRecord],
        reqs: list[RequestRecord],
        fix: Fix | None,
        calls: dict[str, ModelCall] | None = None,
    ) -> _Run:
        key = (id(requests), None if fix is None else (fix.stage, fix.queue, fix.route))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is requests:
            return hit[1]
        calls = calls or {}
        variant = None if fix is None else (fix.stage, fix.queue)
        run = self._run(reqs, None, calls, self._capacities(calls, None), variant)
        self._cache[key] = (requests, run)
        return run

    def _program(
        self,
        req: RequestRecord,
        t0: int,
        fix: Fix | None,
        calls: dict[str, ModelCall],
        variant: Any,
    ) -> list[Node]:
        """A request's program; cached unless ``fix`` changes this request's own code (a
        model-overlap fix changes capacities only: its programs are its baseline's, the
        ``variant`` naming which model calls are held)."""
        if fix is not None and fix.action != "model_overlap" and req.route == fix.route:
            return ProgramBuilder(req, t0, fix, calls).program()
        key = (id(req), variant, t0)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = ProgramBuilder(req, t0, None, calls).program()
        return program

    def _run(
        self,
        reqs: list[RequestRecord],
        fix: Fix | None,
        calls: dict[str, ModelCall],
        capacities: dict[str, int | None],
        variant: Any = None,
    ) -> _Run:
        run = _Run({}, {}, {}, [])
        if not reqs:
            return run
        t0 = min(r.start_ns for r in reqs)
        by_service: dict[str, list[int]] = {}
        for i, req in enumerate(reqs):
            by_service.setdefault(req.service, []).append(i)
        config = self.config
        for service, indexes in by_service.items():
            group = [reqs[i] for i in indexes]
            if _mixes_loops(group):
                run.multi_loop.append(service)
            programs = [self._program(r, t0, fix, calls, variant) for r in group]
            plan = arrivals(group, t0, config.arrivals, config.closed_loop_gap_ms,
                            config.closed_loop_fraction)  # fmt: skip
            sim = Simulation(config.cores, capacities, frozenset((THREADS, PROCESSES)))
            opens = [plan.ready.get(local) for local in range(len(group))]
            ends = sim.run(programs, opens, _Chainer(sim, plan.chains))
            for local, index in enumerate(indexes):
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


def _errors(reqs: list[RequestRecord], run: _Run, route: str) -> tuple[float, float]:
    measured = [r.wall_ms for i, r in enumerate(reqs) if r.route == route and i in run.latency]
    simulated = [
        run.latency[i] for i, r in enumerate(reqs) if r.route == route and i in run.latency
    ]
    if not measured:
        return (math.inf, math.inf)
    return (
        _relative(percentile(simulated, 0.5), percentile(measured, 0.5)),
        _relative(percentile(simulated, 0.95), percentile(measured, 0.95)),
    )


def _relative(simulated: float, measured: float) -> float:
    if measured <= 0:
        return 0.0 if simulated <= 0 else math.inf
    return simulated / measured - 1.0


def _figures(reqs: list[RequestRecord], run: _Run, route: str) -> dict[str, float]:
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


def _mixes_loops(group: list[RequestRecord]) -> bool:
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


def _multi_loop_reason(services: list[str]) -> str:
    names = ", ".join(sorted(services))
    return (
        f"loop slices of different requests overlap in {names}: the trace mixes several "
        f"event loops (worker processes), which the one-loop replay does not model"
    )


def validate(requests: Sequence[RequestRecord], config: ReplayConfig | None = None) -> Validation:
    """Replay ``requests`` as recorded; compare with the measured p50/p95 (:class:`Replayer`).

    Args:
        requests: the request sample.
        config: model parameters; ``None`` for the defaults.

    Returns:
        The :class:`Validation`.
    """
    return (Replayer(config) if config is not None else Replayer()).validate(requests)


def project(
    requests: Sequence[RequestRecord], fix: Fix, config: ReplayConfig | None = None
) -> tuple[dict[str, list[float]] | None, str | None]:
    """Project ``fix`` on ``requests`` (see :meth:`Replayer.project`).

    Args:
        requests: the request sample.
        fix: the change to model.
        config: model parameters; ``None`` for the defaults.

    Returns:
        ``(projection, None)`` or ``(None, note)``.
    """
    return (Replayer(config) if config is not None else Replayer()).project(requests, fix)
