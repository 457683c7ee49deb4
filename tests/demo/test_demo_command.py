"""``tracekit demo`` end to end, as a user runs it: a subprocess of the installed package
(``python -m tracekit demo``), real servers on loopback, real load, the real analyzer."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

#: Each seeded problem of tracekit/demo/gateway.py, as (rule, stage) the report must name.
SEEDED = {
    ("cpu-on-loop", "tokenize"),
    ("cpu-on-loop", "guardrail"),
    ("sequential-independent", "guardrail"),
    ("cpu-on-loop", "serialize"),
    ("serialized-model-calls", "model"),
}
ROUTE = "POST /v1/chat/completions"
PIDS = re.compile(r"model server pid (\d+) .* gateway pid (\d+)")


def demo(out: Path, *args: str) -> subprocess.Popen[str]:
    # The installed command, run where a user may stand: outside the checkout, beside a folder
    # named tracekit (a clone's parent), which `python -m` in its servers once imported instead;
    # with SIGINT ignored, as a script's background job inherits it (CI's shell may): the demo
    # then ignored Ctrl-C and SIGTERM alike, and its servers ignored its SIGINT.
    out.parent.joinpath("tracekit").mkdir(exist_ok=True)
    command = Path(sys.executable).with_name("tracekit")
    return subprocess.Popen([str(command), "demo", "--out", str(out), *args],
                            cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "NO_COLOR": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float, pids: Sequence[int] = ()) -> str:
    """The rest of the demo's output once it exits; if it does not within ``timeout``, it is
    killed with its servers (``pids``, and those it names in that output: they run in
    sessions of their own, and outlived a killed demo) and the test fails with what it last
    said (where a stop hung)."""
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        rest = process.communicate()[0]  # all it said since the first communicate()
        for pid in {*pids, *(int(p) for m in PIDS.finditer(rest) for p in m.groups())}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        said = rest[-2000:]
        raise AssertionError(f"the demo did not exit in {timeout:.0f} s; it last said:\n{said}") from None


def flagged(report: dict) -> set[tuple[str, str | None]]:
    """(rule, stage) of every finding, and of every symptom folded into one (``explains``:
    the same stage as the finding that explains it)."""
    out = set()
    for f in report["findings"]:
        out.add((f["rule"], f["stage"]))
        out.update((rule, f["stage"]) for rule in f["explains"])
    return out


def test_demo_diagnoses_each_seeded_problem_and_measures_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    started = time.monotonic()
    process = demo(out, "--requests", "80", "--cores", "2")
    stdout = finish(process, 180)
    elapsed = time.monotonic() - started
    assert process.returncode == 0, stdout[-3000:]

    report = json.loads((out / "report.json").read_text())
    assert report["validation"]["model"]["cores_source"] == "--cores"  # passed on to the replay
    # One route: the readiness probe is a TCP connect, never a traced request.
    assert [r["route"] for r in report["routes"]] == [ROUTE]
    # Besides the seeded problems, at most the handler's own code, LOW: the streamed quarter
    # of the requests runs 5-10 ms of it on the loop (uvicorn's write of each chunk, ~0.1 ms
    # a chunk, and the SSE re-encoding; /proc measures the same +6 ms a streamed request with
    # tracekit off), so its p95 sits at the rule's 10 ms gate and crosses it on a busy host.
    extra = flagged(report) - SEEDED
    own = [f for f in report["findings"] if f["rule"] == "cpu-on-loop" and f["stage"] is None]
    assert flagged(report) >= SEEDED, json.dumps(report["findings"], indent=1)[:3000]
    assert extra <= {("cpu-on-loop", None)}, extra
    assert all(f["severity"] == "low" for f in own), own
    # No symptom reported twice: each (rule, stage) once, folded or not.
    pairs = [(f["rule"], f["stage"]) for f in report["findings"]]
    pairs += [(r, f["stage"]) for f in report["findings"] for r in f["explains"]]
    assert len(pairs) == len(set(pairs))

    # Every model call carries the model server's own view: its llm_request span, written
    # to the same file, joined the call through traceparent (queue, prefill, decode).
    [route] = report["routes"]
    assert route["model_wait_split_ms"]["requests"] == 80
    # The serial server's finding reads the server's queue time, not the FIFO guess.
    [serial] = [f for f in report["findings"] if f["rule"] == "serialized-model-calls"]
    assert "gen_ai.latency.time_in_queue" in serial["evidence"]

    assert "Findings (" in stdout  # the analyzer's text report was printed
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    # The top finding's fix is the one applied, projected or not.
    top = report["findings"][0]
    assert f"applying the fix of {top['rule']}:{top['stage']}: " in stdout
    comparison = json.loads((out / "compare.json").read_text())
    assert comparison["schema"] == "tracekit.compare/1"
    [change] = comparison["routes"]
    assert change["route"] == ROUTE and change["requests"] == [80, 80]
    assert "tracekit compare" in stdout
    p95 = change["latency_ms"]["p95"]
    # The last lines: measured before and after, the projection's before labelled replayed.
    assert f"the fix of {top['rule']}:{top['stage']}, p95 latency at 8 clients:" in stdout
    assert re.search(rf"measured +before +{p95['before']:.0f} ms +after +{p95['after']:.0f} ms", stdout)
    if top["projection"]:
        assert re.search(r"projected \(replayed\) before +\d+ ms +after +\d+ ms +range \d+-\d+ ms", stdout)
    if top["projection"]:
        # A projected fix that works: measured p95 better after than before (the direction
        # only: the values move with the host's load). Not "inside the projected range": on
        # this busy 2-core host the fixed run's p95 was inside it in 5 of 11 projected runs,
        # above it in the others (bench/demo_projection.py; docs/analyzer-rules.md, "The
        # projection model", has why: the batching server is slower per call under load).
        assert p95["after"] < p95["before"], (top["projection"], p95)
    else:
        assert "has no projection (the report says why)" in stdout
    print(f"demo took {elapsed:.1f} s; top {top['rule']}:{top['stage']}, projected "
          f"{bool(top['projection'])}, p95 {p95['before']:.0f} -> {p95['after']:.0f} ms")  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_demo_stops_every_process_it_started(tmp_path: Path, sig: int) -> None:
    process = demo(tmp_path / "demo", "--requests", "5000")
    assert process.stdout is not None
    pids: list[int] = []
    deadline = time.monotonic() + 60
    while not pids and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if match := PIDS.search(line):
            pids = [int(match[1]), int(match[2])]
    assert pids, "the demo never said which servers it started"
    # Interrupt mid-load: wait for the first progress line.
    while "answered" not in (line := process.stdout.readline()):
        assert line, "the demo ended before its load started"
    process.send_signal(sig)
    rest = finish(process, 60, pids)
    assert process.returncode == 130, rest[-2000:]
    assert "Traceback" not in rest
    for pid in pids:
        assert not alive(pid), f"pid {pid} still running after the demo exited"


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie has stopped; its parent was the demo


def test_bad_option_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tracekit", "demo", "--requests", "0"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--requests" in result.stderr
    # More clients than requests: a run that says "at 200 clients" of 2 requests.
    args = ["--requests", "2", "--concurrency", "200"]
    result = subprocess.run([sys.executable, "-m", "tracekit", "demo", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--concurrency 200: more clients than --requests 2" in result.stderr


def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path: Path) -> None:
    # A new user's `--out app.py` (an existing file) was an "internal error", exit 3.
    (tmp_path / "app.py").write_text("x = 1\n")
    for out in ("app.py", "app.py/sub"):
        result = subprocess.run([sys.executable, "-m", "tracekit", "demo", "--out", out],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and f"--out {out}" in result.stderr
        assert "internal error" not in result.stderr
    assert (tmp_path / "app.py").read_text() == "x = 1\n"
    # A folder that takes no files (a new user's `--out /sys/kernel`, as root too): one line.
    result = subprocess.run([sys.executable, "-m", "tracekit", "demo", "--out", "/sys/kernel"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--out /sys/kernel: cannot use it" in result.stderr


def test_the_otlp_endpoint_is_checked_before_the_run() -> None:
    # --otlp to a port nothing listens on exited 0 with the loss only in servers.log: the demo
    # now says so at the start (runner._listens).
    import socket

    from tracekit.demo.runner import _listens

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert _listens(url)
    assert not _listens(url)  # closed now
    assert not _listens("http://[::1")  # not a URL


def test_keep_running_leaves_a_gateway_to_explore_until_ctrl_c(tmp_path: Path) -> None:
    import httpx

    process = demo(tmp_path / "demo", "--requests", "16", "--keep-running")
    assert process.stdout is not None
    pids: list[int] = []
    url = None
    deadline = time.monotonic() + 150
    while url is None and time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, "the demo ended before saying where the gateway is"
        if match := PIDS.search(line):
            pids += [int(match[1]), int(match[2])]
        if match := re.search(r"the gateway is up at (http://127\.0\.0\.1:\d+)", line):
            url = match[1]
    assert url is not None and len(pids) == 6  # three pairs: before, after, to explore
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.json()["choices"]
    process.send_signal(signal.SIGINT)
    rest = finish(process, 60, pids)
    assert process.returncode == 130, rest[-2000:]
    assert not [pid for pid in pids if alive(pid)]
    assert (tmp_path / "demo" / "explore.jsonl").stat().st_size > 0  # its trace was written
