"""What handing over and encoding a span costs on the threads beside the loop (CPU per span).

Records the spans of bench/overhead.py's app (tracekit's and, for comparison, the OTel
middleware's), then times, each the best of ``--repeat`` passes over them (``process_time``):

- encode: an OTLP ``ExportTraceServiceRequest`` by the SDK's encoder
  (opentelemetry-exporter-otlp-proto-common, then ``SerializePartialToString``) and by
  tracekit._export.otlp_encoding (checked to be the same bytes);
- hand-over: each span to ``on_end``, and each request's spans in one call
  (tracekit._export.sdk.hand_over), of the SDK's ``BatchSpanProcessor`` (as given by an
  application's provider) and of tracekit's (what ``configure(exporter=...)`` makes);
- ``ReadableSpan``: constructed with positional arguments (as tracekit does).

Run: .venv/bin/python bench/export_costs.py [--requests 200] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import overhead
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit import _native
from tracekit._core import current
from tracekit._export import sdk
from tracekit._export.batch import CountedBatchSpanProcessor
from tracekit._export.otlp_encoding import Encoder


def recorded(variant: str, requests: int) -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if variant == "otel":
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        app: Any = OpenTelemetryMiddleware(overhead.make_app(False), tracer_provider=provider)
    else:
        tracekit.configure(tracer_provider=provider)
        app = tracekit.TracekitMiddleware(overhead.make_app(True))
    asyncio.run(overhead.drive(app, requests))
    if current.active_runtime is not None:
        current.active_runtime.flush()
    overhead.retire()
    return list(exporter.get_finished_spans())


def best_us(work: Callable[[], object], count: int, repeat: int) -> float:
    """The best pass's CPU µs per item (``count`` items a pass)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


def one_by_one(processor: Any, spans: list[Any]) -> None:
    processor._batch_processor._queue.clear()
    on_end = processor.on_end
    for span in spans:
        on_end(span)


def in_one_go(processor: Any, groups: list[list[Any]]) -> None:
    processor._batch_processor._queue.clear()
    for group in groups:
        sdk.hand_over(processor, group)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"tracekit build: {'compiled (mypyc)' if _native.compiled() else 'plain Python'}")
    for variant in ("tracekit", "otel"):
        spans = recorded(variant, args.requests)
        n, encoder = len(spans), Encoder()
        same = encoder.encode(spans) == encode_spans(spans).SerializePartialToString()
        sdk_us = best_us(lambda: encode_spans(spans).SerializePartialToString(), n, args.repeat)  # noqa: B023
        ours_us = best_us(lambda: encoder.encode(spans), n, args.repeat)  # noqa: B023
        print(f"{variant:8s} spans: encode µs/span: SDK {sdk_us:.1f}, tracekit {ours_us:.1f} "
              f"({sdk_us / ours_us:.1f} x; same bytes: {same})")  # fmt: skip
    spans = recorded("tracekit", args.requests)
    per_request = len(spans) // args.requests
    groups = [spans[i:i + per_request] for i in range(0, len(spans), per_request)]
    for name, processor in (
        ("BatchSpanProcessor", BatchSpanProcessor(overhead.DroppingExporter())),
        ("tracekit's batch processor", CountedBatchSpanProcessor(overhead.DroppingExporter())),
    ):
        batch = processor._batch_processor
        # no export during the passes: a queue that holds them all, a worker that sleeps
        batch._max_queue_size = batch._max_export_batch_size = 10**7
        print(f"hand-over to {name}, µs/span: on_end "
              f"{best_us(lambda: one_by_one(processor, spans), len(spans), args.repeat):.2f}, "  # noqa: B023
              f"a request's spans in one go "
              f"{best_us(lambda: in_one_go(processor, groups), len(spans), args.repeat):.2f}")  # noqa: B023
        processor.shutdown()
    s = spans[0]
    fields = (s.name, s.context, s.parent, s.resource, s.attributes, s.events, (), s.kind, None,
              s.status, s.start_time, s.end_time, s.instrumentation_scope)  # fmt: skip
    construct = best_us(lambda: [ReadableSpan(*fields) for _ in range(10_000)], 10_000, args.repeat)
    print(f"ReadableSpan(...) µs: {construct:.2f}")


if __name__ == "__main__":
    main()
