"""Builds OpenTelemetry SDK ``ReadableSpan`` objects from a finished request record.

Runs on the span-building thread (see :mod:`tracekit._runtime`), never on the request path.
This module imports the SDK; the core imports it only once something is recorded.
"""

from __future__ import annotations

import traceback
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracekit import _summary, semconv
from tracekit._accounting import Ledger
from tracekit._request import Request

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)


def instrumentation_scope() -> InstrumentationScope:
    """The scope every tracekit span carries."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tracekit_version = version("tracekit")
    except PackageNotFoundError:
        tracekit_version = "0"
    return InstrumentationScope(semconv.SCOPE_NAME, tracekit_version)


def build(request: Request, resource: Any, scope: InstrumentationScope) -> list[ReadableSpan]:
    """All spans of one request: its stages, then (unless enriching) its SERVER span."""
    end = _summary.end_of(request)
    trace_id, trace_state = request.trace_id, request.trace_state
    comps = _summary.all_components(request)
    offset = _summary.epoch(0)
    request_context = SpanContext(trace_id, request.span_id, False, _SAMPLED, trace_state)
    remote_parent = None
    if request.parent_span_id:
        remote_parent = SpanContext(trace_id, request.parent_span_id, request.remote_parent,
                                    _SAMPLED, trace_state)  # fmt: skip
    contexts: dict[int, SpanContext] = {}  # id(ledger) -> its span context, parents first
    spans = []
    for led, c in zip(request.ledgers, comps, strict=True):
        if led.kind == "request":
            contexts[id(led)] = request_context
            continue
        context = SpanContext(trace_id, led.span_id, False, _SAMPLED, trace_state)
        contexts[id(led)] = context
        parent = contexts.get(id(led.parent)) if led.parent is not None else remote_parent
        spans.append(ReadableSpan(
            name=led.name,
            context=context,
            parent=parent,
            resource=resource,
            attributes=_summary.ledger_attributes(led, c),
            events=_events(led) if led.blocked else (),
            kind=SpanKind.INTERNAL,
            status=_status(led.error) if led.error is not None else _OK,
            start_time=led.start + offset,
            end_time=(led.end or end) + offset,
            instrumentation_scope=scope,
        ))  # fmt: skip
    if request.server:
        spans.append(_server_span(request, resource, scope, end, request_context, remote_parent, comps))
    return spans


def _server_span(request: Request, resource: Any, scope: InstrumentationScope, end: int,
                 context: SpanContext, parent: SpanContext | None,
                 comps: list[dict[str, float]]) -> ReadableSpan:  # fmt: skip
    name, attrs = _summary.http_attributes(request)
    attrs.update(_summary.request_attributes(request, comps))
    error = request.error
    status = _status(error)
    events: list[Event] = list(_events(request.root)) if request.root is not None else []
    if error is not None and not request.cancelled:
        attrs[semconv.ERROR_TYPE] = _qualname(error)
        events.append(_exception_event(error, end))
    elif request.cancelled:
        attrs["tracekit.cancelled"] = True
    elif request.status >= 500:
        attrs[semconv.ERROR_TYPE] = str(request.status)
        status = Status(StatusCode.ERROR)
    return ReadableSpan(
        name=name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=attrs,
        events=events,
        kind=SpanKind.SERVER,
        status=status,
        start_time=_summary.epoch(request.start),
        end_time=_summary.epoch(end),
        instrumentation_scope=scope,
    )


def _status(error: BaseException | None) -> Status:
    if error is None or _is_cancel(error):
        return _OK
    return Status(StatusCode.ERROR, f"{_qualname(error)}: {error}"[:1024])


def _is_cancel(error: BaseException) -> bool:
    import asyncio

    return isinstance(error, asyncio.CancelledError)


def _qualname(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _exception_event(error: BaseException, end: int) -> Event:
    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return Event("exception", {
        "exception.type": _qualname(error),
        "exception.message": str(error)[:4096],
        "exception.stacktrace": stack[-16384:],
    }, timestamp=_summary.epoch(end))  # fmt: skip


def _events(led: Ledger) -> tuple[Event, ...]:
    if not led.blocked:
        return ()
    return tuple(
        Event(semconv.EVENT_BLOCKED, {
            semconv.BLOCKED_AT: blocked_at,
            semconv.EVENT_BLOCKED_MS: held_ms,
            semconv.EVENT_STACK: stack,
        }, timestamp=_summary.epoch(when))  # fmt: skip
        for when, held_ms, blocked_at, stack in led.blocked
    )
