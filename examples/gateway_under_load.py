"""Run the example gateway under concurrent load, record its traces, analyze them.

Starts the simulated model server and the example gateway (examples/gateway.py) as
separate uvicorn processes on 127.0.0.1, sends a bounded burst of concurrent chat requests
(streaming and not), stops both by PID, then runs ``tracekit analyze`` on the recorded
OTLP JSON Lines file: text report on the terminal, HTML report and JSON beside the traces.

Run: python examples/gateway_under_load.py [--requests 240] [--concurrency 16] [--out out/]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "explain why the event loop stalls when the tokenizer runs on it",
    "summarise the latency budget of a streaming chat request in one paragraph",
    "what does continuous batching change for queueing under concurrent load",
    "write a haiku about inter token latency and the python gil",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    # A TCP connect, not an HTTP request: a readiness request would be traced (a route of its own).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise SystemExit(f"server exited early: {err.strip()[-500:]}")
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"server on port {port} not ready after {timeout:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        # uvicorn shuts down cleanly and flushes traces (SIGTERM: SIGINT is ignored by a server
        # started from a script run in the background, as this one may be)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def drive(url: str, requests: int, concurrency: int, deadline_s: float) -> tuple[int, int]:
    ok = failed = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    stop_at = time.monotonic() + deadline_s

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal ok, failed
        while not queue.empty() and time.monotonic() < stop_at:
            i = queue.get_nowait()
            body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] * 30}],
                    "max_tokens": 24, "stream": i % 3 == 0}  # fmt: skip
            try:
                if body["stream"]:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for _ in r.aiter_raw():
                            pass
                        ok += r.status_code == 200
                else:
                    r = await client.post("/v1/chat/completions", json=body)
                    ok += r.status_code == 200
            except httpx.HTTPError:
                failed += 1

    async def progress() -> None:  # a line every 5 s: the burst takes ~15 s on two cores
        while True:
            await asyncio.sleep(5)
            print(f"  {ok + failed} of {requests} requests answered", flush=True)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        reporter = asyncio.create_task(progress())
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        reporter.cancel()
    return ok, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default="out", help="folder for traces.jsonl, report.html, report.json")
    parser.add_argument("--serial-model", action="store_true", help="model server without batching")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    traces = out / "traces.jsonl"
    traces.unlink(missing_ok=True)

    model_port, gateway_port = free_port(), free_port()
    env = {**os.environ, "MODEL_URL": f"http://127.0.0.1:{model_port}",
           "OTEL_TRACES_EXPORTER": f"jsonl:{traces.resolve()}", "PYTHONPATH": str(ROOT)}  # fmt: skip
    model_args = ["examples/model_server.py", "--port", str(model_port)]
    model = start(model_args + (["--serial"] if args.serial_model else []), env)
    gateway = start(["-m", "uvicorn", "examples.gateway:app", "--host", "127.0.0.1",
                     "--port", str(gateway_port), "--log-level", "warning"], env)  # fmt: skip
    try:
        wait_ready(model_port, model)
        wait_ready(gateway_port, gateway)
        print(f"sending {args.requests} chat requests to the example gateway, {args.concurrency} at a "
              "time (a third of them streamed)", flush=True)  # fmt: skip
        started = time.monotonic()
        ok, failed = asyncio.run(drive(f"http://127.0.0.1:{gateway_port}", args.requests,
                                       args.concurrency, deadline_s=120))  # fmt: skip
        elapsed = time.monotonic() - started
        print(f"sent {ok + failed} requests ({ok} ok, {failed} failed) in {elapsed:.1f} s "
              f"at concurrency {args.concurrency}")  # fmt: skip
    finally:
        stop(gateway)
        stop(model)
    if not traces.exists():
        raise SystemExit("no traces were written")
    from tracekit.cli import main as tracekit_main

    tracekit_main(["analyze", str(traces), "--format", "html", "-o", str(out / "report.html")])
    tracekit_main(["analyze", str(traces), "--format", "json", "-o", str(out / "report.json")])
    code = tracekit_main(["analyze", str(traces)])
    print(f"\nHTML report: {out / 'report.html'}   JSON: {out / 'report.json'}   traces: {traces}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
