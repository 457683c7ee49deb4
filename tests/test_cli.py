"""The command line: outputs, exit codes, one-line errors for every bad input, fuzzing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import HOTROD, REAL, ROOT, gen_traces, needs_real
from tracekit import semconv
from tracekit.cli import main

GEN = gen_traces()


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-m", "tracekit", *argv],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip


def assert_one_error_line(code: int, err: str, expected: int = 2) -> None:
    assert code == expected, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), err


@pytest.fixture(scope="module")
def gateway_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "gateway.jsonl"
    GEN.write_jsonl(path, 1_500, rate=40.0, seed=11)
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bad_inputs(tmp: Path) -> dict[str, list[str]]:
    (tmp / "not.json").write_text("hello, I am not JSON\n")
    (tmp / "truncated.json").write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"tra')
    (tmp / "other.json").write_text('{"kind": "a JSON document of another program"}')
    (tmp / "empty.json").write_text("")
    return {
        "missing file": [str(tmp / "no-such-file.json")],
        "not JSON": [str(tmp / "not.json")],
        "truncated JSON": [str(tmp / "truncated.json")],
        "neither OTLP nor Jaeger": [str(tmp / "other.json")],
        "empty file": [str(tmp / "empty.json")],
        "a directory": [str(tmp)],
        "unreachable Jaeger": ["--jaeger", f"http://127.0.0.1:{closed_port()}", "--service", "gw"],
    }


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for label, args in bad_inputs(tmp_path).items():
        code, out, err = run_main("analyze", *args)
        assert_one_error_line(code, err)
        assert out == "", label


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["analyze"],
        ["analyze", "a.json", "--jaeger", "http://x"],
        ["analyze", "--jaeger", "http://127.0.0.1:9"],
        ["analyze", "a.json", "--format", "xml"],
        ["analyze", "a.json", "--fail-on", "critical"],
        ["analyze", "a.json", "--limit", "zero"],
        ["analyze", "a.json", "--slo", "ttft=5"],
        ["frobnicate"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str]) -> None:
    code, _, err = run_main(*args)
    assert_one_error_line(code, err)


@needs_real
def test_subprocess_json_output_is_the_report_schema() -> None:
    done = run_cli("analyze", str(HOTROD), "--format", "json")
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["schema"] == "tracekit.report/1" and d["requests"] == 13
    assert "GET /dispatch" in {r["route"] for r in d["routes"]}


def test_subprocess_bad_inputs_never_print_a_traceback(tmp_path: Path) -> None:
    cases = bad_inputs(tmp_path)
    for label in ("missing file", "truncated JSON", "unreachable Jaeger"):
        done = run_cli("analyze", *cases[label])
        assert_one_error_line(done.returncode, done.stderr)


def test_text_output_and_route_and_slo(gateway_file: Path) -> None:
    code, out, err = run_main(
        "analyze", str(gateway_file), "--route", "/v1/chat/completions", "--slo", "e2e=2s"
    )
    assert code == 0, err
    assert "POST /v1/chat/completions" in out and "goodput" in out and "\x1b[" not in out


def test_output_file_is_written_atomically(gateway_file: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    code, out, err = run_main("analyze", str(gateway_file), "--format", "html", "-o", str(target))
    assert (code, out) == (0, ""), err
    assert "loop-timeline" in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary left behind
    code, _, err = run_main("analyze", str(gateway_file), "-o", str(tmp_path / "no" / "dir.txt"))
    assert_one_error_line(code, err)


def test_fail_on_gates_on_severity(gateway_file: Path, tmp_path: Path) -> None:
    code, out, err = run_main("analyze", str(gateway_file), "--format", "json")
    assert code == 0, err
    severities = {f["severity"] for f in json.loads(out)["findings"]}
    order = ["high", "medium", "low"]
    for threshold in order:
        reached = any(order.index(s) <= order.index(threshold) for s in severities)
        code, _, _ = run_main(
            "analyze", str(gateway_file), "--fail-on", threshold, "-o", str(tmp_path / "r.txt")
        )
        assert code == (1 if reached else 0), (threshold, severities)


@needs_real
def test_fail_on_with_the_real_n_plus_one(tmp_path: Path) -> None:
    # The N+1 is a high finding: every threshold trips; a healthy trace trips none.
    for threshold in ("high", "medium", "low"):
        code, _, err = run_main(
            "analyze", str(HOTROD), "--fail-on", threshold, "-o", str(tmp_path / "x")
        )
        assert code == 1, err
    healthy = REAL / "jaeger-petclinic-two-services.json"
    code, _, err = run_main("analyze", str(healthy), "--fail-on", "low", "-o", str(tmp_path / "y"))
    assert code == 0, err


def test_query_options_on_a_file_are_an_error(gateway_file: Path) -> None:
    # --lookback at its default too: a user who typed it expects it to apply.
    for extra in (["--lookback", "2h"], ["--lookback", "1h"], ["--service", "gw"], ["--limit", "5"]):
        code, _, err = run_main("analyze", str(gateway_file), *extra)
        assert_one_error_line(code, err)


def test_interrupt_and_internal_errors_are_one_line(
    gateway_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracekit.analysis.api as api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(api, "analyze", interrupted)
    code, _, err = run_main("analyze", str(gateway_file))
    assert_one_error_line(code, err, expected=130)
    monkeypatch.setattr(api, "analyze", broken)
    monkeypatch.delenv("TRACEKIT_DEBUG", raising=False)
    code, _, err = run_main("analyze", str(gateway_file))
    assert_one_error_line(code, err, expected=3)
    assert "internal error: RuntimeError: a bug with two lines" in err


def test_help_exits_zero() -> None:
    code, out, _ = run_main("analyze", "--help")
    assert code == 0 and "--fail-on" in out and "--jaeger" in out


def test_version() -> None:
    from importlib.metadata import version

    code, out, _ = run_main("--version")
    assert code == 0 and out.strip() == f"tracekit {version('tracekit')}"


def test_skipped_spans_are_a_warning_not_an_error(tmp_path: Path) -> None:
    good = GEN.otlp_span("ab" * 16, "cd" * 8, None, "GET /x", "server", 10, 20)
    bad = GEN.otlp_span("zz", "cd" * 8, None, "GET /y", "server", 10, 20)
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(GEN.traces_data([good, bad])))
    code, out, err = run_main("analyze", str(path), "--format", "json")
    assert code == 0
    assert json.loads(out)["requests"] == 1
    assert err.startswith("tracekit: warning: skipped 1 malformed span") and "Traceback" not in err


def test_stages_without_their_request_span_are_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # A file with one whole request and, on other lines, the stages of requests whose server
    # spans went elsewhere (issue 13): one request, and one warning line on stderr, whether
    # the file is read in one pass or by several workers.
    from tracekit.analysis.readers import parallel

    def stages(trace: str) -> list[dict[str, object]]:
        return [GEN.otlp_span(trace, f"{trace[:14]}{k:02x}", "f" * 16, name, "internal", 10, 20,
                              {semconv.STAGE: name, semconv.CPU_MS: 1.0})
                for k, name in enumerate(("tokenize", "model"))]  # fmt: skip

    whole = [GEN.otlp_span("ab" * 16, "cd" * 8, None, "POST /x", "server", 10, 30)]
    lines = [whole] + [stages(f"{k:02x}" * 16) for k in range(1, 7)]
    path = tmp_path / "split.jsonl"
    path.write_text("".join(json.dumps(GEN.traces_data(spans)) + "\n" for spans in lines))
    monkeypatch.setattr(parallel, "MIN_RANGE_BYTES", 1)
    plans: list[object] = []
    real = parallel.analyze_plan
    monkeypatch.setattr(parallel, "analyze_plan", lambda *a: plans.append(a) or real(*a))
    for workers in ("1", "3"):
        monkeypatch.setenv(parallel.ENV_WORKERS, workers)
        code, out, err = run_main("analyze", str(path), "--format", "json")
        assert code == 0 and json.loads(out)["requests"] == 1
        assert err.splitlines() == [
            "tracekit: warning: 12 stage spans in 6 traces have no request (SERVER) span in the "
            "input, so they are not counted as requests: was the server span exported "
            "elsewhere? (docs/composition.md)"
        ], workers
    assert len(plans) == 1  # the second run was the workers'


def test_broken_pipe_is_quiet(gateway_file: Path) -> None:
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(10)"], stdin=subprocess.PIPE
    )
    done = subprocess.run(
        [sys.executable, "-m", "tracekit", "analyze", str(gateway_file), "--format", "json"],
        stdout=reader.stdin, stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert reader.stdin is not None
    reader.stdin.close()
    reader.wait(timeout=10)
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 141)


# --- fuzzing: malformed and adversarial files never crash or hang the CLI ---------------------
HEX = "0123456789abcdef"
ids = st.one_of(
    st.text(HEX, min_size=16, max_size=16),
    st.text(HEX, min_size=0, max_size=40),  # wrong lengths
    st.sampled_from(["", "ZZZZ", "0" * 16]),
    st.integers(),
    st.none(),
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=30),
    st.booleans(),
    st.just("x" * 200_000),  # huge attribute value
    st.lists(st.integers(min_value=-(10**6), max_value=10**6), max_size=12),
)
attr_keys = st.sampled_from(
    [semconv.STAGE, semconv.STAGE_KIND, semconv.CPU_MS, semconv.WAIT_MS, semconv.LOOP_WAIT_MS,
     semconv.ON_LOOP, semconv.LOOP_SLICES_US, semconv.CHUNKS, semconv.TTFT_MS, semconv.HTTP_ROUTE,
     semconv.HTTP_RESPONSE_STATUS_CODE, "other"]
)  # fmt: skip


@st.composite
def otlp_span_dicts(draw: st.DrawFn) -> dict[str, object]:
    pool = ["a" * 16, "b" * 16, "c" * 16, "d" * 16]  # shared ids: cycles, duplicates
    start = draw(st.integers(min_value=-(10**12), max_value=2**64 + 5))
    span = GEN.otlp_span(
        draw(st.sampled_from(["1" * 32, "2" * 32])),
        draw(st.one_of(st.sampled_from(pool), ids)),
        draw(st.one_of(st.sampled_from(pool), ids)),
        draw(st.text(max_size=20)),
        draw(st.sampled_from(["server", "client", "internal"])),
        start,
        start + draw(st.integers(min_value=-(10**10), max_value=10**10)),  # negative durations
        draw(st.dictionaries(attr_keys, values, max_size=6)),
    )
    if draw(st.booleans()):
        span["kind"] = draw(st.one_of(st.integers(), st.text(max_size=3)))
    return span


@st.composite
def trace_files(draw: st.DrawFn) -> bytes:
    doc = GEN.traces_data(draw(st.lists(otlp_span_dicts(), max_size=12)))
    text = json.dumps(doc).encode()
    shape = draw(st.sampled_from(["whole", "truncated", "jsonl", "junk", "json"]))
    if shape == "truncated":
        return text[: draw(st.integers(min_value=0, max_value=len(text)))]
    if shape == "jsonl":
        return text + b"\n" + text[: len(text) // 2] + b"\n"
    if shape == "junk":
        return draw(st.binary(max_size=200))
    if shape == "json":
        leaves = st.none() | st.integers() | st.text(max_size=5)
        tree = st.recursive(
            leaves, lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c), max_leaves=10
        )
        return json.dumps(draw(tree)).encode()
    return text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=trace_files(), fmt=st.sampled_from(["text", "json", "html"]))
def test_fuzzed_files_give_a_report_or_one_error_line(data: bytes, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.json"
        path.write_bytes(data)
        code, _, err = run_main("analyze", str(path), "--format", fmt, "-o", str(Path(tmp) / "o"))
    assert "Traceback" not in err
    if code == 2:
        assert_one_error_line(code, err)
    else:
        assert code == 0, err
        assert all(line.startswith("tracekit: warning: ") for line in err.splitlines())


@pytest.mark.slow
def test_the_throughput_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "analyze_throughput.py"), "--spans", "1500",
         "--repeat", "1", "--keep", str(tmp_path), "--no-doc"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for command in ("parse", "phases", "analyze-1", "analyze"):
        assert f"\n{command} " in "\n" + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["spans"] >= 1500 and report["instrumented"]
