"""The few places tracekit relies on the OpenTelemetry SDK beyond its public API.

Each is checked where it is used and falls back to the public API when the SDK changed
(tests/core/test_export.py checks both ways):

- :func:`processors`: a provider's span processors, reached inside its multi-processor to
  hand spans to each directly (``SynchronousMultiSpanProcessor._span_processors``);
- :func:`hand_over`: a request's spans queued in the SDK's ``BatchSpanProcessor`` in one go
  (its ``BatchProcessor``'s queue, bound and wake-up event), instead of one ``on_end`` each;
- :func:`active_processor`: the processor chain of a ``TracerProvider`` the application made
  (``TracerProvider._active_span_processor``), to send tracekit's spans where the app's go;
- :func:`is_default_sampler`: whether a sampler is the SDK's default (by its description);
- :func:`span_processor_of`: the processor chain an SDK span will end in
  (``Span._span_processor``: its provider's), to see the spans of another instrumentation
  whose server span tracekit enriches (:mod:`tracekit._export.composition`);
- :func:`otlp_http_sender`: the OTLP/HTTP exporter's client and request-size limit, to send
  it batches encoded by :mod:`tracekit._export.otlp_encoding`;
- span contexts built directly (``tracekit._export.readable_spans``: ``SpanContext`` is a
  tuple; ``ReadableSpan`` takes its fields positionally).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE, TraceState

from tracekit._core.failsafe import internal_error

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_tuple_new: Final = tuple.__new__
_pid = os.getpid()  # this process's, kept current across forks: no getpid call a request


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def processors(processor: Any, sync_multi: type | None) -> tuple[Any, ...]:
    """The processors to hand spans to: those of the SDK's synchronous multi-processor (a
    provider's ``add_span_processor`` chain) directly, one call per span fewer, else it.

    Read at every delivery, so processors the application adds later receive spans too.
    """
    if sync_multi is not None and type(processor) is sync_multi:
        inner = getattr(processor, "_span_processors", None)
        if type(inner) is tuple:
            return inner
    return (processor,)


def hand_over(target: Any, spans: list[Any]) -> None:
    """Give a request's ``spans`` to the span processor ``target``: queued in one go when it
    is the SDK's ``BatchSpanProcessor`` (or has ``on_end_batch``), else one ``on_end`` each.

    ``on_end`` costs 0.6-1.9 µs a span on the span-building thread (a ``getpid`` system call
    and the queue's checks per span; bench/export_costs.py), holding the GIL the request
    loop needs; in one go, 0.3-0.7 µs.
    """
    try:
        on_end_batch = getattr(target, "on_end_batch", None)
        if on_end_batch is not None:
            on_end_batch(spans)
            return
        if type(target) is BatchSpanProcessor and queue_all(target, spans):
            return
    except Exception:
        internal_error("span processor")
        return
    on_end = target.on_end
    for span in spans:
        try:
            on_end(span)
        except Exception:
            internal_error("span processor")


def queue_all(processor: Any, spans: list[Any]) -> bool:
    """Queue ``spans`` in a ``BatchSpanProcessor`` as its ``on_end`` does one by one (True),
    or nothing (False: the caller hands them over one by one) when any of them would not be
    queued as it is (not sampled, the queue too full, the processor shut down or inherited
    across a fork) or the processor is not laid out as expected. ``spans`` are one
    request's: they share its trace's flags, so the first one's are read."""
    batch = getattr(processor, "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    if type(queue) is not deque:
        return False
    size = getattr(batch, "_max_queue_size", None)
    threshold = getattr(batch, "_max_export_batch_size", None)
    awaken = getattr(batch, "_worker_awaken", None)
    if type(size) is not int or type(threshold) is not int or awaken is None:
        return False
    if getattr(batch, "_shutdown", True) is not False or getattr(batch, "_pid", None) != _pid:
        return False
    if not spans or len(queue) + len(spans) > size:
        return False
    context = spans[0].context
    if context is None or not context.trace_flags.sampled:
        return False
    queue.extendleft(spans)  # as on_end's appendleft of each in turn: the oldest on the right
    if len(queue) >= threshold and not awaken.is_set():
        awaken.set()
    return True


def sync_multi_type() -> type | None:
    try:
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    except ImportError:  # the API alone: nothing records, nothing to unwrap
        return None
    return SynchronousMultiSpanProcessor


def is_default_sampler(sampler: Any) -> bool:
    try:
        return bool(sampler.get_description() == "ParentBased{root:AlwaysOnSampler,"
                    "remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,"
                    "localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}")
    except Exception:
        return False


def replace_processors(chain: Any, old: list[Any], new: list[Any]) -> None:
    """In a provider's processor chain (the SDK's synchronous multi-processor), put ``new``
    where ``old`` were, keeping the others (the application's, added since). The caller shuts
    the old ones down."""
    with chain._lock:
        kept = tuple(p for p in chain._span_processors if not any(p is o for o in old))
        chain._span_processors = kept + tuple(new)


def active_processor(provider: Any) -> Any:
    """The span processor chain of an SDK ``TracerProvider`` (None if it has none we can see):
    tracekit's spans go where the application's go."""
    return getattr(provider, "_active_span_processor", None)


def span_processor_of(span: Any) -> Any:
    """The span processor (chain) an SDK span hands itself to when it ends; None when
    ``span`` is not an SDK span, or the SDK changed."""
    return getattr(span, "_span_processor", None)


def _new_context(trace_id: int, span_id: int, trace_state: TraceState | None,
                 valid: bool) -> SpanContext:  # fmt: skip
    """``SpanContext(trace_id, span_id, False, SAMPLED, trace_state)``, built directly.

    ``SpanContext`` is a tuple whose ``__new__`` (Python) only fills defaults and checks the
    ids; span building makes one per span, and that call is a large share of its cost. The tuple
    is made here instead (``valid``: whether both ids are in range, which the caller knows:
    :func:`ids_valid`), after :func:`_fast_contexts_match` checked at import that it comes
    out equal to the constructor's (else :func:`span_context` uses the constructor).
    """
    state = trace_state if trace_state is not None else DEFAULT_TRACE_STATE
    return _tuple_new(SpanContext, (trace_id, span_id, False, _SAMPLED, state, valid))


def ids_valid(trace_id: int, span_id: int) -> bool:
    """What ``SpanContext.is_valid`` says of these ids."""
    return 0 < trace_id < _TRACE_ID_LIMIT and 0 < span_id < _SPAN_ID_LIMIT


def span_context(trace_id: int, span_id: int, trace_state: TraceState | None,
                 valid: bool | None = None) -> SpanContext:  # fmt: skip
    """A sampled, local span context for these ids (``valid``: :func:`ids_valid` of them,
    when the caller knows it already)."""
    if not _FAST_CONTEXTS:
        return SpanContext(trace_id, span_id, False, _SAMPLED, trace_state)
    if valid is None:
        valid = ids_valid(trace_id, span_id)
    return _new_context(trace_id, span_id, trace_state, valid)


def _fast_contexts_match() -> bool:
    for trace_id, span_id in ((0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331), (0, 1)):
        for trace_state in (None, TraceState([("k", "v")])):
            try:
                fast = _new_context(trace_id, span_id, trace_state, ids_valid(trace_id, span_id))
                slow = SpanContext(trace_id, span_id, False, _SAMPLED, trace_state)
            except Exception:
                return False
            if type(fast) is not type(slow) or fast != slow or fast.is_valid != slow.is_valid:
                return False
    return True


_TRACE_ID_LIMIT: Final = 1 << 128
_SPAN_ID_LIMIT: Final = 1 << 64
_FAST_CONTEXTS: Final = _fast_contexts_match()


def readable_span(name: str, context: SpanContext, parent: SpanContext | None, resource: Any,
          attributes: dict[str, Any], events: Sequence[Event], kind: SpanKind, status: Status,
          start: int, end: int, scope: InstrumentationScope) -> ReadableSpan:  # fmt: skip
    """An SDK ``ReadableSpan`` of these fields."""
    # Positional, in the order of ReadableSpan.__init__'s parameters: passing eleven keyword
    # arguments builds a dict per call, a measurable share of span building (tests check
    # every field of the spans built here).
    return ReadableSpan(name, context, parent, resource, attributes, events, (), kind, None,
                        status, start, end, scope)  # fmt: skip


def otlp_http_sender(exporter: Any) -> Any:
    """For the SDK's OTLP/HTTP span exporter, a function that sends an encoded
    ``ExportTraceServiceRequest`` as its ``export`` would (True: sent, False: the send failed,
    None: not sent, its ``export`` is to handle the batch and say why); None for any other
    exporter, or one whose internals are not as expected (it then exports as it does).

    Its ``export`` does the same around its encoder: nothing after shutdown, the request-size
    limit, then its HTTP client (with its retries and timeout). Its own telemetry about
    exports (off unless ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``) is not recorded then,
    so the plain path is kept when that is on.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http import _common
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    if type(exporter) is not OTLPSpanExporter:
        return None
    client = getattr(exporter, "_client", None)
    send = getattr(client, "export", None)
    too_large = getattr(_common, "_is_request_too_large", None)
    limit = getattr(exporter, "_max_request_size", None)
    if send is None or too_large is None or type(limit) is not int or _internal_metrics_on():
        return None

    def send_encoded(data: bytes) -> bool | None:
        if exporter._shutdown is not False or too_large(data, limit):
            return None
        return bool(send(data).success)

    return send_encoded


def _internal_metrics_on() -> bool:
    import os

    value = os.environ.get("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "")
    return value.strip().lower() == "true"
