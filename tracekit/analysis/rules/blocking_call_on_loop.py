"""``blocking-call-on-loop``: a stage holds the event loop for long with little CPU.

A sync call (``time.sleep``, a sync HTTP client, a GPU synchronize, a file read) blocks the
loop thread without running on the CPU: the stage's own loop slices add up to much more than
its CPU. Detects, per route and stage, time held off-CPU with p95 per request >=
``min_block_ms`` making up at least ``off_cpu_share`` of the time held. The share is high
(0.8: held >= 5x its CPU) because a host short of CPU (other processes, a container's CPU
quota) stretches CPU-bound slices too, and a stretched CPU-bound slice is ``cpu-on-loop``'s
case, not a blocking call (``docs/analyzer-rules.md`` has the measurement). The fix names
where the watchdog caught it (``tracekit.blocked_at``) and replaces the call with its async
equivalent, or runs it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tracekit._percentile import percentile
from tracekit.analysis.assembly.blocked_sites import is_import_site
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import (
    LoopIndex,
    LoopUsageRule,
    Usage,
    finding,
    ms,
    name_of,
    victim_note,
)
from tracekit.analysis.rules.findings import Finding, RuleContext
from tracekit.analysis.rules.stage_code import StageCode

#: Why an import on the first request has no projection: it happens once per process.
IMPORT_NOTE = "a module import on the first request happens once per process: not replayed"


class BlockingCallOnLoop(LoopUsageRule):
    """Rule ``blocking-call-on-loop``.

    Args:
        min_block_ms: fire when the time the stage held the loop without CPU has p95 per
            request >= this (10 ms).
        off_cpu_share: ... and that is at least this share of the time it held it (0.8).
        min_requests: routes with fewer instrumented requests are skipped (3).
    """

    id = "blocking-call-on-loop"

    def __init__(
        self, min_block_ms: float = 10.0, off_cpu_share: float = 0.8, min_requests: int = 3
    ) -> None:
        self.min_block_ms = min_block_ms
        self.off_cpu_share = off_cpu_share
        self.min_requests = min_requests

    def fires(self, uses: list[Usage]) -> bool:
        """Whether the stage's off-CPU hold passes this rule's gates. GC pauses inside its
        steps are not off-CPU time of its own (:attr:`Usage.off_cpu_ms` leaves them out)."""
        off = [u.off_cpu_ms for u in uses]
        held = sum(u.held_ms - u.gc_ms for u in uses)
        if percentile(off, 0.95) < self.min_block_ms or held <= 0:
            return False
        return sum(off) / held >= self.off_cpu_share

    def _check(
        self,
        route: str,
        name: str | None,
        uses: list[Usage],
        p50: float,
        service: str,
        index: LoopIndex,
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> Finding | None:
        if not self.fires(uses):
            return None
        code = StageCode.of(name, (u.stage for u in uses))
        if code.blocked_at is None:  # the request's own code: its catches are on the request
            code = replace(code, blocked_at=next((u.blocked_at for u in uses if u.blocked_at), None))
        blocked_at = code.blocked_at
        blame = index.blame_ms_per_request(service, route, name)
        victim = index.main_victim(service, route, name)
        one_off = is_import_site(blocked_at)
        at = f" (blocked in {blocked_at})" if blocked_at else ""
        evidence = (
            f"{name_of(name)} held the event loop {ms(percentile([u.held_ms for u in uses], 0.5))} "
            f"per request (p95 {ms(percentile([u.held_ms for u in uses], 0.95))}, longest "
            f"{ms(max(u.max_block_ms for u in uses))}) while running only "
            f"{ms(percentile([u.cpu_ms for u in uses], 0.5))} of CPU: a blocking call{at}; "
            f"other requests waited {ms(index.blame_ms_per_second(service, route, name))} per "
            f"second for the loop ({ms(blame)} per request){victim_note(victim, route)}"
            f"{code.profile_note()}"
        )
        return finding(
            rule=self.id,
            route=route,
            stage=name,
            function=code.function,
            impact_ms=blame,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fixes.unblock(code),
            requests=requests,
            ctx=ctx,
            model=None if one_off else Fix("thread", route, name, report_route=victim),
            no_model_note=IMPORT_NOTE if one_off else None,
        )
