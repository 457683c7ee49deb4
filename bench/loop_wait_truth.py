"""The loop-wait estimator against the truth, one resumption at a time, on a saturated loop.

Serves ``tests/loop/proxy.py``'s gateway as ``bench/whole_loop.py`` does (uvicorn +
httptools, the model server in a process of its own, closed-loop load from another process)
and logs, for every resumption the estimator judges, its inputs and its estimate. The model
server stamps each reply with the moment it finished (``x-model-done-ns``, ``perf_counter``,
the same system-wide monotonic clock as tracekit's): the resumption of the model call whose
suspension contains that moment waited for the loop ``resumed - done`` (less loopback
delivery, tens of µs). That is the truth each estimate is compared with. It also prints
the model stage's traced wait against the model server's own time (from the request's body
written to the reply done: ``tests/loop/proxy.py``), as ``bench/whole_loop.py`` does.

The estimator's inputs are read by wrapping it, which needs the plain-Python build (the
script sets ``TRACEKIT_PURE_PYTHON=1``); it computes the same in both builds.

Run: .venv/bin/python bench/loop_wait_truth.py [--loops asyncio,uvloop] [--requests 192]
     [--concurrency 64] [--parse-units 12] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ["TRACEKIT_PURE_PYTHON"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracekit  # noqa: E402
from tests.conftest import Server  # noqa: E402
from tests.loop.proxy import ModelServer, Proxy, drive_load  # noqa: E402
from tracekit import semconv as sc  # noqa: E402
from tracekit._core import event_loop  # noqa: E402
from tracekit._export import tracing  # noqa: E402


def run(loop: str, requests: int, concurrency: int, parse_units: float) -> dict[str, Any]:
    log: list[tuple[int, int, int, int]] = []  # (task id, suspended, resumed, estimate)
    estimate = event_loop.estimate_loop_wait

    def logged(state: event_loop.ThreadState, suspended: int, resumed: int, awaiting: Any) -> int:
        waited = estimate(state, suspended, resumed, awaiting)
        log.append((id(asyncio.current_task()), suspended, resumed, waited))
        return waited

    model = ModelServer("--prefill-ms", "40", "--decode-ms", "2")
    proxy = Proxy(model.url, parse_units=parse_units)
    event_loop.estimate_loop_wait = logged  # type: ignore[assignment]
    try:
        with tracekit.record() as rec:
            server = Server(proxy.app, loop=loop, http="httptools")
            try:
                drive_load(server.url, 8, 4)
                time.sleep(0.3)
                tracing.flush_all()
                before = len(rec.spans)
                del log[:], proxy.replies[:], proxy.model_ms[:]
                drive_load(server.url, requests, concurrency)
                time.sleep(0.5)
                tracing.flush_all()
                spans = rec.spans[before:]
            finally:
                server.stop()
    finally:
        event_loop.estimate_loop_wait = estimate  # type: ignore[assignment]
        model.stop()
    by_task: dict[int, list[tuple[int, int, int]]] = {}
    for task, suspended, resumed, waited in log:
        by_task.setdefault(task, []).append((suspended, resumed, waited))
    truths, errors = [], []
    for task, done in proxy.replies:
        for suspended, resumed, waited in by_task.get(task, ()):
            if suspended <= done < resumed:
                truths.append((resumed - done) / 1e6)
                errors.append((waited - (resumed - done)) / 1e6)
    waits = [s.attributes[sc.WAIT_MS] for s in spans if s.attributes.get(sc.STAGE) == "model"]
    return {
        "loop": loop, "replies": len(proxy.replies), "matched": len(truths),
        "truth_p50_ms": round(statistics.median(truths), 1),
        "truth_mean_ms": round(statistics.fmean(truths), 1),
        "error_mean_ms": round(statistics.fmean(errors), 1),
        "error_p10_p50_p90_ms": [round(q, 1) for q in statistics.quantiles(errors, n=10)[::4]],
        "model_server_own_p50_ms": round(statistics.median(proxy.model_ms), 1),
        "model_wait_p50_ms": round(statistics.median(waits), 1),
        "model_wait_error": round(statistics.median(waits) / statistics.median(proxy.model_ms) - 1, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--parse-units", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = [run(loop, args.requests, args.concurrency, args.parse_units)
               for _ in range(args.rounds) for loop in args.loops.split(",")]  # fmt: skip
    for result in results:
        print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
