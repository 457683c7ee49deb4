"""Where the CPU of bench/overhead.py's variants goes, thread by thread (user and system time).

Runs each variant of bench/overhead.py (the same app, exporter and processor) for N requests
plus the flush of what they queued, and reads every thread's user and system CPU time from
``/proc/self/task/*/stat`` and its voluntary context switches from ``/proc/self/task/*/status``
before and after (Linux; clock-tick resolution, hence the many requests). ``tracekit-unbuilt``
is tracekit with finished requests dropped instead of built into spans: the request path alone;
the other diagnostic variants are bench/overhead.py's. Variants alternate for ``--rounds``
rounds; each line is one run.

What it shows on the development machine (docs/performance.md): the loop thread's own CPU,
system time included, is higher when spans are built on the background thread than when they
are not built at all, beyond the builder's own CPU; a thread waiting for the GIL switches in
and out thousands of times a second (``sw``: voluntary switches per request).

Run: .venv/bin/python bench/thread_cpu.py [--requests 20000] [--rounds 2] [--variants V1,V2,...]
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

from tracekit._export import tracing

TICK = os.sysconf("SC_CLK_TCK")


def thread_times() -> dict[int, tuple[float, float, int]]:
    """Native thread id -> (user s, system s, voluntary switches) for every thread."""
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status") as f:
                status = f.read()
        except OSError:  # the thread ended
            continue
        switches = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        times[int(tid)] = (int(fields[11]) / TICK, int(fields[12]) / TICK, switches)
    return times


def run(name: str, n: int) -> dict[str, tuple[float, float, float]]:
    """Per-thread (user µs, system µs, voluntary switches) per request of one variant."""
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
        overhead.retire()
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid, (user, system, switches) in after.items():
        user0, system0, switches0 = before.get(tid, (0.0, 0.0, 0))
        if user - user0 or system - system0 or switches - switches0:
            out[names.get(tid, str(tid))] = (
                (user - user0) / n * 1e6, (system - system0) / n * 1e6, (switches - switches0) / n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="bare,otel,tracekit,tracekit-unbuilt")
    args = parser.parse_args()
    otel_trace.set_tracer_provider(TracerProvider())
    tracing.MAX_QUEUE = 1_000_000  # as bench/overhead.py: every request's spans are built
    print("per request, thread: user + system CPU µs, voluntary context switches")
    for _ in range(args.rounds):
        for name in args.variants.split(","):
            started = time.perf_counter()
            threads = run(name, args.requests)
            wall = (time.perf_counter() - started) / args.requests * 1e6
            cells = ", ".join(f"{thread} {user:.1f} + {system:.1f} ({switches:.2f} sw)"
                              for thread, (user, system, switches) in sorted(threads.items()))  # fmt: skip
            print(f"{name:17s} (~{wall:.0f} µs wall): {cells}")


if __name__ == "__main__":
    main()
