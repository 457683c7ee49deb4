"""The comparison for a terminal: the table, the verdicts, escapes, plain ASCII."""

from __future__ import annotations

from tracekit.analysis.compare import Comparison, RouteComparison, Side
from tracekit.analysis.projection_check import check_finding
from tracekit.analysis.stats.confidence import Change
from tracekit.render.compare_text import render_comparison


def comparison(route: str = "POST /v1/chat") -> Comparison:
    p50 = Change(100.0, 80.0, (600, 600), -25.0, -15.0, -0.25, -0.15)
    p95 = Change(200.0, 204.0, (600, 600), -6.0, 14.0, -0.03, 0.07)
    p99 = Change(300.0, 290.0, (600, 600), note="a p99 interval needs 500 values a side")
    rps = Change(40.0, 40.2, (600, 600), -1.0, 1.4, -0.025, 0.035)
    zero = Change(0.0, 0.0, (600, 600), 0.0, 0.0)
    finding = {"rule": "cpu-on-loop", "stage": "tokenize", "severity": "high",
               "projection": {"p50_ms": [100, 60], "p95_ms": [200, 150]}}  # fmt: skip
    check = check_finding(finding, {"p50_ms": p50, "p95_ms": p95, "throughput_rps": rps},
                          still_found=False, selected=True)  # fmt: skip
    check.stage_ms = p50
    compared = RouteComparison(
        route=route, requests=(600, 600), errors=(0, 2),
        latency={"p50": p50, "p95": p95, "p99": p99}, throughput=rps, streaming=None,
        breakdown={"cpu_on_loop": p50, "gc": zero}, projections=[check],
    )  # fmt: skip
    return Comparison(
        before=Side("before.jsonl", 600, [route]), after=Side("after.jsonl", 600, [route]),
        routes=[compared], only_before=["GET /health"], only_after=[], confidence=0.95,
        draws=2000, seed=0,
    )  # fmt: skip


def test_the_table_and_the_verdicts() -> None:
    text = render_comparison(comparison(), width=100, color=False, unicode=True)
    lines = text.splitlines()
    assert lines[0] == "tracekit compare · 95% confidence intervals"
    assert "  600 → 600 requests · 0 → 2 errors" in lines
    row = next(line for line in lines if line.lstrip().startswith("latency p50 ms"))
    assert row.split() == ["latency", "p50", "ms", "100", "80.0", "-20.0", "(-20.0%)", "[-25.0,", "-15.0]"]
    assert any("latency p95 ms" in line and "no significant change" in line for line in lines)
    assert "(a p99 interval needs 500 values a side)" in text
    assert not any(line.lstrip().startswith("gc ") for line in lines)  # zero in both runs
    assert "  → cpu-on-loop · tokenize · selected · missed · not found in after" in lines
    # p50: projected -40%, measured -20%: short by 20 points of BEFORE. Each change with the
    # values it is from: the replay's before (the recording replayed) is not the measured one.
    words = " ".join(text.split())  # the lines wrap at 100 columns
    assert ("p50 projected -40.0% (replayed 100 → 60.0 ms), measured -20.0% [-25.0%, -15.0%] "
            "(100 → 80.0 ms): missed by 20.0% (short)") in words  # fmt: skip
    assert ("p95 projected -25.0% (replayed 200 → 150 ms), measured +2.0% [-3.0%, +7.0%] "
            "(200 → 204 ms): missed by 27.0% (short)") in words  # fmt: skip
    stage = next(line for line in lines if "stage ms/request" in line)
    assert stage.split()[2:6] == ["100", "80.0", "-20.0", "(-20.0%)"]
    assert lines[-1] == "Only in before: GET /health"


def test_trace_text_is_escaped_and_ascii_and_colour_follow_the_stream() -> None:
    text = render_comparison(comparison("GET /\x1b[2J\u202e"), width=80, color=False, unicode=False)
    assert "\x1b" not in text and "\u202e" not in text
    assert "GET /\\x1b[2J\\u202e" in text
    assert "->" in text and "·" not in text and "→" not in text
    coloured = render_comparison(comparison(), width=80, color=True, unicode=True)
    assert "\x1b[33m" in coloured  # missed, in yellow


