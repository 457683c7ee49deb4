"""The whole event loop, on a gateway shaped like a real proxy (issue 13, items 1-3).

Checked against measurements tracekit does not make: the loop thread's CPU from
``/proc/self/task/<tid>/schedstat``, the model server's own time (from the request's body
written to the reply done, by its ``x-model-done-ns``: ``proxy.py``), and ``gc.callbacks``
timing collections beside tracekit's.
Both loops, as real gateways run them: the stdlib loop and uvloop, HTTP by httptools.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

import pytest

import tracekit
from tracekit import semconv as sc
from tracekit._export import tracing

from .proxy import ModelServer, Proxy, drive_load, thread_cpu_ns

LOOPS = ["asyncio", "uvloop"]
# Model wait against the model server's own time on a saturated loop: -5% to +9% in
# `bench/loop_wait_truth.py --rounds 2` (plain Python), -30% to +11% in 7 compiled runs of
# `bench/whole_loop.py --parse-units 12 --concurrency 64 --requests 192` (6 within 11%; both
# loops, the loop 92-96% busy); with the estimator before 2026-12-06 (the probe's overdue time
# counted half, every checkpoint of a run before a wait for I/O counted as that wait) +80%.
# Booking the loop's queueing as model wait gives +100% and more. docs/attributes.md, "The
# loop-wait estimator".
TOLERANCE = 0.45


def _windows(spans: list[Any]) -> list[dict[str, Any]]:
    return [dict(s.attributes) for s in spans if s.name == sc.LOOP_SPAN]


@pytest.fixture
def model() -> Any:
    server = ModelServer("--prefill-ms", "40", "--decode-ms", "2")
    yield server
    server.stop()


@pytest.mark.alone
@pytest.mark.parametrize("loop", LOOPS)
def test_the_loop_threads_cpu_is_accounted_for(loop: str, model: ModelServer, serve: Any) -> None:
    """Spawned upstream tasks, post-response logging tasks, callbacks and streams: the CPU
    tracekit attributes (requests, GC, its own) is at least 95% of what the kernel counted
    for the loop thread; the rest is reported as background (socket reads, the loop itself)."""
    proxy = Proxy(model.url)
    with tracekit.record() as rec:
        server = serve(proxy.app, loop=loop, http="httptools")
        drive_load(server.url, 8, 4)  # connections, imports, the loop view
        time.sleep(0.3)
        tracing.flush_all()  # closes the loop's window: the next ones start here
        before = len(rec.spans)
        cpu_before = thread_cpu_ns(proxy.loop_tid)
        latencies = drive_load(server.url, 200, 16, stream_every=4)
        time.sleep(0.5)  # the post-response logging tasks end
        cpu_after = thread_cpu_ns(proxy.loop_tid)
        tracing.flush_all()
        spans = rec.spans[before:]
    assert len(latencies) == 200
    proc_ms = (cpu_after - cpu_before) / 1e6
    windows = _windows(spans)
    assert windows, "no loop window was exported"
    assert {w[sc.LOOP_PID] for w in windows} == {os.getpid()}  # the server runs in this process
    total = sum(w[sc.LOOP_CPU_MS] for w in windows)
    attributed = sum(w[sc.LOOP_REQUESTS_CPU_MS] + w[sc.LOOP_GC_CPU_MS] + w[sc.LOOP_TRACEKIT_CPU_MS]
                     for w in windows)  # fmt: skip
    background = sum(w[sc.LOOP_BACKGROUND_CPU_MS] for w in windows)
    where = (f"/proc {proc_ms:.0f} ms, windows {total:.0f}, attributed {attributed:.0f}, "
             f"background {background:.0f}")
    # The windows read the thread's kernel CPU clock over a slightly longer interval (flush
    # to flush); /proc's schedstat lags the running thread's clock by up to a tick.
    assert 0.98 * proc_ms <= total <= proc_ms * 1.05 + 50, where
    # Background (HTTP parsing in protocol callbacks) is 3-6% of it (6.1% in a CI run on
    # 2026-12-04, which failed at 95%); without the task factory only 37% is attributed.
    assert attributed >= 0.90 * proc_ms, where
    # The requests' own spans carry the CPU of the tasks they spawned (the upstream call;
    # the logging after the response, as tracekit.after_response_cpu_ms: the span ended
    # with the response): ~90% of the loop thread's CPU is theirs, less what
    # garbage collection and tracekit took. A full collection walks the whole heap: in a
    # process that imported the whole suite it took 137 ms here once, booked as GC (not a
    # request's CPU, by design), and the request spans then held 89% of the thread's CPU.
    requests = [s for s in spans if s.kind.name == "SERVER"]
    assert len(requests) == 200
    request_cpu = sum(s.attributes[sc.CPU_MS] + s.attributes.get(sc.AFTER_RESPONSE_CPU_MS, 0.0)
                      for s in requests)  # fmt: skip
    assert sum(s.attributes.get(sc.AFTER_RESPONSE_CPU_MS, 0.0) for s in requests) > 0, where
    for s in requests:  # inside the span, CPU never exceeds its wall time
        assert s.attributes[sc.CPU_MS] <= s.attributes[sc.WALL_MS] * 1.01 + 0.05, dict(s.attributes)
    not_requests = sum(w[sc.LOOP_GC_CPU_MS] + w[sc.LOOP_TRACEKIT_CPU_MS] for w in windows)
    assert request_cpu >= 0.9 * (proc_ms - not_requests), f"requests {request_cpu:.0f} ms; {where}"
    # ... and the spans hold what the windows booked as the requests' (within 2%).
    assert abs(request_cpu - (attributed - not_requests)) <= 0.02 * proc_ms, where
    assert not [s for s in spans if s.attributes.get(sc.STAGE) == "spawned task"]


@pytest.mark.alone
@pytest.mark.parametrize("loop", LOOPS)
def test_model_wait_is_the_model_servers_time_on_a_saturated_loop(loop: str, model: ModelServer,
                                                                  serve: Any) -> None:  # fmt: skip
    """At a concurrency that saturates the loop, the time requests queue for the loop is
    loop wait (and queue wait, on the HTTP client's locks), not model wait: the model stage's
    wait stays close to the model server's own time, while its wall time is several times
    that (see TOLERANCE)."""
    proxy = Proxy(model.url, parse_units=12.0)  # three times the CPU of the default proxy's requests
    with tracekit.record() as rec:
        server = serve(proxy.app, loop=loop, http="httptools")
        drive_load(server.url, 8, 4)
        time.sleep(0.3)
        tracing.flush_all()
        before = len(rec.spans)
        done = len(proxy.model_ms)
        seen = drive_load(server.url, 192, 64)
        time.sleep(0.3)
        tracing.flush_all()
        spans = rec.spans[before:]
    served = proxy.model_ms[done:]
    models = [s.attributes for s in spans if s.attributes.get(sc.STAGE) == "model"]
    assert len(models) == len(served) == 192
    own = statistics.median(served)
    wait = statistics.median(a[sc.WAIT_MS] for a in models)
    wall = statistics.median(a[sc.WALL_MS] for a in models)
    lags = [w[sc.LOOP_LAG_P50_MS] for w in _windows(spans) if sc.LOOP_LAG_P50_MS in w]
    where = f"model server {own:.1f} ms, traced wait {wait:.1f}, stage wall {wall:.1f}, lags {lags}"
    # Saturated enough that booking the loop's queueing as model wait would exceed TOLERANCE
    # (wall >= 1.55x own: such a wait would be >= 55% over): 10-12x own in 11 runs. With the
    # load generator in a thread of this process it took the GIL's share, and 1 run in 3 had
    # 1.7-2.4x on uvloop (the loop 75-78% busy).
    assert wall >= (1 + TOLERANCE + 0.1) * own, "the loop was not saturated: " + where
    assert abs(wait - own) <= TOLERANCE * own, where
    requests = [s.attributes for s in spans if s.kind.name == "SERVER"]
    model_wait = statistics.median(a[sc.MODEL_WAIT_MS] for a in requests)
    assert abs(model_wait - own) <= TOLERANCE * own, f"request model wait {model_wait:.1f}; {where}"
    # Before its span began a request waited for its task to run (measured from the server
    # making it): on a saturated loop, some; never more than the clients saw beyond the spans.
    before_span = statistics.mean(a.get(sc.START_WAIT_MS, 0.0) for a in requests)
    beyond = statistics.mean(seen) * 1000 - statistics.mean(a[sc.WALL_MS] for a in requests)
    assert 0.5 < before_span <= beyond + 2.0, (before_span, beyond, where)


def _one_request(handler: Any, loop: str, serve: Any) -> list[Any]:
    """The spans of one ``GET /`` to ``handler`` behind the middleware on real uvicorn."""
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Route

    app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/", handler)]))
    with tracekit.record() as rec:
        server = serve(app, loop=loop, http="httptools")
        assert httpx.get(server.url + "/", timeout=30).status_code == 200
        time.sleep(0.2)
        tracing.flush_all()
        return list(rec.spans)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_forced_full_collection_is_gc_not_the_stages_cpu(loop: str, serve: Any) -> None:
    """A generation-2 collection inside a stage is the stage's ``gc_ms``, not its CPU, and the
    loop's window counts it; its length is checked against ``gc.callbacks`` of the test's own."""
    from starlette.responses import PlainTextResponse

    garbage: list[Any] = []
    pauses: list[tuple[float, float]] = []  # full collections: (wall, thread CPU), s
    started: list[float] = []

    def timer(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2 and phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        elif info["generation"] == 2 and started:
            pauses.append((time.perf_counter() - started[0], time.thread_time() - started[1]))

    @tracekit.stage("serialize")
    def heavy() -> None:
        garbage.append([[i, {"k": i}] for i in range(300_000)])  # many objects to traverse
        gc.collect()  # the forced full collection

    async def handler(request: Any) -> PlainTextResponse:
        heavy()
        return PlainTextResponse("ok")

    gc.callbacks.append(timer)
    try:
        spans = _one_request(handler, loop, serve)
    finally:
        gc.callbacks.remove(timer)
        garbage.clear()
    stage = next(s.attributes for s in spans if s.attributes.get(sc.STAGE) == "serialize")
    collection_ms = max(wall for wall, _ in pauses) * 1000  # the test's own timing of the longest
    assert collection_ms > 20, pauses
    assert stage[sc.GC_MS] >= 0.8 * collection_ms, (stage, collection_ms)
    # Building the list costs CPU too; the collection is not in the stage's CPU.
    assert stage[sc.CPU_MS] + stage[sc.GC_MS] <= stage[sc.WALL_MS] * 1.01 + 0.01, stage
    assert stage[sc.CPU_MS] <= stage[sc.WALL_MS] - 0.8 * collection_ms, stage
    request = next(s.attributes for s in spans if s.kind.name == "SERVER")
    assert request[sc.GC_MS] >= stage[sc.GC_MS]
    windows = _windows(spans)
    assert sum(w[sc.LOOP_GC_COUNTS][2] for w in windows) >= 1
    assert any(w.get(sc.LOOP_GC_MAX_GENERATION) == 2 for w in windows)
    # The longest pause is the collection that took the most CPU (a busy host can stretch
    # another's wall time): its wall time and CPU as the test's own hook timed them (which
    # also hold the hooks' own few µs).
    window = max(windows, key=lambda w: w.get(sc.LOOP_GC_MAX_CPU_MS, 0))
    wall, cpu = (1000 * t for t in max(pauses, key=lambda p: p[1]))
    assert 0.8 * cpu <= window[sc.LOOP_GC_MAX_CPU_MS] <= cpu + 0.5, (window, pauses)
    assert 0.8 * wall <= window[sc.LOOP_GC_MAX_MS] <= wall + 0.5, (window, pauses)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_collection_in_another_thread_is_gc_of_the_stage_that_waited_for_the_gil(
    loop: str, serve: Any
) -> None:
    """A collection holds the GIL from start to end: a loop stage that needs it waits the
    collection out. That wait is GC, not a blocking call of the stage (a new user's sync
    endpoints' generation-2 collections in worker threads read as blocking calls in the
    streamed model stage on the loop, with a fix to move it to a thread)."""
    import threading

    from starlette.responses import PlainTextResponse

    garbage = [[i, {"k": i}] for i in range(600_000)]  # many objects to traverse
    pauses: list[float] = []
    done = threading.Event()

    def collect() -> None:
        time.sleep(0.01)  # the stage below is running
        start = time.perf_counter()
        gc.collect()
        pauses.append((time.perf_counter() - start) * 1000)
        done.set()

    @tracekit.stage("guardrail")
    def guardrail() -> None:  # pure Python until the collection is over: it needs the GIL throughout
        deadline = time.monotonic() + 10
        while not done.is_set() and time.monotonic() < deadline:
            pass

    async def handler(request: Any) -> PlainTextResponse:
        worker = threading.Thread(target=collect)
        worker.start()
        guardrail()
        worker.join()
        return PlainTextResponse("ok")

    try:
        spans = _one_request(handler, loop, serve)
    finally:
        garbage.clear()
    (collection_ms,) = pauses
    assert collection_ms > 20, pauses
    stage = next(s.attributes for s in spans if s.attributes.get(sc.STAGE) == "guardrail")
    # The stage waited for the GIL while the other thread collected (all of the collection
    # fell inside it): the collection is its GC, not time it held the loop off the CPU (a
    # busy host adds its own run-queue waits to that, which are not asserted on).
    assert stage.get(sc.GC_MS, 0.0) >= 0.5 * collection_ms, (stage, collection_ms)
    assert stage[sc.CPU_MS] + stage[sc.GC_MS] <= stage[sc.WALL_MS] * 1.01 + 0.01, stage


@pytest.mark.parametrize("loop", LOOPS)
def test_every_requests_buckets_add_up_to_its_wall_time(loop: str, model: ModelServer, serve: Any) -> None:
    """Streamed replies included (the body runs in tasks Starlette spawns, the model stage is
    an async generator whose consumer sends the chunks): CPU + loop wait + model wait + I/O
    wait + queue wait + GC = the request's wall time, for every request. Within 5%: the
    request's own spawned tasks can run while it waits for the model (the stream's listener
    for a disconnect, say), and their CPU then overlaps that wait (measured: up to 2.4%)."""
    proxy = Proxy(model.url)
    with tracekit.record() as rec:
        server = serve(proxy.app, loop=loop, http="httptools")
        drive_load(server.url, 60, 8, stream_every=2, max_tokens=20)
        time.sleep(0.3)
        tracing.flush_all()
        requests = [s.attributes for s in rec.spans if s.kind.name == "SERVER"]
    assert len(requests) == 60 and sum(a.get(sc.CHUNKS, 0) > 1 for a in requests) == 30
    for a in requests:
        parts = (a[sc.CPU_MS] + a[sc.LOOP_WAIT_MS] + a[sc.MODEL_WAIT_MS] + a[sc.IO_WAIT_MS]
                 + a.get(sc.QUEUE_WAIT_MS, 0.0) + a.get(sc.GC_MS, 0.0))  # fmt: skip
        assert parts == pytest.approx(a[sc.WALL_MS], rel=0.05, abs=0.05), {
            k.split(".")[-1]: v for k, v in a.items() if isinstance(v, float)}
        assert a[sc.MODEL_WAIT_MS] > 0, dict(a)
