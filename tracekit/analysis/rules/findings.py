"""Findings as data: what a rule found, the fix it proposes, and the projected gain.

A rule (``tracekit.analysis.rules``) reads the request sample and returns :class:`Finding`
objects; renderers only read :meth:`Finding.to_dict`. A finding's projection comes from the
replay model (``tracekit.analysis.replay``) through :attr:`RuleContext.project`, with the
replay's :class:`~tracekit.analysis.replay.Fix` that says which transformation of the
recorded requests the proposed code corresponds to.

Severity (report contract): ``high`` when the impact is at least 20% of the route's p50
latency or at least 50 ms, ``medium`` at least 5%, else ``low``. With a projection, the
impact is the projected gain, the weaker of the p50's and the p95's, each measured against
its own before; a gain at or below zero, or within the projection's range (the after's
range reaches the before), counts as none: ``low``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracekit.errors import ConfigurationError

if TYPE_CHECKING:  # types only: the renderers import the severities without the replay
    from collections.abc import Callable

    from tracekit.analysis.model import RequestRecord
    from tracekit.analysis.replay import Fix
    from tracekit.analysis.stats.loop_windows import LoopWindows

    #: ``project(requests, fix) -> (projection dict | None, note | None)``.
    ProjectFn = Callable[[Sequence[RequestRecord], Fix], tuple[dict[str, Any] | None, str | None]]

#: Severities, most severe first: the order reports list findings in and the choices of
#: ``tracekit analyze --fail-on``.
SEVERITIES = ("high", "medium", "low")
_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}

#: Severity thresholds (report contract): fraction of the route's p50, and absolute ms.
HIGH_FRACTION = 0.20
HIGH_MS = 50.0
MEDIUM_FRACTION = 0.05


def severity_rank(severity: object) -> int:
    """Where ``severity`` sorts: 0 for ``"high"``, ..., ``len(SEVERITIES)`` for anything else.

    Args:
        severity: a severity, or any value read from a report (unknown values sort last).
    """
    return _RANK.get(severity, len(SEVERITIES)) if isinstance(severity, str) else len(SEVERITIES)


def severity_at_least(severity: str, threshold: str) -> bool:
    """Whether ``severity`` is at or above ``threshold``.

    Args:
        severity: one of :data:`SEVERITIES`.
        threshold: one of :data:`SEVERITIES`.

    Returns:
        ``True`` when ``severity`` ranks at least as high as ``threshold``.

    Raises:
        ConfigurationError: either value is not a known severity.
    """
    for value in (severity, threshold):
        if value not in _RANK:
            raise ConfigurationError(
                f"unknown severity {value!r}; expected one of {', '.join(SEVERITIES)}"
            )
    return _RANK[severity] <= _RANK[threshold]


def worst_severity(severities: Iterable[object]) -> str | None:
    """The most severe of ``severities``, or ``None`` when none is a known severity."""
    rank = min(map(severity_rank, severities), default=len(SEVERITIES))
    return SEVERITIES[rank] if rank < len(SEVERITIES) else None


def finding_order(finding: Finding) -> tuple[int, float]:
    """Sort key of findings: most severe first, then the larger impact first."""
    return severity_rank(finding.severity), -finding.impact_ms


def severity_for(
    impact_ms: float, route_p50_ms: float | None, projection: Mapping[str, Any] | None = None
) -> str:
    """The severity of a finding: from its projection when it has one, else from its
    measured impact (report contract thresholds); :func:`assess_severity` without the reason.

    Args:
        impact_ms: the measured latency the defect costs, per request.
        route_p50_ms: the route's median latency; ``None`` or 0 when unknown.
        projection: the finding's projection (``p50_ms`` / ``p95_ms`` as ``[before, after]``,
            and the after's ``range`` when known), or ``None``.

    Returns:
        ``"high"``, ``"medium"`` or ``"low"``; never above ``"low"`` when the projected gain
        is at or below zero or within the projection's range.
    """
    return assess_severity(impact_ms, route_p50_ms, projection)[0]


def assess_severity(
    impact_ms: float, route_p50_ms: float | None, projection: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """The severity of a finding and why, in words (the report's ``severity_reason``).

    With a projection: the weaker of the p50's and the p95's projected gain, each against its
    own before (a fix rated high helps the median and the tail), e.g. ``"projected p95 -12%
    (-40 ms, range -31 to +2%): the range reaches the before"``. Without: the measured impact against
    the route's p50, e.g. ``"measured 38 ms per request, 38% of the route's p50 (no
    projection)"``.

    Args: as :func:`severity_for`.

    Returns:
        ``(severity, reason)``.
    """
    if projection is not None:
        return _projected_severity(projection)
    severity = _severity(impact_ms, route_p50_ms)
    share = f", {_share(impact_ms, route_p50_ms)} of the route's p50" if route_p50_ms else ""
    return severity, f"measured {_ms(impact_ms)} per request{share} (no projection)"


def _projected_severity(projection: Mapping[str, Any]) -> tuple[str, str]:
    # The weaker of the p50's and the p95's: a fix rated high helps the median and the tail.
    spread = projection.get("range")
    rank, reason = -1, ""
    for key in ("p50_ms", "p95_ms"):
        pair = projection.get(key)
        if not isinstance(pair, Sequence) or len(pair) != 2:
            return "low", f"the projection has no {key[:3]}"
        before, after = float(pair[0]), float(pair[1])
        gain = before - after
        change = _pct(after, before)
        bounds = spread.get(key) if isinstance(spread, Mapping) else None
        said = f"projected {key[:3]} {change} ({_ms(after - before, signed=True)}"
        if isinstance(bounds, Sequence) and len(bounds) == 2:
            low, high = sorted((float(bounds[0]), float(bounds[1])))
            said += f", range {_pct(low, before).rstrip('%')} to {_pct(high, before)})"
            if high >= before and gain > 0:
                gain = 0.0  # the after's range reaches the before: within noise
                said += ": the range reaches the before"
        else:
            said += ")"
        if gain <= 0 and "reaches" not in said:
            said += ": no gain"
        this = _RANK[_severity(gain, before)]
        if this > rank:  # the weaker figure decides (ties: the p50, named first)
            rank, reason = this, said
    return SEVERITIES[rank], reason


def _pct(value: float, base: float) -> str:
    return f"{100 * (value / base - 1):+.0f}%" if base > 0 else "-"


def _share(impact_ms: float, base_ms: float | None) -> str:
    return f"{100 * impact_ms / base_ms:.0f}%" if base_ms else "-"


def _ms(value: float, *, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{value:{sign}.1f} ms" if abs(value) < 10 else f"{value:{sign}.0f} ms"


def _severity(impact_ms: float, base_ms: float | None) -> str:
    if impact_ms <= 0:
        return "low"
    if impact_ms >= HIGH_MS:
        return "high"
    if base_ms and base_ms > 0:
        share = impact_ms / base_ms
        if share >= HIGH_FRACTION:
            return "high"
        if share >= MEDIUM_FRACTION:
            return "medium"
    return "low"


@dataclass
class RuleContext:
    """What every rule gets besides the requests.

    Attributes:
        route: report findings for this route only (the replay still uses every route:
            they share the event loop).
        project: the replay's ``project(requests, fix)`` (a
            :meth:`tracekit.analysis.replay.Replayer.project`, which caches its baseline
            replays per request sample); ``None``: findings carry no projection.
        routes: the aggregator's route statistics, if the caller has them (unused by the
            rules, which compute what they need from the sample).
        slo: the SLO targets, if any (informational).
        cache: per-sample memo shared by the rules (e.g. the event-loop index).
        loops: the event loops' windows
            (:class:`~tracekit.analysis.stats.loop_windows.LoopWindows`) when the traces had
            ``tracekit.loop`` spans; the loop rules need them, the others ignore them.
        statement: the replay's model statement of a route's service (``statement(route)``:
            its arrivals, clients, cores, the host's other load; a
            :meth:`tracekit.analysis.replay.Replayer.statement`), for models other than the
            replay that need the same reading; ``None``: not known.
    """

    route: str | None = None
    project: ProjectFn | None = None
    routes: list[dict[str, Any]] | None = None
    slo: Any = None
    cache: dict[str, Any] = field(default_factory=dict, repr=False)
    loops: LoopWindows | None = None
    statement: Callable[[str], dict[str, Any] | None] | None = None


@dataclass
class Finding:
    """One defect on one route, with its evidence, fix and projected gain.

    Attributes:
        rule: the rule id (``cpu-on-loop``, ...).
        route: the route it was found on.
        stage: the stage name, or ``None`` for the request's own code / the whole route.
        function: ``code.namespace + "." + code.function`` of the stage, when known.
        severity: ``"high"``, ``"medium"`` or ``"low"`` (:func:`severity_for`).
        severity_reason: why, in words (:func:`assess_severity`), or ``None`` (a finding
            read from an older report).
        impact_ms: the latency the defect costs per request, measured (or projected).
        evidence: one sentence with the numbers that show it.
        fix_title: what to change, in a line.
        fix_code: the change, as code written for this stage.
        projection: ``{"p50_ms": [before, after], "p95_ms": [...], "throughput_rps": [...],
            "range": {...}, "model": {...}}`` from the replay (``docs/analyzer.md``), or
            ``None``.
        projection_note: why there is no projection (``None`` when there is one).
        explains: rule ids of the symptoms this finding's cause also explains (folded in).
        caused_by: (rule, route, stage) of the findings that would explain this one.
        folded: the clause a cause's evidence gains when this finding is folded into it.
    """

    rule: str
    route: str
    stage: str | None
    function: str | None
    severity: str
    impact_ms: float
    evidence: str
    fix_title: str
    fix_code: str
    projection: dict[str, Any] | None = None
    projection_note: str | None = None
    severity_reason: str | None = None
    #: Symptom folding (``rules/folding.py``): the rule ids of the symptoms folded into this
    #: finding (reported); the findings that would explain this one, most likely first, as
    #: (rule, route, stage), and the clause their evidence gains (not reported).
    explains: list[str] = field(default_factory=list)
    caused_by: tuple[tuple[str, str, str | None], ...] = ()
    folded: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report contract's ``findings[]`` item (``fix`` as ``{"title", "code"}``)."""
        return {
            "rule": self.rule,
            "route": self.route,
            "stage": self.stage,
            "function": self.function,
            "severity": self.severity,
            "severity_reason": self.severity_reason,
            "impact_ms": round(self.impact_ms, 3),
            "evidence": self.evidence,
            "fix": {"title": self.fix_title, "code": self.fix_code},
            "projection": self.projection,
            "projection_note": self.projection_note,
            "explains": list(self.explains),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Rebuild a finding from :meth:`to_dict` output (missing keys get defaults).

        Args:
            data: a ``findings[]`` item of a ``tracekit.report/1`` report.

        Returns:
            The finding.

        Raises:
            ConfigurationError: ``data`` is not a mapping, or has no ``rule``.
        """
        if not isinstance(data, Mapping) or not data.get("rule"):
            raise ConfigurationError("a finding needs at least a 'rule' key")
        fix = data.get("fix")
        fix = fix if isinstance(fix, Mapping) else {}
        severity = str(data.get("severity", "low"))
        projection = data.get("projection")
        return cls(
            rule=str(data["rule"]),
            route=str(data.get("route", "")),
            stage=_opt_str(data.get("stage")),
            function=_opt_str(data.get("function")),
            severity=severity if severity in _RANK else "low",
            impact_ms=float(data.get("impact_ms") or 0.0),
            evidence=str(data.get("evidence", "")),
            fix_title=str(fix.get("title", "")),
            fix_code=str(fix.get("code", "")),
            projection=dict(projection) if isinstance(projection, Mapping) else None,
            projection_note=_opt_str(data.get("projection_note")),
            severity_reason=_opt_str(data.get("severity_reason")),
            explains=[str(r) for r in data.get("explains") or [] if isinstance(r, str)],
        )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
