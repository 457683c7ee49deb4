"""Where the CPU of bench/overhead.py's variants goes, thread by thread (user and system time).

Runs each variant of bench/overhead.py (the same app, exporter and processor) for N requests
plus the flush of what they queued, and reads every thread's user and system CPU time from
``/proc/self/task/*/stat`` before and after (Linux; clock-tick resolution, hence the many
requests). ``tracekit-unbuilt`` is tracekit with finished requests dropped instead of built into
spans: the request path alone. Variants alternate for ``--rounds`` rounds; each line is one run.

What it shows on the development machine (docs/performance.md): the loop thread's own CPU,
system time included, is higher when spans are built on the background thread than when they
are not built at all, beyond the builder's own CPU.

Run: .venv/bin/python bench/thread_cpu.py [--requests 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import threading
import time

import overhead
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider

from tracekit import _runtime

TICK = os.sysconf("SC_CLK_TCK")


def thread_times() -> dict[int, tuple[float, float]]:
    """Native thread id -> (user s, system s) for every thread of this process."""
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        times[int(tid)] = (int(fields[11]) / TICK, int(fields[12]) / TICK)
    return times


def run(name: str, n: int) -> dict[str, tuple[float, float]]:
    """Per-thread (user µs, system µs) per request of one variant."""
    app, flush = overhead.variant(name)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(overhead.drive(app, 500))
        flush()
        gc.collect()
        before = thread_times()
        loop.run_until_complete(overhead.drive(app, n))
        flush()
        after = thread_times()
    finally:
        loop.close()
        _runtime.install(None)
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid, (user, system) in after.items():
        user0, system0 = before.get(tid, (0.0, 0.0))
        if user - user0 or system - system0:
            out[names.get(tid, str(tid))] = ((user - user0) / n * 1e6, (system - system0) / n * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    otel_trace.set_tracer_provider(TracerProvider())
    _runtime.MAX_QUEUE = 1_000_000  # as bench/overhead.py: every request's spans are built
    print("CPU µs per request, thread: user + system")
    for _ in range(args.rounds):
        for name in ("bare", "otel", "tracekit", "tracekit-unbuilt"):
            started = time.perf_counter()
            threads = run(name, args.requests)
            wall = (time.perf_counter() - started) / args.requests * 1e6
            cells = ", ".join(f"{thread} {user:.1f} + {system:.1f}"
                              for thread, (user, system) in sorted(threads.items()))  # fmt: skip
            print(f"{name:17s} (~{wall:.0f} µs wall): {cells}")


if __name__ == "__main__":
    main()
