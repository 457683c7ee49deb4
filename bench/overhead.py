"""Per-request overhead of tracekit vs the OpenTelemetry contrib ASGI middleware (in-process).

Each variant serves the same Starlette app, called directly as an ASGI app (no sockets), one
request after another on one event loop: a handler running four stages (tokenize, guardrail,
model with one real suspension, serialize). Variants:

- bare:     the app, stage functions undecorated
- otel:     opentelemetry-instrumentation-asgi's OpenTelemetryMiddleware (default options),
            SDK TracerProvider + BatchSpanProcessor(dropping exporter)
- tracekit: TracekitMiddleware + @tracekit.stage on the four stages, 100% sampled, full
            attribution, BatchSpanProcessor(dropping exporter)
- tracekit-dropped: as tracekit, with an always-off sampler (the request is not recorded)
- tracekit-nogc: as tracekit, with the garbage collector paused (to measure its share)

``--compare`` runs chosen variants only, among them diagnostic ones (see ``_alter``):
tracekit-unbuilt, tracekit-inline, tracekit-starved, tracekit-nowatchdog, tracekit-pythonpoll.

Time per request = (wall time of N requests + flushing everything queued) / N, and also
process CPU time (all threads: span building and export included) / N. Variants run in
interleaved rounds; the best (minimum) round is reported: on a shared machine noise only ever
adds time, and the minimum is the most repeatable estimate of the true cost. The ratio to the
OTel middleware is also computed within each round (the three variants ran within a second of
each other, under the same load) and its median over the rounds reported. Streaming: the cost
per body chunk is the
slope between a 1-chunk and a 201-chunk response. Soak: RSS growth over 100,000 traced
requests after a warm-up, and the growth in objects the garbage collector tracks (spans
exported on the spot, so that the SDK's batch queue does not add its own high-water mark).

tracekit's request path is compiled with mypyc where it was built (tracekit/_native.py); the
results say which build ran ("build"). TRACEKIT_PURE_PYTHON=1 measures the plain-Python one.

Run: .venv/bin/python bench/overhead.py [--requests 20000] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import tracekit
from tracekit import _native
from tracekit._core import current
from tracekit._export import tracing
from tracekit.testing import HTTPRequest
from tracekit.testing import drive as send_requests

DEFAULT_MAX_QUEUE = tracing.MAX_QUEUE


class DroppingExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def make_app(decorate: bool, chunks: int = 0) -> Starlette:
    wrap = tracekit.stage if decorate else (lambda name: lambda fn: fn)

    @wrap("tokenize")
    def tokenize(text: str) -> list[int]:
        return [len(w) for w in text.split()]

    @wrap("guardrail")
    async def guardrail(tokens: list[int]) -> bool:
        return len(tokens) < 100

    @wrap("model")
    async def model(tokens: list[int]) -> str:
        await asyncio.sleep(0)  # one real suspension, as an awaited network call has
        return "reply " * len(tokens)

    @wrap("serialize")
    def serialize(text: str) -> bytes:
        return json.dumps({"choices": [{"text": text}]}).encode()

    async def chat(request: Request) -> Response:
        tokens = tokenize("the quick brown fox jumps over the lazy dog")
        await guardrail(tokens)
        return Response(serialize(await model(tokens)), media_type="application/json")

    async def stream(request: Request) -> StreamingResponse:
        async def body():  # type: ignore[no-untyped-def]
            for _ in range(chunks):
                yield b"data: x\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/chat", chat, methods=["POST"]), Route("/stream", stream)])


# The requests, sent by tracekit.testing.drive (also what tracekit.testing.measure_overhead sends).
_HEADERS = {"user-agent": "bench/1", "content-type": "application/json"}
CHAT = HTTPRequest("POST", "/chat", body=b"{}", headers=_HEADERS)
STREAM = HTTPRequest("GET", "/stream", headers=_HEADERS)


async def drive(app: Any, n: int, path: str = "/chat") -> None:
    await send_requests(app, [CHAT if path == "/chat" else STREAM], n)


def variant(name: str, chunks: int = 0, batch: bool = True) -> tuple[Any, Any]:
    """(asgi app, flush callable) for a variant; installs its tracing (``batch``: through a
    ``BatchSpanProcessor``, else a ``SimpleSpanProcessor`` that exports on the spot)."""
    if name == "bare":
        return make_app(False, chunks), lambda: None
    exporter = DroppingExporter()
    processor: Any = SimpleSpanProcessor(exporter)
    if batch:
        processor = BatchSpanProcessor(exporter, max_queue_size=1_000_000)  # never drop: full cost
    provider = TracerProvider(sampler=ALWAYS_OFF if name == "tracekit-dropped" else None)
    provider.add_span_processor(processor)
    if name == "otel":
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        app = OpenTelemetryMiddleware(make_app(False, chunks), tracer_provider=provider)
        return app, lambda: processor.force_flush()
    tracekit.configure(tracer_provider=provider)
    runtime = current.active_runtime
    assert runtime is not None
    _alter(runtime, name.removeprefix("tracekit").lstrip("-"))

    def flush() -> None:
        runtime.flush()
        if runtime.dropped and tracing.MAX_QUEUE > 100_000:  # the soak keeps the shipped bound
            raise SystemExit(f"tracekit dropped {runtime.dropped} requests: the benchmark is invalid")

    return tracekit.TracekitMiddleware(make_app(True, chunks)), flush


def _alter(runtime: tracing.Runtime, changes: str) -> None:
    """The diagnostic variants (``--compare``), each tracekit with one thing changed, or
    several joined by ``+`` (``tracekit-unbuilt+pythonpoll``):

    - unbuilt:     finished requests are dropped, never built into spans (the request path alone)
    - inline:      spans are built and delivered on the request path, right after the response
    - starved:     the loop thread never hands the GIL to the span-building thread
                   (tracekit._export.tracing: Runtime._hand_over_gil)
    - nowatchdog:  no watchdog thread
    - pythonpoll:  the watchdog polls in Python, taking the GIL every 10 ms (its fallback when
                   tracekit/_core/_slicewatch.c is not built), instead of without the GIL
    """
    for change in changes.split("+"):
        if change == "unbuilt":
            runtime.submit = lambda request: request.release()  # type: ignore[method-assign]
        elif change == "inline":
            runtime.submit = _build_now(runtime)  # type: ignore[method-assign]
        elif change == "starved":
            runtime._hand_over_gil = lambda: setattr(runtime, "_due_at", tracing._NEVER)  # type: ignore[method-assign]
        elif change == "nowatchdog":
            runtime.watchdog = None
        elif change == "pythonpoll":
            runtime.watchdog.gil_free_wait = None
        elif change not in ("", "dropped"):
            raise SystemExit(f"unknown variant: tracekit-{change}")


def _build_now(runtime: tracing.Runtime) -> Any:
    """A ``submit`` that builds and delivers the spans on the spot (the ``inline`` variant)."""
    from tracekit._export import readable_spans

    scope = readable_spans.instrumentation_scope()

    def build_now(request: Any) -> None:
        try:
            runtime._deliver(readable_spans.build(request, runtime.resource, scope))
        finally:
            request.release()

    return build_now


def retire() -> None:
    """Uninstall the variant's runtime and stop its threads (its watchdog would poll on, in
    every later variant of the process)."""
    runtime = tracing.install(None)
    if runtime is not None:
        runtime.shutdown()


BACKLOG: list[int] = []  # tracekit variants: requests still waiting for span building at the end


def measure(name: str, n: int, path: str = "/chat", chunks: int = 0) -> tuple[float, float]:
    """(wall µs, process CPU µs) per request, flush included.

    ``tracekit-nogc`` is ``tracekit`` with the cyclic garbage collector paused during the
    timed part: the difference is what collecting the per-request objects costs.
    """
    app, flush = variant(name.removesuffix("-nogc"), chunks)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive(app, min(1000, n), path))  # warm-up
        flush()
        gc.collect()
        if name.endswith("-nogc"):
            gc.disable()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        loop.run_until_complete(drive(app, n, path))
        if name == "tracekit" and current.active_runtime is not None:
            BACKLOG.append(len(current.active_runtime._queue))
        flush()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        gc.enable()
        loop.close()
        retire()
    return wall / n * 1e6, cpu / n * 1e6


ROUND_RATIOS: dict[str, list[float]] = {"wall_us": [], "cpu_us": []}  # tracekit/otel, per round


def rounds(names: list[str], n: int, count: int, **kw: Any) -> dict[str, dict[str, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for _ in range(count):
        for name in names:
            samples[name].append(measure(name, n, **kw))
        if {"bare", "otel", "tracekit"} <= samples.keys():  # the ratio within this round
            for i, metric in enumerate(ROUND_RATIOS):
                bare = samples["bare"][-1][i]
                ROUND_RATIOS[metric].append(
                    (samples["tracekit"][-1][i] - bare) / (samples["otel"][-1][i] - bare))
    return {name: {"wall_us": min(w for w, _ in s), "cpu_us": min(c for _, c in s)}
            for name, s in samples.items()}  # fmt: skip


def soak(total: int) -> dict[str, float]:
    tracing.MAX_QUEUE = DEFAULT_MAX_QUEUE  # as shipped: a saturated loop may drop (counted)
    # Spans exported on the spot: the SDK's batch queue, whose export thread falls behind on a
    # loop that never idles, would add its own high-water mark (tens of MB) to tracekit's.
    app, flush = variant("tracekit", batch=False)
    runtime = current.active_runtime
    assert runtime is not None
    process = psutil.Process()
    loop = asyncio.new_event_loop()
    try:
        # Warm-up: caches, arenas, and the backlog's high-water mark. On a loop that never
        # idles the span builder falls behind until flushed, and memory freed after a
        # high-water mark stays with the allocator: each later batch is half as long as the
        # warm-up and flushed after it, so RSS can grow only by what requests leave behind.
        loop.run_until_complete(drive(app, 20_000))
        flush()
        gc.collect()
        before, objects_before = process.memory_info().rss, len(gc.get_objects())
        done = 0
        while done < total:
            loop.run_until_complete(drive(app, 10_000))
            done += 10_000
            flush()
        gc.collect()
        after, objects_after = process.memory_info().rss, len(gc.get_objects())
        dropped = runtime.dropped
    finally:
        loop.close()
        retire()
    return {"requests": total, "rss_before_mb": before / 2**20, "rss_after_mb": after / 2**20,
            "growth_mb": (after - before) / 2**20, "dropped_requests": dropped,
            "gc_objects_growth": objects_after - objects_before}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--soak", type=int, default=100_000)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--compare", metavar="V1,V2,...",
                        help="only run these variants in interleaved rounds and print each one's "
                             "best overhead (e.g. bare,tracekit,tracekit-inline)")  # fmt: skip
    args = parser.parse_args()
    otel_trace.set_tracer_provider(TracerProvider())  # a global SDK provider, as an app would have
    # The loop here is saturated (no idle time), so the span-building thread falls behind; let
    # its queue grow so that every request's spans are built and their cost counted.
    tracing.MAX_QUEUE = 1_000_000

    if args.compare:
        names = args.compare.split(",")
        best = rounds(names if "bare" in names else ["bare", *names], args.requests, args.rounds)
        for name, figures in best.items():
            print(f"{name:22s} overhead: wall {figures['wall_us'] - best['bare']['wall_us']:6.1f} µs,"
                  f" CPU {figures['cpu_us'] - best['bare']['cpu_us']:6.1f} µs")  # fmt: skip
        return

    main_names = ["bare", "otel", "tracekit", "tracekit-nogc", "tracekit-dropped"]
    per_request = rounds(main_names, args.requests, args.rounds)
    one = rounds(["bare", "tracekit"], args.requests // 4, args.rounds, path="/stream", chunks=1)
    many = rounds(
        ["bare", "tracekit"], args.requests // 20, args.rounds, path="/stream", chunks=201
    )
    results: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },  # fmt: skip
        "build": "compiled (mypyc)" if _native.compiled() else "plain Python",
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "per_request": per_request,
        "backlog_at_end_of_requests": BACKLOG,
    }
    for metric in ("wall_us", "cpu_us"):
        bare = per_request["bare"][metric]
        otel = per_request["otel"][metric] - bare
        ours = per_request["tracekit"][metric] - bare
        dropped = per_request["tracekit-dropped"][metric] - bare
        chunk = ((many["tracekit"][metric] - many["bare"][metric])
                 - (one["tracekit"][metric] - one["bare"][metric])) / 200  # fmt: skip
        gc_share = per_request["tracekit"][metric] - per_request["tracekit-nogc"][metric]
        paired = sorted(ROUND_RATIOS[metric])
        results[metric] = {"otel_overhead_us": otel, "tracekit_overhead_us": ours,
                           "ratio_tracekit_to_otel": ours / otel,
                           "ratio_per_round_median": paired[len(paired) // 2],
                           "ratio_per_round_quartiles": [paired[len(paired) // 4],
                                                         paired[(3 * len(paired)) // 4]],
                           "dropped_request_us": dropped,
                           "per_chunk_us": chunk, "tracekit_gc_us": gc_share}  # fmt: skip
    results["soak"] = soak(args.soak)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
