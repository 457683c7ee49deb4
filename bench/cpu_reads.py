"""How many CPU-clock readings a traced request takes, and how many are real system calls.

Every step boundary takes a thread-CPU reading; one within 20 µs of wall time after a real one
is inferred from it (tracekit/_core/event_loop.py, cpu_now; docs/attributes.md). This counts both on the
overhead benchmark's request (bench/overhead.py: a handler with four stages), one request after
another on one loop. The count of boundaries needs the plain-Python build (it wraps a module
function that compiled callers do not look up); real reads are counted on either build.

Run: .venv/bin/python bench/cpu_reads.py            (the build installed: compiled, usually)
     TRACEKIT_PURE_PYTHON=1 .venv/bin/python bench/cpu_reads.py
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from overhead import drive, variant

from tracekit import _native
from tracekit._core import clock, event_loop

REQUESTS = 5000


def count(app: Any, flush: Any, loop: asyncio.AbstractEventLoop) -> tuple[float, float | None]:
    """(real readings, all readings or None) per request."""
    real, boundaries = [0], [0]
    thread_time, cpu_now = time.thread_time_ns, event_loop.cpu_now

    def counted_clock() -> int:
        real[0] += 1
        return thread_time()

    def counted_now(state: event_loop.ThreadState, now: int) -> int:
        boundaries[0] += 1
        return cpu_now(state, now)

    clock.cpu_ns = counted_clock
    event_loop.cpu_now = counted_now  # type: ignore[assignment]
    try:
        loop.run_until_complete(drive(app, REQUESTS))
        flush()
    finally:
        clock.cpu_ns, event_loop.cpu_now = thread_time, cpu_now  # type: ignore[assignment]
    return real[0] / REQUESTS, (boundaries[0] / REQUESTS if boundaries[0] else None)


def main() -> None:
    otel_trace.set_tracer_provider(TracerProvider())
    app, flush = variant("tracekit")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(drive(app, 500))  # warm-up
    flush()
    real, boundaries = count(app, flush, loop)
    build = "compiled" if _native.compiled() else "plain Python"
    seen = f"{boundaries:.2f}" if boundaries is not None else "not countable on this build"
    print(f"{build}: {real:.2f} real CPU-clock reads per request; readings taken: {seen}")


if __name__ == "__main__":
    main()
