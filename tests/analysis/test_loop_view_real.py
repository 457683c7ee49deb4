"""The loop view and the loop rules on real spans: a gateway served by uvicorn in this
process, recorded with ``tracekit.record()``, driven by a load generator in a process of its
own (so that it does not share the gateway's GIL).

- saturated: 32 closed-loop clients on a handler of three short CPU stages (~2 ms slices):
  ``loop-saturated`` fires, and the report's loop section is the sum of the exported windows;
- idle: ten spaced requests: no loop finding;
- background: a periodic task of no request spins on the loop: ``background-on-loop`` fires.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tests.conftest import Server
from tests.loop.proxy import spin
from tracekit import semconv
from tracekit.analysis.report import Report

# The windows are exported about once a second: wait this long after the load for the last.
SETTLE_S = 1.5
LOAD = """
import asyncio, sys, time, httpx
url, conc, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
async def main():
    end = time.monotonic() + secs
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=conc)) as c:
        async def worker():
            while time.monotonic() < end:
                (await c.post("/v1/chat", content=b"{}")).raise_for_status()
        await asyncio.gather(*(worker() for _ in range(conc)))
asyncio.run(main())
"""


# ~2 ms slices: short (no stage holds the loop long), but enough CPU per request that the
# gateway, not the load generator sharing its 2 cores, is the bottleneck.
@tracekit.stage("tokenize")
def tokenize() -> None:
    spin(2.0)


@tracekit.stage("guardrail")
def guardrail() -> None:
    spin(2.0)


@tracekit.stage("render")
def render() -> None:
    spin(1.6)


async def chat(request: Request) -> JSONResponse:
    await request.body()
    tokenize()
    guardrail()
    await asyncio.sleep(0.005)  # the model call
    render()
    return JSONResponse({"ok": True})


def _app(lifespan: Callable[[Any], Any] | None = None) -> Any:
    return tracekit.TracekitMiddleware(
        Starlette(routes=[Route("/v1/chat", chat, methods=["POST"])], lifespan=lifespan)
    )


def _record(app: Any, drive: Callable[[str], None]) -> tuple[Report, list[Any]]:
    with tracekit.record() as rec:
        server = Server(app)
        try:
            drive(server.url)
            time.sleep(SETTLE_S)
        finally:
            server.stop()
    return rec.report(), rec.spans


def _load(seconds: float, concurrency: int = 32) -> Callable[[str], None]:
    def drive(url: str) -> None:
        subprocess.run([sys.executable, "-c", LOAD, url, str(concurrency), str(seconds)],
                       check=True, timeout=seconds + 60)  # fmt: skip

    return drive


@pytest.fixture(scope="module")
def saturated() -> Iterator[tuple[Report, list[Any]]]:
    yield _record(_app(), _load(3.0))


def test_a_saturated_gateway_is_loop_saturated(saturated: tuple[Report, list[Any]]) -> None:
    report, _ = saturated
    rules = [f.rule for f in report.findings]
    assert "loop-saturated" in rules, report.to_text(color=False)
    # Short slices: not cpu-on-loop's case. (blocking-call-on-loop can read slices stretched
    # off-CPU by a host short of CPU as blocking: its documented limit, seen at load 8 on 2 cores.)
    assert "cpu-on-loop" not in rules
    (f,) = [f for f in report.findings if f.rule == "loop-saturated"]
    assert "--workers" in f.fix_code
    # The load generator shares the 2 cores: where the loop thread waited for a CPU 10% of
    # the time or more, more workers get no projection (the queueing model gives each a core).
    # The note says why; the evidence says so only when the loop also read less than saturated
    # (beside other tests' servers a saturated loop's host can be short too).
    if f.projection is None:
        assert f.projection_note is not None
        assert f.projection_note.startswith("more workers need free cores")
    else:
        assert f.projection["p50_ms"][1] < f.projection["p50_ms"][0]
    for stage in ("guardrail", "tokenize", "render"):
        assert stage in f.evidence


def test_the_loop_section_sums_the_exported_windows(saturated: tuple[Report, list[Any]]) -> None:
    report, spans = saturated
    windows = [s for s in spans if s.name == semconv.LOOP_SPAN]
    assert len(windows) >= 2
    loop = report.to_dict()["loop"]
    (one,) = loop["loops"]
    assert one["windows"] == len(windows)

    def total(key: str) -> float:
        return sum(float(w.attributes.get(key, 0.0)) for w in windows)

    assert one["cpu_ms"]["total"] == pytest.approx(total(semconv.LOOP_CPU_MS), rel=1e-6)
    assert one["cpu_ms"]["requests"] == pytest.approx(total(semconv.LOOP_REQUESTS_CPU_MS), rel=1e-6)
    assert one["cpu_ms"]["background"] == pytest.approx(total(semconv.LOOP_BACKGROUND_CPU_MS), rel=1e-6)
    assert one["gc"]["counts"] == [
        sum(w.attributes[semconv.LOOP_GC_COUNTS][g] for w in windows) for g in range(3)
    ]
    busy = sorted(w.attributes[semconv.LOOP_BUSY_RATIO] for w in windows)
    assert one["busy"]["max"] == pytest.approx(busy[-1])
    # The route ran most of the loop's CPU (its requests' CPU and tasks, as the loop saw it).
    (route,) = loop["routes"]
    assert route["route"] == "POST /v1/chat" and 0.5 < route["loop_cpu_share"] < 1.2


def test_an_idle_gateway_has_no_loop_finding() -> None:
    def drive(url: str) -> None:
        for _ in range(10):
            httpx.post(url + "/v1/chat", content=b"{}").raise_for_status()
            time.sleep(0.1)

    report, _ = _record(_app(), drive)
    rules = [f.rule for f in report.findings]
    assert "loop-saturated" not in rules and "background-on-loop" not in rules


def test_background_work_of_no_request_is_reported() -> None:
    # A metrics flusher started at start-up (no request): ~8 ms of CPU every 10 ms, so that on
    # a host busy enough to give the loop a third of a core its CPU is still over 10% of the
    # loop's wall time (at 4 ms it was 10.1%, and failed at times, with 3 other jobs per core).
    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def flusher() -> None:
            while True:
                spin(8.0)
                await asyncio.sleep(0.01)

        task = asyncio.create_task(flusher())
        yield
        task.cancel()

    report, _ = _record(_app(lifespan), _load(2.5, concurrency=4))
    (one,) = report.to_dict()["loop"]["loops"]
    assert one["cpu_share"]["background"] > 0.25, one
    found = [f for f in report.findings if f.rule == "background-on-loop"]
    assert len(found) == 1, report.to_text(color=False)
    assert "no traced request owns" in found[0].evidence


HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/schedstat"),
                    reason="needs Linux's CPU affinity and scheduler statistics")  # fmt: skip
def test_a_loop_thread_short_of_cpu_is_told_apart_from_waiting() -> None:
    # The loop thread and a busy process pinned to one core: the requests' steps run half the
    # time. The windows' run-queue delay (tracekit.loop.runqueue_ms) must match the requests'
    # own wall time that was not CPU (a request here only computes), and the report must say
    # the host is short of CPU.
    core = max(os.sched_getaffinity(0))

    @tracekit.stage("guardrail")
    def busy() -> None:
        spin(80.0)

    async def handler(request: Request) -> JSONResponse:
        busy()
        return JSONResponse({"ok": True})

    app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/v1/chat", handler, methods=["POST"])]))
    with tracekit.record() as rec:
        server = Server(app)
        hog = None
        try:
            assert server.thread.native_id is not None
            os.sched_setaffinity(server.thread.native_id, {core})
            hog = subprocess.Popen([sys.executable, "-c", HOG, str(core), "30"])
            time.sleep(0.3)  # the hog is spinning
            with httpx.Client(base_url=server.url, timeout=30) as client:
                for _ in range(5):
                    client.post("/v1/chat", content=b"{}").raise_for_status()
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
            time.sleep(SETTLE_S)
            server.stop()
        report, spans = rec.report(), rec.spans
    requests = [s.attributes for s in spans if s.kind.name == "SERVER"]
    assert len(requests) == 5
    off_cpu = sum(a[semconv.WALL_MS] - a[semconv.CPU_MS] for a in requests)
    windows = [s.attributes for s in spans if s.name == semconv.LOOP_SPAN]
    waited = sum(w.get(semconv.LOOP_RUNQUEUE_MS, 0.0) for w in windows)
    assert off_cpu > 100, requests  # the hog took the core from the requests
    # The windows also hold the server's own waits outside the requests (a few ms each).
    assert 0.8 * off_cpu <= waited <= 1.5 * off_cpu + 50, (waited, off_cpu)
    (one,) = report.to_dict()["loop"]["loops"]
    assert one["cpu_wait"]["ms"] == pytest.approx(waited, rel=1e-6)
    assert "the host is short of CPU" in " ".join(report.to_text(color=False).split())
