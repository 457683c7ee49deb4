"""The budget logic behind the pytest marker, on request records built by hand (exact figures)."""

from __future__ import annotations

import pytest

from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.rules.findings import Finding
from tracekit.errors import ConfigurationError
from tracekit.integrations.pytest_budgets import Outcome, describe, evaluate, parse, parse_ini

MS = 1_000_000


def request(route: str, wall_ms: float, *, tokenize_ms: float | None = None, overhead_ms: float = 0.0,
            ttft_ms: float | None = None, max_block_ms: float = 0.0) -> RequestRecord:  # fmt: skip
    stages = []
    if tokenize_ms is not None:
        end = int(tokenize_ms * MS)
        stages.append(StageRecord("tokenize", "cpu", "s1", "r", 0, end, wall_ms=tokenize_ms))
    return RequestRecord("t", "r", "svc", route, 0, int(wall_ms * MS), instrumented=True,
                         overhead_ms=overhead_ms, ttft_ms=ttft_ms, max_block_ms=max_block_ms,
                         loop_wait_ms=0.0, stages=stages)  # fmt: skip


def finding(severity: str, rule: str = "cpu-on-loop") -> Finding:
    return Finding(rule, "POST /chat", "tokenize", None, severity, 10.0, "", "", "")


def test_a_stage_p95_is_the_shared_percentile_of_its_instances() -> None:
    # 1..20 ms: p95 by linear interpolation (tracekit._percentile) is 19.05 ms.
    requests = [request("POST /chat", 50, tokenize_ms=ms) for ms in range(1, 21)]
    assert evaluate({"stage_p95_ms": {"tokenize": 19.1}}, requests, []) == []
    (breach,) = evaluate({"stage_p95_ms": {"tokenize": 19}}, requests, [])
    assert breach.budget == "stage_p95_ms[tokenize] <= 19 ms"
    assert breach.measured == "p95 19.1 ms"  # 19.05, shown to a tenth
    assert breach.requests == "1 of 20 over: POST /chat x1 (worst 20 ms)"


def test_requests_over_a_budget_are_grouped_by_route_worst_first() -> None:
    requests = [request("GET /health", 5, max_block_ms=30)]
    requests += [request("POST /chat", 50, max_block_ms=ms) for ms in (90, 10, 40)]
    (breach,) = evaluate({"max_block_ms": 20}, requests, [])
    assert breach.measured == "max 90 ms"
    assert breach.requests == "3 of 4 over: POST /chat x2 (worst 90 ms), GET /health x1 (worst 30 ms)"


def test_the_overhead_ratio_is_weighted_by_request_time() -> None:
    # A 10 ms health check is all overhead (ratio 1), but 20 ms of 110 is 0.18 of the time.
    requests = [request("POST /chat", 100, overhead_ms=10), request("GET /health", 10, overhead_ms=10)]
    assert evaluate({"overhead_ratio": 0.2}, requests, []) == []
    (breach,) = evaluate({"overhead_ratio": 0.1}, requests, [])
    assert breach.measured == "0.182 of request time"
    assert breach.requests == "1 of 2 over: GET /health x1 (worst 1)"


def test_a_budget_nothing_measured_is_not_met() -> None:
    requests = [request("POST /chat", 50, tokenize_ms=5)]
    breaches = evaluate({"stage_p95_ms": {"detokenize": 5}, "ttft_p95_ms": 500}, requests, [])
    assert [(b.measured, b.requests) for b in breaches] == [
        ("not measured", "stage 'detokenize' never ran (stages that ran: tokenize)"),
        ("not measured", "no request streamed a body (no TTFT)"),
    ]
    (breach,) = evaluate({"max_block_ms": 20}, [], [])
    assert (breach.measured, breach.requests) == ("not measured", "no request recorded")


@pytest.mark.parametrize(("allowed", "severities", "failing"), [
    ("none", ["low"], ["low"]),
    ("low", ["low", "low"], []),
    ("low", ["medium", "low", "high"], ["medium", "high"]),
    ("medium", ["medium", "high"], ["high"]),
    ("high", ["high"], []),
])  # fmt: skip
def test_findings_allow_up_to_a_severity(allowed: str, severities: list[str], failing: list[str]) -> None:
    breaches = evaluate({"findings": allowed}, [], [finding(s) for s in severities])
    if not failing:
        assert breaches == []
        return
    (breach,) = breaches
    worst = "high" if "high" in failing else failing[0]
    assert breach.measured == f"worst {worst}"
    assert breach.requests == ", ".join(f"cpu-on-loop ({s}) on POST /chat stage tokenize" for s in failing)


def test_the_table_lines_up_its_columns() -> None:
    requests = [request("POST /chat", 50, tokenize_ms=30, max_block_ms=30)]
    table = Outcome(1, evaluate({"stage_p95_ms": {"tokenize": 5}, "max_block_ms": 20}, requests, [])).table()
    assert table.splitlines() == [
        "tracekit budget exceeded (1 request recorded):",
        "  budget                          measured   requests",
        "  stage_p95_ms[tokenize] <= 5 ms  p95 30 ms  1 of 1 over: POST /chat x1 (worst 30 ms)",
        "  max_block_ms <= 20 ms           max 30 ms  1 of 1 over: POST /chat x1 (worst 30 ms)",
    ]


def test_ini_values_parse_to_what_the_marker_takes() -> None:
    assert parse_ini("stage_p95_ms", "tokenize=5, model=300") == {"tokenize": 5.0, "model": 300.0}
    assert parse_ini("findings", " low ") == "low"
    assert parse_ini("overhead_ratio", "0.25") == 0.25
    budgets = parse({"stage_p95_ms": {"tokenize": 5}, "max_block_ms": 20, "findings": None}, "m")
    assert budgets == {"stage_p95_ms": {"tokenize": 5.0}, "max_block_ms": 20.0, "findings": None}
    assert describe(budgets) == "stage_p95_ms=tokenize:5, max_block_ms=20"
    with pytest.raises(ConfigurationError, match="tracekit_budget_max_block_ms: 'x' is not a number"):
        parse_ini("max_block_ms", "x")
    for bad in ({"max_block_ms": True}, {"ttft_p95_ms": float("nan")}, {"stage_p95_ms": {"": 5}},
                {"loop_wait_p95_ms": -1}, {"stage_p95_ms": {}}):  # fmt: skip
        with pytest.raises(ConfigurationError):
            parse(bad, "m")