def test_the_text_shows_the_verdicts_the_comparison_gives() -> None:
    # The renderer prints each check's own verdict: an unselected finding's is "not the
    # change made" (no metric lines), a change made without a projection says why.
    data = comparison().to_dict()
    [route] = data["routes"]
    made = route["projections"][0]
    other = {**made, "rule": "sequential-independent", "stage": "guardrail", "selected": False,
             "verdict": "not the change made", "stage_ms": None,
             "metrics": [{**m, "verdict": "not the change made"} for m in made["metrics"]]}  # fmt: skip
    route["projections"] = [other, made]
    text = render_comparison(data, width=100, color=False, unicode=True)
    lines = text.splitlines()
    assert "    sequential-independent · guardrail · not the change made · not found in after" in lines
    assert sum(line.lstrip().startswith(("p50 ", "p95 ", "rps ")) for line in lines) == 2  # made's
    route["projections"] = [{**made, "verdict": "no projection", "metrics": [],
                             "projection_note": "the replay could not reproduce this route"}]  # fmt: skip
    text = render_comparison(data, width=60, color=False, unicode=True)
    assert "  → cpu-on-loop · tokenize · selected · no projection · not found in after" in text
    said = " ".join(text.split())
    assert "no projection: the replay could not reproduce this route; the measured change only" in said
    lines = text.splitlines()
    at = lines.index("      no projection: the replay could not reproduce this")  # wrapped at 60
    assert lines[at + 1] == "        route; the measured change only"


def test_a_route_without_a_projection_says_there_is_nothing_to_check() -> None:
    data = comparison().to_dict()
    data["routes"][0]["projections"] = []
    words = " ".join(render_comparison(data, width=80, color=False, unicode=True).split())
    assert "projected vs measured: nothing to check: before has no projected finding on this route" in words


def test_what_got_worse_is_said_whatever_the_verdict_and_tiny_routes_take_a_line() -> None:
    # A new user's fix: p50 held as projected, but the stream's first token came later.
    data = comparison().to_dict()
    [route] = data["routes"]
    slower = Change(90.0, 164.0, (100, 100), 50.0, 95.0, 0.55, 1.05).to_dict()
    route["streaming"] = {"ttft_ms": {"p50": slower}, "itl_ms": {}}
    route["throughput_rps"] = Change(40.0, 30.0, (600, 600), -12.0, -8.0, -0.3, -0.2).to_dict()
    probe = {**route, "route": "GET /docs", "requests": [1, 1], "projections": []}
    data["routes"].append(probe)
    text = render_comparison(data, width=100, color=False, unicode=True)
    words = " ".join(text.split())
    assert "significantly worse after: throughput -25.0%, TTFT p50 +82.2%" in words
    assert (
        "GET /docs\n" not in text
        and "Too few requests to compare (under 5 a side, nothing projected): GET /docs (1→1)" in words
    )
    # Nothing worse: no such line.
    assert "worse" not in render_comparison(comparison(), width=100, color=False, unicode=True)


def test_a_change_from_what_shows_as_nothing_is_not_a_percentage() -> None:
    # A new user's process pool: CPU off the loop 0.00004 -> 14.0 ms read "+340353.9%".
    data = comparison().to_dict()
    [route] = data["routes"]
    route["breakdown_ms"]["cpu_off_loop"] = Change(0.00004, 14.0, (200, 200), 13.8, 14.1).to_dict()
    text = render_comparison(data, width=100, color=False, unicode=True)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("cpu off loop"))
    assert row.split() == ["cpu", "off", "loop", "0.00", "14.0", "+14.0", "(from", "~0)", "[+13.8,", "+14.1]"]


def test_model_wait_rising_as_loop_wait_falls_on_a_stream_is_explained() -> None:
    # A new user's fix freed the loop: the model server's own times did not move, but the
    # streamed replies' model wait rose by 21 ms as their loop wait fell by 34.
    data = comparison().to_dict()
    [route] = data["routes"]
    route["breakdown_ms"]["model_wait"] = Change(94.6, 115.4, (200, 200), 11.7, 30.0).to_dict()
    route["breakdown_ms"]["loop_wait"] = Change(53.0, 19.1, (200, 200), -41.6, -26.2).to_dict()
    note = "(model wait rose as loop wait fell: a streamed chunk that arrived while the loop was busy"
    plain = render_comparison(data, width=100, color=False, unicode=True)
    assert note not in " ".join(plain.split())  # not streamed: the note would not apply
    route["streaming"] = {"ttft_ms": {}, "itl_ms": {}}
    words = " ".join(render_comparison(data, width=100, color=False, unicode=True).split())
    assert note in words and "the report's TPOT is its pace)" in words
