"""``cpu-on-loop``: a CPU-bound stage runs on the event-loop thread and delays other requests.

Detects, per route and stage (and the request's own code), on-loop CPU that is large
(p95 per request >= ``min_cpu_ms``) and held in long slices (p95 longest slice >=
``min_slice_ms``) or measurably delaying others: thousands of 0.1 ms slices delay nobody
long. The slices may also hold the loop off-CPU (a host short of CPU stretches them; a
blocking call inside the stage adds to them): the CPU alone decides this rule. The fix
depends on what the CPU is and on the stage's shape (:func:`fix_for_cpu`,
:mod:`tracekit.analysis.rules.stage_code`): code where it applies, words where it does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, after_response_cpu
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
from tracekit.analysis.rules.stage_code import (
    GIL_FREE,
    JSON_DECODE,
    JSON_ENCODE,
    TOKENIZERS,
    StageCode,
    cpu_of,
)

#: Why an (async) generator's CPU has no projection: its fix is words, not a replay action.
GENERATOR_NOTE = (
    "no mechanical fix to replay: a generator's per-item CPU stays on the loop until the "
    "code does less per item"
)
#: Why a faster JSON parser has no projection: only the encoder's speed-up is measured.
PARSER_NOTE = (
    "orjson.loads' speed-up over json.loads on this stage's payloads is not measured "
    "(the calibration measures encoding), so there is no projection"
)


def fix_for_cpu(route: str, code: StageCode) -> tuple[tuple[str, str], Fix | None, str | None]:
    """The fix (title, code) for on-loop CPU in a stage, the :class:`Fix` modelling it, and
    the note when there is none.

    The fix fits what the CPU is (:func:`~tracekit.analysis.rules.stage_code.cpu_of`) and the
    stage's shape: HF tokenizers -> ``encode_batch`` in a thread; JSON -> orjson; a
    generator -> less work per item (words: no pool can take it); a GIL-releasing library
    in a sync function -> a thread; Python CPU in a module-level sync function -> a process
    pool; anything else (a coroutine, a method, a closure, a block, an unknown shape) ->
    words saying what to move where. The model is kept only where it is what the fix does.

    Args:
        route: the route.
        code: the stage's code (:meth:`StageCode.of`).
    """
    stage = code.stage
    what, why = cpu_of(code)
    if stage is not None and what == TOKENIZERS:
        fix = fixes.tokenize_off_loop(code, why, assumed=not code.tokenizers_seen)
        return fix, Fix("thread", route, stage, gil_free=True), None
    if stage is not None and what == JSON_ENCODE:
        model = Fix("shrink", route, stage, factor=1.0 / fixes.ORJSON_SPEEDUP)
        return fixes.faster_serializer(code, why), model, None
    if what == JSON_DECODE:
        return fixes.faster_parser(code, why), None, PARSER_NOTE
    if code.is_generator:
        return fixes.less_per_item(code, why), None, GENERATOR_NOTE
    if stage is not None and code.callable_shape:
        if what == GIL_FREE:
            return fixes.thread_pool(code, why), Fix("thread", route, stage, gil_free=True), None
        if code.module_level:
            return fixes.process_pool(code, why), Fix("process", route, stage), None
    model = Fix("thread", route, stage, gil_free=True) if what == GIL_FREE else Fix("process", route, stage)
    return fixes.move_cpu_in_words(code, what, why), model, None


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
        code = StageCode.of(name, (u.stage for u in uses))
        fix, model, note = fix_for_cpu(route, code)
        victim = index.main_victim(service, route, name)
        # A collection inside its steps is the collector's (gc-pauses reports it), not its slice.
        gc_note = ", GC pauses left out" if any(u.gc_ms > 0 for u in uses) else ""
        evidence = (
            f"{name_of(name)} ran {ms(percentile(cpu, 0.5))} of CPU on the event loop per "
            f"request{_after_note(name, route, requests, percentile(cpu, 0.5))} "
            f"(p95 {ms(cpu95)}, longest slice {ms(max(u.slice_ms for u in uses))}{gc_note}); "
            f"other requests waited {ms(per_second)} per second for the loop while it ran "
            f"({ms(blame)} per request){victim_note(victim, route)}{code.profile_note()}"
        )
        return finding(
            rule=self.id,
            route=route,
            stage=name,
            function=code.function,
            impact_ms=blame,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fix,
            requests=requests,
            ctx=ctx,
            model=replace(model, report_route=victim) if model is not None else None,
            no_model_note=note,
        )


def _after_note(name: str | None, route: str, requests: Sequence[RequestRecord], cpu_ms: float) -> str:
    """For the request's own code, how much of its CPU ran after the response, when that is a
    sizeable part (a new user's async BackgroundTask: 36 of 42 ms, read as the handler's)."""
    if name is not None:
        return ""
    after = [after_response_cpu(r)[0] for r in requests if r.route == route and r.instrumented]
    late = percentile(after, 0.5) if after else 0.0
    if late < 0.25 * cpu_ms or late <= 0:
        return ""
    return (f", {ms(late)} of it after the response (work the request left on the loop: "
            "Starlette's BackgroundTasks, logging)")
