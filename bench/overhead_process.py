"""Per-request overhead as the process's CPU, median of interleaved rounds: the second method
beside bench/overhead.py (docs/performance.md, "Two ways to count").

Each round runs every variant of bench/overhead.py once (the same app, exporter, processor),
in turn: the variant is set up afresh, as a process that starts serving would be, and N
requests are called as ASGI on a new event loop, then tracekit's queue and the SDK's batch
queue are flushed. What is counted is the process's CPU (``time.process_time``: every
thread, the garbage collector included) from the first request to the end of the flush,
divided by N; the figure is the median over the rounds, and the ratio is
(median variant - median bare) / (median otel - median bare).

Unlike bench/overhead.py, nothing is warmed up by default (``--warmup 0``): a variant's first
requests pay for what it sets up on first use, as they do in a process that just started; and
the statistic is the median, not the best round. ``--warmup N`` runs N requests (and a flush,
and a collection) first, as bench/overhead.py does: the two settings side by side show what
the first requests cost (``--split`` does both in the same rounds).

Each thread's CPU over the same span is read from its clock (``pthread_getcpuclockid``) and
reported too (median per thread name): the event loop's thread, tracekit's span builder,
the SDK's export thread, the watchdog; ``ended`` is the CPU of threads that ended during the
run (the process's minus the live threads').

Run: .venv/bin/python bench/overhead_process.py [--requests 1500] [--rounds 5] [--warmup 0]
     [--variants bare,otel,tracekit] [--split] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

import overhead
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider

from tracekit import _native
from tracekit._export import tracing


def thread_cpu() -> dict[str, float]:
    """Thread name -> CPU seconds, for every live Python thread (same names summed)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # ended meanwhile
            continue
        name = _family(thread.name)
        out[name] = out.get(name, 0.0) + seconds
    return out


def _family(name: str) -> str:
    """A thread's name without the SDK's or threading's per-instance suffix."""
    if name.startswith("OtelBatch"):
        return "sdk-export"
    return name.split(" ")[0]


def measure(name: str, n: int, warmup: int) -> tuple[float, dict[str, float]]:
    """(process CPU µs per request, thread name -> CPU µs per request) of one run."""
    gc.collect()  # the previous variant's garbage is not this one's
    cpu0 = time.process_time()
    threads0 = thread_cpu()
    app, flush = overhead.variant(name)
    loop = asyncio.new_event_loop()
    try:
        if warmup:
            loop.run_until_complete(overhead.drive(app, warmup))
            flush()
            gc.collect()
            cpu0 = time.process_time()
            threads0 = thread_cpu()
        loop.run_until_complete(overhead.drive(app, n))
        flush()
        cpu = time.process_time() - cpu0
        threads1 = thread_cpu()
    finally:
        loop.close()
        overhead.retire()
    per_thread = {t: (s - threads0.get(t, 0.0)) / n * 1e6 for t, s in threads1.items()}
    per_thread = {t: us for t, us in per_thread.items() if us > 0.05}
    per_thread["ended"] = max(0.0, cpu / n * 1e6 - sum(per_thread.values()))
    return cpu / n * 1e6, per_thread


def run(names: list[str], n: int, count: int, warmups: list[int]) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    threads: dict[str, dict[str, list[float]]] = {}
    for _ in range(count):
        for warmup in warmups:
            for name in names:
                key = name if len(warmups) == 1 else f"{name}@warmup{warmup}"
                cpu, per_thread = measure(name, n, warmup)
                samples.setdefault(key, []).append(cpu)
                for thread, us in per_thread.items():
                    threads.setdefault(key, {}).setdefault(thread, []).append(us)
    medians = {key: statistics.median(s) for key, s in samples.items()}
    out: dict[str, Any] = {"cpu_us_median": medians, "cpu_us_rounds": samples,
                           "threads_us_median": {k: {t: statistics.median(v + [0.0] * (count - len(v)))
                                                     for t, v in ts.items()}
                                                 for k, ts in threads.items()}}  # fmt: skip
    ratios = {}
    for warmup in warmups:
        suffix = "" if len(warmups) == 1 else f"@warmup{warmup}"
        bare, otel = medians.get("bare" + suffix), medians.get("otel" + suffix)
        if bare is None or otel is None:
            continue
        for name in names:
            if name not in ("bare", "otel"):
                ratios[name + suffix] = (medians[name + suffix] - bare) / (otel - bare)
    out["ratio_to_otel"] = ratios
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--split", action="store_true",
                        help="run every variant both without warm-up and after --warmup "
                             "(default 1000 then) in the same rounds")  # fmt: skip
    parser.add_argument("--variants", default="bare,otel,tracekit")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    otel_trace.set_tracer_provider(TracerProvider())  # as bench/overhead.py
    tracing.MAX_QUEUE = 1_000_000  # as bench/overhead.py: every request's spans are built
    warmups = [0, args.warmup or 1000] if args.split else [args.warmup]
    results = run(args.variants.split(","), args.requests, args.rounds, warmups)
    results = {"build": "compiled (mypyc)" if _native.compiled() else "plain Python",
               "tracekit": os.path.dirname(_native.__file__),
               "python": sys.version.split()[0], "requests_per_round": args.requests,
               "rounds": args.rounds, "load_average": os.getloadavg(), **results}  # fmt: skip
    for key, us in results["cpu_us_median"].items():
        cells = ", ".join(f"{t} {v:.1f}" for t, v in
                          sorted(results["threads_us_median"][key].items(), key=lambda kv: -kv[1]))
        print(f"{key:28s} process CPU {us:7.1f} µs/request (threads: {cells})")
    for key, ratio in results["ratio_to_otel"].items():
        print(f"{key:28s} overhead / OTel's: {ratio:.3f}")
    print(f"tracekit from {results['tracekit']} ({results['build']}); load average "
          f"{results['load_average'][0]:.2f} {results['load_average'][1]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
