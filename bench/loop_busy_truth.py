"""``loop-saturated``'s busy ratio on a short recording, against the loop thread's CPU from /proc.

The proxy-shaped gateway of ``tests/loop/proxy.py`` (uvicorn, its model server in a process of
its own) gets one warm-up request, ``--idle`` seconds of nothing, then a burst of closed-loop
requests from another process (a new user's first recording has this shape). The truth is the
loop thread's CPU over the burst (``/proc/self/task/<tid>/schedstat``) divided by the burst's
wall time. tracekit's figures: each ``tracekit.loop`` window's busy ratio as recorded (loop CPU
over the window) and as ``loop-saturated`` reads it (loop CPU over the part of the window that
requests were in flight: :func:`tracekit.analysis.rules.loop_load.loop_load`), and their
medians, which the rule compares with its 85% gate.

Run: .venv/bin/python bench/loop_busy_truth.py [--loop uvloop] [--requests 96]
     [--concurrency 16] [--idle 3] [--parse-units 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracekit  # noqa: E402
from tests.conftest import Server  # noqa: E402
from tests.loop.proxy import ModelServer, Proxy, drive_load, thread_cpu_ns  # noqa: E402
from tracekit._export import tracing  # noqa: E402
from tracekit.analysis.pipeline import Pipeline, Settings  # noqa: E402
from tracekit.analysis.readers import read_spans  # noqa: E402
from tracekit.analysis.rules.findings import RuleContext  # noqa: E402
from tracekit.analysis.rules.loop_load import loop_loads  # noqa: E402


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--parse-units", type=float, default=4.0)
    args = parser.parse_args()
    model = ModelServer("--prefill-ms", "20", "--decode-ms", "2")
    proxy = Proxy(model.url, parse_units=args.parse_units)
    try:
        with tracekit.record() as rec:
            server = Server(proxy.app, loop=args.loop, http="httptools")
            try:
                drive_load(server.url, 1, 1)  # the warm-up
                time.sleep(args.idle)
                cpu0, wall0 = thread_cpu_ns(proxy.loop_tid), time.perf_counter()
                drive_load(server.url, args.requests, args.concurrency)
                cpu1, wall1 = thread_cpu_ns(proxy.loop_tid), time.perf_counter()
                time.sleep(1.2)  # the last loop window
                tracing.flush_all()
                spans = list(read_spans(list(rec.spans)))
            finally:
                server.stop()
    finally:
        model.stop()
    pipeline = Pipeline(Settings())
    pipeline.add(spans)
    pipeline.finish()
    agg = pipeline.aggregator
    (load,) = loop_loads(agg.sample(), RuleContext(loops=agg.loops)).values()
    recorded = [w.busy_ratio for w in load.windows]
    print(json.dumps({
        "loop": args.loop,
        # the load generator's process start (~0.3 s) is inside the burst's wall: a lower bound
        "truth_busy_during_burst": round((cpu1 - cpu0) / 1e9 / (wall1 - wall0), 3),
        "burst_s": round(wall1 - wall0, 2),
        "windows_recorded_busy": [round(b, 3) for b in recorded],
        "windows_busy_while_serving": [round(b, 3) for b in load.busy],
        "median_recorded": round(statistics.median(recorded), 3),
        "median_while_serving": round(load.busy_p50, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
