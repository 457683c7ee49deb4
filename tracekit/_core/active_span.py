"""What OpenTelemetry sees as the current span while a recorded request runs.

tracekit attaches one OpenTelemetry context per request (not per stage): its span,
:class:`LedgerSpan`, computes its span context when asked (a propagator injecting
``traceparent``, an instrumentation starting a child span) from tracekit's own context
variable, so it is always the innermost open stage of the request in this task or thread.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tracekit._core.current import current_ledger
from tracekit._core.ledger import REQUEST
from tracekit._core.request_record import Request

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class LedgerSpan(NonRecordingSpan):
    """The OpenTelemetry "current span" for the whole of a recorded request.

    Attached once per request instead of once per stage: its span context is computed when
    someone asks (a propagator injecting ``traceparent``, an instrumentation starting a
    child span) from tracekit's own context variable, so it is always the innermost open
    stage of this request in this task or thread. When tracekit enriches a server span made
    by other instrumentation, calls that record (``set_attribute``...) made at the request's
    top level go to that span.
    """

    def __init__(self, request: Request, delegate: Any = None) -> None:
        # NonRecordingSpan.__init__ only stores a SpanContext; ours is built when asked for.
        self._request = request
        self._delegate = delegate

    def get_span_context(self) -> SpanContext:
        led = current_ledger.get()
        request = self._request
        # The innermost stage of this request (its root ledger has the request's span id).
        span_id = led.span_id if led is not None and led.request is request else request.span_id
        return SpanContext(request.trace_id, span_id, False, _SAMPLED, request.trace_state)

    def _target(self) -> Any:
        led = current_ledger.get()
        at_top = led is None or led.request is not self._request or led.site is REQUEST
        return self._delegate if at_top else None

    def is_recording(self) -> bool:
        target = self._target()
        return bool(target is not None and target.is_recording())

    def set_attribute(self, key: str, value: Any) -> None:
        target = self._target()
        if target is not None:
            target.set_attribute(key, value)

    def set_attributes(self, attributes: Any) -> None:
        target = self._target()
        if target is not None:
            target.set_attributes(attributes)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        target = self._target()
        if target is not None:
            target.add_event(name, attributes, timestamp)

    def record_exception(self, exception: BaseException, attributes: Any = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:  # fmt: skip
        target = self._target()
        if target is not None:
            target.record_exception(exception, attributes, timestamp, escaped)

    def set_status(self, status: Any, description: str | None = None) -> None:
        target = self._target()
        if target is not None:
            target.set_status(status, description)


def request_context(request: Request) -> Context:
    """The OpenTelemetry context to attach for the whole of ``request``."""
    return otel_trace.set_span_in_context(LedgerSpan(request, request.enrich))


def unsampled_context(trace_id: int, span_id: int, trace_state: Any) -> Context:
    """Context for a request the sampler dropped: ids still propagate, flagged not sampled."""
    span_context = SpanContext(trace_id, span_id, False, _NOT_SAMPLED, trace_state)
    return otel_trace.set_span_in_context(NonRecordingSpan(span_context))
