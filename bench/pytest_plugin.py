"""What tracekit's pytest plugin costs: loaded and unused, and per budgeted test.

- import: importing ``tracekit.integrations.pytest_plugin`` after ``import tracekit`` (and
  pytest), in a fresh interpreter; best of ``--rounds``.
- unused: a pytest run of ``--tests`` trivial tests with the plugin loaded (``-p MODULE``) and
  without it (``-p no:tracekit``): the run's CPU time (user + system, of the pytest process:
  steadier than wall time on a shared host), best of ``--rounds``; the difference is the
  start-up (importing tracekit) plus the per-test hooks.
- check: the budget check at the end of a marked test (settle, analysis with rules and replay,
  the measures) over N recorded requests of bench/overhead.py's app.

Run: .venv/bin/python bench/pytest_plugin.py [--rounds 5] [--tests 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tracekit.integrations.pytest_plugin"
IMPORT_PROBE = f"""
import time
import pytest, tracekit
start = time.perf_counter()
import {PLUGIN}
print(time.perf_counter() - start)
"""


def import_ms(rounds: int) -> float:
    runs = [float(subprocess.run([sys.executable, "-c", IMPORT_PROBE], check=True, capture_output=True,
                                 text=True).stdout) for _ in range(rounds)]  # fmt: skip
    return min(runs) * 1e3


def unused_cpu(tests: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        body = "".join(f"def test_{i}():\n    pass\n\n" for i in range(tests))
        Path(folder, "test_many.py").write_text(body)
        Path(folder, "pytest.ini").write_text("[pytest]\n")
        variants = {"without": ["-p", "no:tracekit"], "with": ["-p", "no:tracekit", "-p", PLUGIN]}
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(rounds):
            for name, flags in variants.items():
                before = _children_cpu()
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags],
                               cwd=folder, check=True, capture_output=True)  # fmt: skip
                best[name] = min(best[name], _children_cpu() - before)
    return {"tests": tests, "cpu_without_s": best["without"], "cpu_with_s": best["with"],
            "difference_ms": (best["with"] - best["without"]) * 1e3}  # fmt: skip


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check_ms(requests: int, rounds: int) -> float:
    sys.path.insert(0, str(ROOT / "bench"))
    import overhead

    import tracekit
    from tracekit.integrations.pytest_budgets import check

    app = tracekit.TracekitMiddleware(overhead.make_app(True))
    budgets = {"stage_p95_ms": {"tokenize": 100}, "max_block_ms": 100, "overhead_ratio": 1,
               "loop_wait_p95_ms": 100, "findings": "high"}  # fmt: skip
    with tracekit.record() as rec:
        asyncio.run(overhead.drive(app, requests))
        runs = []
        for _ in range(rounds):
            start = time.perf_counter()
            outcome = check(rec, budgets)
            runs.append(time.perf_counter() - start)
        assert outcome.requests == requests and not outcome.breaches, outcome
    return min(runs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = {
        "import_ms": import_ms(args.rounds),
        "unused": unused_cpu(args.tests, args.rounds),
        "check_ms": {str(n): check_ms(n, args.rounds) for n in (10, 100, 1000)},
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
