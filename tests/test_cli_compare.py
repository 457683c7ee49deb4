"""``tracekit compare`` on the command line: outputs, and one line for every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import gen_traces
from tests.test_cli import assert_one_error_line, run_cli, run_main


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("cli-compare")
    gen = gen_traces()
    gen.write_jsonl(folder / "before.jsonl", 1_200, rate=40.0, seed=21, tokenize_ms=6.0)
    gen.write_jsonl(folder / "after.jsonl", 1_200, rate=40.0, seed=22, tokenize_ms=1.0)
    return str(folder / "before.jsonl"), str(folder / "after.jsonl")


def test_text_output(runs: tuple[str, str]) -> None:
    code, out, err = run_main("compare", *runs)
    assert (code, err) == (0, "")
    assert out.startswith("tracekit compare")
    for line in ("POST /v1/chat/completions", "95% interval", "latency p50 ms", "throughput req/s",
                 "TTFT p50 ms", "cpu on loop", "projected (before's findings"):  # fmt: skip
        assert line in out, line


def test_json_output_to_a_file_with_the_finding_made(runs: tuple[str, str], tmp_path: Path) -> None:
    path = tmp_path / "compare.json"
    code, out, err = run_main(
        "compare", *runs, "--format", "json", "-o", str(path), "--finding", "cpu-on-loop:tokenize",
        "--confidence", "0.9", "--cores", "3",
    )  # fmt: skip
    assert (code, out, err) == (0, "", "")
    data = json.loads(path.read_text())
    assert data["schema"] == "tracekit.compare/1"
    assert data["method"]["confidence"] == 0.9 and data["method"]["finding"] == "cpu-on-loop:tokenize"
    [route] = data["routes"]
    assert set(route["latency_ms"]) == {"p50", "p95", "p99"}
    assert set(route["breakdown_ms"]) == {
        "cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait", "gc", "queue_wait",
    }  # fmt: skip
    selected = [p for p in route["projections"] if p["selected"]]
    assert [(p["rule"], p["stage"]) for p in selected] == [("cpu-on-loop", "tokenize")]
    assert {m["metric"] for m in selected[0]["metrics"]} == {"p50_ms", "p95_ms", "throughput_rps"}
    assert (selected[0]["model"]["cores"], selected[0]["model"]["cores_source"]) == (3, "--cores")


def test_every_bad_input_is_one_line_and_exit_2(runs: tuple[str, str], tmp_path: Path) -> None:
    before, after = runs
    (tmp_path / "not.json").write_text("hello, I am not JSON\n")
    report = tmp_path / "report.json"
    assert run_main("analyze", before, "--format", "json", "-o", str(report))[0] == 0
    cases = {
        "missing before": ([str(tmp_path / "none.jsonl"), after], "before: "),
        "after not JSON": ([before, str(tmp_path / "not.json")], "after: "),
        "a report, not traces": ([str(report), after], "is a tracekit report, not traces"),
        "no such route": ([before, after, "--route", "/nope"], "no request has route"),
        "bad finding": ([before, after, "--finding", "BAD RULE"], "RULE or RULE:STAGE"),
        "unmatched finding": ([before, after, "--finding", "fp32-weights"], "its findings: cpu-on-loop"),
        "confidence": ([before, after, "--confidence", "2"], "confidence must be between"),
        "cores": ([before, after, "--cores", "0"], "--cores"),
        "missing AFTER": ([before], "the following arguments are required: AFTER"),
        "-o is a trace file": ([before, after, "-o", after], "is the trace file being read"),
        "query options on files": ([before, after, "--service", "gw"], "neither run is one"),
        "lookback on files": ([before, after, "--lookback", "1h"], "neither run is one"),
    }
    for label, (args, message) in cases.items():
        code, out, err = run_main("compare", *args)
        assert_one_error_line(code, err)
        assert message in err, (label, err)
        assert out == "", label


def test_subprocess_bad_input_never_prints_a_traceback(tmp_path: Path) -> None:
    result = run_cli("compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    assert_one_error_line(result.returncode, result.stderr)
    assert "before: " in result.stderr and "no such file" in result.stderr
