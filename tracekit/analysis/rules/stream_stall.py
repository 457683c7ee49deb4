"""``stream-stall``: inter-token gaps of streamed responses far above the model's own pace.

For each streamed request (``tracekit.chunks`` >= 3 and an ITL p95), the model's own time
per chunk is read from its model call's chunk arrivals where an integration timed them, else
estimated from its model stage after its first chunk (:func:`_model_pace_ms`: the time it
was suspended per gap, loop waits it did not catch up left out). Fires when the
median of the requests' ITL p95 is at least ``ratio`` times that and at least
``min_excess_ms`` above it.

Then it looks for what held the loop between chunks: the streamed requests' loop waits after
their first chunk are intersected with every other request's loop slices (and their own
per-chunk work after the first chunk is compared with the model's pace). The stalls are then
a symptom of the culprit stage's finding and are folded into it
(:mod:`tracekit.analysis.rules.folding`); alone, the culprit stage gets the fix. When no stage
explains them but the streams' model stages waited for the loop for a good part of the
stalls (``culprit_share``), the loop's load as a whole is the cause (many short slices, GC,
work of no request: folded into ``loop-saturated``). When the loop explains nothing, the
stalls come from the model server (e.g. long prefills pausing decodes), and the fix is
chunked prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import LoopIndex, by_route, finding, ms, p50_latency
from tracekit.analysis.rules.cpu_on_loop import fix_for_cpu
from tracekit.analysis.rules.findings import Finding, RuleContext
from tracekit.analysis.rules.stage_code import StageCode
from tracekit.analysis.stats.intervals import StageTree, function_of

_MS = 1e6
_STALLED = "streamed responses stalled: "


#: Where a stream's model pace was read from (:func:`_model_pace_ms`), as the evidence says it.
ARRIVALS = "the model's chunks' arrivals at the gateway"
SUSPENDED = "its stage's time suspended between chunks"
MEAN_GAP = "the streams' mean gap"


def _model_pace_ms(req: RequestRecord) -> tuple[float, str] | None:
    """The model's own time per chunk in a stream, and where it was read from.

    From the model call's own chunk arrivals where its integration timed them
    (``tracekit.upstream.tpot_ms``: first to last arrival over the gaps; read as the gateway
    got to each chunk, so the model's pace or, on a loop too busy to keep up, slower).
    Else from the model stage after its first chunk (``gen_ai.response.time_to_first_chunk``,
    else the request's first chunk): its time suspended per gap (wall less its CPU, its
    consumer's time and its children's), and the part of it that was not a recorded loop
    wait. A stream read in bursts (its median gap below that second figure: chunks that
    arrived while the loop was held were read back to back) absorbed its loop waits, so
    its pace is the suspended time per gap (the model kept producing meanwhile); a stream
    without bursts waited for the model after each loop wait, so its pace leaves them out
    (on a saturated loop a new user's 5 ms stream read 2.8 ms so: the arrivals said 5.6).
    The median gap alone is not the pace (a burst's chunks are microseconds apart), nor
    is token time from the stage's wait alone. Without a timed model stage: the stream's
    mean gap (``tracekit.tpot_ms``).
    """
    gaps = (req.chunks or 0) - 1
    if gaps < 1:
        return None
    model = next((s for s in reversed(req.stages) if s.kind == semconv.KIND_MODEL
                  and s.cpu_ms is not None), None)  # fmt: skip
    if model is not None:
        arrivals = model.attributes.get(semconv.UPSTREAM_TPOT_MS)
        if isinstance(arrivals, (int, float)) and 0 < arrivals < float("inf"):
            return float(arrivals), ARRIVALS
        ttfc = model.attributes.get(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)
        first = (
            model.start_ns + int(ttfc * 1e9) if isinstance(ttfc, (int, float)) and ttfc >= 0
            else req.start_ns + int((req.ttft_ms or 0.0) * _MS)
        )
        busy = (model.cpu_ms or 0.0) + (model.children_ms or 0.0) + _consumer_ms(model)
        suspended = (model.end_ns - first) / _MS - busy
        if suspended > 0:
            loop_waits = sum(max(0, b - max(a, first)) for a, b in model.loop_waits) / _MS
            waiting = max(0.0, suspended - loop_waits) / gaps
            bursts = req.itl_p50_ms is not None and req.itl_p50_ms < waiting
            return (suspended / gaps if bursts else waiting), SUSPENDED
    if req.tpot_ms is not None and req.tpot_ms > 0:
        return req.tpot_ms, MEAN_GAP
    return None


def _consumer_ms(stage: StageRecord) -> float:
    """``tracekit.consumer_ms`` of a generator stage: 0 when absent or malformed."""
    value = stage.attributes.get(semconv.CONSUMER_MS)
    return float(value) if isinstance(value, (int, float)) and 0 <= value < float("inf") else 0.0


class StreamStall:
    """Rule ``stream-stall``.

    Args:
        ratio: fire when the median ITL p95 is at least this multiple of the model's own
            time per chunk (3).
        min_excess_ms: ... and at least this many ms above it (10 ms).
        min_requests: streamed requests needed on the route (3).
        culprit_share: a stage explains the stalls when the loop waits it caused the streams
            add up to at least this share of their excess gap time (0.3).
    """

    id = "stream-stall"

    def __init__(
        self,
        ratio: float = 3.0,
        min_excess_ms: float = 10.0,
        min_requests: int = 3,
        culprit_share: float = 0.3,
    ) -> None:
        self.ratio = ratio
        self.min_excess_ms = min_excess_ms
        self.min_requests = min_requests
        self.culprit_share = culprit_share

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """Findings for every streamed route whose chunks stall."""
        out: list[Finding] = []
        for route, reqs in by_route(requests, ctx).items():
            streamed = [r for r in reqs if (r.chunks or 0) >= 3 and r.itl_p95_ms is not None]
            if len(streamed) < self.min_requests:
                continue
            found = self._check(route, streamed, reqs, requests, ctx)
            if found is not None:
                out.append(found)
        return out

    def _check(
        self,
        route: str,
        streamed: list[RequestRecord],
        reqs: list[RequestRecord],
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> Finding | None:
        paces = [p for p in (_model_pace_ms(r) for r in streamed) if p is not None]
        if not paces:
            return None
        pace = percentile([p for p, _ in paces], 0.5)
        sources = [source for _, source in paces]
        source = max((ARRIVALS, SUSPENDED, MEAN_GAP), key=sources.count)  # the most streams'; ties: the first
        p95 = percentile([r.itl_p95_ms or 0.0 for r in streamed], 0.5)
        if pace <= 0 or p95 < self.ratio * pace or p95 - pace < self.min_excess_ms:
            return None
        worst = max(r.itl_max_ms or 0.0 for r in streamed)
        stall = percentile([max(0.0, (r.itl_max_ms or 0.0) - pace) for r in streamed], 0.5)
        culprit = self._culprit(streamed, requests, ctx)
        head = (
            f"{_STALLED}their inter-chunk gap p95 is {ms(p95)} (median over "
            f"{len(streamed)} requests; max {ms(worst)}) against the model's own {ms(pace)} "
            f"per chunk ({source})"
        )
        p50 = p50_latency(reqs)
        excess = sum(_stall_ms(r, pace) for r in streamed)
        if culprit is not None and culprit[3] >= self.culprit_share * excess:
            return self._loop_culprit(
                route, culprit, len(streamed), head, stall, p50, requests, ctx
            )
        own = self._own_per_chunk(streamed)
        if own is not None and own[1] >= 0.5 * pace:
            return self._per_chunk(route, own, head, stall, p50, requests, ctx)
        # Else: the streams waited for the loop for a good part of it, with no one stage
        # holding it (many short slices, GC, work of no request: loop-saturated's symptom;
        # it was put on the model server before), or the loop explains nothing.
        waited = sum(_stream_loop_wait_ms(r) for r in streamed) / len(streamed)
        busy_loop = waited * len(streamed) >= self.culprit_share * excess
        if busy_loop:
            clause = (
                f"the streams waited {ms(waited)} each for the event loop between chunks (their "
                f"model stage's loop wait), with no one stage holding it: many short slices, "
                f"garbage collection or work no request owns kept it busy"
            )
        else:
            clause = ("the gateway's event loop does not explain them (no other work held it "
                      "while the streams waited): the model server paused the streams")  # fmt: skip
        model_stage = next((s for s in streamed[0].stages if s.kind == semconv.KIND_MODEL), None)
        return finding(
            rule=self.id,
            route=route,
            stage=model_stage.name if model_stage is not None else None,
            function=function_of(model_stage),
            impact_ms=stall,
            route_p50_ms=p50,
            evidence=f"{head}; {clause}",
            fix=fixes.busy_loop_streams() if busy_loop else fixes.chunked_prefill(),
            requests=requests,
            ctx=ctx,
            model=None,
            no_model_note=(
                "the replay models end-to-end latency, not per-chunk timing" if busy_loop
                else "the model server's scheduling is outside the replay model"
            ),
            caused_by=(("loop-saturated", route, None),) if busy_loop else (),
            folded=f"this is also why {route}'s streams stall: {head.removeprefix(_STALLED)} (stream-stall)"
            if busy_loop else None,
        )

    def _loop_culprit(
        self,
        route: str,
        culprit: tuple[str, str | None, StageRecord | None, float],
        streams: int,
        head: str,
        stall: float,
        p50: float,
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> Finding:
        """Another request's stage held the loop while the streams waited: fix that stage
        (the symptom of its cpu-on-loop or blocking-call-on-loop finding, folded into it)."""
        c_route, c_stage, c_record, blamed_ms = culprit
        code = StageCode.of(c_stage, [c_record])
        fix, model, note = fix_for_cpu(c_route, code)
        # Never "their own": the streams' own stages before their first chunk are excluded;
        # what held the loop was this stage of *other* requests (new arrivals, for a stage
        # that runs before a stream starts).
        whose = "other requests' own" if c_route == route else f"{c_route}'s"
        held = (
            f"while they waited for the loop, it was running {whose} "
            f"{c_stage or 'handler code'} ({ms(blamed_ms / streams)} per streamed request)"
        )
        return finding(
            rule=self.id,
            route=route,
            stage=c_stage,
            function=code.function,
            impact_ms=stall,
            route_p50_ms=p50,
            evidence=f"{head}; {held}",
            fix=fix,
            requests=requests,
            ctx=ctx,
            model=replace(model, report_route=route) if model is not None else None,
            no_model_note=note,
            caused_by=(("cpu-on-loop", c_route, c_stage), ("blocking-call-on-loop", c_route, c_stage)),
            folded=f"this is also why {route}'s streams stall: {head.removeprefix(_STALLED)} (stream-stall)",
        )

    def _per_chunk(
        self,
        route: str,
        own: tuple[str | None, float, StageRecord | None],
        head: str,
        stall: float,
        p50: float,
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> Finding:
        """The streams' own work per chunk is slow next to the model's pace."""
        o_stage, per_chunk, o_record = own
        function = function_of(o_record)
        evidence = (
            f"{head}; their own per-chunk work on the loop ({o_stage or 'handler code'}) "
            f"takes {ms(per_chunk)} per chunk"
        )
        model: Fix | None = None
        if o_record is not None and o_record.kind == semconv.KIND_SERIALIZE:
            model = fix_for_cpu(route, StageCode.of(o_stage, [o_record]))[1]
        return finding(
            rule=self.id,
            route=route,
            stage=o_stage,
            function=function,
            impact_ms=stall,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fixes.flush_less(o_stage, function),
            requests=requests,
            ctx=ctx,
            model=model,
            no_model_note=(
                "the replay models end-to-end latency, not per-chunk timing: coalescing "
                "chunks has no projection"
            ),
            caused_by=(("cpu-on-loop", route, o_stage),),
            folded=(
                f"this is also why the streams stall: {head.removeprefix(_STALLED)}, and "
                f"{o_stage or 'handler code'} takes {ms(per_chunk)} per chunk (stream-stall)"
            ),
        )

    def _culprit(
        self, streamed: list[RequestRecord], requests: Sequence[RequestRecord], ctx: RuleContext
    ) -> tuple[str, str | None, StageRecord | None, float] | None:
        """(route, stage, a record of it, ms) of what held the loop while streams waited."""
        index = LoopIndex.of(requests, ctx)
        position = {id(r): i for i, r in enumerate(requests)}
        totals: dict[tuple[str, str | None], float] = {}
        records: dict[tuple[str, str | None], StageRecord | None] = {}
        for req in streamed:
            first = req.start_ns + int((req.ttft_ms or 0.0) * _MS)
            me = position.get(id(req))
            waits = [*req.loop_waits, *(w for s in req.stages for w in s.loop_waits)]
            for a, b in waits:
                if b <= first:
                    continue
                for piece, ns in index.overlapping(req.service, max(a, first), b, exclude=me):
                    key = (piece.route, piece.stage)
                    totals[key] = totals.get(key, 0.0) + ns / _MS
                    if key not in records:
                        records[key] = _record_of(requests[piece.index], piece.stage)
        if not totals:
            return None
        key = max(totals, key=lambda k: totals[k])
        return key[0], key[1], records[key], totals[key]

    def _own_per_chunk(
        self, streamed: list[RequestRecord]
    ) -> tuple[str | None, float, StageRecord | None] | None:
        """The streams' own on-loop work per chunk: (stage, ms per chunk, a record of it)."""
        per: dict[str | None, list[float]] = {}
        records: dict[str | None, StageRecord | None] = {}
        for req in streamed:
            tree = StageTree(req)
            first = req.start_ns + int((req.ttft_ms or 0.0) * _MS)
            gaps = max(1, (req.chunks or 1) - 1)
            for stage in (None, *req.stages):
                if stage is not None and (stage.kind == semconv.KIND_MODEL or stage.cpu_ms is None
                                          or stage.on_loop is False):  # fmt: skip
                    continue  # the model's own steps are the stream, not work per chunk
                # Only what held the loop after the first chunk: a stage that ran before the
                # stream started (its own tokenizer, guardrail) is not work per chunk.
                held = sum(max(0, b - max(a, first)) for a, b in tree.own_slices(stage, req))
                if stage is not None and stage.start_ns >= first:
                    # All of it is after the first chunk: its CPU counts, slices < 1 ms too.
                    held = max(held, int((stage.cpu_ms or 0.0) * _MS))
                name = stage.name if stage is not None else None
                per.setdefault(name, []).append(held / _MS / gaps)
                records.setdefault(name, stage)
        if not per:
            return None
        name = max(per, key=lambda k: percentile(per[k], 0.5))
        return name, percentile(per[name], 0.5), records[name]


def _stream_loop_wait_ms(req: RequestRecord) -> float:
    """The loop wait of a streamed request's model stage (where its chunks waited)."""
    model = next((s for s in reversed(req.stages) if s.kind == semconv.KIND_MODEL), None)
    return (model.loop_wait_ms or 0.0) if model is not None else 0.0


def _stall_ms(req: RequestRecord, pace: float) -> float:
    """A lower bound of a stream's gap time above ``pace``: its longest gap's excess plus,
    for the 5% of gaps at or above its p95, their excess at p95."""
    gaps = max(1, (req.chunks or 1) - 1)
    p95_excess = max(0.0, (req.itl_p95_ms or 0.0) - pace)
    return max(0.0, (req.itl_max_ms or 0.0) - pace) + p95_excess * (gaps - 1) * 0.05


def _record_of(req: RequestRecord, stage: str | None) -> StageRecord | None:
    if stage is None:
        return None
    return next((s for s in req.stages if s.name == stage), None)
