"""Builds OpenTelemetry SDK ``ReadableSpan`` objects from a finished request record.

Runs on the span-building thread (see :mod:`tracekit._export.tracing`), never on the request path.
This module imports the SDK; the core imports it only once something is recorded.
"""

from __future__ import annotations

import traceback
from typing import Any, Final

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracekit import semconv
from tracekit._core import clock
from tracekit._core.ledger import REQUEST, SPAWNED, Ledger
from tracekit._core.request_record import Request, new_span_id
from tracekit._export import sdk, span_attributes

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_OK: Final = Status(StatusCode.UNSET)
_INTERNAL: Final = SpanKind.INTERNAL
_SERVER: Final = SpanKind.SERVER
_CLIENT: Final = SpanKind.CLIENT
# exception.stacktrace: characters kept (its end: the innermost frames and the message), frames
# kept per exception (the innermost), exceptions kept of a __cause__/__context__ chain.
MAX_STACKTRACE: Final = 8192
MAX_FRAMES: Final = 64
MAX_CHAINED: Final = 8
_CAUSED: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"


def instrumentation_scope() -> InstrumentationScope:
    """The scope every tracekit span carries (made once a process: reading the installed
    version scans the installed distributions, milliseconds for every runtime otherwise)."""
    if _scope:
        return _scope[0]
    from importlib.metadata import PackageNotFoundError, version

    try:
        tracekit_version = version("tracekit")
    except PackageNotFoundError:
        tracekit_version = "0"
    _scope.append(InstrumentationScope(semconv.SCOPE_NAME, tracekit_version))
    return _scope[0]


_scope: Final[list[InstrumentationScope]] = []


def build(request: Request, resource: Any, scope: InstrumentationScope) -> list[ReadableSpan]:
    """All spans of one request: its stages, then (unless enriching) its SERVER span."""
    end = span_attributes.end_of(request)
    privacy = getattr(request.runtime, "privacy", None) or span_attributes.DEFAULT_PRIVACY
    limit = privacy.message_limit
    trace_id, trace_state = request.trace_id, request.trace_state
    parts = span_attributes.ledger_parts(request, end)
    offset = clock.epoch_ns(0)
    request_context = sdk.span_context(trace_id, request.span_id, trace_state)
    remote_parent = None
    if request.parent_span_id:
        remote_parent = SpanContext(trace_id, request.parent_span_id, request.remote_parent,
                                    _SAMPLED, trace_state)  # fmt: skip
    # Span ids are made non-zero and 64-bit (request_record.new_span_id): only the trace id, which
    # may come from a traceparent, decides whether a stage's context is valid.
    valid = sdk.ids_valid(trace_id, 1)
    open_at = span_attributes.open_end(request, end)
    contexts: dict[Ledger, SpanContext] = {}  # ledger -> its span context, parents first
    spans = []
    ledgers = request.ledgers
    for i in range(len(parts)):  # every ledger: none is added once the request is handed on
        led = ledgers[i]
        if led.site is REQUEST:
            contexts[led] = request_context
            continue
        if led.site is SPAWNED:  # a spawned task's: folded into the ledger that spawned it
            continue
        wall, children, wait, loop_wait = parts[i]
        context = contexts[led] = sdk.span_context(trace_id, led.span_id, trace_state, valid)
        parent = contexts.get(led.parent) if led.parent is not None else remote_parent
        spans.append(sdk.readable_span(
            led.site.name, context, parent, resource,
            span_attributes.stage_attributes(led, wall, children, wait, loop_wait),
            _events(led, offset) if led.blocked else (),
            _CLIENT if led.site.client_call else _INTERNAL,
            _status(led.error, limit) if led.error is not None else _OK,
            led.start + offset, span_attributes.ledger_end(led, open_at) + offset, scope,
        ))  # fmt: skip
    if request.server:
        spans.append(_server_span(request, resource, scope, end, offset, request_context,
                                  remote_parent, parts, privacy))  # fmt: skip
    else:  # the enriched span ended with the response: what ran after it needs its own
        after = _after_response(request, resource, scope, offset, request_context, parts, open_at)
        if after is not None:
            spans.append(after)
    return spans


