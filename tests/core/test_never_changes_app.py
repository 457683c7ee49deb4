"""Tracing never changes what the application does (issue 2, item 7).

Each test runs the same app with and without tracekit on a real uvicorn server and compares
what the client and the server see.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

import tracekit
from tracekit import semconv as sc

from ..conftest import settled


class Boom(Exception):
    pass


def make_app(events: dict[str, Any]) -> Starlette:
    async def fail(request: Request) -> None:
        error = Boom("handler failed")
        events["raised"] = error
        raise error

    async def not_found(request: Request) -> None:
        raise HTTPException(404, detail="no such model", headers={"x-reason": "missing"})

    async def stream(request: Request) -> StreamingResponse:
        async def chunks():  # type: ignore[no-untyped-def]
            try:
                for i in range(1000):
                    await asyncio.sleep(0.005)
                    yield f"data: {i}\n\n".encode()
                events["stream_completed"] = True
            except BaseException as exc:
                events["stream_stopped_by"] = type(exc).__name__
                raise
            finally:
                events["stream_finally"] = True

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        text = await websocket.receive_text()
        await websocket.send_text(text.upper())
        await websocket.close()

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        events["startup"] = True
        yield
        events["shutdown"] = True

    return Starlette(routes=[Route("/fail", fail), Route("/missing", not_found),
                             Route("/stream", stream), WebSocketRoute("/ws", echo)],
                     lifespan=lifespan)  # fmt: skip


def _wait_for(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def catching(app: Any, events: dict[str, Any]) -> Any:
    """What the server sees: the exception that leaves the ASGI app."""

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except BaseException as exc:
            events.setdefault("escaped", exc)
            raise

    return outer


@pytest.fixture(params=["bare", "traced"])
def server_and_events(request: pytest.FixtureRequest, serve: Any):  # type: ignore[no-untyped-def]
    events: dict[str, Any] = {}
    app: Any = make_app(events)
    if request.param == "traced":
        app = tracekit.TracekitMiddleware(app)
    with tracekit.record() as rec:
        server = serve(catching(app, events), lifespan="on")
        yield server, events, rec, request.param


def test_app_exception_reaches_the_server_unchanged(server_and_events) -> None:  # type: ignore[no-untyped-def]
    server, events, rec, mode = server_and_events
    response = httpx.get(f"{server.url}/fail")
    assert response.status_code == 500
    _wait_for(lambda: "escaped" in events)  # the 500 is sent before the exception leaves the app
    assert events["escaped"] is events["raised"]  # the same object, not a copy or a wrapper
    if mode == "traced":
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
        assert span.status.status_code.name == "ERROR"
        assert span.attributes[sc.ERROR_TYPE].endswith("Boom")
        assert any(e.name == "exception" for e in span.events)


def test_http_exception_response_is_identical(server_and_events) -> None:  # type: ignore[no-untyped-def]
    server, events, rec, mode = server_and_events
    response = httpx.get(f"{server.url}/missing")
    assert (response.status_code, response.text, response.headers["x-reason"]) == (
        404, "no such model", "missing")
    assert "escaped" not in events
    if mode == "traced":
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
        assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 404
        assert span.status.status_code.name == "UNSET"  # a 4xx is the client's error


def test_client_disconnect_mid_stream(server_and_events) -> None:  # type: ignore[no-untyped-def]
    server, events, rec, mode = server_and_events
    with httpx.stream("GET", f"{server.url}/stream") as response:
        received = 0
        for chunk in response.iter_raw():
            received += bool(chunk)
            if received >= 3:
                break  # hang up mid-stream
    _wait_for(lambda: "stream_finally" in events)
    assert events.get("stream_finally") is True
    assert "stream_completed" not in events
    if mode == "traced":
        (span,) = [s for s in settled(rec, 1) if s.kind.name == "SERVER"]
        assert 3 <= span.attributes[sc.CHUNKS] < 1000  # recorded, not lost


def test_websocket_passes_through(server_and_events) -> None:  # type: ignore[no-untyped-def]
    import websockets.sync.client as ws_client  # type: ignore[import-not-found]

    server, events, rec, mode = server_and_events
    with ws_client.connect(server.url.replace("http", "ws") + "/ws") as ws:
        ws.send("hello")
        assert ws.recv() == "HELLO"
    assert not rec.spans  # websockets are not traced


def test_lifespan_runs_through_the_middleware(server_and_events) -> None:  # type: ignore[no-untyped-def]
    server, events, rec, mode = server_and_events
    assert events["startup"] is True
    server.stop()
    assert events["shutdown"] is True
    server.stop = lambda: None  # already stopped


class RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        pass


class HangingExporter(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def _latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client() as client:
        for _ in range(n):
            start = time.perf_counter()
            assert client.get(f"{url}/missing").status_code == 404
            out.append(time.perf_counter() - start)
    return out


@pytest.mark.parametrize("exporter_class", [RaisingExporter, HangingExporter])
def test_broken_exporter_never_delays_a_response(serve, otel_globals, exporter_class) -> None:  # type: ignore[no-untyped-def]
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    events: dict[str, Any] = {}
    baseline_server = serve(make_app(events))
    baseline = sorted(_latencies(baseline_server.url, 40))

    exporter = exporter_class()
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=10, max_export_batch_size=4)
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracekit.configure(service_name="broken", tracer_provider=provider)
    server = serve(tracekit.TracekitMiddleware(make_app(events)))
    traced = sorted(_latencies(server.url, 200))
    if isinstance(exporter, HangingExporter):
        assert exporter.entered.wait(5)  # the exporter really is stuck in export()
        exporter.release.set()
    else:
        assert exporter.calls > 0
    # medians within a wide margin of the untraced app: nothing waited on the exporter
    assert traced[len(traced) // 2] < baseline[len(baseline) // 2] * 3 + 0.005
    assert traced[-1] < 1.0
