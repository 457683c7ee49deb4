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

**The server's own word.** When the model server's span (vLLM's ``llm_request``) joined most
of the calls, its time in queue (``gen_ai.latency.time_in_queue``) is the evidence instead of
the FIFO reading: the server measured it. The rule then fires when at least ``min_contended``
calls (and ``min_share`` of them) waited >= 1 ms in the server's queue and their median wait
is at least ``min_queue_ratio`` of the server's median inference time (prefill + decode):
queueing that matters next to the work. This also catches a server that runs a few
sequences at once (``--max-num-seqs 4`` under 16 clients), whose calls overlap and whose
completions leave FIFO order, which the FIFO reading cannot see. The evidence says how many
sequences the server ran at once (its spans' inference intervals, on the server's clock) and
how the queue grew with the calls in flight.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, ServerTiming
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
        min_queue_ratio: with the server's spans, the median time queued calls waited in
            its queue / its median inference time at least this (0.25).
    """

    id = "serialized-model-calls"

    def __init__(
        self,
        min_calls: int = 5,
        min_contended: int = 3,
        min_share: float = 0.2,
        service_ratio: float = 0.75,
        max_out_of_order: float = 0.1,
        min_queue_ratio: float = 0.25,
    ) -> None:
        self.min_calls = min_calls
        self.min_contended = min_contended
        self.min_share = min_share
        self.service_ratio = service_ratio
        self.max_out_of_order = max_out_of_order
        self.min_queue_ratio = min_queue_ratio

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
            served = [c for c in calls if c.stage.server is not None]
            server_said = len(served) >= self.min_calls and 2 * len(served) >= len(calls)
            if server_said:
                found = self._server_findings(name, served, routes, requests, ctx)
                if found:
                    out.extend(found)
                    continue
            verdict = self._serialized(calls)
            if verdict is None:
                continue
            quickest_ms, outside = verdict
            if server_said and not outside:
                continue  # waited inside the stage, but not in the server's queue: it said so
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

    def _server_findings(
        self,
        name: str,
        calls: list[CallTiming],
        routes: dict[str, list[RequestRecord]],
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> list[Finding]:
        """Findings from the server's own queue times (calls whose server span joined)."""
        timings = [_server(c) for c in calls]
        queued = [t for t in timings if t.queue_ms >= _CONTENDED_NS / _MS]
        if len(queued) < max(self.min_contended, self.min_share * len(calls)):
            return []
        inference = percentile([t.prefill_ms + t.decode_ms for t in timings], 0.5)
        waited = percentile([t.queue_ms for t in queued], 0.5)
        if waited < self.min_queue_ratio * inference:
            return []
        at_once = _most_running(timings)
        growth = _queue_growth(timings)
        function = function_of(calls[0].stage)
        out: list[Finding] = []
        for route in sorted({requests[c.index].route for c in calls}):
            on_route = [c for c in calls if requests[c.index].route == route]
            if route not in routes or not any(_server(c).queue_ms >= 1 for c in on_route):
                continue
            queues = [_server(c).queue_ms for c in on_route]
            running = "one sequence at a time" if at_once == 1 else f"at most {at_once} sequences at once"
            evidence = (
                f"the model server reported {len(queued)} of {len(calls)} {name} calls waiting in "
                f"its queue (gen_ai.latency.time_in_queue) for {ms(waited)} (p95 "
                f"{ms(percentile([t.queue_ms for t in queued], 0.95))}) before its "
                f"{ms(inference)} of prefill and decode; it ran {running}{growth}"
            )
            out.append(
                finding(
                    rule=self.id,
                    route=route,
                    stage=name,
                    function=function,
                    impact_ms=sum(queues) / len(queues),
                    route_p50_ms=p50_latency(routes[route]),
                    evidence=evidence,
                    fix=fixes.batching_server(name, function, at_once),
                    requests=requests,
                    ctx=ctx,
                    model=Fix("model_overlap", route, name, queue="inside"),
                )
            )
        return out


def _server(call: CallTiming) -> ServerTiming:
    server = call.stage.server
    assert server is not None  # only calls the server's span joined come here
    return server


def _most_running(timings: list[ServerTiming]) -> int:
    """The most calls in the server's engine at once: their inference intervals (queue
    left out), on the server's own clock."""
    edges: list[tuple[float, int]] = []
    for t in timings:
        # The span ends a little after the last token (output processing): an end within
        # 1 ms after the next call's start is not an overlap.
        end = t.end_ns / _MS
        edges += [(end - t.prefill_ms - t.decode_ms, 1), (end - _CONTENDED_NS / _MS, -1)]
    edges.sort()  # an end before a start at the same instant
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return max(1, most)


def _queue_growth(timings: list[ServerTiming]) -> str:
    """How the server's queue time grew with the calls in flight at the server when each
    arrived (its spans' start and end), when their number varied: evidence text or ""."""
    starts = sorted(t.start_ns for t in timings)
    ends = sorted(t.end_ns for t in timings)
    # Others in flight as each arrived: started at or before it, not ended by then.
    rows = sorted(
        (bisect_right(starts, t.start_ns) - bisect_right(ends, t.start_ns) - 1, t.queue_ms)
        for t in timings
    )
    middle = rows[len(rows) // 2][0]
    low = [row for row in rows if row[0] <= middle]
    high = [row for row in rows if row[0] > middle]
    if not high:
        return ""
    return (
        f"; its queue grew with the calls in flight: {ms(percentile([q for _, q in low], 0.5))} "
        f"with {low[0][0]}-{low[-1][0]} others in flight, "
        f"{ms(percentile([q for _, q in high], 0.5))} with {high[0][0]}-{high[-1][0]}"
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
