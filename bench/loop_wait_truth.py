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

Streamed replies (``--stream-every N``: every N-th request streamed) are judged the same way:
the server stamps a streamed reply's headers and each chunk with the moment it sent them, and
the resumption of the streaming stage whose suspension contains one or more of those moments
waited for the loop from the earliest of them on. Its suspensions that contain none (the
connection, the request being sent, checkpoints) have no truth: their estimates are summed
apart (``stream_unmatched_*``).

The estimator's inputs are read by wrapping it, which needs the plain-Python build (the
script sets ``TRACEKIT_PURE_PYTHON=1``); it computes the same in both builds.

Run: .venv/bin/python bench/loop_wait_truth.py [--loops asyncio,uvloop] [--requests 192]
     [--concurrency 64] [--parse-units 12] [--stream-every 0] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
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
from tests.loop.proxy import ModelServer, Proxy, drive_load, task_key  # noqa: E402
from tracekit import semconv as sc  # noqa: E402
from tracekit._core import event_loop  # noqa: E402
from tracekit._export import tracing  # noqa: E402


def run(loop: str, requests: int, concurrency: int, parse_units: float,
        stream_every: int = 0) -> dict[str, Any]:  # fmt: skip
    log: list[tuple[int, int, int, int]] = []  # (task id, suspended, resumed, estimate)
    estimate = event_loop.estimate_loop_wait

    def logged(state: event_loop.ThreadState, suspended: int, resumed: int, awaiting: Any,
               cpu: int = -1) -> int:  # fmt: skip
        waited = estimate(state, suspended, resumed, awaiting, cpu)
        log.append((task_key(), suspended, resumed, waited))
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
                del log[:], proxy.replies[:], proxy.model_ms[:], proxy.chunks[:]
                drive_load(server.url, requests, concurrency, stream_every)
                time.sleep(0.5)
                tracing.flush_all()
                spans = rec.spans[before:]
            finally:
                server.stop()
    finally:
        event_loop.estimate_loop_wait = estimate  # type: ignore[assignment]
        model.stop()
    by_task: dict[int, list[tuple[int, int, int]]] = {}
    for task, suspended, resumed, waited in dict.fromkeys(log):  # once per suspension
        by_task.setdefault(task, []).append((suspended, resumed, waited))
    truths, errors = [], []
    for task, done in proxy.replies:
        for suspended, resumed, waited in by_task.get(task, ()):
            if suspended <= done < resumed:
                truths.append((resumed - done) / 1e6)
                errors.append((waited - (resumed - done)) / 1e6)
    # A streamed reply's chunks: the resumption whose suspension contains a chunk's sending
    # waited for the loop from the earliest such chunk on (more may come in one read).
    sends: dict[int, list[int]] = {}
    for task, sent in proxy.chunks:
        sends.setdefault(task, []).append(sent)
    stream_truths, stream_errors, unmatched, unmatched_held = [], [], 0.0, 0.0
    for task, sent_list in sends.items():
        sent_list.sort()
        # A stage's suspension is seen twice: by the stage's ledger and, around it, by its
        # caller's (suspended a few µs earlier, resumed later). The innermost is the stage's.
        judged = sorted(by_task.get(task, ()))
        inner = [j for i, j in enumerate(judged) if i + 1 == len(judged) or judged[i + 1][0] >= j[1]]
        for suspended, resumed, waited in inner:
            inside = [sent for sent in sent_list if suspended <= sent < resumed]
            if inside:
                stream_truths.append((resumed - inside[0]) / 1e6)
                stream_errors.append((waited - (resumed - inside[0])) / 1e6)
            else:  # the connection, the request being sent, a checkpoint: no truth here
                unmatched += waited / 1e6
                unmatched_held += (resumed - suspended) / 1e6
    streams = {}
    if stream_truths:
        streams = {
            "chunks": len(proxy.chunks), "stream_matched": len(stream_truths),
            "stream_truth_sum_ms": round(sum(stream_truths), 1),
            "stream_estimate_sum_ms": round(sum(stream_truths) + sum(stream_errors), 1),
            "stream_error_mean_ms": round(statistics.fmean(stream_errors), 2),
            "stream_error_p10_p50_p90_ms":
                [round(q, 2) for q in statistics.quantiles(stream_errors, n=10)[::4]],
            "stream_unmatched_estimates_ms": round(unmatched, 1),
            "stream_unmatched_suspended_ms": round(unmatched_held, 1),
        }  # fmt: skip
    if not truths:
        return {"loop": loop, **streams, "load_average": [round(x, 2) for x in os.getloadavg()]}
    waits = [s.attributes[sc.WAIT_MS] for s in spans if s.attributes.get(sc.STAGE) == "model"
             and s.attributes.get(sc.STAGE_SHAPE) != sc.SHAPE_ASYNC_GENERATOR]  # fmt: skip
    return {
        **streams,
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
    parser.add_argument("--stream-every", type=int, default=0,
                        help="every N-th request streamed (1: all); 0: none")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = [run(loop, args.requests, args.concurrency, args.parse_units, args.stream_every)
               for _ in range(args.rounds) for loop in args.loops.split(",")]  # fmt: skip
    for result in results:
        print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
