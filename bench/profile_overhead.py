"""CPU per request of the pyinstrument drill-down (tracekit.integrations.pyinstrument).

An ASGI gateway (TracekitMiddleware + Starlette, called in-process: no sockets, so only the
gateway's CPU is counted) whose ``tokenize`` stage spends ~``--work-ms`` of Python CPU in a
helper two calls down, recorded with ``tracekit.record()``. Runs the same requests with the
drill-down off, ``enable(every=50)`` (the default) and ``enable(every=1)`` (every call
profiled), interleaved over ``--rounds`` rounds, and prints the process CPU per request
(``time.process_time``, median over rounds) and the difference to "off".

Run: PYTHONPATH=. TRACEKIT_PURE_PYTHON=1 .venv/bin/python bench/profile_overhead.py
     [--requests 400] [--rounds 5] [--work-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tracekit.integrations import pyinstrument

ROUNDS_PER_MS = 0


def _helper(rounds: int) -> int:
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) % 1_000_003
    return total


def _middle(rounds: int) -> int:
    return _helper(rounds)


@tracekit.stage("tokenize")
def tokenize(rounds: int) -> int:
    return _middle(rounds)


def _app() -> Any:
    async def chat(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"n": tokenize(ROUNDS_PER_MS)})

    return tracekit.TracekitMiddleware(Starlette(routes=[Route("/v1/chat", chat, methods=["POST"])]))


async def _one(app: Any) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat", "raw_path": b"/v1/chat", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}  # fmt: skip
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(scope, receive, send)


def _cpu_per_request(app: Any, n: int) -> float:
    async def run() -> float:
        c0 = time.process_time()
        for _ in range(n):
            await _one(app)
        return (time.process_time() - c0) / n * 1e6

    return asyncio.run(run())


def main() -> None:
    global ROUNDS_PER_MS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-ms", type=float, default=2.0)
    args = parser.parse_args()
    c0 = time.process_time()
    _helper(1_000_000)
    ROUNDS_PER_MS = int(1_000_000 / ((time.process_time() - c0) * 1e3) * args.work_ms)
    app = _app()
    configs: dict[str, dict[str, Any] | None] = {"off": None, "every=50": {"every": 50},
                                                 "every=1": {"every": 1}}  # fmt: skip
    results: dict[str, list[float]] = {k: [] for k in configs}
    with tracekit.record() as rec:
        _cpu_per_request(app, 50)  # warm-up
        for _ in range(args.rounds):
            for name, options in configs.items():
                if options is None:
                    pyinstrument.disable()
                else:
                    pyinstrument.enable(**options, loop=False)
                results[name].append(_cpu_per_request(app, args.requests))
                rec.clear()
        pyinstrument.disable()
    base = statistics.median(results["off"])
    print(f"{args.requests} requests x {args.rounds} rounds, stage work ~{args.work_ms} ms of CPU")
    print(f"{'config':<10} {'CPU us/request (median)':>24} {'vs off':>10}")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<10} {med:>24.0f} {med - base:>+10.0f}")


if __name__ == "__main__":
    main()
