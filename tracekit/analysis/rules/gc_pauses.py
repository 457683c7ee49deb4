"""``gc-pauses``: garbage collections on the event-loop thread long enough to matter.

Reads the service's ``tracekit.loop`` windows over the sample's period (collections per
generation, their CPU and wall time, the longest pause and its generation) and the requests'
own ``tracekit.gc_ms`` (the pauses inside their steps, which the recorder never counts as a
stage's CPU). Fires when the longest pause took at least ``min_pause_ms`` of CPU or the
collections' CPU is at least ``min_share`` of the loop's time, and at least ``min_requests``
requests were hit. The collector is judged by its CPU, not its wall time: on a busy host the
thread can be descheduled in the middle of a tiny collection, and that stall is the host's
(the evidence says how much of the pauses' wall time it was). In traces recorded before the
longest pause's CPU was written, its wall time is scaled by its window's collections' CPU over
their wall time; without any CPU figure, wall time is used.

A pause holds the loop, so stages' slices and other requests' loop waits contain it; the
stage rules leave it out (``Usage.off_cpu_ms`` and ``Usage.slice_ms`` subtract a stage's
``tracekit.gc_ms``), so no stage is blamed for the collector.

The fix follows the longest pause's generation: a full (generation-2) collection walks every
object alive, so ``gc.freeze()`` after start-up takes what start-up built out of it; young
collections are made rarer with ``gc.set_threshold``. Either way: fewer allocations per
request. The projection is computed from the traces without the replay: the route's requests
without their own GC pauses (other requests' waits behind a pause are kept: a lower bound).
"""

from __future__ import annotations

from collections.abc import Sequence

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.rules import loop_fixes
from tracekit.analysis.rules.common import by_route, ms, p50_latency
from tracekit.analysis.rules.findings import Finding, RuleContext, assess_severity
from tracekit.analysis.rules.loop_index import gc_ms
from tracekit.analysis.rules.loop_load import LoopLoad, loop_loads, queueing_projection
from tracekit.analysis.stats.loop_windows import LoopWindow

#: The longest pause (ms) that matters on its own: it stalls every request on the loop that
#: long, twice cpu-on-loop's slice gate (5 ms) because collections are rarer than steps.
MIN_PAUSE_MS = 10.0
#: ... or the share of the loop's wall time spent in collections that matters: 5%, the
#: "medium" severity fraction of a request's latency.
MIN_SHARE = 0.05
#: Requests with a pause inside their steps needed (fewer: the pauses hit nobody measured).
MIN_REQUESTS = 3
_FULL = 2  # the oldest generation: a full collection


class GcPauses:
    """Rule ``gc-pauses`` (thresholds: the module constants, documented there)."""

    id = "gc-pauses"

    def __init__(
        self, min_pause_ms: float = MIN_PAUSE_MS, min_share: float = MIN_SHARE,
        min_requests: int = MIN_REQUESTS,
    ) -> None:  # fmt: skip
        self.min_pause_ms = min_pause_ms
        self.min_share = min_share
        self.min_requests = min_requests

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """At most one finding per service whose loop thread pauses long for GC."""
        out = []
        for load in loop_loads(requests, ctx).values():
            found = self._finding(load, requests, ctx)
            if found is not None:
                out.append(found)
        return out

    def _finding(self, load: LoopLoad, requests: Sequence[RequestRecord], ctx: RuleContext) -> Finding | None:
        counts = [sum(w.gc_counts[g] for w in load.windows) for g in range(3)]
        longest = max(load.windows, key=lambda w: (_pause_cpu_ms(w), w.gc_max_generation or 0))
        longest_ms = longest.gc_max_ms or 0.0
        longest_cpu_ms = _pause_cpu_ms(longest)
        generation = longest.gc_max_generation if longest.gc_max_generation is not None else 0
        timed_cpu = load.gc_cpu_ms > 0
        gc_cpu_ms = load.gc_cpu_ms if timed_cpu else load.gc_ms
        share = gc_cpu_ms / load.wall_ms if load.wall_ms > 0 else 0.0
        if not sum(counts) or (longest_cpu_ms < self.min_pause_ms and share < self.min_share):
            return None
        hit: dict[str, list[float]] = {}
        for r in load.requests:
            pause = gc_ms(r.attributes)
            if pause > 0:
                hit.setdefault(r.route, []).append(pause)
        if sum(map(len, hit.values())) < self.min_requests:
            return None
        route = min(hit, key=lambda k: (-sum(hit[k]), k))
        if ctx.route is not None and route != ctx.route:
            return None
        reqs = by_route(requests, RuleContext()).get(route, [])
        pauses = hit[route]
        per_request = sum(pauses) / max(1, len(reqs))
        host = ""
        if timed_cpu and load.gc_ms > 2 * gc_cpu_ms:
            host = (f"; {ms(load.gc_ms - gc_cpu_ms)} more of wall time passed during them, the "
                    "thread descheduled by a busy host (not the collector's doing)")  # fmt: skip
        spent = f"spent {ms(gc_cpu_ms)} of CPU in" if timed_cpu else f"paused for {ms(gc_cpu_ms)} of"
        evidence = (
            f"the event loop of {load.service} {spent} garbage collection in "
            f"{load.wall_ms / 1e3:.0f} s of windows ({share:.1%} of its time; "
            f"{sum(counts):,} collections: {counts[0]:,} generation 0, {counts[1]:,} generation 1, "
            f"{counts[2]:,} generation 2{host}); the longest pause {ms(longest_ms)}"
            + (f" ({ms(longest_cpu_ms)} of CPU)" if timed_cpu else "")
            + f" (generation {generation}); {len(pauses)} of {len(reqs)} {route} requests were "
            f"hit (collections in their steps, on the loop or in the threads running their "
            f"work, and other threads' while they waited for the GIL: "
            f"p50 {ms(percentile(pauses, 0.5))}, p95 {ms(percentile(pauses, 0.95))}, max "
            f"{ms(max(pauses))}; {ms(per_request)} per request)"
        )
        if generation >= _FULL or counts[_FULL]:
            fix = loop_fixes.freeze_after_startup(longest_cpu_ms, generation)
        else:
            fix = loop_fixes.fewer_collections(longest_cpu_ms, generation, counts[0] + counts[1])
        projection = queueing_projection(requests, route, 1.0, minus_ms=semconv.GC_MS)
        impact = per_request
        if projection is not None:
            impact = max(impact, projection["p50_ms"][0] - projection["p50_ms"][1])
        severity, reason = assess_severity(impact, p50_latency(reqs), projection)
        return Finding(
            rule=self.id, route=route, stage=None, function=None,
            severity=severity, severity_reason=reason, impact_ms=impact,
            evidence=evidence, fix_title=fix[0],
            fix_code=fix[1] + "# projected: the route's requests without their own GC pauses "
            "(other requests' waits behind a pause kept: a lower bound on the gain)\n",
            projection=projection,
            projection_note=None if projection is not None else "no instrumented requests to project",
        )  # fmt: skip


def _pause_cpu_ms(window: LoopWindow) -> float:
    # The longest collection's CPU in ``window``. Traces recorded before tracekit wrote it:
    # its wall time scaled by the window's collections' CPU over their wall time, else its
    # wall time.
    if window.gc_max_cpu_ms is not None:
        return window.gc_max_cpu_ms
    wall = window.gc_max_ms or 0.0
    if window.gc_cpu_ms > 0 and window.gc_ms > 0:
        return wall * min(1.0, window.gc_cpu_ms / window.gc_ms)
    return wall
