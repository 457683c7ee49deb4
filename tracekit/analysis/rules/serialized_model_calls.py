"""``serialized-model-calls``: model calls of concurrent requests never run at the same time.

Reads all calls of one model stage in a service as customers of one FIFO server
(:mod:`tracekit.analysis.stats.model_calls`): a call *contended* when its request was ready while
an earlier call was still running. On a one-at-a-time model server, behind a lock, or with
a blocking client, every contended call waits for the earlier one and is then served for
about as long as an uncontended call takes; on a batching server contended calls overlap,
finish close together, and their "service times" collapse to the arrival spacing. Fires
when at least ``min_contended`` calls (and ``min_share`` of all calls) were contended, their
completions kept FIFO order, and their median service time is at least ``service_ratio`` of
the quickest uncontended call's latency (the model's own).

Where the waiting sits says what serializes the calls: before the stage starts (a lock or
a blocking client in the gateway: the model stages never overlap) or inside it (the model
server queues them).
"""

from __future__ import annotations

from collections.abc import Sequence

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import LoopIndex, by_route, finding, ms, p50_latency
from tracekit.analysis.rules.findings import Finding, RuleContext
from tracekit.analysis.stats.intervals import function_of
from tracekit.analysis.stats.model_calls import CallTiming, is_model_stage, model_calls

_MS = 1e6
_CONTENDED_NS = 1_000_000  # waited at least 1 ms for an earlier call
#: Calls that waited before their stage while one stage of other requests held the loop for
#: at least this share of the wait were not sent, not serialized: that stage is the cause.
LOOP_SHARE = 0.5


