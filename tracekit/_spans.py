"""Builds OpenTelemetry SDK ``ReadableSpan`` objects from a finished request record.

Runs on the span-building thread (see :mod:`tracekit._runtime`), never on the request path.
This module imports the SDK; the core imports it only once something is recorded.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE, TraceState

from tracekit import _clock, _summary, semconv
from tracekit._accounting import REQUEST, Ledger
from tracekit._request import Request

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_OK: Final = Status(StatusCode.UNSET)
_INTERNAL: Final = SpanKind.INTERNAL
_SERVER: Final = SpanKind.SERVER
_tuple_new: Final = tuple.__new__
# exception.stacktrace: characters kept (its end: the innermost frames and the message), frames
# kept per exception (the innermost), exceptions kept of a __cause__/__context__ chain.
MAX_STACKTRACE: Final = 8192
MAX_FRAMES: Final = 64
MAX_CHAINED: Final = 8
_CAUSED: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _new_context(trace_id: int, span_id: int, trace_state: TraceState | None,
                 valid: bool) -> SpanContext:  # fmt: skip
    """``SpanContext(trace_id, span_id, False, SAMPLED, trace_state)``, built directly.

    ``SpanContext`` is a tuple whose ``__new__`` (Python) only fills defaults and checks the
    ids; span building makes one per span, and that call was a tenth of its cost. The tuple
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
    privacy = getattr(request.runtime, "privacy", None) or _summary.DEFAULT_PRIVACY
    limit = privacy.message_limit
    trace_id, trace_state = request.trace_id, request.trace_state
    parts = _summary.ledger_parts(request, end)
    offset = _clock.epoch_ns(0)
    request_context = span_context(trace_id, request.span_id, trace_state)
    remote_parent = None
    if request.parent_span_id:
        remote_parent = SpanContext(trace_id, request.parent_span_id, request.remote_parent,
                                    _SAMPLED, trace_state)  # fmt: skip
    # Span ids are made non-zero and 64-bit (_request.new_span_id): only the trace id, which
    # may come from a traceparent, decides whether a stage's context is valid.
    valid = ids_valid(trace_id, 1)
    open_at = _summary.open_end(request, end)
    contexts: dict[Ledger, SpanContext] = {}  # ledger -> its span context, parents first
    spans = []
    ledgers = request.ledgers
    for i in range(len(parts)):  # the ledgers split (a stage opened late is not built)
        led = ledgers[i]
        if led.site is REQUEST:
            contexts[led] = request_context
            continue
        wall, children, wait, loop_wait = parts[i]
        context = contexts[led] = span_context(trace_id, led.span_id, trace_state, valid)
        parent = contexts.get(led.parent) if led.parent is not None else remote_parent
        spans.append(_span(
            led.site.name, context, parent, resource,
            _summary.stage_attributes(led, wall, children, wait, loop_wait),
            _events(led, offset) if led.blocked else (), _INTERNAL,
            _status(led.error, limit) if led.error is not None else _OK,
            led.start + offset, _summary.ledger_end(led, open_at) + offset, scope,
        ))  # fmt: skip
    if request.server:
        spans.append(_server_span(request, resource, scope, end, offset, request_context,
                                  remote_parent, parts, privacy))  # fmt: skip
    return spans


def _span(name: str, context: SpanContext, parent: SpanContext | None, resource: Any,
          attributes: dict[str, Any], events: Sequence[Event], kind: SpanKind, status: Status,
          start: int, end: int, scope: InstrumentationScope) -> ReadableSpan:  # fmt: skip
    # Positional, in the order of ReadableSpan.__init__'s parameters: passing eleven keyword
    # arguments builds a dict per call, a measurable share of span building (tests check
    # every field of the spans built here).
    return ReadableSpan(name, context, parent, resource, attributes, events, (), kind, None,
                        status, start, end, scope)  # fmt: skip


def _server_span(request: Request, resource: Any, scope: InstrumentationScope, end: int,
                 offset: int, context: SpanContext, parent: SpanContext | None,
                 parts: list[tuple[int, int, int, int]],
                 privacy: _summary.Privacy) -> ReadableSpan:  # fmt: skip
    name, attrs = _summary.http_attributes(request, privacy)
    _summary.request_attributes(request, parts, attrs)
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
    return _span(name, context, parent, resource, attrs, events, _SERVER, status,
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
        attributes["exception.message"] = _summary.clip(_message(error), limit)
    attributes["exception.stacktrace"] = _stacktrace(error, limit)[-MAX_STACKTRACE:]
    return Event("exception", attributes, timestamp=when)


def _headline(error: BaseException, limit: int) -> str:
    """``type: message`` as a traceback ends, the message cut to ``limit`` (none at 0)."""
    name = _qualname(error)
    message = _message(error) if limit > 0 else ""
    return f"{name}: {_summary.clip(message, limit)}" if message else name


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
