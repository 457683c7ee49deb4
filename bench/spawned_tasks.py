"""CPU per task a traced request spawns, with and without tracekit's task factory.

One request (in-process ASGI call, no sockets) spawns and awaits N trivial tasks that each
suspend once (``asyncio.sleep(0)``); variants interleaved in rounds, the thread's CPU time per
task, best round (noise only adds). ``tracekit`` drives each task and folds its ledger into the
request's; ``untraced`` is the same app without the middleware.

Run: .venv/bin/python bench/spawned_tasks.py [--tasks 20000] [--rounds 5] [--loop asyncio|uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import tracekit


async def _child() -> None:
    await asyncio.sleep(0)


def _app(tasks: int) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        for _ in range(tasks // 100):
            await asyncio.gather(*(asyncio.create_task(_child()) for _ in range(100)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def _one(app: Any) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "root_path": "",
             "query_string": b"", "headers": [], "scheme": "http", "http_version": "1.1"}  # fmt: skip
    await app(scope, receive, send)


def measure(tasks: int, traced: bool, loop: str) -> float:
    """µs of thread CPU per spawned task."""
    app = _app(tasks)
    if traced:
        app = tracekit.TracekitMiddleware(app)
    runner = asyncio.run
    if loop == "uvloop":
        import uvloop

        runner = uvloop.run
    started = time.thread_time()
    runner(_one(app))
    return (time.thread_time() - started) / tasks * 1e6


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    args = parser.parse_args()
    results: dict[str, list[float]] = {"untraced": [], "tracekit": []}
    with tracekit.record():
        for _ in range(args.rounds):
            for name in results:
                results[name].append(measure(args.tasks, name == "tracekit", args.loop))
    best = {name: min(values) for name, values in results.items()}
    print(json.dumps({
        "loop": args.loop, "tasks": args.tasks, "rounds": args.rounds,
        "untraced_us_per_task": round(best["untraced"], 2),
        "tracekit_us_per_task": round(best["tracekit"], 2),
        "added_us_per_task": round(best["tracekit"] - best["untraced"], 2),
        "build": "plain Python" if os.environ.get("TRACEKIT_PURE_PYTHON") else "compiled where built",
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
