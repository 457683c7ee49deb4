"""record() -> report(): the in-memory path from spans to findings (DESIGN §3)."""

from __future__ import annotations

import asyncio

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
