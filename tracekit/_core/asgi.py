"""The per-request bookkeeping behind :class:`tracekit.TracekitMiddleware`.

The middleware stays a thin ASGI class (servers inspect it: it must be a real coroutine
function); everything it does per request and per message lives here: the request record
and its sampling decision, the W3C ``traceparent``, the send watching (TTFB, TTFT,
inter-chunk gaps, the last byte), and handing the finished record to the runtime.

Every function that runs inside a request is guarded: a bookkeeping failure is logged once
and the request goes on (:func:`tracekit._core.failsafe.internal_error`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import MutableMapping
from contextvars import Token
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanContext, TraceFlags

from tracekit._core import active_span, clock, event_loop, ledger, loop_view, spawned
from tracekit._core.current import reset_ledger, set_ledger
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import REQUEST, Ledger, Site
from tracekit._core.request_record import Request, new_span_id, new_trace_id

MAX_GAPS: Final = 4096  # inter-chunk gaps kept per request; beyond, a uniform reservoir sample
UNSAMPLED: Final = Ledger(Site("unsampled", "request"), None, None, 0)  # marks "inside a dropped request"

_randrange: Final = random.randrange
_get_running_loop: Final = asyncio._get_running_loop
_current_task: Final = asyncio.current_task


def begin(runtime: Any, scope: MutableMapping[str, Any]) -> Request | SpanContext | None:
    """A request record for ``scope``; when the sampler drops it, the parent (or None)."""
    try:
        active = otel_trace.get_current_span()
        active_context = active.get_span_context()
        enrich = active if active.is_recording() and active_context.is_valid else None
        if enrich is not None:
            parent: SpanContext | None = active_context
        else:
            parent = traceparent(scope)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        if not runtime.sample(trace_id, parent, scope.get("method", "")):
            return parent
        request = Request(runtime, trace_id,
                          parent.span_id if parent is not None and enrich is None else None,
                          parent is not None and parent.is_remote,
                          parent.trace_state if parent is not None else None,
                          server=enrich is None)  # fmt: skip
        if enrich is not None:
            request.enrich = enrich
            request.span_id = active_context.span_id
            # Its provider's spans of this trace (the span itself, the framework's) are to
            # reach tracekit's recordings and exporters too (tracekit._export.composition).
            runtime.compose(enrich)
        # Frameworks add the matched route to the scope later: keep the same dict.
        request.scope = scope if type(scope) is dict else dict(scope)
        root_path = scope.get("root_path", "")
        request.root_path = root_path if isinstance(root_path, str) else ""
        root = Ledger(REQUEST, request, None, request.span_id)
        request.root = root
        request.start = root.start
        return request
    except Exception:
        internal_error("request start")
        return None


def enter(request: Request) -> tuple[Token[Ledger | None], object] | None:
    """Bind the request as the current one (its root ledger and OpenTelemetry context), have
    the watchdog watch this loop thread and the loop's view count the request (the first
    time on a loop: its view, and the task factory that makes the tasks a request spawns
    its own, :mod:`tracekit._core.spawned`); returns what :func:`leave` unbinds (None: it
    could not, logged)."""
    try:
        state = event_loop.thread_state()
        watchdog = request.runtime.watchdog
        if state.watched is not watchdog and watchdog is not None:
            watchdog.watch(state)
        loop = _get_running_loop()
        if loop is not None:
            created = spawned.created_at(_current_task(loop))
            if created:  # the server made this request's task then: it waited since
                request.start_wait = request.start - created
            view = state.view
            if view is None or view.loop is not loop:
                view = loop_view.view_for(loop, state)
            if not view.factory:
                view.factory = spawned.install(loop)
            view.request_started()
            request.view = view
        return (set_ledger(request.root),
                otel_context.attach(active_span.request_context(request)))  # fmt: skip
    except Exception:
        internal_error("request start")
        return None


def watch_loop() -> None:
    """The server starts (the lifespan scope): tracekit's task factory from now on, so that
    the tasks the application starts in its lifespan are the loop's named background work
    (:mod:`tracekit._core.spawned`; timed once the loop's view exists, from the first traced
    request), not tasks made before tracekit saw the loop."""
    try:
        loop = _get_running_loop()
        if loop is not None:
            spawned.install(loop)
    except Exception:
        internal_error("lifespan")


def failed(request: Request, error: BaseException) -> None:
    """The application raised ``error`` (or was cancelled): it goes on the request span,
    unless the client had gone (a send failing, then the app failing because of it)."""
    if request.cancelled:
        return
    request.error = error
    request.cancelled = isinstance(error, asyncio.CancelledError)


def disconnected(request: Request) -> None:
    """The client went away before the response was complete: the request was cancelled
    (``tracekit.cancelled``; not an error of the application's)."""
    request.cancelled = True
    request.error = None


def leave(request: Request, tokens: tuple[Token[Ledger | None], object]) -> None:
    """The application returned or failed: unbind, close the root, hand the record on.

    A response begun but never finished means the client disconnected: servers speaking ASGI
    before 2.4 (uvicorn) drop the sends then, and Starlette cancels a streamed body when it
    receives ``http.disconnect``, so the app returns as if all went well."""
    try:
        otel_context.detach(tokens[1])  # type: ignore[arg-type]
        reset_ledger(tokens[0])
        if request.view is not None:
            request.view.request_ended()
        if request.status and not request.end and request.error is None:
            disconnected(request)
        root = request.root
        last = ledger.close(root) if root is not None else True
        if request.enrich is not None and request.enrich.is_recording():
            enrich(request)
        if last:
            request.runtime.submit(request)
        else:  # stages it spawned are still open: handed on when the last closes
            request.runtime.linger(request)
    except Exception:
        internal_error("request finish")


def response_start(request: Request, message: MutableMapping[str, Any]) -> None:
    """``http.response.start`` is being sent: the status and the time to first byte."""
    try:
        status = message.get("status", 0)
        request.status = status if type(status) is int else 0
        request.ttfb = clock.wall_ns()
    except Exception:
        internal_error("send watch")


def body(request: Request, message: MutableMapping[str, Any]) -> bool:
    """An ``http.response.body`` message is being sent: count a non-empty chunk; returns
    whether it is the last (the server span is enriched before that one leaves)."""
    try:
        if message.get("body"):
            _chunk(request)
        last = not message.get("more_body", False)
        if last and request.enrich is not None:
            enrich(request)  # before the outer instrumentation ends its span on this send
        return last
    except Exception:
        internal_error("send watch")
        return False


def body_sent(request: Request) -> None:
    """The last body message left: the request span ends now. The step under way is booked
    up to here: what the request's code does after it (the rest of this step, background
    tasks) is after the span (:func:`tracekit._core.ledger.answered`)."""
    try:
        request.end = clock.wall_ns()
        ledger.book_open_steps(event_loop.thread_state(), request)
        spawned.fold_open(request)
    except Exception:
        internal_error("send watch")


def _chunk(request: Request) -> None:
    now = clock.wall_ns()
    if request.chunks:
        gap = now - request.chunk_last
        gaps = request.gaps
        if gaps is None:
            gaps = request.gaps = []
        if len(gaps) < MAX_GAPS:
            gaps.append(gap)
        else:  # very long streams: memory stays bounded, percentiles stay unbiased
            slot = _randrange(request.chunks)  # request.chunks - 1 gaps seen before this one
            if slot < MAX_GAPS:
                gaps[slot] = gap
        if gap > request.gap_max:
            request.gap_max = gap
    else:
        request.chunk_first = now
    request.chunk_last = now
    request.chunks += 1


def enrich(request: Request) -> None:
    """Put the request-level attributes on the server span another instrumentation made."""
    from tracekit._export import span_attributes

    try:
        # The span ends on this send, inside the request's step: its CPU so far is booked
        # first (else a request answered in one step would show no CPU at all).
        ledger.book_open_steps(event_loop.thread_state(), request)
        if request.end == 0:
            request.end = clock.wall_ns()  # provisional: the span ends with this send
        spawned.fold_open(request)
        attrs = span_attributes.request_attributes(request)
        attrs.update(request.runtime.host_cpus)  # the span's resource is not tracekit's
        request.enrich.set_attributes(attrs)
    except Exception:
        internal_error("enrich server span")


def unsampled(parent: SpanContext | None) -> tuple[Token[Ledger | None], object]:
    """Bind a request the sampler dropped: ids still propagate, flagged not sampled."""
    trace_id = parent.trace_id if parent is not None else new_trace_id()
    context = active_span.unsampled_context(
        trace_id, new_span_id(), parent.trace_state if parent is not None else None)  # fmt: skip
    return set_ledger(UNSAMPLED), otel_context.attach(context)


def unbind(tokens: tuple[Token[Ledger | None], object]) -> None:
    """Undo :func:`unsampled`."""
    otel_context.detach(tokens[1])  # type: ignore[arg-type]
    reset_ledger(tokens[0])


def traceparent(scope: MutableMapping[str, Any]) -> SpanContext | None:
    """The W3C ``traceparent`` (and ``tracestate``) of the request, if valid."""
    header = state = None
    for key, value in scope.get("headers", ()):
        if key == b"traceparent":
            header = value
        elif key == b"tracestate":
            state = value
    if header is None:
        return None
    parts = header.decode("latin-1").strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if len(trace_hex) != 32 or len(span_hex) != 16 or len(flags_hex) != 2:
        return None
    if version == "00" and len(parts) != 4:
        return None
    try:
        trace_id, span_id, flags = int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    trace_state = None
    if state is not None:
        from opentelemetry.trace.span import TraceState

        trace_state = TraceState.from_header([state.decode("latin-1")])
    return SpanContext(trace_id, span_id, True, TraceFlags(flags & 0xFF), trace_state)
