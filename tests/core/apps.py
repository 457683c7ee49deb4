"""Small instrumented apps the core tests serve with real uvicorn."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

import tracekit


def burn_cpu(ms: float) -> int:
    """Pure-Python CPU work for about ``ms`` of wall time."""
    end = time.perf_counter() + ms / 1000
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def spin(units: int) -> int:
    """A fixed amount of pure-Python CPU work (about 1 ms per unit here)."""
    total = 0
    for i in range(units * 20_000):
        total += i * i % 7
    return total


@tracekit.stage("tokenize")
def tokenize_cpu(ms: float) -> int:
    return burn_cpu(ms)


@tracekit.stage("model")
async def model_sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


async def cpu_on_loop(request: Request) -> JSONResponse:
    tokenize_cpu(float(request.query_params.get("ms", "50")))
    return JSONResponse({"ok": True})


@tracekit.stage("tokenize")
def tokenize_work(units: int) -> int:
    return spin(units)


async def cpu_in_thread(request: Request) -> JSONResponse:
    await asyncio.to_thread(tokenize_work, int(request.query_params.get("units", "30")))
    return JSONResponse({"ok": True})


async def cpu_in_anyio_thread(request: Request) -> JSONResponse:
    await anyio.to_thread.run_sync(tokenize_work, int(request.query_params.get("units", "30")))
    return JSONResponse({"ok": True})


SLEEPING = threading.Event()  # set when a /sleep request is about to sleep in its model stage


async def sleeper(request: Request) -> JSONResponse:
    SLEEPING.set()
    await model_sleep(float(request.query_params.get("s", "0.1")))
    return JSONResponse({"ok": True})


async def blocking_handler(request: Request) -> PlainTextResponse:
    time.sleep(0.1)  # BLOCKING-LINE: the watchdog must blame this line
    return PlainTextResponse("slept")


async def stream(request: Request) -> StreamingResponse:
    chunks = int(request.query_params.get("n", "20"))
    gap = float(request.query_params.get("gap", "0.01"))

    async def events():  # type: ignore[no-untyped-def]
        for i in range(chunks):
            await asyncio.sleep(gap)
            yield f"data: {i}\n\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream")


def make_app() -> Starlette:
    return Starlette(routes=[
        Route("/cpu", cpu_on_loop),
        Route("/cpu-thread", cpu_in_thread),
        Route("/cpu-anyio", cpu_in_anyio_thread),
        Route("/sleep", sleeper),
        Route("/block", blocking_handler),
        Route("/stream", stream),
    ])  # fmt: skip


def a_sleeps_while_b_burns(url: str) -> None:
    """B sleeps 50 ms in its model stage; once it is asleep, A holds the loop for 200 ms."""
    import httpx

    with httpx.Client(base_url=url, timeout=10) as a_client:
        a_client.get("/cpu?ms=0")  # connect A's client first: A must arrive right after B sleeps
        SLEEPING.clear()
        b = threading.Thread(target=httpx.get, args=(f"{url}/sleep?s=0.05",), kwargs={"timeout": 10})
        b.start()
        assert SLEEPING.wait(10), "B never reached its sleep"
        assert a_client.get("/cpu?ms=200").status_code == 200
        b.join()


def traced_app() -> tracekit.TracekitMiddleware:
    return tracekit.TracekitMiddleware(make_app())
