"""The batch span processor ``configure()`` puts in front of a network exporter (OTLP).

The SDK's ``BatchSpanProcessor`` (export on its own thread, a bounded queue), plus what it
lacks for a bounded shutdown (:mod:`tracekit._export.shutdown`):

- ``force_flush`` and ``shutdown`` return by their deadline whatever the collector does. The
  SDK's ``force_flush`` ignores its timeout and its ``shutdown`` waits up to 30 s, while a
  collector that refuses connections holds each batch of 512 spans for ~7 s of retries, and
  one that never answers for ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s).
- counts of the spans handed in and of those exported, for the line logged at shutdown;
- a queue of ``QUEUE_SPANS`` spans unless ``OTEL_BSP_MAX_QUEUE_SIZE`` says otherwise: tracekit
  hands spans over in bursts (a drain builds every request queued since the last, five spans
  or more each), and the SDK's 2,048 overflowed (spans dropped) while the exporter kept up;
- the SDK's OTLP/HTTP exporter is given batches encoded by
  :mod:`tracekit._export.otlp_encoding` (the same bytes, a fraction of the SDK encoder's time
  on the export thread, which holds the GIL the request loop needs); any other exporter, or a
  batch that encoder or send refuses, goes through the exporter's own ``export``.

Imports the SDK: loaded by ``configure()`` only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tracekit._core.failsafe import internal_error
from tracekit._export import sdk, shutdown
from tracekit._export.otlp_encoding import Encoder

QUEUE_SPANS = 8192


class CountedBatchSpanProcessor(BatchSpanProcessor):
    """``BatchSpanProcessor(exporter)`` with bounded flush and shutdown, counting its spans."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._counting = _CountingExporter(exporter)
        size = None if os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else QUEUE_SPANS
        super().__init__(self._counting, max_queue_size=size)
        self.received = 0  # sampled spans handed in (those the SDK's processor queues)
        shutdown.exports.add(self)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None and context.trace_flags.sampled:
            # Not locked: two threads ending spans at once may rarely lose an increment (a
            # figure for the log, not an invariant); a lock would cost more than the figure is worth.
            self.received += 1
        super().on_end(span)

    def on_end_batch(self, spans: list[ReadableSpan]) -> None:
        """A request's spans, queued in one go where the SDK's processor allows
        (:func:`tracekit._export.sdk.queue_all`), else one by one."""
        if sdk.queue_all(self, spans):
            self.received += len(spans)
            return
        for span in spans:
            self.on_end(span)

    def unexported(self) -> int:
        """Spans handed in and not (yet) exported: failed, dropped, queued or in flight."""
        return max(0, self.received - self._counting.exported)

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        timeout_s = (30_000 if timeout_millis is None else timeout_millis) / 1000
        flush = super().force_flush
        return shutdown.bounded(flush, time.monotonic() + timeout_s, "span export flush")

    def shutdown(self) -> None:
        # The SDK provider's atexit handler calls this too: bounded by the shutdown timeout.
        shutdown.bounded(super().shutdown, shutdown.deadline(), "span export shutdown")


class _CountingExporter(SpanExporter):
    """Passes batches to ``exporter``, counting the spans it exported."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.exported = 0  # written by the batch processor's exports, one at a time
        self._send = sdk.otlp_http_sender(exporter)
        self._encoder = Encoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        send = self._send
        if send is not None:
            data = None
            try:
                data = self._encoder.encode(spans)
            except Exception:
                internal_error("OTLP encoding")
                self._send = None  # the exporter's own path from now on
            sent = send(data) if data is not None else None
            if sent is not None:  # sent (its client retried and logged a failure)
                if sent:
                    self.exported += len(spans)
                return SpanExportResult.SUCCESS if sent else SpanExportResult.FAILURE
        result = self.exporter.export(spans)  # also a batch not sent above: it logs why
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)
