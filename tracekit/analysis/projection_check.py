"""BEFORE's projections checked against the measured change (``tracekit compare``).

A finding's ``projection`` (``tracekit.report/1``) gives, per metric (``p50_ms``, ``p95_ms``,
``throughput_rps``), ``[before, after]`` from the replay, and may give ``range[metric] =
[low, high]``: the interval the after value is projected in. Changes are compared relative to
each side's own before: the replay's before for the projection, the measured BEFORE for the
measurement (the replay runs on a sample and models the loop, so its before differs a little
from the measured one; the relative change is what it projects).

Verdicts, per metric (:data:`VERDICTS`):

- ``held``: the measured change's confidence interval overlaps the projected change (its
  range, else its point), and both exclude no change: a change happened, as projected;
- ``inconclusive``: they overlap, but the projected range or the measured interval includes
  no change (zero): the pair cannot confirm the projection (two runs of the same code, or a
  run too short to tell, would "hold" any wide projection);
- ``wrong direction``: the projected change is one side of zero (all of its range) and the
  measured interval lies wholly on the other side;
- ``missed``: otherwise, by the gap between the measured change and the nearest end of the
  projected change, in percent of BEFORE, and ``short`` (a smaller change than projected, in
  the projected direction or none) or ``beyond`` (a larger one);
- ``unmeasured``: no measured change (a side without that value, or a zero before).

Without a measured interval (too few requests: the measured change's ``note`` says how many
it needs) the verdict is ``inconclusive``: a point cannot tell a change from noise. A
finding's verdict is ``wrong direction`` if any metric's is, else ``missed`` if any metric's
is, else ``held`` if any metric's is, else ``inconclusive`` if any metric's is, else
``unmeasured``.

Only the change made is judged. A finding that is not (``selected`` false) gets ``not the
change made`` as its verdict and each metric's: its figures are kept, but measured against
another fix a "held" says nothing (two wide intervals overlap) and would read as a claim.
The change made without a projection (``--finding`` naming a finding whose replay declined)
gets ``no projection``, with the finding's note saying why, and no metrics: the measured
change is the route's table (and the stage's, ``stage_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracekit.analysis.stats.confidence import Change

__all__ = ["METRICS", "VERDICTS", "MetricCheck", "ProjectionCheck", "check_finding", "unprojected"]

#: The projection's metrics, in the order they are checked and shown.
METRICS = ("p50_ms", "p95_ms", "throughput_rps")
HELD, WRONG, MISSED, UNMEASURED = "held", "wrong direction", "missed", "unmeasured"
INCONCLUSIVE = "inconclusive"
NOT_MADE, NO_PROJECTION = "not the change made", "no projection"
VERDICTS = (HELD, INCONCLUSIVE, MISSED, WRONG, UNMEASURED, NOT_MADE, NO_PROJECTION)


@dataclass
class MetricCheck:
    """One metric of one projection, checked.

    Attributes:
        metric: ``p50_ms``, ``p95_ms`` or ``throughput_rps``.
        projected: the replay's ``(before, after)``.
        range: the projected after's ``(low, high)``, or ``None`` (the point is used).
        expected: the projected relative change ``(low, high)`` (after / before - 1), or
            ``None`` when the projected before is not positive.
        measured: the measured change.
        verdict: one of :data:`VERDICTS`.
        missed_by: for ``missed`` and ``wrong direction``: the gap, relative to BEFORE.
        short: for ``missed``: whether the measured change fell short of the projected one.
    """

    metric: str
    projected: tuple[float, float]
    range: tuple[float, float] | None
    expected: tuple[float, float] | None
    measured: Change
    verdict: str
    missed_by: float | None = None
    short: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``projections[].metrics[]`` item of ``tracekit.compare/1``."""
        m = self.measured
        return {
            "metric": self.metric,
            "projected": list(self.projected),
            "range": None if self.range is None else list(self.range),
            "projected_change_pct": None if self.expected is None else [100 * e for e in self.expected],
            "measured": [m.before, m.after],
            "measured_change_pct": None if m.relative is None else 100 * m.relative,
            "measured_ci_pct": _percent(m.rel_low, m.rel_high),
            "verdict": self.verdict,
            "missed_by_pct": None if self.missed_by is None else 100 * self.missed_by,
            "short": self.short,
        }


@dataclass
class ProjectionCheck:
    """One of BEFORE's projected findings, checked against the measured change.

    Attributes:
        rule / stage / severity: the finding's.
        selected: this is the change made (``--finding``, or the route's top projection).
        still_found: AFTER has a finding of the same rule on the same route and stage.
        model: the projection's ``model`` object (the replay's assumptions), if it has one.
        metrics: the checked metrics, in :data:`METRICS` order (none without a projection).
        projected: the finding has a projection.
        note: without one, why (the finding's ``projection_note``).
        stage_ms: the change made's stage, measured: its mean wall ms per request (set by
            ``compare`` for the selected finding of a stage), else ``None``.
        route: the route the projection's figures are for, where it is not the finding's
            own (a fix to one route's stage projected for the route whose requests waited),
            else ``None``; its measured change is the one checked.
    """

    rule: str
    stage: str | None
    severity: str
    selected: bool
    still_found: bool
    model: Any
    metrics: list[MetricCheck]
    projected: bool = True
    note: str | None = None
    stage_ms: Change | None = None
    route: str | None = None

    @property
    def label(self) -> str:
        """``RULE`` or ``RULE:STAGE``, as ``--finding`` takes it."""
        return self.rule if self.stage is None else f"{self.rule}:{self.stage}"

    @property
    def verdict(self) -> str:
        """The finding's verdict (module docstring)."""
        if not self.selected:
            return NOT_MADE
        if not self.projected:
            return NO_PROJECTION
        verdicts = {m.verdict for m in self.metrics}
        for verdict in (WRONG, MISSED, HELD, INCONCLUSIVE):
            if verdict in verdicts:
                return verdict
        return UNMEASURED

    def to_dict(self) -> dict[str, Any]:
        """The ``projections[]`` item of ``tracekit.compare/1``."""
        return {
            "rule": self.rule,
            "stage": self.stage,
            "severity": self.severity,
            "selected": self.selected,
            "verdict": self.verdict,
            "still_found": self.still_found,
            "model": self.model,
            "projection_note": self.note,
            "projected_route": self.route,
            "stage_ms": None if self.stage_ms is None else self.stage_ms.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
        }


