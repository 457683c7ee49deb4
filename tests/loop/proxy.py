"""A gateway shaped like a real LLM proxy, and the model server it calls.

The shape of open-source LLM proxies (LiteLLM's, say), with tracekit added as a user would
(the middleware and one stage): the upstream call runs in a task of its own; the response is
post-processed there, unstaged; spend logging runs after the response as a background task
the request spawns, and as a plain callback; streamed replies relay the model's chunks
through Starlette's StreamingResponse (which runs the body in an anyio task group). The
model server is a separate process (``examples/model_server.py``); the independent measure
of model wait is its time from the request's body being written to the reply being done
(``x-model-done-ns``, on the same system-wide monotonic clock as ``perf_counter_ns`` here),
and for a streamed reply the send time of its headers (``x-sent-ns``) and of each chunk
(``x_sent_ns``).
Until 2026-12-06 the server's ``x-model-ms`` started at the request's headers, and the
server then waited for the body, which a busy gateway loop sends one loop iteration later
(anyio yields to the loop after each write): that wait is the gateway's loop wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

import tracekit

ROOT = Path(__file__).resolve().parents[2]
_SENT = re.compile(r'"x_sent_ns": (\d+)')  # a streamed chunk's send time (the model server)
_TASK_KEYS: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_NEXT_KEY = itertools.count()


def task_key() -> int:
    """The running task's number, never reused (an ``id()`` is, once a task is freed); -1
    outside a task."""
    task = asyncio.current_task()
    if task is None:
        return -1
    key = _TASK_KEYS.get(task)
    if key is None:
        key = _TASK_KEYS[task] = next(_NEXT_KEY)
    return key


def spin(units: float) -> int:
    """A fixed amount of pure-Python CPU work (about 1 ms per unit on this machine)."""
    total = 0
    for i in range(int(units * 20_000)):
        total += i * i % 7
    return total


@tracekit.stage("tokenize")
def tokenize(text: str, units: float) -> int:
    spin(units)
    return len(text)


class Proxy:
    """The gateway: ``app`` (ASGI, traced), its loop thread's native id once it has served."""

    # About the loop CPU per request of the open-source proxy the issue measured (~24 ms).
    def __init__(self, model_url: str, tokenize_units: float = 2.0, parse_units: float = 4.0,
                 log_units: float = 2.0, callback_units: float = 0.1) -> None:  # fmt: skip
        self.model_url = model_url
        self.units = (tokenize_units, parse_units, log_units, callback_units)
        self.loop_tid = 0
        self.model_ms: list[float] = []  # the model server's own time, per call (module doc)
        self.written: dict[int, int] = {}  # task id: when its request's body was written
        self.replies: list[tuple[int, int]] = []  # (the receiving task's task_key(), x-model-done-ns)
        # (the relaying task's task_key(), when the model server sent a streamed reply's headers or a chunk)
        self.chunks: list[tuple[int, int]] = []
        self.background: set[asyncio.Task[Any]] = set()
        self.client: httpx.AsyncClient | None = None
        routes = [Route("/v1/chat/completions", self.completions, methods=["POST"])]
        self.app = tracekit.TracekitMiddleware(Starlette(routes=routes, lifespan=self._lifespan))

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        # Its connections closed with the server (left to the collector, they warn in a later test).
        yield
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(base_url=self.model_url, timeout=60,
                                            limits=httpx.Limits(max_connections=256))  # fmt: skip
        return self.client

    @tracekit.stage("model")
    async def call_model(self, body: dict[str, Any]) -> httpx.Response:
        return await self._client().post("/v1/chat/completions", json=body,
                                         extensions={"trace": self._trace})  # fmt: skip

    async def _trace(self, event: str, info: Any) -> None:
        """httpcore's trace: the request's body is written next, in the same step."""
        if event == "http11.send_request_body.started":
            self.written[task_key()] = time.perf_counter_ns()

    @tracekit.stage("model")
    async def stream_model(self, body: dict[str, Any]) -> Any:
        async with self._client().stream("POST", "/v1/chat/completions", json=body,
                                         headers={"x-stamp-chunks": "1"}) as response:  # fmt: skip
            self.chunks.append((task_key(), int(response.headers["x-sent-ns"])))
            async for line in response.aiter_lines():
                if line:
                    yield line

    async def upstream(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream call, as the proxy's router runs it: in a task of its own."""
        response = await self.call_model(body)
        task, done = task_key(), int(response.headers["x-model-done-ns"])
        self.replies.append((task, done))
        self.model_ms.append((done - self.written.pop(task)) / 1e6)
        data: dict[str, Any] = response.json()
        spin(self.units[1])  # response post-processing, unstaged
        return data

    async def log_spend(self, data: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        spin(self.units[2])
        json.dumps(data)

    def log_callback(self) -> None:
        spin(self.units[3])

    def after_response(self, data: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self.log_spend(data))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        asyncio.get_running_loop().call_soon(self.log_callback)

    async def completions(self, request: Request) -> Any:
        self.loop_tid = threading.get_native_id()
        body = await request.json()
        tokenize(json.dumps(body["messages"]), self.units[0])
        if not body.get("stream"):
            data = await asyncio.create_task(self.upstream(body))
            self.after_response(data)
            return JSONResponse(data)

        async def relay() -> Any:
            async for line in self.stream_model(body):
                sent = _SENT.search(line)
                if sent is not None:
                    self.chunks.append((task_key(), int(sent.group(1))))
                spin(self.units[1] / 10)
                yield line + "\n\n"
            self.after_response({"streamed": True})

        return StreamingResponse(relay(), media_type="text/event-stream")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ModelServer:
    """``examples/model_server.py`` in a process of its own, on a free loopback port."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "model_server.py"), "--port", str(self.port), *args],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the model server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def thread_cpu_ns(tid: int) -> int:
    """CPU time of thread ``tid`` of this process, from ``/proc`` (schedstat: ns on CPU)."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


# The load generator, run by ``drive_load`` in a process of its own: argv is url, requests,
# concurrency, stream_every, max_tokens, timeout_s; it prints one JSON object.
_LOAD = """
import asyncio, json, sys, time
import httpx

url, requests, concurrency, stream_every, max_tokens = sys.argv[1], *map(int, sys.argv[2:6])
timeout_s = float(sys.argv[6])
latencies, failures = [], []

async def run():
    counter = iter(range(requests))
    deadline = time.monotonic() + timeout_s
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def worker():
            for i in counter:
                if time.monotonic() > deadline:
                    return
                stream = bool(stream_every) and i % stream_every == 0
                body = {"messages": [{"role": "user", "content": "hello " * 20}],
                        "max_tokens": max_tokens, "stream": stream}
                start = time.perf_counter()
                try:
                    response = await client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as error:
                    failures.append(f"request {i}: {type(error).__name__}: {error!r}")
                    continue
                if response.status_code != 200:
                    failures.append(f"request {i}: HTTP {response.status_code}: {response.text[:300]}")
                    continue
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

asyncio.run(run())
print(json.dumps({"latencies": latencies, "failures": failures}))
"""


def drive_load(url: str, requests: int, concurrency: int, stream_every: int = 0,
               max_tokens: int = 8, timeout_s: float = 120) -> list[float]:  # fmt: skip
    """``requests`` chat requests from ``concurrency`` closed-loop clients; every
    ``stream_every``-th streamed. Returns each request's latency (s), as the clients saw it.

    The clients run in a process of their own: in a thread of the gateway's process they
    took a share of its GIL, and at times the gateway's loop no longer saturated. A failed
    request does not stop the others (that would leave the gateway serving requests after
    the test has read its spans); the failures are raised together at the end.
    """
    args = [url, requests, concurrency, stream_every, max_tokens, timeout_s]
    done = subprocess.run([sys.executable, "-c", _LOAD, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout_s + 30)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"the load generator failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    if result["failures"]:
        raise AssertionError(f"{len(result['failures'])} of {requests} requests failed: "
                             + "; ".join(result["failures"][:5]))  # fmt: skip
    latencies: list[float] = result["latencies"]
    return latencies

