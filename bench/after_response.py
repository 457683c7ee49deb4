"""Work a request leaves on the loop after its response: recorded, reported, replayed.

A FastAPI gateway on real uvicorn (a thread of this process, 127.0.0.1): each request burns
``--handler`` units of pure-Python CPU, awaits a 20 ms "model call", spawns a spend-logging
task and returns; the task sleeps 1 ms, then burns ``--after`` units on the loop, after the
response has left. ``--clients`` closed-loop httpx clients (in this process too) send
``--requests`` requests. Printed per run: the request spans' CPU against their wall time (no
span may show more CPU than wall), the route's ``after_response_cpu_ms``, the loop CPU the
report gives the route, and the as-recorded replay's p50 and p95 errors (``validation``):
with ``--after 0`` the baseline, the same gateway with no work after its responses.

Run: .venv/bin/python bench/after_response.py [--after 4] [--handler 2] [--clients 4]
     [--requests 300] [--runs 3] [--loop asyncio|uvloop] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any

import fastapi
import httpx
import uvicorn

import tracekit
from tracekit import semconv as sc


def spin(units: int) -> int:
    """A fixed amount of pure-Python CPU work (about 0.8 ms a unit on this host)."""
    total = 0
    for i in range(units * 20_000):
        total += i * i % 7
    return total


def gateway(handler: int, after: int) -> fastapi.FastAPI:
    app = fastapi.FastAPI(telemetry={"tracing": False})
    app.add_middleware(tracekit.TracekitMiddleware)
    tasks: set[asyncio.Task[None]] = set()

    async def log_spend() -> None:
        await asyncio.sleep(0.001)
        spin(after)

    @app.post("/chat")
    async def chat() -> dict[str, bool]:
        spin(handler)
        await asyncio.sleep(0.02)  # the model call
        task = asyncio.create_task(log_spend())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"ok": True}

    return app


async def drive(url: str, requests: int, clients: int) -> None:
    left = [requests]
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one() -> None:
            while left[0] > 0:
                left[0] -= 1
                (await client.post("/chat", json={})).raise_for_status()

        await asyncio.gather(*(one() for _ in range(clients)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = uvicorn.Config(gateway(args.handler, args.after), host="127.0.0.1", port=0,
                            log_level="warning", loop=args.loop)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("uvicorn did not start")
        time.sleep(0.01)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        with tracekit.record() as rec:
            asyncio.run(asyncio.wait_for(drive(url, args.requests, args.clients), 120))
            time.sleep(0.5)  # the last spend logging ends
            spans = rec.spans
    finally:
        server.should_exit = True
        thread.join(15)
    servers = [s.attributes for s in spans if s.kind.name == "SERVER"]
    report = tracekit.analyze(spans).to_dict()
    (route,) = [r for r in report["routes"] if r["route"] == "POST /chat"]
    loop_routes = (report.get("loop") or {}).get("routes") or []
    validation = report.get("validation") or {}
    return {
        "requests": len(servers),
        "cpu_over_wall": sum(a[sc.CPU_MS] > a[sc.WALL_MS] * 1.01 + 0.05 for a in servers),
        "latency_p50_ms": route["latency_ms"]["p50"],
        "after_response_cpu_ms": route.get("after_response_cpu_ms"),
        "loop_cpu_share": next((r["loop_cpu_share"] for r in loop_routes
                                if r["route"] == "POST /chat"), None),  # fmt: skip
        "replay_p50_error": validation.get("p50_error"),
        "replay_p95_error": validation.get("p95_error"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", type=int, default=4, help="CPU units after the response")
    parser.add_argument("--handler", type=int, default=2, help="CPU units in the handler")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        result = run(args)
        results.append(result)
        print(f"run {i + 1}: " + json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
