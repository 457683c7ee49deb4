"""Projections: replay the recorded requests through a model of the gateway, before and after a fix.

The model (``docs/analyzer-rules.md``, "The projection model"): each service is one process
with **one event-loop thread** (a single server with a FIFO ready queue; the request's own
code and every on-loop stage slice run there), a **thread pool** of ``thread_pool_size``
workers, a **process pool**, and **the GIL**: CPU that holds the GIL (the loop's slices,
pure-Python work on worker threads) progresses one thread at a time, GIL-free CPU (native code
that releases it, a process pool) runs in parallel up to ``cores``. Waits for I/O and for the
model are delays that hold nothing, except where a one-at-a-time model server (or a lock) is
part of the fix being modelled. Each recorded request becomes a program
(:mod:`tracekit.analysis.replay.build`) started at its recorded arrival time, or, when the
trace comes from closed-loop clients (a request starts right after another ends), right
after its predecessor ends in the replay.

:func:`validate` replays the trace **as recorded** and compares the simulated p50/p95 latency
of every route with the measured ones: the model is trusted on a trace only when both are
within ``tolerance`` (±15%). :func:`project` replays it again with a :class:`Fix` applied and
returns before/after figures, or ``None`` and a note saying why there is no projection: too
few requests, an uninstrumented route, or a failed validation (with its errors). It never
returns figures from a replay that did not reproduce the trace.

Both replay a *window* of the sample (:func:`window`): its earliest 5,000 instrumented
requests, more when a rare route needs them, which keeps the cost of the replays fixed
whatever the sample size (why 5,000 is enough: ``docs/analyzer-rules.md``, "Replay window").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, queue_wait_ms
from tracekit.analysis.replay.build import ProgramBuilder
from tracekit.analysis.replay.fixes import (
    FIX_ACTIONS,
    PROCESSES,
    THREADS,
    Fix,
    ModelCall,
    no_cpu_won,
    not_applied_note,
)
from tracekit.analysis.replay.host import (
    FROM_MACHINE,
    Host,
    quantile_range,
    statement,
    throughput_range,
    widen,
)
from tracekit.analysis.replay.memo import ProgramMemo
from tracekit.analysis.replay.run import (
    Loops,
    Run,
    errors,
    figures,
    latencies,
    measured,
    multi_loop_reason,
    reproduced,
    simulate,
)
from tracekit.analysis.replay.sim import Node
from tracekit.analysis.stats.loop_windows import LoopCpu
from tracekit.analysis.stats.model_calls import model_calls
from tracekit.errors import ConfigurationError

__all__ = [
    "FIX_ACTIONS",
    "Fix",
    "ReplayConfig",
    "Replayer",
    "Validation",
    "default_thread_pool_size",
    "project",
    "validate",
    "window",
]

_MS = 1e6


def default_thread_pool_size(cpus: int | None = None) -> int:
    """asyncio's default executor size on a host of ``cpus`` CPUs (``None``: this machine's):
    ``min(32, cpus + 4)``."""
    return min(32, (cpus or os.cpu_count() or 1) + 4)


@dataclass(frozen=True)
class ReplayConfig:
    """Parameters of the replay model.

    Attributes:
        thread_pool_size: workers of the default executor; ``None``: asyncio's default on
            the gateway host, ``min(32, cpus + 4)`` (:mod:`~tracekit.analysis.replay.host`).
        cores: CPU cores of the gateway host (GIL-free work runs on up to this many);
            ``None``: the trace's (``tracekit.process.cpus``), else this machine's.
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
            the request chained to it (``tracekit.analysis.replay.arrivals``).
        closed_loop_fraction: see ``arrivals``.
        max_requests: the earliest this many instrumented requests are replayed (a window of
            intact concurrency, ``docs/analyzer-rules.md``, "Replay window"), or more, see
            ``route_requests``.
        route_requests: the window extends past ``max_requests`` until every route with at
            least ``min_requests`` in the sample has this many requests in it (or all it
            has), so that a rare route is still validated on a usable sample.
        max_window: never more than this many requests (the analyzer's sample size).
    """

    thread_pool_size: int | None = None
    cores: int | None = None
    process_pool_size: int | None = None
    tolerance: float = 0.15
    min_requests: int = 20
    arrivals: str = "auto"
    closed_loop_gap_ms: float = 2.0
    closed_loop_fraction: float = 0.6
    max_requests: int = 5_000
    route_requests: int = 200
    max_window: int = 20_000

    def __post_init__(self) -> None:
        if any(v is not None and v < 1 for v in (self.thread_pool_size, self.cores)):
            raise ConfigurationError("thread_pool_size and cores must be >= 1")
        if self.process_pool_size is not None and self.process_pool_size < 1:
            raise ConfigurationError("process_pool_size must be >= 1")
        if self.arrivals not in ("open", "closed", "auto"):
            raise ConfigurationError(
                f"arrivals must be 'open', 'closed' or 'auto', not {self.arrivals!r}"
            )
        if not 0 < self.tolerance < 1:
            raise ConfigurationError(f"tolerance must be within (0, 1), not {self.tolerance}")
        if min(self.min_requests, self.max_requests, self.route_requests, self.max_window) < 1:
            raise ConfigurationError(
                "min_requests, max_requests, route_requests and max_window must be >= 1"
            )


@dataclass
class Validation:
    """The replay's self-check on one trace.

    Attributes:
        ok: every validated route's simulated p50 and p95 are within tolerance.
        p50_error: the worst route's relative p50 error, signed (simulated / measured - 1).
        p95_error: the same for p95.
        reason: why it is not ok (or ``None``).
        routes: route -> (p50_error, p95_error), for every validated route.
        model: the model statement of the busiest service's replay (``docs/analyzer.md``),
            or ``None`` when nothing was replayed.
    """

    ok: bool
    p50_error: float | None
    p95_error: float | None
    reason: str | None
    routes: dict[str, tuple[float, float]] = field(default_factory=dict)
    model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report's ``validation`` object (``model`` only when something was replayed)."""
        out: dict[str, Any] = {
            "ok": self.ok,
            "p50_error": None if self.p50_error is None else round(self.p50_error, 4),
            "p95_error": None if self.p95_error is None else round(self.p95_error, 4),
            "reason": self.reason,
        }
        if self.model is not None:
            out["model"] = self.model
        return out


class Replayer:
    """Validates and projects on request samples, caching what replays of a sample share.

    Args:
        config: the model's parameters (defaults: :class:`ReplayConfig`).
        loop_cpu: per service, what its event loop got of the host's CPU, from the trace's
            loop windows (:meth:`~tracekit.analysis.stats.loop_windows.LoopWindows.loop_cpu`):
            the host's other load is read from it (:mod:`~tracekit.analysis.replay.host`).
            ``None``: the cores are taken as free.

    Cost: one replay is O(events x log events) (about 2 per loop step and 1 per delay) plus
    building the programs. Per sample, once: sorting and grouping its window, its arrivals,
    the as-recorded programs (their parts are kept in a :class:`ProgramMemo` per request, so
    a fix rebuilds only what it changes) and the as-recorded replay. Memory: about twice the
    programs of the window (a program has a loop step per recorded loop wait, see
    ``_replay_build``; figures in ``docs/analyzer-rules.md``).
    """

    def __init__(
        self, config: ReplayConfig | None = None, loop_cpu: Mapping[str, LoopCpu] | None = None
    ) -> None:
        self.config = config or ReplayConfig()
        self._loop_cpu = loop_cpu
        # Everything below belongs to the sample in ``_sample`` (held, so that the ids used
        # as keys stay valid); a new sample clears it.
        self._sample: Sequence[RequestRecord] | None = None
        self._reqs: list[RequestRecord] = []
        self._loops: Loops | None = None
        self._baselines: dict[Any, Run] = {}
        self._memos: dict[int, ProgramMemo] = {}
        self._programs: dict[tuple[int, Any], list[Node]] = {}
        self._applied = False  # the last fix's replay changed some request's program

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
            # No instrumented request at all: plain OpenTelemetry spans, not a short recording.
            few = (
                "no tracekit attributes (plain OpenTelemetry spans): no CPU, wait and loop "
                "components to replay"
                if most == 0 and requests
                else f"too few instrumented requests to validate the replay "
                f"({most} on the busiest route, {self.config.min_requests} needed)"
            )
            return Validation(False, None, None, few)
        run = self._baseline(None)
        errs = {r: errors(reqs, run, r) for r in routes}
        tol = self.config.tolerance
        missed = [r for r in routes if not reproduced(reqs, run, r, tol)]
        worst = max(missed or routes, key=lambda r: max(abs(errs[r][0]), abs(errs[r][1])))
        p50_error, p95_error = errs[worst]
        reason: str | None = None
        if run.multi_loop:
            reason = multi_loop_reason(run.multi_loop)
        elif missed:
            reason = (
                f"route {worst}: simulated p50 off by {p50_error:+.0%}, p95 by {p95_error:+.0%} "
                f"(tolerance ±{tol:.0%} or the measured percentile's 95% interval)"
            )
        return Validation(reason is None, p50_error, p95_error, reason, errs, self.statement(None))

    def project(
        self, requests: Sequence[RequestRecord], fix: Fix
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Replay ``requests`` with ``fix`` applied, after validating the matching baseline.

        Args:
            requests: the request sample (all routes: they share the event loop).
            fix: the change to model; the before/after figures are for
                ``fix.measured_route``.

        Returns:
            ``({"route": ..., "p50_ms": [before, after], "p95_ms": [...], "throughput_rps":
            [...], "range": {"p50_ms": [lo, hi], ...}, "model": {...}}, None)`` (``route``:
            the route the figures are for, ``fix.measured_route``; the range is the
            after's, :mod:`~tracekit.analysis.replay.host`; the model statement, see
            ``docs/analyzer.md``), or ``(None, note)`` saying why there is no projection and,
            when the replay could not reproduce the route, what would let it project.
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
        before = self._baseline(fix if calls else None, calls)
        if before.multi_loop:
            return None, multi_loop_reason(before.multi_loop) + "; no projection"
        p50_error, p95_error = errors(reqs, before, route)
        tol = self.config.tolerance
        if not reproduced(reqs, before, route, tol):
            measured_ms = [r.wall_ms for r in on_route]
            simulated = [before.latency[i] for i, r in enumerate(reqs) if r.route == route]
            return None, (
                f"the replay could not reproduce this route as recorded "
                f"(simulated p50 {percentile(simulated, 0.5):.1f} ms vs measured "
                f"{percentile(measured_ms, 0.5):.1f} ms, {p50_error:+.0%}; p95 "
                f"{percentile(simulated, 0.95):.1f} vs {percentile(measured_ms, 0.95):.1f} ms, "
                f"{p95_error:+.0%}; tolerance ±{tol:.0%} or the measured percentile's 95% "
                "interval), so no projection is shown; "
                + self._hint(route, p50_error + p95_error)
            )
        variant = (fix.stage, fix.queue) if calls else None
        self._applied = False
        capacities = self._capacities(calls, fix)
        after = self._simulate(fix, calls, capacities, variant)
        if not calls and not self._applied:
            return None, not_applied_note(fix)
        # On a host short of CPU, the CPU moved off the loop may win none from it: the
        # range reaches that replay too.
        bound = no_cpu_won(fix)
        far = None
        if bound is not None and self._host_short(route):
            far = self._simulate(bound, calls, capacities, variant)
        return self._projection(before, after, route, far), None

    def _projection(self, before: Run, after: Run, route: str, far: Run | None = None) -> dict[str, Any]:
        """Before/after figures of ``route``, the after's range (reaching ``far``'s figures
        too, when given) and the model statement."""
        reqs = self._reqs
        b, a = figures(reqs, before, route), figures(reqs, after, route)
        real = measured(reqs, before, route)
        runs = [after] if far is None else [after, far]
        simulated = [latencies(reqs, run, route) for run in runs]
        spread: dict[str, list[float]] = {}
        for key, q in (("p50_ms", 0.5), ("p95_ms", 0.95)):
            error = b[key] / real[key] - 1 if real[key] > 0 else 0.0
            intervals = [quantile_range(values, q) for values in simulated]
            spread[key] = widen((min(lo for lo, _ in intervals), max(hi for _, hi in intervals)), error)
        x_error = b["throughput_rps"] / real["throughput_rps"] - 1 if real["throughput_rps"] > 0 else 0.0
        rates = [throughput_range(figures(reqs, run, route)["throughput_rps"], x_error, len(simulated[0]))
                 for run in runs]  # fmt: skip
        spread["throughput_rps"] = [min(lo for lo, _ in rates), max(hi for _, hi in rates)]
        out: dict[str, Any] = {"route": route}
        out.update({key: [b[key], a[key]] for key in ("p50_ms", "p95_ms", "throughput_rps")})
        out["range"] = spread
        out["model"] = self.statement(route)
        return out

    def _host_short(self, route: str) -> bool:
        """Whether the host of ``route``'s service was short of CPU (after a replay)."""
        loops = self._loops
        return loops is not None and loops.services[self._service(route)].host.short

    def _service(self, route: str) -> str:
        """The service most of ``route``'s replayed requests are of."""
        counts: dict[str, int] = {}
        for req in self._reqs:
            if req.route == route:
                counts[req.service] = counts.get(req.service, 0) + 1
        return max(sorted(counts), key=lambda s: counts[s])

    def statement(self, route: str | None) -> dict[str, Any] | None:
        """The model statement of ``route``'s service (``None``: the busiest service) in the
        sample last validated or projected; ``None`` before one, or for a route it lacks."""
        loops = self._loops
        if loops is None or not loops.services:
            return None
        reqs = self._reqs
        if route is not None:
            if not any(r.route == route for r in reqs):
                return None
            service = self._service(route)
        else:
            service = max(sorted(loops.services), key=lambda s: len(loops.services[s].indexes))
        loop = loops.services[service]
        group = [reqs[i] for i in loop.indexes]
        span_s = (max(r.start_ns for r in group) - min(r.start_ns for r in group)) / 1e9
        rate = (len(group) - 1) / span_s if span_s > 0 else 0.0
        config = self.config
        flight = loop.plan.in_flight
        return statement(loop.host, loop.mode, loop.clients, rate, len(group), config.tolerance,
                         None if flight is None else flight.to_dict(), loop.plan.read_by,
                         loop.plan.think_ms)  # fmt: skip

    def _hint(self, route: str, error: float) -> str:
        """What would let the replay project ``route`` (its error's sign says which way)."""
        model = self.statement(route) or {}
        reqs = [r for r in self._reqs if r.route == route]
        queued = sum(queue_wait_ms(r) for r in reqs) / max(1, len(reqs))
        hints = []
        if model.get("cores_source") == FROM_MACHINE:
            hints.append(
                f"the trace does not say the gateway host's cores (tracekit.process.cpus), so "
                f"{model.get('cores')} (this machine's) were assumed: pass --cores N"
            )
        if error < 0:
            cores = model.get("cores")
            if isinstance(cores, int) and cores > 1:
                hints.append(
                    f"the gateway was slower than the model of it: if its host was shared (a "
                    f"load generator, other processes), pass --cores with the CPUs it really "
                    f"had (fewer than {cores})"
                )
            if queued >= 1.0:
                hints.append(
                    f"its requests waited {queued:.1f} ms each on locks and queues "
                    f"(tracekit.queue_wait_ms), which the replay keeps as recorded"
                )
            # Always true of the model, and the remaining suspect once the others are out.
            hints.append(
                "the loop's work outside the requests (the report's event loop section: "
                "background tasks, the server's own code) is not replayed"
            )
        else:
            hints.append(
                f"the gateway was faster than the model of it: the arrivals were read as "
                f"{'closed-loop clients' if model.get('arrivals') == 'closed' else 'open'}; "
                f"more cores than {model.get('cores')} (--cores) would also explain it"
            )
        return "what would let it project: " + "; ".join(hints)

    # --- internals ------------------------------------------------------------------------
    def _replayable(self, requests: Sequence[RequestRecord]) -> list[RequestRecord]:
        if self._sample is not requests:
            self._sample = requests
            reqs = sorted((r for r in requests if r.instrumented), key=lambda r: r.start_ns)
            self._reqs = reqs[: window(reqs, self.config)]
            self._loops = None
            self._baselines = {}
            self._memos = {}
            self._programs = {}
        return self._reqs

    def _model_calls(self, reqs: list[RequestRecord], fix: Fix) -> dict[str, ModelCall]:
        if fix.action != "model_overlap" or fix.stage is None:
            return {}
        services = {r.service for r in reqs if r.route == fix.route}
        out: dict[str, ModelCall] = {}
        for service in services:
            key = f"model:{service}:{fix.stage}"
            for call in model_calls(reqs, service, fix.stage):
                outside = max(0, min(call.queue_ns, call.stage.start_ns - call.submit_ns))
                server = call.stage.server  # the server's own queue time, when it said
                out[call.stage.span_id] = ModelCall(
                    key=key,
                    queue_out_ms=outside / _MS,
                    queue_in_ms=(call.queue_ns - outside) / _MS if server is None else server.queue_ms,
                    wrap_stage=fix.queue == "outside",
                    service_ms=None if server is None else server.prefill_ms + server.decode_ms,
                )
        return out

    def _capacities(self, calls: dict[str, ModelCall], fix: Fix | None) -> dict[str, int | None]:
        config = self.config
        # None: the pools of each service's host (run.simulate).
        caps: dict[str, int | None] = {
            THREADS: config.thread_pool_size,
            PROCESSES: config.process_pool_size or config.cores,
        }
        for call in calls.values():
            caps[call.key] = 1 if fix is None else fix.capacity
        return caps

    def _baseline(self, fix: Fix | None, calls: dict[str, ModelCall] | None = None) -> Run:
        """The as-recorded replay of the current sample (with a one-at-a-time server for
        ``fix``'s model calls, when given), cached."""
        key = None if fix is None else (fix.stage, fix.queue, fix.route)
        run = self._baselines.get(key)
        if run is None:
            calls = calls or {}
            variant = None if fix is None else (fix.stage, fix.queue)
            run = self._simulate(None, calls, self._capacities(calls, None), variant)
            self._baselines[key] = run
        return run

    def _simulate(
        self,
        fix: Fix | None,
        calls: dict[str, ModelCall],
        capacities: dict[str, int | None],
        variant: Any,
    ) -> Run:
        if self._loops is None:
            config = self.config
            self._loops = Loops(self._reqs, config.arrivals, config.closed_loop_gap_ms,
                                config.closed_loop_fraction, config.cores,
                                config.thread_pool_size, self._loop_cpu)  # fmt: skip
        return simulate(self._loops, lambda req, host: self._program(req, host, fix, calls, variant),
                        capacities)  # fmt: skip

    def _program(self, req: RequestRecord, host: Host, fix: Fix | None, calls: dict[str, ModelCall],
                 variant: Any) -> list[Node]:  # fmt: skip
        """A request's program on ``host``; cached unless ``fix`` changes this request's own
        code (a model-overlap fix changes capacities only: its programs are its baseline's,
        the ``variant`` naming which model calls are held)."""
        memo = self._memos.get(id(req))
        if memo is None:
            memo = self._memos[id(req)] = ProgramMemo()
        if fix is not None and fix.action != "model_overlap" and req.route == fix.route:
            builder = ProgramBuilder(req, 0, fix, calls, memo, host.cpu_wait)
            fixed = builder.program()
            self._applied = self._applied or builder.applied
            return fixed
        key = (id(req), variant)
        program = self._programs.get(key)
        if program is None:
            builder = ProgramBuilder(req, 0, None, calls, memo, host.cpu_wait)
            program = self._programs[key] = builder.program()
        return program


def window(reqs: Sequence[RequestRecord], config: ReplayConfig) -> int:
    """How many of ``reqs`` (sorted by start) to replay: ``config.max_requests``, or more
    until every route with ``config.min_requests`` has ``config.route_requests`` in the
    window (or all it has), at most ``config.max_window``.

    Cost: O(len(reqs)).
    """
    limit = min(len(reqs), config.max_window)
    if limit <= config.max_requests:
        return limit
    total: dict[str, int] = {}
    for req in reqs:
        total[req.route] = total.get(req.route, 0) + 1
    need = {
        route: min(config.route_requests, n)
        for route, n in total.items()
        if n >= config.min_requests
    }
    for i, req in enumerate(reqs[:limit]):
        left = need.get(req.route)
        if left is not None:
            if left > 1:
                need[req.route] = left - 1
            else:
                del need[req.route]
        if i + 1 >= config.max_requests and not need:
            return i + 1
    return limit


def validate(requests: Sequence[RequestRecord], config: ReplayConfig | None = None) -> Validation:
    """Replay ``requests`` as recorded; compare with the measured p50/p95 (:class:`Replayer`).

    Args:
        requests: the request sample.
        config: model parameters; ``None`` for the defaults.

    Returns:
        The :class:`Validation`.
    """
    return Replayer(config).validate(requests)


def project(
    requests: Sequence[RequestRecord], fix: Fix, config: ReplayConfig | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """Project ``fix`` on ``requests`` (see :meth:`Replayer.project`).

    Args:
        requests: the request sample.
        fix: the change to model.
        config: model parameters; ``None`` for the defaults.

    Returns:
        ``(projection, None)`` or ``(None, note)``.
    """
    return Replayer(config).project(requests, fix)
