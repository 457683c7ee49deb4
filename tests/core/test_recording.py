"""record() -> report(): the in-memory path from spans to findings (DESIGN §3)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import tracekit
from tracekit import semconv as sc

from .apps import spin
from .asgi import call, http_scope


@tracekit.stage("tokenize")
def tokenize() -> None:
    spin(15)  # ~15 ms of pure-Python CPU on the loop, every request


@tracekit.stage("model")
async def model() -> None:
    await asyncio.sleep(0.02)


async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    tokenize()
    await model()
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


def test_report_of_a_recording_names_the_cpu_bound_stage() -> None:
    traced = tracekit.TracekitMiddleware(app)

    async def load() -> None:
        await asyncio.gather(*(call(traced, http_scope("/v1/chat")) for _ in range(12)))

    with tracekit.record() as rec:
        asyncio.run(load())
        report = rec.report()
    data = report.to_dict()
    assert data["schema"] == "tracekit.report/1"
    assert data["requests"] == 12 and data["instrumented"] is True
    (route,) = data["routes"]
    assert route["route"] == "GET"  # a raw ASGI app exposes no route template: method only
    stages = {s["stage"]: s for s in route["stages"]}
    assert stages["tokenize"]["on_loop"] is True
    rules = {(f["rule"], f["stage"]) for f in data["findings"]}
    assert ("cpu-on-loop", "tokenize") in rules
    assert report.to_dict() == tracekit.analyze(rec.spans).to_dict() | {"source": data["source"]}
    assert all(s.attributes.get(sc.STAGE) != "request" for s in rec.spans)


def test_reading_a_recording_never_waits_for_the_exporters(
    monkeypatch: pytest.MonkeyPatch, otel_globals: None
) -> None:
    # configure()'s default exports OTLP to localhost:4318; with no collector there, reading a
    # recording flushed the exporter too and waited out its retries (~8 s for each read).
    # A recording needs tracekit's spans built and handed to it, not the network exports.
    from tracekit._export import shutdown

    with socket.socket() as probe:  # a port nothing listens on: every connection is refused
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", dead)
    # The teardown's shutdown (otel_globals, before monkeypatch restores this) gives up at once.
    monkeypatch.setattr(shutdown, "shutdown_timeout_ms", shutdown.shutdown_timeout_ms)
    tracekit.configure(service_name="recording-test", exporter="otlp", shutdown_timeout_ms=0)
    traced = tracekit.TracekitMiddleware(app)
    with tracekit.record() as rec:
        for _ in range(5):
            asyncio.run(call(traced, http_scope("/v1/chat")))
        start = time.monotonic()
        spans = rec.spans
        report = rec.report()
        elapsed = time.monotonic() - start
    assert elapsed < 2.0, f"reading the recording took {elapsed:.1f} s"
    names = [s.name for s in spans if s.name != "tracekit.loop"]
    assert sorted(names) == sorted(["GET"] * 5 + ["tokenize"] * 5 + ["model"] * 5)
    assert report.to_dict()["requests"] == 5


def test_a_middleware_added_twice_records_each_request_once(caplog: pytest.LogCaptureFixture) -> None:
    # A new user's gateway with the middleware added twice: each request was two traces (one
    # without stages), or its CPU read 0.03 ms under an outer instrumentation's span. The
    # inner one now passes requests through, and says so once.
    import tracekit.middleware as middleware

    middleware._nested_said = False
    twice = tracekit.TracekitMiddleware(tracekit.TracekitMiddleware(app))
    with caplog.at_level("WARNING", logger="tracekit"), tracekit.record() as rec:
        for _ in range(3):
            asyncio.run(call(twice, http_scope("/v1/chat")))
    servers = [s for s in rec.spans if s.kind.name == "SERVER"]
    assert len(servers) == 3 and len({s.context.trace_id for s in servers}) == 3
    assert all(s.attributes[sc.CPU_MS] >= 10 for s in servers)  # tokenize's 15 ms, on the request
    names = [s.name for s in rec.spans if s.kind.name != "SERVER"]
    assert names.count("tokenize") == 3 and names.count("model") == 3
    said = [r.getMessage() for r in caplog.records if "inside another one" in r.getMessage()]
    assert len(said) == 1
