"""BEFORE's projections against the measured change: held, missed, wrong direction."""

from __future__ import annotations

import pytest

from tracekit.analysis.projection_check import check_finding, check_metric, unprojected
from tracekit.analysis.stats.confidence import Change


def measured(before: float, after: float, rel_ci: tuple[float, float] | None) -> Change:
    # A measured change with the given relative interval (the absolute one is not used).
    low, high = rel_ci if rel_ci is not None else (None, None)
    return Change(before, after, (500, 500), rel_low=low, rel_high=high)


def test_a_measured_change_inside_the_projected_range_held() -> None:
    # Projected p95 200 -> 160..180 (-20%..-10%); measured 210 -> 178 (-15.2%).
    check = check_metric("p95_ms", (200.0, 170.0), (160.0, 180.0), measured(210, 178, (-0.2, -0.1)))
    assert check.verdict == "held"
    assert check.expected == pytest.approx((-0.2, -0.1))
    assert check.missed_by is None


def test_a_point_projection_holds_when_the_interval_covers_it() -> None:
    # No range: the point -10% is inside the measured interval -12%..-4%.
    assert check_metric("p50_ms", (100.0, 90.0), None, measured(100, 92, (-0.12, -0.04))).verdict == "held"
    # Without a measured interval (too few requests) nothing is judged, even a point inside
    # the projected range or far from it: a point cannot tell a change from noise.
    check = check_metric("p50_ms", (100.0, 90.0), None, measured(100, 92, None))
    assert check.verdict == "inconclusive" and check.missed_by is None
    inside = check_metric("p95_ms", (240.0, 210.0), (200.0, 230.0), measured(241, 212, None))
    far = check_metric("p95_ms", (240.0, 210.0), (200.0, 230.0), measured(241, 300, None))
    assert inside.verdict == far.verdict == "inconclusive"


def test_a_smaller_gain_than_projected_missed_short() -> None:
    # Projected -40% (range -45%..-35%); measured -20% (-25%..-15%): short by 15 points.
    check = check_metric("p50_ms", (100.0, 60.0), (55.0, 65.0), measured(120, 96, (-0.25, -0.15)))
    assert check.verdict == "missed"
    assert check.missed_by == pytest.approx(0.15)
    assert check.short is True
    d = check.to_dict()
    assert d["missed_by_pct"] == pytest.approx(15.0) and d["short"] is True
    assert d["projected_change_pct"] == [pytest.approx(-45.0), pytest.approx(-35.0)]
    assert d["measured_change_pct"] == pytest.approx(-20.0)


def test_a_larger_gain_than_projected_missed_beyond() -> None:
    check = check_metric("p50_ms", (100.0, 90.0), None, measured(100, 50, (-0.55, -0.45)))
    assert (check.verdict, check.short) == ("missed", False)
    assert check.missed_by == pytest.approx(0.4)


def test_no_measured_change_misses_a_projected_gain() -> None:
    # The interval spans 0 but not the projection: short, not the wrong direction.
    check = check_metric("p95_ms", (100.0, 70.0), None, measured(100, 101, (-0.05, 0.07)))
    assert (check.verdict, check.short) == ("missed", True)


def test_a_significant_change_of_the_other_sign_is_the_wrong_direction() -> None:
    check = check_metric("p95_ms", (100.0, 80.0), (75.0, 85.0), measured(100, 110, (0.04, 0.16)))
    assert check.verdict == "wrong direction"
    assert check.missed_by == pytest.approx(0.25)  # +10% against the range's end, -15%
    # Throughput projected up, measured significantly down.
    rps = check_metric("throughput_rps", (40.0, 50.0), None, measured(40, 30, (-0.3, -0.2)))
    assert rps.verdict == "wrong direction"


def test_a_zero_before_cannot_be_checked() -> None:
    assert check_metric("p50_ms", (0.0, 0.0), None, measured(10, 9, (-0.2, 0.0))).verdict == "unmeasured"
    assert check_metric("p50_ms", (10.0, 9.0), None, measured(0, 0, None)).verdict == "unmeasured"


