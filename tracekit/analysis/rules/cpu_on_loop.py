"""``cpu-on-loop``: a CPU-bound stage runs on the event-loop thread and delays other requests.

Detects, per route and stage (and the request's own code), on-loop CPU that is large
(p95 per request >= ``min_cpu_ms``) and held in long slices (p95 longest slice >=
``min_slice_ms``) or measurably delaying others: thousands of 0.1 ms slices delay nobody
long. The slices may also hold the loop off-CPU (a host short of CPU stretches them; a
blocking call inside the stage adds to them): the CPU alone decides this rule. The fix
depends on the stage kind: a worker thread running the GIL-free ``encode_batch`` for
``tokenize``, ``orjson`` for ``serialize``, a process pool (or less work) for pure-Python
CPU anywhere else, since a thread would still hold the GIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import (
    LoopIndex,
    LoopUsageRule,
    Usage,
    finding,
    function_or,
    ms,
    name_of,
    victim_note,
)
from tracekit.analysis.rules.findings import Finding, RuleContext


def fix_for_cpu(
    route: str, stage: str | None, kind: str | None, function: str | None
) -> tuple[tuple[str, str], Fix]:
    """The fix (title, code) for on-loop CPU in ``stage``, and the :class:`Fix` modelling it.

    Args:
        route: the route.
        stage: the stage name (``None``: the request's own code).
        kind: the stage kind.
        function: the stage's function.
    """
    if stage is not None and kind == semconv.KIND_TOKENIZE:
        return fixes.tokenize_off_loop(stage, function), Fix("thread", route, stage, gil_free=True)
    if stage is not None and kind == semconv.KIND_SERIALIZE:
        return fixes.faster_serializer(stage, function), Fix(
            "shrink", route, stage, factor=1.0 / fixes.ORJSON_SPEEDUP
        )
    return fixes.process_pool(stage, function, route), Fix("process", route, stage)


class CpuOnLoop(LoopUsageRule):
    """Rule ``cpu-on-loop``.

    Args:
        min_cpu_ms: fire when the stage's on-loop CPU per request has p95 >= this (10 ms).
        min_slice_ms: ... and its longest slice has p95 >= this (5 ms), or the waits it
            caused others per request are at least ``min_blame_share`` of the route's p50.
        min_requests: routes with fewer instrumented requests are skipped (3).
        min_blame_share: see ``min_slice_ms`` (0.05).
    """

    id = "cpu-on-loop"

    def __init__(
        self,
        min_cpu_ms: float = 10.0,
        min_slice_ms: float = 5.0,
        min_requests: int = 3,
        min_blame_share: float = 0.05,
    ) -> None:
        self.min_cpu_ms = min_cpu_ms
        self.min_slice_ms = min_slice_ms
        self.min_requests = min_requests
        self.min_blame_share = min_blame_share

    def fires(
        self, route: str, name: str | None, uses: list[Usage], p50: float, service: str,
        index: LoopIndex,
    ) -> bool:  # fmt: skip
        """Whether the stage's on-loop CPU passes this rule's gates (``loop-saturated`` asks,
        so as not to report the same CPU twice). The slice gate leaves out GC pauses inside
        the stage's steps (:attr:`Usage.slice_ms`): a collection is not the stage's slice."""
        if percentile([u.cpu_ms for u in uses], 0.95) < self.min_cpu_ms:
            return False
        slice95 = percentile([u.slice_ms for u in uses], 0.95)
        if slice95 >= self.min_slice_ms:
            return True
        return index.blame_ms_per_request(service, route, name) >= self.min_blame_share * p50

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
        if not self.fires(route, name, uses, p50, service, index):
            return None
        cpu = [u.cpu_ms for u in uses]
        cpu95 = percentile(cpu, 0.95)
        blame = index.blame_ms_per_request(service, route, name)
        per_second = index.blame_ms_per_second(service, route, name)
        first = next((u for u in uses if u.stage is not None), None)
        kind = first.stage.kind if first is not None and first.stage is not None else None
        function = function_or(first)
        fix, model = fix_for_cpu(route, name, kind, function)
        victim = index.main_victim(service, route, name)
        evidence = (
            f"{name_of(name)} ran {ms(percentile(cpu, 0.5))} of CPU on the event loop per "
            f"request (p95 {ms(cpu95)}, longest slice {ms(max(u.max_slice_ms for u in uses))}); "
            f"other requests waited {ms(per_second)} per second for the loop while it ran "
            f"({ms(blame)} per request){victim_note(victim, route)}"
        )
        model = replace(model, report_route=victim)
        return finding(
            rule=self.id,
            route=route,
            stage=name,
            function=function,
            impact_ms=blame,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fix,
            requests=requests,
            ctx=ctx,
            model=model,
        )