def check_finding(
    finding: Mapping[str, Any],
    measured: Mapping[str, Change],
    *,
    still_found: bool,
    selected: bool,
) -> ProjectionCheck:
    """Check one finding's projection against the measured changes.

    Args:
        finding: a ``findings[]`` item of a ``tracekit.report/1`` report, with a projection.
        measured: the measured change of each metric of :data:`METRICS`.
        still_found: whether AFTER still has the finding.
        selected: whether it is the change made; if not, nothing is judged (every verdict
            is ``not the change made``).

    Returns:
        The check.
    """
    projection = finding.get("projection")
    projection = projection if isinstance(projection, Mapping) else {}
    ranges = projection.get("range")
    ranges = ranges if isinstance(ranges, Mapping) else {}
    metrics = []
    for metric in METRICS:
        pair = _pair(projection.get(metric))
        change = measured.get(metric)
        if pair is not None and change is not None:
            range_ = _pair(ranges.get(metric))
            if selected:
                metrics.append(check_metric(metric, pair, range_, change))
            else:
                metrics.append(MetricCheck(metric, pair, range_, _expected(pair, range_), change, NOT_MADE))
    stage = finding.get("stage")
    return ProjectionCheck(
        rule=str(finding.get("rule")),
        stage=None if stage is None else str(stage),
        severity=str(finding.get("severity")),
        selected=selected,
        still_found=still_found,
        model=projection.get("model"),
        metrics=metrics,
    )


def unprojected(finding: Mapping[str, Any], *, still_found: bool) -> ProjectionCheck:
    """The change made when its finding has no projection: nothing to check, and why.

    Args:
        finding: a ``findings[]`` item without a projection.
        still_found: whether AFTER still has the finding.
    """
    stage, note = finding.get("stage"), finding.get("projection_note")
    return ProjectionCheck(
        rule=str(finding.get("rule")),
        stage=None if stage is None else str(stage),
        severity=str(finding.get("severity")),
        selected=True,
        still_found=still_found,
        model=None,
        metrics=[],
        projected=False,
        note=str(note) if note else "the report gives no reason",
    )


def check_metric(
    metric: str,
    projected: tuple[float, float],
    range_: tuple[float, float] | None,
    measured: Change,
) -> MetricCheck:
    """Check one projected metric (see the module docstring for the verdicts).

    Args:
        metric: its name.
        projected: the replay's ``(before, after)``.
        range_: the projected after's ``(low, high)``, or ``None``.
        measured: the measured change.

    Returns:
        The :class:`MetricCheck`.
    """
    expected = _expected(projected, range_)
    m = measured.relative
    if expected is None or m is None:
        return MetricCheck(metric, projected, range_, expected, measured, UNMEASURED)
    if measured.rel_low is None or measured.rel_high is None:
        # A point is no measurement of a change: "held" on the one figure without an
        # interval (the demo's p95 at 40 requests) read as success beside an inconclusive p50.
        return MetricCheck(metric, projected, range_, expected, measured, INCONCLUSIVE)
    m_low, m_high = measured.rel_low, measured.rel_high
    e_low, e_high = expected
    if m_low <= e_high and e_low <= m_high:
        # Only a change both sides see confirms the projection (module docstring).
        confirmed = not (e_low <= 0 <= e_high or m_low <= 0 <= m_high)
        return MetricCheck(metric, projected, range_, expected, measured, HELD if confirmed else INCONCLUSIVE)
    gap = e_low - m if m < e_low else m - e_high
    if (e_low > 0 and m_high < 0) or (e_high < 0 and m_low > 0):
        return MetricCheck(metric, projected, range_, expected, measured, WRONG, gap)
    # Short: the measured change lies between zero and the projection, or on the far side of
    # zero from it; beyond: past the projection, away from zero.
    toward = e_low if e_low > 0 else e_high if e_high < 0 else 0.0
    short = (m < e_low and toward > 0) or (m > e_high and toward < 0)
    return MetricCheck(metric, projected, range_, expected, measured, MISSED, gap, short)


def _expected(
    projected: tuple[float, float], range_: tuple[float, float] | None
) -> tuple[float, float] | None:
    # The projected relative change (its range's, else the point's), None without a before.
    base, point = projected
    low, high = sorted(range_) if range_ is not None else (point, point)
    return (low / base - 1, high / base - 1) if base > 0 else None


def _percent(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [100 * low, 100 * high]


def _pair(value: Any) -> tuple[float, float] | None:
    # A [number, number] pair of finite numbers, else None (a report read from a file).
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    a, b = value
    for x in (a, b):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return None
    return float(a), float(b)
