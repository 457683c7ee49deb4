"""``background-on-loop``: the event loop spends a large share of its time on work that no
traced request owns.

The loop windows split the loop thread's CPU into requests, GC, tracekit and *background*:
the server's own code (HTTP parsing, writes), tasks and callbacks of no request (logging
handlers, billing and metrics callbacks, periodic tasks). Requests wait behind it like behind
each other. Fires when, over the sample's period, the background CPU is at least
``min_busy_share`` of the loop's wall time, at least ``min_cpu_share`` of the loop's CPU, and
at least ``min_per_request_ms`` per request (the server's own cost per request is well below
it, see the constant).

The fix is to see the work (name background tasks as stages, or profile the loop) and move it
off the loop. The projection: the queueing model of
:mod:`~tracekit.analysis.rules.loop_load` with the background CPU off the loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracekit.analysis.model import RequestRecord
from tracekit.analysis.rules import loop_fixes
from tracekit.analysis.rules.common import by_route, ms, p50_latency
from tracekit.analysis.rules.findings import Finding, RuleContext, assess_severity
from tracekit.analysis.rules.loop_load import (
    LoopLoad,
    loop_loads,
    queueing_projection,
    utilisation_factor,
)

#: Background CPU as a share of the loop's wall time from which it matters: 100 ms of every
#: second, where an M/M/1 loop's waiting grows by a tenth of a step for everyone.
MIN_BUSY_SHARE = 0.10
#: ... and as a share of the loop's CPU: a quarter, a part the report's breakdown cannot show.
MIN_CPU_SHARE = 0.25
#: ... and per request (ms): uvicorn's own HTTP parsing and writes cost about 0.2 ms of loop
#: CPU per request of the served test gateway (303 requests, stdlib asyncio:
#: docs/analyzer-rules.md), so 1 ms, five times that, is work beyond the server's own.
MIN_PER_REQUEST_MS = 1.0


class BackgroundOnLoop:
    """Rule ``background-on-loop`` (thresholds: the module constants, documented there)."""

    id = "background-on-loop"

    def __init__(
        self, min_busy_share: float = MIN_BUSY_SHARE, min_cpu_share: float = MIN_CPU_SHARE,
        min_per_request_ms: float = MIN_PER_REQUEST_MS, min_requests: int = 3,
    ) -> None:  # fmt: skip
        self.min_busy_share = min_busy_share
        self.min_cpu_share = min_cpu_share
        self.min_per_request_ms = min_per_request_ms
        self.min_requests = min_requests

    def fires(self, load: LoopLoad) -> bool:
        """Whether the loop's background work passes the gates."""
        if len(load.requests) < self.min_requests or load.wall_ms <= 0 or load.cpu_ms <= 0:
            return False
        background = load.background_cpu_ms
        return (
            background / load.wall_ms >= self.min_busy_share
            and background / load.cpu_ms >= self.min_cpu_share
            and load.per_request(background) >= self.min_per_request_ms
        )

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """At most one finding per service whose loop runs heavy untraced work."""
        out = []
        for load in loop_loads(requests, ctx).values():
            if self.fires(load):
                found = self._finding(load, requests, ctx)
                if found is not None:
                    out.append(found)
        return out

    def _finding(self, load: LoopLoad, requests: Sequence[RequestRecord], ctx: RuleContext) -> Finding | None:
        waited: dict[str, float] = {}
        for r in load.requests:
            if r.instrumented:
                waited[r.route] = waited.get(r.route, 0.0) + (r.loop_wait_ms or 0.0)
        if not waited:
            return None
        route = min(waited, key=lambda k: (-waited[k], k))
        if ctx.route is not None and route != ctx.route:
            return None
        reqs = by_route(requests, RuleContext()).get(route, [])
        background = load.background_cpu_ms
        rho = load.rho
        removed = background / load.wall_ms
        tasks = max((w.tasks for w in load.windows if w.tasks is not None), default=None)
        per_second = load.per_second(background)
        named = [(name, load.per_second(cpu)) for name, cpu in _named_tasks(load)]
        evidence = (
            f"the event loop of {load.service} ran {ms(per_second)} per second of work that no "
            f"traced request owns ({background / load.cpu_ms:.0%} of its CPU, "
            f"{ms(load.per_request(background))} per request; server I/O, tasks and callbacks of "
            f"no request) while traced requests ran {ms(load.per_second(load.requests_cpu_ms))} "
            f"per second; the loop was busy {rho:.0%}"
            + (f" with up to {tasks:,} tasks alive" if tasks is not None else "")
            + f"; {route}'s requests waited {ms(waited[route] / max(1, len(reqs)))} each for the loop"
        )
        if named:
            evidence += "; of it, background tasks: " + ", ".join(
                f"{name} {ms(cpu)} per second" for name, cpu in named)  # fmt: skip
        title, code = loop_fixes.background_off_loop(per_second, tasks, named)
        projection = queueing_projection(requests, route, utilisation_factor(rho, rho - removed))
        if projection is not None:
            code += (
                f"# projected for {route} (queueing model, the background CPU off the loop: busy "
                f"{rho:.0%} -> {max(0.0, rho - removed):.0%}): p50 {projection['p50_ms'][0]:.0f} -> "
                f"{projection['p50_ms'][1]:.0f} ms\n"
            )
        impact = 0.0
        if projection is not None:
            impact = projection["p50_ms"][0] - projection["p50_ms"][1]
        severity, reason = assess_severity(impact, p50_latency(reqs), projection)
        return Finding(
            rule=self.id, route=route, stage=None, function=None,
            severity=severity, severity_reason=reason, impact_ms=impact,
            evidence=evidence, fix_title=title, fix_code=code, projection=projection,
            projection_note=None if projection is not None else "no instrumented requests to project",
        )  # fmt: skip


#: Background tasks named in a finding: those that took at least this share of the
#: background CPU.
MIN_TASK_SHARE = 0.10


def _named_tasks(load: LoopLoad) -> list[tuple[str, float]]:
    """The background tasks (coroutine, CPU ms over the windows) that took at least
    ``MIN_TASK_SHARE`` of the background CPU, most first, at most three."""
    cpu: dict[str, float] = {}
    for w in load.windows:
        for name, task_ms in w.background_tasks:
            cpu[name] = cpu.get(name, 0.0) + task_ms
    ranked = sorted(cpu.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(n, c) for n, c in ranked if c >= MIN_TASK_SHARE * load.background_cpu_ms][:3]
