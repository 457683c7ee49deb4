"""The analyzer's small benchmarks still run (tiny sizes: this checks the scripts, not the speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import gen_traces

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_analyzer_phases_runs_every_phase(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 2_000)
    for upto in ("imports", "pipeline", "pipeline-unpacked", "report"):
        assert _run("bench/analyzer_phases.py", str(path), "--upto", upto) == ""


def test_loop_wait_overlap_reads_the_calls_a_block_overlapped(tmp_path: Path) -> None:
    # The simulated gateway's tokenize holds the loop while other requests' model calls wait.
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 300)
    out = _run("bench/loop_wait_overlap.py", str(path), "--block", "tokenize").splitlines()
    counted = out[0].removeprefix("model calls a tokenize block of another request overlapped: ")
    overlapped, total = (int(n) for n in counted.split(" of "))
    assert 0 < overlapped <= total
    assert out[1].startswith("  their wall p50 ") and "loop wait booked p50" in out[1]


def test_host_others_check_samples_the_kernels_count_and_says_what_a_trace_lacks(tmp_path: Path) -> None:
    samples = tmp_path / "procs.txt"
    assert _run("bench/host_others_check.py", "sample", "0.05", str(samples)) == ""
    lines = samples.read_text().splitlines()
    assert lines and all(int(t) > 0 and int(n) >= 1 for t, n in (line.split() for line in lines))
    # The simulated gateway's traces carry no loop windows: one line, a non-zero exit.
    trace = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(trace, 50)
    done = subprocess.run([sys.executable, "bench/host_others_check.py", "compare", str(trace), str(samples)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("host_others_check: ")


def test_after_response_reports_the_spans_the_route_and_the_replays_error(tmp_path: Path) -> None:
    out = tmp_path / "after.json"
    _run("bench/after_response.py", "--runs", "1", "--requests", "60", "--clients", "2",
         "--json", str(out))  # fmt: skip
    (run,) = json.loads(out.read_text())["runs"]
    assert run["requests"] == 60 and run["cpu_over_wall"] == 0
    assert run["after_response_cpu_ms"]["cpu_on_loop"] > 1.0  # 4 units, about 3 ms
    assert abs(run["replay_p50_error"]) < 0.15  # the as-recorded replay validated (tolerance)
