"""The GIL hand-over to the span-building thread on a loop that never idles.

Serves bench/overhead.py's app (four stages, one zero-time suspension a request: the loop's
select never blocks) one request after another for ``--seconds``, traced, its spans to a
``SimpleSpanProcessor`` that drops them (no other thread wanting the GIL). Prints the requests
served, the hand-overs (``tracekit._export.tracing.Runtime._hand_over_gil``) and those the
builder did not take within ``HAND_OVER_WAIT_S``, the spans exported against the requests'
five each (plus a ``tracekit.loop`` window span a second), how long each hand-over blocked the
loop (until the builder's slice of building ended), and how late the builder returned from
its sleeps (the time it waited for the GIL). ``--starved`` runs it with no hand-over (bench/overhead.py's
``tracekit-starved``). Run it beside busy processes to see a busy host
(``python3 -c 'while 1: pass' &`` twice).

Run: .venv/bin/python bench/gil_hand_over.py [--seconds 3] [--starved]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import overhead
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import tracekit
from tracekit._core import current


class TimedWake(threading.Event):
    """The builder's wake-up event, timing how late each of its timed-out sleeps returned."""

    def __init__(self) -> None:
        super().__init__()
        self.late_ms: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        started = time.monotonic()
        woken = super().wait(timeout)
        if not woken and timeout is not None:
            self.late_ms.append((time.monotonic() - started - timeout) * 1000)
        return woken


def quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"p50 {pick(0.5):.2f}, p90 {pick(0.9):.2f}, max {ordered[-1]:.2f} ms ({len(ordered)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--starved", action="store_true", help="no hand-over")
    args = parser.parse_args()
    exporter = overhead.DroppingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracekit.configure(tracer_provider=provider)
    runtime = current.active_runtime
    assert runtime is not None
    wake = runtime._wake = TimedWake()
    blocked_ms: list[float] = []
    hand_over = runtime._hand_over_gil

    def timed_hand_over() -> None:
        started = time.perf_counter()
        hand_over()
        blocked_ms.append((time.perf_counter() - started) * 1000)

    if args.starved:
        overhead._alter(runtime, "starved")
    else:
        runtime._hand_over_gil = timed_hand_over  # type: ignore[method-assign]
    app: Any = tracekit.TracekitMiddleware(overhead.make_app(True))

    async def serve() -> int:
        served = 0
        until = time.monotonic() + args.seconds
        while time.monotonic() < until:
            await overhead.drive(app, 200)
            served += 200
        return served

    served = asyncio.run(serve())
    runtime.flush()
    print(f"requests {served}; hand-overs {runtime.hand_overs}, missed {runtime.hand_overs_missed}; "
          f"spans {exporter.spans} of {served * 5}")  # 5 a request, and the loop's windows
    print(f"loop blocked by a hand-over: {quantiles(blocked_ms)}; in all {sum(blocked_ms):.1f} ms")
    print(f"builder late after its sleep: {quantiles(wake.late_ms)}")


if __name__ == "__main__":
    main()