def _after_response(request: Request, resource: Any, scope: InstrumentationScope, offset: int,
                    parent: SpanContext, parts: list[tuple[int, int, int, int]],
                    open_at: int) -> ReadableSpan | None:  # fmt: skip
    """The ``tracekit.after_response`` span of a request whose server span another
    instrumentation owns, when its code used CPU after the response; else ``None``."""
    attrs = span_attributes.request_attributes(request, parts)
    if semconv.AFTER_RESPONSE_CPU_MS not in attrs or not request.end:
        return None
    keys = (semconv.AFTER_RESPONSE_CPU_MS, semconv.AFTER_RESPONSE_CPU_OFF_LOOP_MS)
    kept: dict[str, Any] = {key: attrs[key] for key in keys if key in attrs}
    last = max([request.end, *(span_attributes.ledger_end(led, open_at) for led in request.ledgers)])
    context = sdk.span_context(request.trace_id, new_span_id(), request.trace_state)
    return sdk.readable_span(semconv.AFTER_RESPONSE_SPAN, context, parent, resource, kept, (), _INTERNAL,
                             _OK, request.end + offset, last + offset, scope)  # fmt: skip


def _server_span(request: Request, resource: Any, scope: InstrumentationScope, end: int,
                 offset: int, context: SpanContext, parent: SpanContext | None,
                 parts: list[tuple[int, int, int, int]],
                 privacy: span_attributes.Privacy) -> ReadableSpan:  # fmt: skip
    name, attrs = span_attributes.http_attributes(request, privacy)
    span_attributes.request_attributes(request, parts, attrs)
    error = request.error
    limit = privacy.message_limit
    status = _status(error, limit)
    root = request.root
    events: list[Event] = list(_events(root, offset)) if root is not None and root.blocked else []
    if error is not None and not request.cancelled:
        attrs[semconv.ERROR_TYPE] = _qualname(error)
        events.append(_exception_event(error, end + offset, limit))
    elif request.status >= 500 and not request.cancelled:
        attrs[semconv.ERROR_TYPE] = str(request.status)
        status = Status(StatusCode.ERROR)
    return sdk.readable_span(name, context, parent, resource, attrs, events, _SERVER, status,
                 request.start + offset, end + offset, scope)  # fmt: skip


def _status(error: BaseException | None, limit: int) -> Status:
    if error is None or _is_cancel(error):
        return _OK
    return Status(StatusCode.ERROR, _headline(error, limit))


def _is_cancel(error: BaseException) -> bool:
    import asyncio

    return isinstance(error, asyncio.CancelledError)


def _qualname(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _exception_event(error: BaseException, when: int, limit: int) -> Event:
    """The OpenTelemetry ``exception`` event; messages cut to ``limit`` characters, none at 0."""
    attributes = {"exception.type": _qualname(error)}
    if limit > 0:
        attributes["exception.message"] = span_attributes.clip(_message(error), limit)
    attributes["exception.stacktrace"] = _stacktrace(error, limit)[-MAX_STACKTRACE:]
    return Event("exception", attributes, timestamp=when)


def _headline(error: BaseException, limit: int) -> str:
    """``type: message`` as a traceback ends, the message cut to ``limit`` (none at 0)."""
    name = _qualname(error)
    message = _message(error) if limit > 0 else ""
    return f"{name}: {span_attributes.clip(message, limit)}" if message else name


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not cost the request its spans
        return "<str() failed>"


def _stacktrace(error: BaseException, limit: int) -> str:
    """What ``traceback.format_exception`` prints, but each message through :func:`_headline`
    (the frames name code, never values; notes and exception groups' members are left out)."""
    text = ""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < MAX_CHAINED:
        seen.add(id(current))
        frames = traceback.format_tb(current.__traceback__, -MAX_FRAMES)
        head = "Traceback (most recent call last):\n" + "".join(frames) if frames else ""
        text = head + _headline(current, limit) + "\n" + text
        if current.__cause__ is not None:
            current = current.__cause__
            text = _CAUSED + text
        elif current.__context__ is not None and not current.__suppress_context__:
            current = current.__context__
            text = _DURING + text
        else:
            current = None
    return text


def _events(led: Ledger, offset: int) -> tuple[Event, ...]:
    if not led.blocked:
        return ()
    return tuple(
        Event(semconv.EVENT_BLOCKED, {
            semconv.BLOCKED_AT: blocked_at,
            semconv.EVENT_BLOCKED_MS: held_ms,
            semconv.EVENT_STACK: stack,
        }, timestamp=when + offset)  # fmt: skip
        for when, held_ms, blocked_at, stack in led.blocked
    )
