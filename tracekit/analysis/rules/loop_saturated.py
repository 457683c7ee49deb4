"""``loop-saturated``: the event loop is busy nearly all the time, from many short slices.

Reads the service's ``tracekit.loop`` windows over the sample's period
(:func:`~tracekit.analysis.rules.loop_load.loop_load`). Fires when the median window's busy
ratio (loop thread CPU / wall) is at least ``min_busy``, or the loop probe's typical lag is
high (median window lag p50 >= ``min_lag_ms``) on a loop at least ``min_busy_with_lag`` busy:
a host short of CPU (other processes, other threads holding the GIL) keeps a saturated loop
thread runnable but off-CPU, so its busy ratio reads low and its lag does not. Measured on a
served test gateway (``tests/analysis/test_loop_view_real.py``): 29-44% busy, lag p50 42-124
ms, p95 154-218 ms, with a load generator and other jobs on the same 2 cores.

One symptom, one finding: when the time that stages ``cpu-on-loop`` or
``blocking-call-on-loop`` flag (their own gates, asked through their ``fires``) held the loop
is at least ``fold_share`` of the time the requests held it (CPU, and blocking calls' time
off the CPU), their findings are the fix and this rule stays quiet (the request's own code
flagged does not count: its fix is to wrap it in stages, which an unmodified proxy whose
handler is all its own code cannot take); when the loop's background CPU exceeds the
requests' CPU, ``background-on-loop`` reports it. Otherwise the loop is saturated by many
short slices of many stages: the fix is more worker processes, or less CPU per request named
by stage.

Projections: more workers through the queueing model of
:mod:`~tracekit.analysis.rules.loop_load` (the replay has no model of several processes);
each stage candidate through the replay when it validates, else the same queueing model
(each line says which).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.assembly.request_records import ms_value
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.replay.host import FROM_OPTION
from tracekit.analysis.rules import loop_fixes
from tracekit.analysis.rules.blocking_call_on_loop import BlockingCallOnLoop
from tracekit.analysis.rules.common import LoopIndex, by_route, ms, name_of, p50_latency
from tracekit.analysis.rules.cpu_on_loop import CpuOnLoop, fix_for_cpu
from tracekit.analysis.rules.findings import Finding, RuleContext, assess_severity
from tracekit.analysis.rules.loop_index import Usage, loop_usage
from tracekit.analysis.rules.loop_load import (
    LoopLoad,
    closed_loop_projection,
    loop_loads,
    queueing_projection,
    utilisation_factor,
)
from tracekit.analysis.rules.stage_code import StageCode, hottest
from tracekit.analysis.stats.loop_windows import HOST_SHORT_SHARE, larger_profile

#: Median window busy ratio from which the loop is saturated: at 85% busy an M/M/1 queue
#: waits 5.7 service times per visit, and a burst leaves no headroom at all.
MIN_BUSY = 0.85
#: Median window lag p50 (ms) that shows saturation on a loop that is not fully on-CPU: half
#: the probes waited 5 ms for the loop, five times a typical short step (< 1 ms), so it was
#: rarely free. The median, not the p95: a rare long slice or GC pause moves a window's p95
#: and max (cpu-on-loop's and gc-pauses' cases), not the typical wait.
MIN_LAG_MS = 5.0
#: ... on a loop at least this busy on-CPU: traffic, not a nearly idle loop whose probe hop
#: waited for a core of a loaded host (ten spaced requests keep a loop ~5% busy). Low on
#: purpose: a starved loop thread reads far below its real load (29% and 42-44% measured on
#: the served test gateway, loop waits 120-240 ms per request, the 2-core host at load 4-7).
MIN_BUSY_WITH_LAG = 0.1
#: Flagged stages (cpu-on-loop, blocking-call-on-loop) with this share of the time the
#: requests held the loop explain the saturation: their findings are the fix.
FOLD_SHARE = 0.5
#: The busy ratio the proposed worker count aims at: at 50% an M/M/1 loop waits one service
#: time per visit, and a 2x burst still fits.
TARGET_BUSY = 0.5
#: Stages proposed as CPU to move or cut (each costs a replay); a stage must carry at least
#: ``MIN_CANDIDATE_SHARE`` of the requests' on-loop CPU.
MAX_CANDIDATES = 2
MIN_CANDIDATE_SHARE = 0.1


class LoopSaturated:
    """Rule ``loop-saturated`` (thresholds: the module constants, documented there)."""

    id = "loop-saturated"

    def __init__(
        self,
        min_busy: float = MIN_BUSY,
        min_lag_ms: float = MIN_LAG_MS,
        min_busy_with_lag: float = MIN_BUSY_WITH_LAG,
        fold_share: float = FOLD_SHARE,
        target_busy: float = TARGET_BUSY,
        min_requests: int = 3,
        cpu_rule: CpuOnLoop | None = None,
        blocking_rule: BlockingCallOnLoop | None = None,
    ) -> None:
        self.min_busy = min_busy
        self.min_lag_ms = min_lag_ms
        self.min_busy_with_lag = min_busy_with_lag
        self.fold_share = fold_share
        self.target_busy = target_busy
        self.min_requests = min_requests
        self.cpu_rule = cpu_rule or CpuOnLoop()
        self.blocking_rule = blocking_rule or BlockingCallOnLoop()

    def saturated(self, load: LoopLoad) -> bool:
        """Whether the loop's windows show saturation (busy, or lag on a busy-enough loop)."""
        if load.busy_p50 >= self.min_busy:
            return True
        lag = load.lag_p50_ms
        return lag is not None and lag >= self.min_lag_ms and load.busy_p50 >= self.min_busy_with_lag

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """At most one finding per service whose loop is saturated by short slices."""
        out = []
        for load in loop_loads(requests, ctx).values():
            if len(load.requests) < self.min_requests or not self.saturated(load):
                continue
            if load.background_cpu_ms > load.requests_cpu_ms:
                continue  # background-on-loop's finding
            found = self._finding(load, requests, ctx)
            if found is not None:
                out.append(found)
        return out

    def _finding(self, load: LoopLoad, requests: Sequence[RequestRecord], ctx: RuleContext) -> Finding | None:
        # Each (route, stage)'s on-loop CPU in the windows' requests, and its usages.
        uses: dict[tuple[str, str | None], list[Usage]] = {}
        for req in load.requests:
            if req.instrumented:
                for name, usage in loop_usage(req).items():
                    uses.setdefault((req.route, name), []).append(usage)
        cpu = {key: sum(u.cpu_ms for u in us) for key, us in uses.items()}
        total = sum(cpu.values())
        if total <= 0:
            return None
        index = LoopIndex.of(requests, ctx)
        routes = by_route(requests, RuleContext())
        p50s = {route: p50_latency(reqs) for route, reqs in routes.items()}
        flagged: dict[tuple[str, str | None], str] = {}  # -> the rule that reports it
        for key, us in uses.items():
            if len(us) < self.min_requests:
                continue
            if self.cpu_rule.fires(key[0], key[1], us, p50s.get(key[0], 0.0), load.service, index):
                flagged[key] = self.cpu_rule.id
            elif self.blocking_rule.fires(us):
                flagged[key] = self.blocking_rule.id
        # Their share of the time the requests held the loop (a blocking call holds it without
        # CPU: by CPU alone a time.sleep on the loop would leave this rule blaming the rest).
        # Stages only: the request's own code flagged names no fix but "wrap it in stages",
        # which an unmodified proxy (its handler all own code) cannot take; more workers it can.
        held = {key: sum(max(u.held_ms - u.gc_ms, u.cpu_ms) for u in us) for key, us in uses.items()}
        named = sum(held[key] for key in flagged if key[1] is not None)
        if named >= self.fold_share * sum(held.values()):
            return None  # cpu-on-loop / blocking-call-on-loop name the fix
        victim = self._victim(load)
        if victim is None or (ctx.route is not None and victim != ctx.route):
            return None
        victim_reqs = routes.get(victim, [])
        p50 = p50s.get(victim, 0.0)
        waits = [r.loop_wait_ms or 0.0 for r in victim_reqs]
        rho = max(load.rho, load.busy_p50)
        now = load.processes
        workers = max(now + 1, math.ceil(now * rho / self.target_busy))
        rho_after = rho * now / workers
        # The queueing model gives each worker a core of its own: on a host short of CPU the
        # cores are not free, and it would project a gain the host cannot give (two new users'
        # runs and the busy validation runs measured less than projected there, and the
        # more so as the other load grew), unless --cores says how many are free.
        model = ctx.statement(victim) if ctx.statement is not None else None
        cores_given = model is not None and model.get("cores_source") == FROM_OPTION
        short = (load.cpu_wait_share is not None and load.cpu_wait_share >= HOST_SHORT_SHARE
                 and not cores_given)  # fmt: skip
        projection = None if short else self._workers_projection(
            load, requests, victim, workers, utilisation_factor(rho, rho_after), model)
        per_request = load.per_request(total)
        ranked = sorted(cpu, key=lambda k: (-cpu[k], k[0], k[1] or ""))
        n = max(1, len(load.requests))
        parts = [
            f"{name_of(k[1])}{'' if k[0] == victim else f' ({k[0]})'} {ms(cpu[k] / n)} ({cpu[k] / total:.0%})"
            for k in ranked[:4]
            if cpu[k] >= 0.01 * total
        ]
        folded = [f"{name_of(k[1])}: see {flagged[k]}" for k in ranked if k in flagged]
        evidence = [
            f"the event loop of {load.service} was busy {load.busy_p50:.0%} of the time its "
            f"requests were in flight (median of {len(load.windows)} windows, p95 "
            f"{percentile(load.busy, 0.95):.0%}; {now} process{'es' if now > 1 else ''})"
        ]
        if load.lag_p50_ms is not None and load.lag_p95_ms is not None:
            evidence.append(
                f"work made ready waited {ms(load.lag_p50_ms)} for it (median window lag p50; p95 "
                f"{ms(load.lag_p95_ms)})"
            )
        if load.busy_p50 < self.min_busy:
            evidence.append(self._why_not_busier(load))
        slice_ms = {k: max(u.slice_ms for u in uses[k]) for k in ranked}
        longest = max(ranked, key=lambda k: slice_ms[k])  # ranked: ties go to the most CPU
        slices = (
            f"in short slices (no stage's longest slice reached {ms(self.cpu_rule.min_slice_ms)})"
            if slice_ms[longest] < self.cpu_rule.min_slice_ms
            else f"(longest slice: {name_of(longest[1])} {ms(slice_ms[longest])})"
        )
        evidence.append(
            f"each request ran {ms(per_request)} of CPU on it {slices}: {', '.join(parts)}; plus "
            f"{ms(load.per_request(load.untraced_cpu_ms))} per request that no request owns (server "
            f"I/O and tasks of no request {ms(load.per_request(load.background_cpu_ms))}, GC "
            f"{ms(load.per_request(load.gc_cpu_ms))}, tracekit {ms(load.per_request(load.tracekit_cpu_ms))})"
        )
        before = sorted(v for v in (ms_value(r.attributes.get(semconv.START_WAIT_MS)) for r in victim_reqs)
                        if v is not None)  # fmt: skip
        measured = (
            f" (at least {ms(percentile(before, 0.5))} p50, p95 {ms(percentile(before, 0.95))}: from "
            "the server making the task to its first step)" if before else ""
        )
        evidence.append(
            f"{victim}'s requests waited {ms(sum(waits) / max(1, len(waits)))} each for the loop "
            f"(p95 {ms(percentile(waits, 0.95))}) once their spans had begun; they also waited "
            f"before, for the server to read them and start their tasks{measured}, which no "
            "latency here includes: clients saw more"
        )
        if folded:
            evidence.append("; ".join(folded))
        profile = None
        for window in load.windows:
            profile = larger_profile(profile, window.profile)
        if profile is not None:
            evidence.append(
                f"pyinstrument profiled the loop thread for a window ({profile[3] or 'busy'}; "
                f"{profile[0]:.0f} ms sampled): most self time in {hottest(profile[1])}"
            )
        title, code = loop_fixes.more_workers(workers, now, rho, rho_after)
        if projection is not None:
            closed = projection["model"]["arrivals"] == "closed"
            how = (f"{projection['model']['clients']} closed-loop clients, mean value analysis"
                   if closed else "M/M/1 loop, open arrivals")  # fmt: skip
            rps = projection["throughput_rps"]
            code += (
                f"# projected for {victim} (queueing model, {how}): p50 "
                f"{projection['p50_ms'][0]:.0f} -> {projection['p50_ms'][1]:.0f} ms, p95 "
                f"{projection['p95_ms'][0]:.0f} -> {projection['p95_ms'][1]:.0f} ms"
                + (f", {rps[0]:.0f} -> {rps[1]:.0f} req/s" if closed else "") + "\n"
            )
        lines = self._candidates(load, ranked, flagged, cpu, uses, total, rho, victim, requests, ctx)
        if lines:
            title += "; or take CPU off the loop: " + ", ".join(name for name, _ in lines)
            code += "\n# or less CPU per request on the loop, by stage:\n" + "".join(
                text for _, text in lines
            )
        impact = sum(waits) / max(1, len(waits))
        if projection is not None:
            impact = max(impact, projection["p50_ms"][0] - projection["p50_ms"][1])
        severity, reason = assess_severity(impact, p50, projection)
        return Finding(
            rule=self.id, route=victim, stage=None, function=None,
            severity=severity, severity_reason=reason, impact_ms=impact, evidence="; ".join(evidence),
            fix_title=title, fix_code=code, projection=projection,
            projection_note=None if projection is not None else (
                f"more workers need free cores, and the loop thread waited for a CPU "
                f"{load.cpu_wait_share:.0%} of the time (the host is short of CPU): the queueing "
                f"model, a core per worker, would project a gain the host cannot give; with "
                f"--cores N (the cores free for the gateway's workers) it projects"
                if short else "no instrumented requests to project"),
        )  # fmt: skip

    @staticmethod
    def _workers_projection(
        load: LoopLoad, requests: Sequence[RequestRecord], victim: str,
        workers: int, factor: float, model: dict[str, Any] | None,
    ) -> dict[str, Any] | None:  # fmt: skip
        # Closed-loop clients send again when answered: more workers raise the throughput,
        # and the loops fill again (mean value analysis); open arrivals keep their rate (M/M/1).
        if model is not None and model.get("arrivals") == "closed":
            share = model.get("loop_cpu_share")
            return closed_loop_projection(
                load, victim, clients=int(model["clients"]), workers=workers,
                cores=int(model["cores"]), others=float(model.get("host_others") or 0.0),
                share=float(share) if isinstance(share, (int, float)) else 1.0,
                cores_free=model.get("cores_source") == FROM_OPTION,
            )  # fmt: skip
        return queueing_projection(requests, victim, factor)

    @staticmethod
    def _why_not_busier(load: LoopLoad) -> str:
        # Saturated by its lag on a loop under MIN_BUSY: what the run-queue delay says of it.
        share = load.cpu_wait_share
        if share is None:
            return (
                "the loop thread may have waited for a CPU or the GIL (other processes or "
                "threads; this trace does not say how long), or been busy in bursts"
            )
        if share >= HOST_SHORT_SHARE:
            return (
                f"the loop thread waited for a CPU {share:.0%} of the time (run-queue delay: "
                f"the host is short of CPU), so more workers need free cores"
            )
        return (
            f"the loop thread waited for a CPU only {share:.1%} of the time: its work came in "
            f"bursts (busy p95 {percentile(load.busy, 0.95):.0%}), or other threads of the "
            f"process held the GIL"
        )

    def _victim(self, load: LoopLoad) -> str | None:
        # The route whose requests waited longest for the loop in total (ties: by name).
        waited: dict[str, float] = {}
        for r in load.requests:
            if r.instrumented:
                waited[r.route] = waited.get(r.route, 0.0) + (r.loop_wait_ms or 0.0)
        return min(waited, key=lambda route: (-waited[route], route)) if waited else None

    def _candidates(
        self,
        load: LoopLoad,
        ranked: list[tuple[str, str | None]],
        flagged: dict[tuple[str, str | None], str],
        cpu: dict[tuple[str, str | None], float],
        uses: dict[tuple[str, str | None], list[Usage]],
        total: float,
        rho: float,
        victim: str,
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> list[tuple[str, str]]:
        # The biggest unflagged stages: their fix (as cpu-on-loop would write it) and its
        # projected p50 for the victim route, by the replay when it validates, else queued.
        lines = []
        n = max(1, len(load.requests))
        for route, name in [k for k in ranked if k not in flagged][:MAX_CANDIDATES]:
            if cpu[(route, name)] < MIN_CANDIDATE_SHARE * total:
                break
            code = StageCode.of(name, (u.stage for u in uses[(route, name)]))
            (fix_title, fix_code), model, _ = fix_for_cpu(route, code)
            projection, how = None, "replay"
            if ctx.project is not None and model is not None:
                projection, _ = ctx.project(requests, replace(model, report_route=victim))
            if projection is None and model is not None:
                removed = cpu[(route, name)] * _removed_share(model) / max(load.wall_ms, 1e-9)
                projection = queueing_projection(requests, victim, utilisation_factor(rho, rho - removed))
                how = "queueing model"
            gain = ""
            if projection is not None:
                before, after = projection["p50_ms"]
                gain = f": {victim} p50 {before:.0f} -> {after:.0f} ms ({how})"
            share = cpu[(route, name)] / total
            text = (
                f"# {name_of(name)} ({route}): {ms(cpu[(route, name)] / n)} per request, {share:.0%} of "
                f"the requests' loop CPU -> {' '.join(fix_title.split())}{gain}\n"
            )
            if code.hot:
                text += f"#     pyinstrument: most self time in {hottest(code.hot)}\n"
            text += "".join(f"#     {line}\n" for line in fix_code.rstrip().splitlines())
            lines.append((name_of(name) if route == victim else f"{name_of(name)} ({route})", text))
        return lines


def _removed_share(model: Fix) -> float:
    # The share of the stage's loop CPU a fix takes off the loop: all of it to a thread or a
    # process pool, 1 - factor for a faster library.
    return 1.0 - model.factor if model.action == "shrink" else 1.0
