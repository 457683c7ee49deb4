"""What several rules need: per-route groups, per-stage usage, and who held the loop when.

:class:`LoopIndex` answers "while this stage held the event loop, how long did *other*
requests wait for it?": every recorded loop wait (``tracekit.loop_waits_us`` of requests and
stages) is intersected with every recorded loop slice of another request (own slices: a
stage's slices minus its descendants'), per service. That is the measured blame of a
stage; rules report it per request and per second of trace.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tracekit.analysis._intervals import StageTree, function_of, percentile
from tracekit.analysis.findings import Finding, Fix, RuleContext, severity_for
from tracekit.analysis.model import RequestRecord, StageRecord

_MS = 1e6
#: Stage key for the request's own code (outside any stage).
OWN = None


def by_route(
    requests: Sequence[RequestRecord], ctx: RuleContext, *, instrumented: bool = True
) -> dict[str, list[RequestRecord]]:
    """Requests grouped by route (only ``ctx.route`` when set), in sample order.

    Args:
        requests: the sample.
        ctx: the rule context.
        instrumented: keep only requests with tracekit attributes.
    """
    out: dict[str, list[RequestRecord]] = {}
    for req in requests:
        if instrumented and not req.instrumented:
            continue
        if ctx.route is not None and req.route != ctx.route:
            continue
        out.setdefault(req.route, []).append(req)
    return out


def p50_latency(reqs: Sequence[RequestRecord]) -> float:
    """Median end-to-end latency of ``reqs`` in ms (0 for none)."""
    return percentile([r.wall_ms for r in reqs], 0.5) if reqs else 0.0


@dataclass
class Usage:
    """One stage's use of the event loop in one request (summed over its spans of that name).

    Attributes:
        cpu_ms: on-loop CPU.
        held_ms: time it held the loop (its own recorded slices; at least its CPU).
        max_block_ms: its longest uninterrupted slice.
        max_slice_ms: its longest own recorded slice.
        blocked_at: where the watchdog caught it blocking, if it did.
        stage: its first span (for the function name).
    """

    cpu_ms: float = 0.0
    held_ms: float = 0.0
    max_block_ms: float = 0.0
    max_slice_ms: float = 0.0
    blocked_at: str | None = None
    stage: StageRecord | None = None

    @property
    def off_cpu_ms(self) -> float:
        """Time it held the loop without running on the CPU."""
        return max(0.0, self.held_ms - self.cpu_ms)


def loop_usage(req: RequestRecord, tree: StageTree | None = None) -> dict[str | None, Usage]:
    """Per stage name (``None``: the request's own code), its use of the loop in ``req``.

    Only stages on the loop (``on_loop`` true or unknown) with known CPU count.
    """
    tree = tree or StageTree(req)
    out: dict[str | None, Usage] = {}
    stage_cpu = 0.0
    for stage in req.stages:
        if stage.cpu_ms is None:
            continue
        stage_cpu += stage.cpu_ms
        if stage.on_loop is False:
            continue
        pieces = tree.own_slices(stage, req)
        _add(out.setdefault(stage.name, Usage(stage=stage)), stage.cpu_ms, pieces,
             stage.max_block_ms, stage.blocked_at)  # fmt: skip
    if req.cpu_ms is not None:
        own_cpu = max(0.0, req.cpu_ms - stage_cpu)
        pieces = tree.own_slices(None, req)
        _add(out.setdefault(OWN, Usage()), own_cpu, pieces, None, req.blocked_at)
    return out


def usages_by_route(
    requests: Sequence[RequestRecord], ctx: RuleContext, min_requests: int
) -> Iterator[tuple[str, list[RequestRecord], dict[str | None, list[Usage]]]]:
    """Per route with at least ``min_requests`` requests: the requests, and each stage's
    (``None``: the request's own code) :class:`Usage` of the loop, one per request."""
    for route, reqs in by_route(requests, ctx).items():
        if len(reqs) < min_requests:
            continue
        usages: dict[str | None, list[Usage]] = {}
        for req in reqs:
            for name, usage in loop_usage(req, StageTree(req)).items():
                usages.setdefault(name, []).append(usage)
        yield route, reqs, usages


class LoopUsageRule(ABC):
    """Base of the rules that judge each (route, stage)'s use of the loop: subclasses set
    ``min_requests`` and implement ``_check`` for one stage's usages on one route."""

    min_requests: int

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """Findings for every (route, stage) that ``_check`` flags."""
        index = LoopIndex.of(requests, ctx)
        out: list[Finding] = []
        for route, reqs, usages in usages_by_route(requests, ctx, self.min_requests):
            p50 = p50_latency(reqs)
            service = reqs[0].service
            for name, uses in usages.items():
                found = self._check(route, name, uses, p50, service, index, requests, ctx)
                if found is not None:
                    out.append(found)
        return out

    @abstractmethod
    def _check(self, route: str, name: str | None, uses: list[Usage], p50: float, service: str,
               index: LoopIndex, requests: Sequence[RequestRecord],
               ctx: RuleContext) -> Finding | None:  # fmt: skip
        """The finding for one stage (``name``; None: the request's own code) on ``route``."""


def _add(
    usage: Usage,
    cpu_ms: float,
    pieces: list[tuple[int, int]],
    max_block_ms: float | None,
    blocked_at: str | None,
) -> None:
    held = sum(b - a for a, b in pieces) / _MS
    longest = max((b - a for a, b in pieces), default=0) / _MS
    usage.cpu_ms += cpu_ms
    usage.held_ms += max(held, cpu_ms)
    usage.max_slice_ms = max(usage.max_slice_ms, longest)
    usage.max_block_ms = max(usage.max_block_ms, max_block_ms or 0.0, longest)
    usage.blocked_at = usage.blocked_at or blocked_at


@dataclass
class _Slice:
    start: int
    end: int
    index: int  # request index in the sample
    route: str
    stage: str | None


@dataclass
class LoopIndex:
    """Loop slices and loop waits of a sample, per service (see the module docstring).

    Attributes:
        blame_ns: (service, route, stage) -> ns that other requests waited for the loop
            while that stage held it.
        victims_ns: (service, route, stage) -> {route of the waiting requests: ns}.
        window_s: service -> seconds from its first request's start to its last one's end.
        requests: service -> requests in the sample.
    """

    blame_ns: dict[tuple[str, str, str | None], int] = field(default_factory=dict)
    victims_ns: dict[tuple[str, str, str | None], dict[str, int]] = field(default_factory=dict)
    window_s: dict[str, float] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    _slices: dict[str, list[_Slice]] = field(default_factory=dict)
    _ends: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, requests: Sequence[RequestRecord], ctx: RuleContext) -> LoopIndex:
        """The index of ``requests``, built once per sample and kept in ``ctx.cache``."""
        cached = ctx.cache.get("loop_index")
        if cached is not None and cached[0] is requests:
            index: LoopIndex = cached[1]
            return index
        index = cls._build(requests)
        ctx.cache["loop_index"] = (requests, index)
        return index

    @classmethod
    def _build(cls, requests: Sequence[RequestRecord]) -> LoopIndex:
        index = cls()
        waits: dict[str, list[tuple[int, int, int]]] = {}
        bounds: dict[str, tuple[int, int]] = {}
        for i, req in enumerate(requests):
            if not req.instrumented:
                continue
            service = req.service
            index.requests[service] = index.requests.get(service, 0) + 1
            lo, hi = bounds.get(service, (req.start_ns, req.end_ns))
            bounds[service] = (min(lo, req.start_ns), max(hi, req.end_ns))
            tree = StageTree(req)
            slices = index._slices.setdefault(service, [])
            for a, b in tree.own_slices(None, req):
                slices.append(_Slice(a, b, i, req.route, OWN))
            service_waits = waits.setdefault(service, [])
            service_waits.extend((a, b, i) for a, b in req.loop_waits)
            for stage in req.stages:
                for a, b in tree.own_slices(stage, req):
                    slices.append(_Slice(a, b, i, req.route, stage.name))
                service_waits.extend((a, b, i) for a, b in stage.loop_waits)
        for service, slices in index._slices.items():
            slices.sort(key=lambda s: s.start)
            index._ends[service] = _running_max([s.end for s in slices])
            lo, hi = bounds[service]
            index.window_s[service] = max(1e-9, (hi - lo) / 1e9)
            for a, b, who in waits.get(service, ()):
                victim = requests[who].route
                for piece, ns in index.overlapping(service, a, b, exclude=who):
                    key = (service, piece.route, piece.stage)
                    index.blame_ns[key] = index.blame_ns.get(key, 0) + ns
                    victims = index.victims_ns.setdefault(key, {})
                    victims[victim] = victims.get(victim, 0) + ns
        return index

    def overlapping(
        self, service: str, start: int, end: int, exclude: int | None = None
    ) -> list[tuple[_Slice, int]]:
        """Slices of ``service`` overlapping [start, end] (not of request ``exclude``),
        each with the overlap in ns."""
        slices = self._slices.get(service, [])
        ends = self._ends.get(service, [])
        out: list[tuple[_Slice, int]] = []
        # First slice whose running-max end passes ``start``; slices are sorted by start.
        i = bisect_right(ends, start)
        while i < len(slices) and slices[i].start < end:
            piece = slices[i]
            ns = min(end, piece.end) - max(start, piece.start)
            if ns > 0 and piece.index != exclude:
                out.append((piece, ns))
            i += 1
        return out

    def blame_ms_per_request(self, service: str, route: str, stage: str | None) -> float:
        """Mean ms each request of ``service`` waited for the loop because of this stage."""
        total = self.blame_ns.get((service, route, stage), 0) / _MS
        return total / max(1, self.requests.get(service, 1))

    def main_victim(self, service: str, route: str, stage: str | None) -> str:
        """The route whose requests waited longest for the loop while this stage held it
        (``route`` itself when nobody waited)."""
        victims = self.victims_ns.get((service, route, stage))
        return max(victims, key=lambda r: victims[r]) if victims else route

    def blame_ms_per_second(self, service: str, route: str, stage: str | None) -> float:
        """Ms of loop waiting this stage caused per second of trace."""
        total = self.blame_ns.get((service, route, stage), 0) / _MS
        return total / self.window_s.get(service, 1.0)


def _running_max(values: list[int]) -> list[int]:
    out: list[int] = []
    best = -(2**63)
    for value in values:
        best = max(best, value)
        out.append(best)
    return out


def victim_note(victim: str, route: str) -> str:
    """Evidence suffix when the projection is for another route than the finding's."""
    if victim == route:
        return ""
    return f"; mostly {victim}'s requests waited, so the projection is for {victim}"


def ms(value: float) -> str:
    """A duration for evidence text: ``38 ms``, ``4.2 ms``, ``0.35 ms``."""
    if value >= 10:
        return f"{value:.0f} ms"
    if value >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def finding(
    *,
    rule: str,
    route: str,
    stage: str | None,
    function: str | None,
    impact_ms: float,
    route_p50_ms: float,
    evidence: str,
    fix: tuple[str, str],
    requests: Sequence[RequestRecord],
    ctx: RuleContext,
    model: Fix | None,
    no_model_note: str | None = None,
) -> Finding:
    """Assemble a finding: project ``model`` through ``ctx.project`` and set the severity.

    Args:
        rule / route / stage / function / evidence: as in :class:`Finding`.
        impact_ms: the measured impact per request.
        route_p50_ms: the route's median latency, for the severity.
        fix: (title, code).
        requests: the whole sample (the projection replays all routes).
        ctx: the rule context.
        model: the :class:`Fix` that models the proposed code, or ``None``.
        no_model_note: the note when there is no model of the fix.

    Returns:
        The finding; its impact is the larger of the measured one and the projected p50 gain.
    """
    projection: dict[str, list[float]] | None = None
    note = no_model_note
    if model is not None and ctx.project is not None:
        projection, note = ctx.project(requests, model)
    if projection is not None:
        gain = projection["p50_ms"][0] - projection["p50_ms"][1]
        impact_ms = max(impact_ms, gain)
    return Finding(
        rule=rule,
        route=route,
        stage=stage,
        function=function,
        severity=severity_for(impact_ms, route_p50_ms),
        impact_ms=impact_ms,
        evidence=evidence,
        fix_title=fix[0],
        fix_code=fix[1],
        projection=projection,
        projection_note=None if projection is not None else note,
    )


def name_of(stage: str | None) -> str:
    """A stage name for text (the request's own code has none)."""
    return stage if stage is not None else "the request handler's own code"


def function_or(usage: Usage | None, fallback: str | None = None) -> str | None:
    """The function of a usage's stage, else ``fallback``."""
    return function_of(usage.stage) if usage is not None and usage.stage else fallback
