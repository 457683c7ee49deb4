"""The whole loop on a proxy-shaped gateway, against measurements tracekit does not make.

Serves ``tests/loop/proxy.py``'s gateway (the shape of an open-source LLM proxy: the upstream
call in a spawned task, logging after the response, streamed replies) with uvicorn + httptools
on 127.0.0.1, the model server (``examples/model_server.py``) in a process of its own, and
drives closed-loop load. Prints, per event loop:

- the loop thread's CPU from ``/proc/self/task/<tid>/schedstat`` against tracekit's loop
  windows: attributed (requests + GC + tracekit) and background;
- the model stage's wait p50 against the model server's own time (from the request's
  body written to the reply done, by its ``x-model-done-ns``: ``tests/loop/proxy.py``) and
  a direct probe (a separate process calling the model server one request at a time during
  the load);
- the loop probe's lag and the model stage's wall time (how saturated the loop was), and its
  queue and loop waits (mean);
- the clients' latency beyond the request spans' wall time (the wait before a span begins)
  against the part of it tracekit measures (``tracekit.start_wait_ms``).

Run: .venv/bin/python bench/whole_loop.py [--loops asyncio,uvloop] [--requests 300]
     [--concurrency 32] [--stream-every 0] [--parse-units 4] [--rounds 1] [--json out.json]

``--parse-units 12 --concurrency 64 --requests 192`` is the saturated-loop test's setup
(``tests/loop/test_whole_loop.py``); each result line also gives the model wait's error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracekit  # noqa: E402
from tests.conftest import Server  # noqa: E402
from tests.loop.proxy import ModelServer, Proxy, drive_load, thread_cpu_ns  # noqa: E402
from tracekit import semconv as sc  # noqa: E402
from tracekit._core import current  # noqa: E402
from tracekit._export import tracing  # noqa: E402

_PROBE = """
import json, sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
body = json.dumps({"messages": [{"role": "user", "content": "probe"}], "max_tokens": 8}).encode()
out, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    start = time.perf_counter()
    urllib.request.urlopen(urllib.request.Request(
        url + "/v1/chat/completions", body, {"content-type": "application/json"}), timeout=30).read()
    out.append((time.perf_counter() - start) * 1000)
    time.sleep(0.02)
print(json.dumps(out))
"""


def run(loop: str, requests: int, concurrency: int, stream_every: int, parse_units: float) -> dict[str, Any]:
    model = ModelServer("--prefill-ms", "40", "--decode-ms", "2")
    proxy = Proxy(model.url, parse_units=parse_units)
    try:
        with tracekit.record() as rec:
            server = Server(proxy.app, loop=loop, http="httptools")
            try:
                drive_load(server.url, 8, 4)
                time.sleep(0.3)
                tracing.flush_all()
                before, served_before = len(rec.spans), len(proxy.model_ms)
                runtime = current.active_runtime
                hand_overs = runtime.hand_overs if runtime is not None else 0
                cpu_before = thread_cpu_ns(proxy.loop_tid)
                probe = subprocess.Popen([sys.executable, "-c", _PROBE, model.url, "4"],
                                         stdout=subprocess.PIPE, text=True)  # fmt: skip
                started = time.perf_counter()
                latencies = drive_load(server.url, requests, concurrency, stream_every=stream_every)
                elapsed = time.perf_counter() - started
                direct = json.loads(probe.communicate(timeout=120)[0])
                time.sleep(0.5)
                cpu_after = thread_cpu_ns(proxy.loop_tid)
                if runtime is not None:
                    hand_overs = runtime.hand_overs - hand_overs
                tracing.flush_all()
                spans = rec.spans[before:]
            finally:
                server.stop()
    finally:
        model.stop()
    windows = [s.attributes for s in spans if s.name == sc.LOOP_SPAN]
    models = [s.attributes for s in spans if s.attributes.get(sc.STAGE) == "model"]
    servers = [s.attributes for s in spans if s.kind.name == "SERVER"]
    proc = (cpu_after - cpu_before) / 1e6

    def total(key: str) -> float:
        return sum(w[key] for w in windows)

    attributed = total(sc.LOOP_REQUESTS_CPU_MS) + total(sc.LOOP_GC_CPU_MS) + total(sc.LOOP_TRACEKIT_CPU_MS)
    return {
        "loop": loop, "requests": len(latencies), "concurrency": concurrency,
        "elapsed_s": round(elapsed, 2), "client_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "loop_cpu_proc_ms": round(proc, 1), "loop_cpu_windows_ms": round(total(sc.LOOP_CPU_MS), 1),
        "attributed_share": round(attributed / proc, 3),
        # the request spans' CPU with what their work ran after the response (not in cpu_ms)
        "requests_spans_share": round(sum(a[sc.CPU_MS] + a.get(sc.AFTER_RESPONSE_CPU_MS, 0.0)
                                          for a in servers) / proc, 3),
        # the wait before the spans: the clients' latency beyond the spans' wall time, and the
        # part tracekit measures (tracekit.start_wait_ms: the server's task made to its first step)
        "client_beyond_spans_mean_ms": round(statistics.mean(latencies) * 1000
                                             - statistics.mean(a[sc.WALL_MS] for a in servers), 1),
        "start_wait_mean_ms": round(statistics.mean(a.get(sc.START_WAIT_MS, 0.0) for a in servers), 1),
        "background_share": round(total(sc.LOOP_BACKGROUND_CPU_MS) / proc, 3),
        "model_server_own_p50_ms": round(statistics.median(proxy.model_ms[served_before:]), 1)
        if len(proxy.model_ms) > served_before else None,
        "direct_probe_p50_ms": round(statistics.median(direct), 1) if direct else None,
        "model_wait_p50_ms": round(statistics.median(a[sc.WAIT_MS] for a in models), 1),
        "model_wait_error": round(statistics.median(a[sc.WAIT_MS] for a in models)
                                  / statistics.median(proxy.model_ms[served_before:]) - 1, 3)
        if len(proxy.model_ms) > served_before else None,  # streamed calls: no server time kept
        "model_stage_wall_p50_ms": round(statistics.median(a[sc.WALL_MS] for a in models), 1),
        # the HTTP client's connection locks (anyio's, held across a yield to the loop)
        "model_queue_wait_mean_ms": round(statistics.mean(a.get(sc.QUEUE_WAIT_MS, 0.0) for a in models), 1),
        "model_loop_wait_mean_ms": round(statistics.mean(a.get(sc.LOOP_WAIT_MS, 0.0) for a in models), 1),
        # the GIL handed to the span builder (tracekit._export.tracing: a loop that never idles)
        "builder_hand_overs": hand_overs,
        "lag_p50_ms_by_window": [round(w.get(sc.LOOP_LAG_P50_MS, 0), 1) for w in windows],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stream-every", type=int, default=0)
    parser.add_argument("--parse-units", type=float, default=4.0,
                        help="the proxy's unstaged CPU after the model call (~1 ms a unit)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per loop, loops alternating")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = [run(loop, args.requests, args.concurrency, args.stream_every, args.parse_units)
               for _ in range(args.rounds) for loop in args.loops.split(",")]  # fmt: skip
    for result in results:
        print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
