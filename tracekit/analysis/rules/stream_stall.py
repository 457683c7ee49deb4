"""``stream-stall``: inter-token gaps of streamed responses far above the model's own pace.

For each streamed request (``tracekit.chunks`` >= 3 and an ITL p95), the model's own time
per chunk is estimated from its model stage: the stage's wait (less the time to the first
chunk when ``gen_ai.response.time_to_first_chunk`` is known) over the output tokens
(``gen_ai.usage.output_tokens``), times tokens per chunk; without token counts, the route's
median ITL stands in. Fires when the median of the requests' ITL p95 is at least ``ratio``
times that and at least ``min_excess_ms`` above it.

Then it looks for what held the loop between chunks: the streamed requests' loop waits after
their first chunk are intersected with every other request's loop slices (and their own
per-chunk work is compared with the model's pace). The culprit stage gets the fix; when the
loop explains nothing, the stalls come from the model server (e.g. long prefills pausing
decodes), and the fix is chunked prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import LoopIndex, by_route, finding, loop_usage, ms, p50_latency
from tracekit.analysis.rules.cpu_on_loop import fix_for_cpu
from tracekit.analysis.rules.findings import Finding, RuleContext
from tracekit.analysis.stats.intervals import StageTree, function_of

_MS = 1e6


def _model_pace_ms(req: RequestRecord) -> float | None:
    """The model's own time per chunk in ``req`` from token counts, or ``None``."""
    if not req.chunks:
        return None
    wait = 0.0
    tokens = 0
    for stage in req.stages:
        if stage.kind != semconv.KIND_MODEL or stage.wait_ms is None:
            continue
        count = stage.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)
        if type(count) is not int or count <= 1:
            continue
        first = stage.attributes.get(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)
        decode = stage.wait_ms
        if isinstance(first, (int, float)) and 0 <= first * 1000 < decode:
            decode -= first * 1000
            count -= 1
        wait += decode
        tokens += count
    if tokens <= 0:
        return None
    return wait / tokens * max(1.0, tokens / req.chunks)


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
        if paces:
            pace, source = percentile(paces, 0.5), "from model time / output tokens"
        else:
            pace = percentile([r.itl_p50_ms or 0.0 for r in streamed], 0.5)
            source = "the median inter-chunk gap"
        p95 = percentile([r.itl_p95_ms or 0.0 for r in streamed], 0.5)
        if pace <= 0 or p95 < self.ratio * pace or p95 - pace < self.min_excess_ms:
            return None
        worst = max(r.itl_max_ms or 0.0 for r in streamed)
        stall = percentile([max(0.0, (r.itl_max_ms or 0.0) - pace) for r in streamed], 0.5)
        culprit = self._culprit(streamed, requests, ctx)
        head = (
            f"streamed responses stalled: their inter-chunk gap p95 is {ms(p95)} (median over "
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
        evidence = (
            f"{head}; the gateway's event loop does not explain them (no other work held it "
            f"while the streams waited): the model server paused the streams"
        )
        model_stage = next((s for s in streamed[0].stages if s.kind == semconv.KIND_MODEL), None)
        return finding(
            rule=self.id,
            route=route,
            stage=model_stage.name if model_stage is not None else None,
            function=function_of(model_stage),
            impact_ms=stall,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fixes.chunked_prefill(),
            requests=requests,
            ctx=ctx,
            model=None,
            no_model_note="the model server's scheduling is outside the replay model",
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
        """Another stage held the loop while the streams waited: fix that stage."""
        c_route, c_stage, c_record, blamed_ms = culprit
        function = function_of(c_record)
        kind = c_record.kind if c_record is not None else None
        fix, model = fix_for_cpu(c_route, c_stage, kind, function)
        whose = "their own" if c_route == route else f"{c_route}'s"
        evidence = (
            f"{head}; while they waited for the loop, it was running {whose} "
            f"{c_stage or 'handler code'} ({ms(blamed_ms / streams)} per streamed request)"
        )
        return finding(
            rule=self.id,
            route=route,
            stage=c_stage,
            function=function,
            impact_ms=stall,
            route_p50_ms=p50,
            evidence=evidence,
            fix=fix,
            requests=requests,
            ctx=ctx,
            model=replace(model, report_route=route),
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
            model = fix_for_cpu(route, o_stage, o_record.kind, function)[1]
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
            for name, usage in loop_usage(req, tree).items():
                if usage.stage is not None and usage.stage.kind == semconv.KIND_MODEL:
                    continue  # the model's own steps are the stream, not work per chunk
                per.setdefault(name, []).append(usage.held_ms / max(1, req.chunks or 1))
                records.setdefault(name, usage.stage)
        if not per:
            return None
        name = max(per, key=lambda k: percentile(per[k], 0.5))
        return name, percentile(per[name], 0.5), records[name]


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