def test_a_finding_is_checked_on_each_metric_with_its_range_and_model() -> None:
    finding = {
        "rule": "cpu-on-loop", "stage": "tokenize", "severity": "high",
        "projection": {
            "p50_ms": [100.0, 80.0], "p95_ms": [200.0, 150.0], "throughput_rps": [40, 40],
            "range": {"p50_ms": [75.0, 85.0], "p95_ms": ["bad", 1]},
            "model": {"arrivals": "open"},
        },
    }  # fmt: skip
    changes = {
        "p50_ms": measured(100, 82, (-0.22, -0.14)),  # held: -25%..-15% overlaps
        "p95_ms": measured(200, 196, (-0.06, 0.02)),  # missed: the point -25%, no usable range
        "throughput_rps": measured(40, 40.4, (-0.05, 0.07)),  # inconclusive: no change, as projected
    }
    check = check_finding(finding, changes, still_found=True, selected=True)
    assert check.label == "cpu-on-loop:tokenize"
    assert [m.verdict for m in check.metrics] == ["held", "missed", "inconclusive"]
    assert check.metrics[1].range is None  # a malformed range is ignored, the point used
    assert check.verdict == "missed"
    d = check.to_dict()
    assert d["model"] == {"arrivals": "open"} and d["still_found"] is True
    assert d["selected"] is True and d["verdict"] == "missed" and d["projection_note"] is None
    changes["p95_ms"] = measured(200, 260, (0.2, 0.4))
    assert check_finding(finding, changes, still_found=False, selected=True).verdict == "wrong direction"
    none = check_finding({"rule": "gc-pauses", "projection": {}}, changes, still_found=False, selected=True)
    assert (none.metrics, none.verdict, none.label) == ([], "unmeasured", "gc-pauses")


def test_a_projection_is_confirmed_only_by_a_change_both_sides_see() -> None:
    # Two runs of the same code (an A/A pair, the new-user trial's): a projected range from
    # -13.7% to +11.4% and a measured -3.7% overlap, but nothing changed: not "held". Nor a
    # measured interval that includes no change; a change both see is.
    finding = {"rule": "cpu-on-loop", "stage": "guardrail", "severity": "medium",
               "projection": {"p50_ms": [100.0, 95.0], "range": {"p50_ms": [86.3, 111.4]}}}  # fmt: skip
    same = {"p50_ms": measured(100, 96.3, (-0.09, 0.02))}
    aa = check_finding(finding, same, still_found=True, selected=True)
    assert aa.verdict == "inconclusive" and aa.metrics[0].verdict == "inconclusive"
    narrow = {"rule": "cpu-on-loop", "stage": "guardrail", "severity": "medium",
              "projection": {"p50_ms": [100.0, 80.0], "range": {"p50_ms": [75.0, 85.0]}}}  # fmt: skip
    short_run = {"p50_ms": measured(100, 82, (-0.4, 0.05))}
    assert check_finding(narrow, short_run, still_found=True, selected=True).verdict == "inconclusive"
    seen = {"p50_ms": measured(100, 82, (-0.25, -0.1))}
    assert check_finding(narrow, seen, still_found=True, selected=True).verdict == "held"


def test_a_fix_that_was_not_made_is_not_judged() -> None:
    # The same projection and measurement as a "held": not the change made, nothing is
    # judged, in the check and in each metric (the JSON and the text say the same).
    finding = {"rule": "sequential-independent", "stage": "guardrail", "severity": "low",
               "projection": {"p50_ms": [100.0, 90.0], "p95_ms": [200.0, 180.0]}}  # fmt: skip
    changes = {"p50_ms": measured(100, 91, (-0.15, -0.03)), "p95_ms": measured(200, 182, (-0.2, 0.0))}
    assert check_finding(finding, changes, still_found=True, selected=True).verdict == "held"
    other = check_finding(finding, changes, still_found=True, selected=False)
    assert other.verdict == "not the change made"
    assert [m.verdict for m in other.metrics] == ["not the change made"] * 2
    assert all(m.missed_by is None and m.short is None for m in other.metrics)
    d = other.to_dict()
    assert d["verdict"] == "not the change made" and d["selected"] is False
    assert [m["verdict"] for m in d["metrics"]] == ["not the change made"] * 2
    # Its figures are kept: the projected change and the measured one.
    assert d["metrics"][0]["projected_change_pct"] == [pytest.approx(-10.0)] * 2
    assert d["metrics"][0]["measured_change_pct"] == pytest.approx(-9.0)


def test_the_change_made_without_a_projection_says_why() -> None:
    finding = {"rule": "stream-stall", "stage": "model", "severity": "medium", "projection": None,
               "projection_note": "the model server's scheduling is outside the replay model"}  # fmt: skip
    check = unprojected(finding, still_found=False)
    assert (check.selected, check.verdict, check.metrics) == (True, "no projection", [])
    d = check.to_dict()
    assert d["verdict"] == "no projection" and d["metrics"] == []
    assert d["projection_note"] == "the model server's scheduling is outside the replay model"
