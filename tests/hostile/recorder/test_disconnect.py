"""A client that hangs up mid-stream is recorded as such (issue 11, item 7), on real uvicorn
with each of its HTTP implementations and loops, and through ASGI 2.4's failing ``send``."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

import tracekit
from tracekit import semconv as sc

from ...conftest import settled

STREAM_DONE = threading.Event()


async def stream(request: Request) -> StreamingResponse:
    async def tokens():  # type: ignore[no-untyped-def]
        try:
            for i in range(200):
                await asyncio.sleep(0.01)
                yield f"data: {i}\n\n".encode()
        finally:
            STREAM_DONE.set()

    return StreamingResponse(tokens(), media_type="text/event-stream")


def app() -> tracekit.TracekitMiddleware:
    return tracekit.TracekitMiddleware(Starlette(routes=[Route("/stream", stream)]))


SERVERS = [("h11", "asyncio"), ("h11", "uvloop")]
if importlib.util.find_spec("httptools"):
    SERVERS.append(("httptools", "asyncio"))


@pytest.mark.parametrize(("http", "loop"), SERVERS)
def test_a_hang_up_mid_stream_is_a_cancelled_request(serve: Any, http: str, loop: str) -> None:
    with tracekit.record() as rec:
        server = serve(app(), http=http, loop=loop)
        STREAM_DONE.clear()
        with httpx.stream("GET", f"{server.url}/stream", timeout=10) as response:
            received = 0
            for chunk in response.iter_raw():
                received += bool(chunk)
                if received >= 3:
                    break  # hang up
        assert STREAM_DONE.wait(10)
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
    attributes = span.attributes
    assert attributes[sc.CANCELLED] is True
    assert span.status.status_code.name == "UNSET"  # the client left: not the app's error
    assert 3 <= attributes[sc.CHUNKS] < 200


def test_a_whole_stream_is_not_cancelled(serve: Any) -> None:
    with tracekit.record() as rec:
        server = serve(app())
        with httpx.stream("GET", f"{server.url}/stream", timeout=10) as response:
            assert sum(bool(chunk) for chunk in response.iter_raw()) >= 1
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
    assert sc.CANCELLED not in span.attributes
    assert span.attributes[sc.CHUNKS] == 200


def test_a_send_failing_as_in_asgi_2_4_is_a_cancelled_request() -> None:
    """ASGI 2.4 servers raise an ``OSError`` from ``send`` once the client has gone."""

    async def streamer(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(10):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent = 0

    async def send(message: Any) -> None:
        nonlocal sent
        sent += 1
        if sent > 3:
            raise OSError("client disconnected")

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "asgi": {"version": "3.0", "spec_version": "2.4"}}  # fmt: skip
    with tracekit.record() as rec:
        with pytest.raises(OSError, match="client disconnected"):  # the app's behaviour, unchanged
            asyncio.run(tracekit.TracekitMiddleware(streamer)(scope, receive, send))
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
    assert span.attributes[sc.CANCELLED] is True
    assert span.status.status_code.name == "UNSET"
    assert sc.ERROR_TYPE not in span.attributes
