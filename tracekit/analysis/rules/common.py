"""What several rules need: per-route groups, per-stage usage of the loop and who held it
when (:mod:`tracekit.analysis.rules.loop_index`), and assembling a finding."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules.findings import Finding, RuleContext, assess_severity
from tracekit.analysis.rules.loop_index import OWN, LoopIndex, Usage, loop_usage

__all__ = [
    "OWN",
    "LoopIndex",
    "LoopUsageRule",
    "Usage",
    "by_route",
    "finding",
    "loop_usage",
    "ms",
    "name_of",
    "named",
    "p50_latency",
    "usages_by_route",
    "victim_note",
]


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


def usages_by_route(
    requests: Sequence[RequestRecord], ctx: RuleContext, min_requests: int
) -> Iterator[tuple[str, list[RequestRecord], dict[str | None, list[Usage]]]]:
    """Per route with at least ``min_requests`` requests: the requests, and each stage's
    (``None``: the request's own code) :class:`Usage` of the loop, one per request (from
    the sample's :class:`LoopIndex`, computed once for every rule)."""
    index = LoopIndex.of(requests, ctx)
    for route, reqs in by_route(requests, ctx).items():
        if len(reqs) >= min_requests:
            yield route, reqs, index.usages.get(route, {})


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
    caused_by: tuple[tuple[str, str, str | None], ...] = (),
    folded: str | None = None,
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
        caused_by / folded: when the finding is a symptom, the findings that would be its
            cause and the clause their evidence gains (``rules/folding.py``).

    Returns:
        The finding; its impact is the larger of the measured one and the projected p50 gain.
    """
    projection: dict[str, Any] | None = None
    note = no_model_note
    if model is not None and ctx.project is not None:
        projection, note = ctx.project(requests, model)
    if projection is not None:
        gain = projection["p50_ms"][0] - projection["p50_ms"][1]
        impact_ms = max(impact_ms, gain)
    severity, reason = assess_severity(impact_ms, route_p50_ms, projection)
    return Finding(
        rule=rule,
        route=route,
        stage=stage,
        function=function,
        severity=severity, severity_reason=reason,
        impact_ms=impact_ms,
        evidence=evidence,
        fix_title=fix[0],
        fix_code=fix[1],
        projection=projection,
        projection_note=None if projection is not None else note,
        caused_by=caused_by,
        folded=folded,
    )


def name_of(stage: str | None) -> str:
    """A stage name for text (the request's own code has none)."""
    return stage if stage is not None else "the request handler's own code"


def named(role: str, stage: str) -> str:
    """A stage in a role, without saying the name twice: ``named("input guardrail",
    "guardrail")`` is "the input guardrail", ``named("input guardrail", "pii_check")`` "the
    input guardrail pii_check", ``named("input guardrail", "safety_guardrail")``
    "safety_guardrail (the input guardrail)".

    Args:
        role: what the stage is here, in words ("input guardrail", "model call").
        stage: the stage name.
    """
    words = set(role.lower().split())
    said = set(re.split(r"[\W_]+", stage.lower())) - {""}
    if said and said <= words:
        return f"the {role}"
    if said & words:
        return f"{stage} (the {role})"
    return f"the {role} {stage}"
