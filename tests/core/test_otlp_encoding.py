"""The export path's SDK shortcuts: tracekit._export.otlp_encoding writes the bytes the SDK's
OTLP encoder makes; sdk.hand_over queues a request's spans as the SDK's on_end would."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

import tracekit
from tracekit._export import sdk
from tracekit._export.batch import CountedBatchSpanProcessor
from tracekit._export.otlp_encoding import Encoder


def _span(**fields: Any) -> ReadableSpan:
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False,
                          TraceFlags(1), TraceState([("k", "v")]))  # fmt: skip
    values: dict[str, Any] = {"name": "s", "context": context, "kind": SpanKind.CLIENT,
                              "start_time": 1, "end_time": 2**63,
                              "resource": Resource.create({"service.name": "x"})}  # fmt: skip
    values.update(fields)
    return ReadableSpan(**values)


def _check(spans: list[ReadableSpan]) -> None:
    expected = encode_spans(spans).SerializePartialToString()
    encoder = Encoder()
    assert encoder.encode(spans) == expected
    assert encoder.encode(spans) == expected  # again, from what it kept


def test_tracekit_spans_encode_as_the_sdk_does() -> None:
    app = tracekit.TracekitMiddleware(_app)
    with tracekit.record() as recording:
        for _ in range(3):
            asyncio.run(_call(app))
    spans = recording.spans
    assert len(spans) >= 6
    _check(list(spans))


def test_every_kind_of_value_and_field_encodes_as_the_sdk_does() -> None:
    parent = SpanContext(1, 2, True, TraceFlags(1))
    scope = InstrumentationScope("lib", "1.0", "https://schema", {"a": 1})
    other_resource = Resource.create({"service.name": "x"})  # equal to the default one: one group
    spans = [
        _span(attributes={"s": "é\U0001f600", "t": True, "f": False, "i": -5, "big": 2**63 - 1,
                          "d": -0.0, "l": [1, 2], "ls": ("a", "b"), "lf": [1.5], "e": [],
                          "b": b"\x00\xff", "m": {"k": 1}, "n": None}),  # fmt: skip
        _span(parent=parent, status=Status(StatusCode.ERROR, "boom"), instrumentation_scope=scope,
              events=[Event("e", {"x": 1.0}, timestamp=5), Event("", None, timestamp=0)]),
        _span(links=[Link(parent, {"l": 1})], kind=SpanKind.SERVER, resource=other_resource),
        _span(attributes={"s": "é\U0001f600", "i": 7, 1: "non-string key"}),
        _span(attributes={"surrogate": "\ud800", "i": 8}),  # the SDK leaves that one out
        _span(status=Status(StatusCode.OK), start_time=None, end_time=None, instrumentation_scope=scope),
    ]
    _check(spans)
    _check(spans[::-1])
    _check([])


@tracekit.stage("model")
async def _model() -> int:
    await asyncio.sleep(0)
    return 1


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await _model()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _call(app: Any) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": "/x", "raw_path": b"/x", "root_path": "",
             "query_string": b"q=1", "headers": [(b"host", b"h")], "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 5)}  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(scope, receive, send)


# --- a request's spans handed to the SDK's batch processor in one go (sdk.hand_over) ---------
class _Exporter(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _queued(processor: BatchSpanProcessor) -> list[Any]:
    return list(processor._batch_processor._queue)


def test_spans_are_queued_in_one_go_as_one_by_one() -> None:
    spans = [_span(name=str(i)) for i in range(5)]
    one_by_one, at_once = BatchSpanProcessor(_Exporter()), BatchSpanProcessor(_Exporter())
    try:
        for span in spans:
            one_by_one.on_end(span)
        sdk.hand_over(at_once, spans)
        assert _queued(at_once) == _queued(one_by_one)
        counted = CountedBatchSpanProcessor(_Exporter())
        sdk.hand_over(counted, spans)
        assert _queued(counted) == _queued(one_by_one) and counted.received == 5
    finally:
        for processor in (one_by_one, at_once):
            processor.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_processor_of_another_process_is_not_queued_in_one_go() -> None:
    # The SDK re-makes its processor's queue and thread in a forked child and notes the new
    # pid; one not (yet) re-made for this process gets on_end, which re-makes it. tracekit
    # keeps the pid it compares with current across forks, without a getpid call a request.
    processor = BatchSpanProcessor(_Exporter(), schedule_delay_millis=60_000)
    try:
        assert sdk.queue_all(processor, [_span()])
        processor._batch_processor._pid = -1  # as inherited before the SDK's re-making
        assert not sdk.queue_all(processor, [_span()])
    finally:
        processor.shutdown()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, b"1" if sdk._pid == os.getpid() else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(child, 0)


def test_what_one_go_cannot_queue_goes_one_by_one() -> None:
    full = BatchSpanProcessor(_Exporter(), max_queue_size=3, max_export_batch_size=3,
                              schedule_delay_millis=60_000)  # fmt: skip
    unsampled = _span(context=SpanContext(1, 2, False, TraceFlags(0)))
    try:
        full._batch_processor._queue.extend([_span(), _span()])
        # refused as a whole (the caller then hands them over one by one, the SDK dropping)
        assert not sdk.queue_all(full, [_span(), _span()])  # one more than fits
        assert not sdk.queue_all(full, [unsampled])  # on_end skips it
        assert sdk.queue_all(full, [_span()]) and len(_queued(full)) == 3
    finally:
        full.shutdown()
    seen: list[Any] = []

    class Plain:
        def on_end(self, span: Any) -> None:
            seen.append(span)
            if len(seen) == 1:
                raise RuntimeError("a broken processor")

    spans = [_span(), _span()]
    sdk.hand_over(Plain(), spans)  # the first one's error does not lose the second
    assert seen == spans