class SerializedModelCalls:
    """Rule ``serialized-model-calls``.

    Args:
        min_calls: model calls needed to judge (5).
        min_contended: contended calls needed (3).
        min_share: contended calls as a share of all calls (0.2).
        service_ratio: median service of contended calls / the quickest uncontended call's
            latency at least this (0.75).
        max_out_of_order: at most this share of contended calls may finish before an
            earlier one (0.1): a one-at-a-time server answers in order.
    """

    id = "serialized-model-calls"

    def __init__(
        self,
        min_calls: int = 5,
        min_contended: int = 3,
        min_share: float = 0.2,
        service_ratio: float = 0.75,
        max_out_of_order: float = 0.1,
    ) -> None:
        self.min_calls = min_calls
        self.min_contended = min_contended
        self.min_share = min_share
        self.service_ratio = service_ratio
        self.max_out_of_order = max_out_of_order

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """Findings for every model stage whose calls were served one at a time."""
        routes = by_route(requests, ctx, instrumented=False)
        keys = {
            (r.service, s.name)
            for reqs in routes.values()
            for r in reqs
            for s in r.stages
            if is_model_stage(s)
        }
        out: list[Finding] = []
        for service, name in sorted(keys):
            calls = model_calls(requests, service, name)
            verdict = self._serialized(calls)
            if verdict is None:
                continue
            quickest_ms, outside = verdict
            for route in sorted({requests[c.index].route for c in calls}):
                if route not in routes:
                    continue
                on_route = [c for c in calls if requests[c.index].route == route]
                if not any(c.queue_ns >= _CONTENDED_NS for c in on_route):
                    continue
                out.append(
                    self._finding(
                        route, name, on_route, quickest_ms, outside, routes[route], requests, ctx
                    )
                )
        return out

    def _serialized(self, calls: list[CallTiming]) -> tuple[float, bool] | None:
        """``(quickest uncontended call ms, waited outside the stage)`` when the calls look
        served one at a time, else ``None``."""
        if len(calls) < self.min_calls:
            return None
        contended = [c for c in calls if c.queue_ns >= _CONTENDED_NS]
        if len(contended) < max(self.min_contended, self.min_share * len(calls)):
            return None
        # A completion before an earlier call's shows up as a zero service time.
        out_of_order = sum(1 for c in contended if c.service_ns <= 0)
        if out_of_order > self.max_out_of_order * len(contended):
            return None
        # The model's own latency: the quickest uncontended call's (else the quickest call).
        # Not their median: a load that saturates the server from the start leaves only its
        # first calls uncontended, and the very first is cold (a new connection,
        # first-request imports): bench/validate.py's serial server, 28 ms of service, had
        # uncontended calls of 49, 30 and 42 ms and got no finding against their median.
        alone = [c.wall_ns for c in calls if c.queue_ns < _CONTENDED_NS]
        reference = min(alone) if alone else min(c.wall_ns for c in calls)
        service = percentile([c.service_ns for c in contended], 0.5)
        if reference <= 0 or service < self.service_ratio * reference:
            return None
        waited_outside = [
            min(c.queue_ns, max(0, c.stage.start_ns - c.submit_ns)) / c.queue_ns for c in contended
        ]
        return reference / _MS, percentile(waited_outside, 0.5) >= 0.5

    def _finding(
        self,
        route: str,
        name: str,
        calls: list[CallTiming],
        quickest_ms: float,
        outside: bool,
        reqs: list[RequestRecord],
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> Finding:
        queues = [c.queue_ns / _MS for c in calls]
        contended = [c for c in calls if c.queue_ns >= _CONTENDED_NS]
        waited = [c.queue_ns / _MS for c in contended]
        service = percentile([c.service_ns / _MS for c in contended], 0.5)
        function = function_of(calls[0].stage)
        if outside:
            how = (
                "the model stages never overlapped: the wait was before each stage started "
                "(a lock or a blocking client in the gateway)"
            )
            fix = fixes.async_model_client(name, function)
        else:
            how = "the wait was inside the stage: the model server answered one call at a time"
            fix = fixes.batching_server(name, function)
        evidence = (
            f"{len(contended)} of {len(calls)} {name} calls were ready while another call was "
            f"running and waited {ms(percentile(waited, 0.5))} for it (p95 "
            f"{ms(percentile(waited, 0.95))}), then took {ms(service)} each, as long as the "
            f"quickest uncontended call ({ms(quickest_ms)}): {how}"
        )
        caused_by: tuple[tuple[str, str, str | None], ...] = ()
        folded = None
        held = _loop_holder(contended, requests, ctx) if outside else None
        if held is not None:
            # The calls waited before their stage started while other requests held the
            # loop: they were not sent, not queued behind each other. That stage's finding
            # is the cause.
            (h_route, h_stage), share = held
            evidence += (
                f"; but the event loop was running {h_stage or 'handler code'} ({h_route}) "
                f"for {share:.0%} of that wait, so the calls were not sent, not locked"
            )
            caused_by = (
                ("cpu-on-loop", h_route, h_stage),
                ("blocking-call-on-loop", h_route, h_stage),
                ("loop-saturated", route, None),
            )
            folded = (
                f"this is also why {name} calls look served one at a time: they waited "
                f"{ms(percentile(waited, 0.5))} to be sent while the loop ran it "
                f"(serialized-model-calls)"
            )
        return finding(
            rule=self.id,
            route=route,
            stage=name,
            function=function,
            impact_ms=sum(queues) / len(queues),
            route_p50_ms=p50_latency(reqs),
            evidence=evidence,
            fix=fix,
            requests=requests,
            ctx=ctx,
            model=Fix("model_overlap", route, name, queue="outside" if outside else "inside"),
            caused_by=caused_by,
            folded=folded,
        )


def _loop_holder(
    contended: list[CallTiming], requests: Sequence[RequestRecord], ctx: RuleContext
) -> tuple[tuple[str, str | None], float] | None:
    """The (route, stage) whose loop slices filled the most of the contended calls' waits
    before their stage started, and the share they filled, when that is at least half."""
    index = LoopIndex.of(requests, ctx)
    held: dict[tuple[str, str | None], int] = {}
    total = 0
    for c in contended:
        end = min(c.submit_ns + c.queue_ns, c.stage.start_ns)
        if end <= c.submit_ns:
            continue
        total += end - c.submit_ns
        service = requests[c.index].service
        for piece, ns in index.overlapping(service, c.submit_ns, end, exclude=c.index):
            key = (piece.route, piece.stage)
            held[key] = held.get(key, 0) + ns
    if not held or total <= 0:
        return None
    key = max(held, key=lambda k: (held[k], str(k)))
    share = held[key] / total
    return (key, share) if share >= LOOP_SHARE else None
