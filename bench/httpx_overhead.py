"""What the httpx integration adds to a model call: CPU µs per call, instrumented vs not.

An ``httpx.AsyncClient`` calls the example model server (its own process, on a free loopback
port, no prefill or decode delay) one call at a time; each call runs inside an async stage (a
request's code, as in a gateway), while tracekit records in memory. Two arms run the same calls
in alternating rounds: ``plain`` (the client as is) and ``instrumented``
(``tracekit.integrations.httpx.instrument(client)``). Measured per call:

- loop thread: the thread CPU of the thread making the calls (the request path: the model
  stage's bookkeeping and steps, the request body read, traceparent, each chunk's parsing);
- process: all of this process's CPU (adds the span-building and export threads).

Per arm, the least CPU per call of any round (a busy host only ever adds CPU), then
instrumented minus plain. The same call made with the OpenAI SDK (uninstrumented) is timed
too, for scale. Non-streamed calls, and streamed ones of ``--tokens`` chunks (the example
server sends no usage in streams: the tokens are counted).

Run: PYTHONPATH=. .venv/bin/python bench/httpx_overhead.py [--calls 200] [--rounds 7] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai

import tracekit
from tracekit import _native
from tracekit.integrations import httpx as tracekit_httpx

ROOT = Path(__file__).resolve().parents[1]


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "model_server.py"), "--port", str(port),
         "--prefill-ms", "0", "--decode-ms", "0"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise SystemExit("the model server did not start") from None
            time.sleep(0.05)


BODY: dict[str, Any] = {"model": "sim-1", "messages": [{"role": "user", "content": "hello " * 50}]}


@tracekit.stage("handler")
async def handler(http: httpx.AsyncClient, url: str, stream: bool, tokens: int) -> None:
    body = {**BODY, "max_tokens": tokens, "stream": stream}
    if not stream:
        (await http.post(url, json=body)).raise_for_status()
        return
    async with http.stream("POST", url, json=body) as reply:
        async for _ in reply.aiter_raw():
            pass


@tracekit.stage("handler")
async def sdk_handler(client: openai.AsyncOpenAI, stream: bool, tokens: int) -> None:
    messages: Any = BODY["messages"]
    if not stream:
        await client.chat.completions.create(model="sim-1", messages=messages, max_tokens=tokens)
        return
    chunks = await client.chat.completions.create(model="sim-1", messages=messages, max_tokens=tokens,
                                                  stream=True)  # fmt: skip
    async for _ in chunks:
        pass


async def run(call: Callable[[], Awaitable[None]], calls: int) -> tuple[int, int]:
    """(loop thread CPU ns, process CPU ns) of ``calls`` calls."""
    thread0, process0 = time.thread_time_ns(), time.process_time_ns()
    for _ in range(calls):
        await call()
    return time.thread_time_ns() - thread0, time.process_time_ns() - process0


async def measure(url: str, calls: int, rounds: int, stream: bool, tokens: int) -> dict[str, float]:
    """Per call: the least CPU of any round per arm (a busy host only ever adds to it: cache
    misses, a sibling hyperthread, a colder CPU), instrumented minus plain; and the OpenAI
    SDK's own call on the plain client, for scale."""
    endpoint = url + "/v1/chat/completions"
    plain_http: Any = httpx.AsyncClient()  # the SDK types its http_client as httpx2's
    traced_http = tracekit_httpx.instrument(httpx.AsyncClient())
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=plain_http)
    arms: dict[str, Callable[[], Awaitable[None]]] = {
        "plain": lambda: handler(plain_http, endpoint, stream, tokens),
        "instrumented": lambda: handler(traced_http, endpoint, stream, tokens),
        "sdk": lambda: sdk_handler(sdk, stream, tokens),
    }
    for call in arms.values():  # connections, lazy imports
        await run(call, 20)
    times: dict[str, list[tuple[int, int]]] = {name: [] for name in arms}
    for i in range(rounds):  # the order of the arms turns round by round
        names = list(arms)[i % 3 :] + list(arms)[: i % 3]
        for name in names:
            times[name].append(await run(arms[name], calls))
    await plain_http.aclose()
    await traced_http.aclose()

    def least(arm: str, which: int) -> float:
        return min(t[which] for t in times[arm]) / calls / 1e3

    return {"loop_us": least("instrumented", 0) - least("plain", 0),
            "process_us": least("instrumented", 1) - least("plain", 1),
            "plain_us": least("plain", 0), "sdk_us": least("sdk", 0)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per arm per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32, help="chunks of a streamed reply")
    args = parser.parse_args()
    process, url = start_server()
    try:
        print(f"tracekit {'compiled' if _native.compiled() else 'plain Python'}; {args.calls} calls x "
              f"{args.rounds} rounds per arm; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        with tracekit.record() as rec:
            for stream in (False, True):
                r = asyncio.run(measure(url, args.calls, args.rounds, stream, args.tokens))
                kind = f"streamed ({args.tokens} chunks)" if stream else "non-streamed"
                print(f"{kind:>22}: +{r['loop_us']:.1f} µs loop thread CPU per call, "
                      f"+{r['process_us']:.1f} µs process CPU (the call: {r['plain_us']:.0f} µs with "
                      f"httpx, {r['sdk_us']:.0f} µs with the OpenAI SDK)")  # fmt: skip
                rec.clear()
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
