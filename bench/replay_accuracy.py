"""Do the replay's projections hold? Small gateways under uvicorn, before and after the fix.

Each case is a small Starlette gateway (``TracekitMiddleware``, a ``tokenize`` stage, a
model call to ``examples/model_server.py`` with httpx) with one defect, served by uvicorn
(1 worker, 127.0.0.1) and driven by a load process (closed loop: ``--clients`` clients, or
open: Poisson arrivals at ``--rate`` requests/s):

- ``tokenize``: GIL-free CPU (``hashlib``, as a Rust tokenizer) on the event loop;
  fixed: ``asyncio.to_thread``.
- ``blocking``: a blocking HTTP client (``httpx.Client``) on the loop; fixed: ``to_thread``.
- ``serial``: the model server serves one request at a time; fixed: a batching server.

Per case and round: record the defective gateway, ``tracekit.analyze`` it (the finding
whose fix is the one applied, its projection, range and model), record the fixed gateway,
and print the measured figures beside the projected ones. Runs alternate before/after.

Run: .venv/bin/python bench/replay_accuracy.py [--cases tokenize,blocking,serial]
     [--clients 8 | --rate 40] [--requests 300] [--rounds 1] [--cores N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from servers import free_port, start, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
RULES = {"tokenize": "cpu-on-loop", "blocking": "blocking-call-on-loop", "serial": "serialized-model-calls"}
_DATA = b"x" * 400_000  # hashlib releases the GIL on inputs over 2 KiB


def make_app(case: str, fixed: bool, model_url: str) -> Any:
    """The gateway of ``case`` (defective, or with the fix applied)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import tracekit

    client = httpx.AsyncClient(base_url=model_url, timeout=30)
    sync_client = httpx.Client(base_url=model_url, timeout=30)

    @tracekit.stage("tokenize")
    def tokenize(text: str) -> int:
        rounds = 50 if case == "tokenize" else 1  # ~14 ms / ~0.3 ms of CPU
        digest = b""
        for _ in range(rounds):
            digest = hashlib.sha256(_DATA + text.encode()).digest()
        return len(digest) + len(text.split())

    @tracekit.stage("lookup", kind="other")
    def lookup() -> int:  # a blocking client: the model server's prefill, ~20 ms
        return sync_client.post("/v1/chat/completions", json={"max_tokens": 0, "messages": []}).status_code

    @tracekit.stage("model")
    async def complete(text: str) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
        r = await client.post("/v1/chat/completions", json=body)
        return r.json()  # type: ignore[no-any-return]

    async def chat(request: Request) -> JSONResponse:
        text = (await request.json())["prompt"]
        off = fixed and case == "tokenize"
        tokens = await asyncio.to_thread(tokenize, text) if off else tokenize(text)
        if case == "blocking":
            await asyncio.to_thread(lookup) if fixed else lookup()
        reply = await complete(text)
        return JSONResponse({"tokens": tokens, "reply": reply["choices"][0]["message"]["content"]})

    tracekit.configure(service_name=f"gw-{case}")
    app = Starlette(routes=[Route("/chat", chat, methods=["POST"])])
    return tracekit.TracekitMiddleware(app)


async def _load(port: int, requests: int, clients: int, rate: float, deadline_s: float) -> None:
    import httpx

    stop_at = time.monotonic() + deadline_s
    body = {"prompt": "explain the event loop and the gil " * 8}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                 limits=httpx.Limits(max_connections=256)) as client:  # fmt: skip
        for _ in range(3):  # warm-up, not recorded apart: the analyzer sees them too
            await client.post("/chat", json=body)
        if rate > 0:  # open arrivals: Poisson at ``rate``
            rng = random.Random(1)
            tasks = []
            for _ in range(requests):
                if time.monotonic() > stop_at:
                    break
                tasks.append(asyncio.create_task(client.post("/chat", json=body)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks, return_exceptions=True)
            return
        left = [requests]

        async def worker() -> None:
            while left[0] > 0 and time.monotonic() < stop_at:
                left[0] -= 1
                await client.post("/chat", json=body)

        await asyncio.gather(*(worker() for _ in range(clients)))


def record(case: str, fixed: bool, args: argparse.Namespace, tmp: str) -> str:
    """Serve ``case`` (fixed or not) under load; return the trace file."""
    model_port, port = free_port(), free_port()
    traces = str(Path(tmp) / f"{case}-{'after' if fixed else 'before'}-{time.monotonic_ns()}.jsonl")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_TRACES_EXPORTER": f"jsonl:{traces}"}
    serial = case == "serial" and not fixed
    model_args = ["--decode-ms", "2", *(["--prefill-ms", "4"] if case == "serial" else []),
                  *(["--serial"] if serial else [])]  # fmt: skip
    model = start(["examples/model_server.py", "--port", str(model_port), *model_args], env)
    gateway = start([__file__, "--serve", case, "--port", str(port), "--model-port", str(model_port),
                      *(["--fixed"] if fixed else [])], env)  # fmt: skip
    try:
        wait_ready(model_port, model)
        wait_ready(port, gateway)
        asyncio.run(_load(port, args.requests, args.clients, args.rate, deadline_s=120))
    finally:
        stop(gateway)
        stop(model)
    return traces


def _measured(path: str) -> dict[str, float]:
    import tracekit

    report = tracekit.analyze(path, route="/chat")
    route = report.routes[0]
    reqs = [r for r in report.sample if r.route == route["route"]]
    span_s = (max(r.end_ns for r in reqs) - min(r.start_ns for r in reqs)) / 1e9
    return {"p50_ms": route["latency_ms"]["p50"], "p95_ms": route["latency_ms"]["p95"],
            "throughput_rps": len(reqs) / span_s}  # fmt: skip


def _projection(path: str, case: str, cores: int | None) -> dict[str, Any]:
    import tracekit

    report = tracekit.analyze(path, route="/chat", **({"cores": cores} if cores else {}))
    out: dict[str, Any] = {"validation": report.validation}
    for finding in report.findings:
        if finding.rule == RULES[case]:
            out.update(severity=finding.severity, projection=finding.projection,
                       note=finding.projection_note)  # fmt: skip
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="tokenize,blocking,serial")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, help="open arrivals at this rate (req/s)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cores", type=int, default=None, help="passed to tracekit.analyze")
    parser.add_argument("--keep", help="keep the traces in this folder")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--fixed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        app = make_app(args.serve, args.fixed, f"http://127.0.0.1:{args.model_port}")
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        Path(folder).mkdir(parents=True, exist_ok=True)
        for round_ in range(args.rounds):
            for case in args.cases.split(","):
                before = record(case, False, args, folder)
                after = record(case, True, args, folder)
                result = {"case": case, "round": round_, "before": _measured(before),
                          "after": _measured(after), **_projection(before, case, args.cores)}  # fmt: skip
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
