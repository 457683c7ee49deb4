"""The as-recorded replay of open arrivals, on a gateway with nothing but the loop in it.

One process, no server, no model: ``TracekitMiddleware`` over a bare ASGI app called in-process
by a driver task at Poisson arrivals (``--rate`` a second). Each request burns 0.3 ms of CPU,
makes a 21 ms blocking call (``time.sleep``, a sync client) in a ``lookup`` stage, then a
``model`` stage waits 20 ms and runs ``--steps`` steps of 0.2 ms CPU 2 ms apart (a stream's
chunks). The loop is the only thing the requests share, so what the replay misses here is its
model of the loop and of the arrivals, not of a server, a lock or the host.

Prints the recorded breakdown and the replay's self-check (``validation``: simulated / measured
− 1 for p50 and p95).

Run: .venv/bin/python bench/replay_open_arrivals.py [--rate 20] [--requests 300] [--steps 8]
     [--loop asyncio|uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tracekit
from tests.core.asgi import call, http_scope


def _burn(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="Poisson arrivals a second")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--steps", type=int, default=8, help="the model stage's steps")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()

    @tracekit.stage("lookup", kind="other")
    def lookup() -> None:
        _burn(0.5)
        time.sleep(0.021)

    @tracekit.stage("model")
    async def model() -> None:
        await asyncio.sleep(0.020)
        for _ in range(args.steps):
            _burn(0.2)
            await asyncio.sleep(0.002)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        _burn(0.3)
        lookup()
        await model()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    traced = tracekit.TracekitMiddleware(app)
    rng = random.Random(1)

    async def drive() -> None:
        tasks, began, due = [], time.perf_counter(), 0.0
        for _ in range(args.requests):
            due += rng.expovariate(args.rate)
            if (wait := began + due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(call(traced, http_scope("/chat", "POST"))))
        await asyncio.gather(*tasks)

    with tracekit.record() as recording:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(drive())
        else:
            asyncio.run(drive())
    report = tracekit.analyze(recording.spans).to_dict()
    for route in report["routes"]:
        latency = route["latency_ms"]
        print(f"{route['route']}: {route['requests']} requests, p50 {latency['p50']:.1f} ms, "
              f"p95 {latency['p95']:.1f} ms; mean ms a request:",
              ", ".join(f"{k} {v:.1f}" for k, v in route["breakdown_ms"].items()))  # fmt: skip
    check = report["validation"]
    print(f"replayed as recorded: p50 {check['p50_error']:+.0%}, p95 {check['p95_error']:+.0%}"
          f" ({'ok' if check['ok'] else 'declines'})")  # fmt: skip


if __name__ == "__main__":
    main()
