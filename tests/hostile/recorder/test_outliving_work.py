"""Work a request spawns that outlives it is exported whole, in the request's trace (issue 11,
item 4): a stage in a task created while serving it, in a thread that task starts, in a thread
started with a copy of the request's context; begun before the response left or after."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import tracekit
from tracekit import semconv as sc
from tracekit._export import tracing

STARTED = threading.Event()
_tasks: set[asyncio.Task[Any]] = set()


def _keep(task: asyncio.Task[Any]) -> None:
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


@tracekit.stage("audit")
async def audit() -> None:
    STARTED.set()
    await asyncio.sleep(0.1)


@tracekit.stage("audit_thread")
def audit_in_thread() -> None:
    time.sleep(0.08)


async def spawn(request: Request) -> PlainTextResponse:  # the task starts after the response
    _keep(asyncio.create_task(audit()))
    return PlainTextResponse("ok")


async def spawn_begun(request: Request) -> PlainTextResponse:  # the task's stage is open when it ends
    STARTED.clear()
    _keep(asyncio.create_task(audit()))
    while not STARTED.is_set():
        await asyncio.sleep(0.001)
    return PlainTextResponse("ok")


async def spawn_thread(request: Request) -> PlainTextResponse:
    _keep(asyncio.create_task(asyncio.to_thread(audit_in_thread)))
    return PlainTextResponse("ok")


async def copied_context(request: Request) -> PlainTextResponse:
    threading.Thread(target=contextvars.copy_context().run, args=(audit_in_thread,)).start()
    return PlainTextResponse("ok")


def app() -> tracekit.TracekitMiddleware:
    return tracekit.TracekitMiddleware(Starlette(routes=[
        Route("/spawn", spawn), Route("/spawn-begun", spawn_begun),
        Route("/spawn-thread", spawn_thread), Route("/copied-context", copied_context),
    ]))  # fmt: skip


def _spans_of(rec: Any, name: str, timeout: float = 10.0) -> tuple[Any, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = rec.spans
        servers = [s for s in spans if s.kind.name == "SERVER"]
        stages = [s for s in spans if s.name == name]
        if servers and stages:
            return servers[0], stages[0]
        time.sleep(0.02)
    raise AssertionError(f"no {name} span with its request: {[s.name for s in rec.spans]}")


@pytest.mark.parametrize(("path", "stage", "least_ms"), [
    ("/spawn", "audit", 90), ("/spawn-begun", "audit", 90),
    ("/spawn-thread", "audit_thread", 70), ("/copied-context", "audit_thread", 70),
])  # fmt: skip
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_work_that_outlives_its_request_is_exported_whole(serve: Any, loop: str, path: str,
                                                          stage: str, least_ms: float) -> None:  # fmt: skip
    with tracekit.record() as rec:
        server = serve(app(), loop=loop)
        assert httpx.get(server.url + path, timeout=10).status_code == 200
        request_span, late = _spans_of(rec, stage)
        report = rec.report()
    assert late.context.trace_id == request_span.context.trace_id
    assert late.parent.span_id == request_span.context.span_id
    assert late.end_time >= late.start_time
    assert late.attributes[sc.WALL_MS] >= least_ms
    assert "tracekit.unfinished" not in late.attributes
    assert report.requests == 1
    assert not any("malformed" in w for w in report.warnings)


def test_a_request_waits_for_its_open_stages_at_most_the_linger_time(monkeypatch: Any) -> None:
    monkeypatch.setattr(tracing, "LINGER_S", 0.2)
    release = threading.Event()

    @tracekit.stage("forever")
    def forever() -> None:
        release.wait(10)

    async def handler() -> None:
        await asyncio.sleep(0)

    async def main() -> threading.Thread:
        with tracekit.stage("request"):
            thread = threading.Thread(target=contextvars.copy_context().run, args=(forever,))
            thread.start()
            await handler()
        return thread

    with tracekit.record() as rec:
        thread = asyncio.run(main())
        time.sleep(0.6)  # past the linger time: handed on with "forever" still open
        spans = {s.name: s for s in rec.spans}
        release.set()
        thread.join(10)
        time.sleep(0.2)
        assert len(rec.spans) == 2  # its close afterwards adds nothing
    assert spans["forever"].attributes["tracekit.unfinished"] is True
    assert spans["forever"].end_time >= spans["forever"].start_time
    assert spans["forever"].end_time > spans["request"].end_time  # it ran on past its parent
