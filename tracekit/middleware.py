"""``TracekitMiddleware``: one SERVER span per HTTP request, with full attribution.

Pure ASGI (never ``BaseHTTPMiddleware``): lifespan and websocket scopes pass through in the
first lines; per-request state lives in locals and closures, never on ``self``. The app's
coroutine is driven step by step (:mod:`tracekit._steps`), so the request's own code (the
handler, the framework) is accounted like a stage; ``send`` is watched for TTFB, TTFT,
inter-chunk latency and the last byte, which ends the span (DESIGN §1).

If a server span is already active (the OpenTelemetry ASGI/FastAPI instrumentation wraps
this middleware), tracekit adds its attributes to that span and parents its stages to it
instead of making a second server span.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanContext, TraceFlags

from tracekit import _clock, _loop, _runtime
from tracekit._accounting import Ledger, close
from tracekit._context import current_ledger
from tracekit._failsafe import internal_error
from tracekit._request import Request, new_span_id, new_trace_id
from tracekit._steps import Stepped

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_randrange = random.randrange
_UNSAMPLED = Ledger("unsampled", "request", None, None, 0)  # marks "inside a dropped request"


class TracekitMiddleware:
    """Trace every HTTP request of ``app`` (see the module docstring).

    Args:
        app: the ASGI application to wrap.
        service_name: used when tracekit has to configure tracing itself (nothing configured
            yet when the first request arrives): ``tracekit.configure(service_name=...)``.
        tracer_provider: an SDK ``TracerProvider`` to send spans to (default: the runtime
            set by ``tracekit.configure()``, else the global provider if it is an SDK one).

    Cost per request (docs/performance.md): a few tens of µs when sampled, a few µs when not.
    """

    def __init__(self, app: ASGIApp, *, service_name: str | None = None,
                 tracer_provider: Any = None) -> None:  # fmt: skip
        self.app = app
        self.service_name = service_name
        self._provider = tracer_provider
        self._runtime: _runtime.Runtime | None = None
        self._inflight = 0  # a gauge shared by all requests on purpose (tracekit.inflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        runtime = self._runtime  # set only when given its own tracer_provider
        if runtime is None:
            runtime = _runtime.current if self._provider is None else None
            if runtime is None:
                runtime = self._resolve_runtime()
        if runtime is None or not runtime.enabled:
            await self.app(scope, receive, send)
            return
        request = _begin(runtime, scope)
        if not isinstance(request, Request):
            await self._call_unsampled(request, scope, receive, send)
            return
        self._inflight += 1
        request.inflight = self._inflight
        try:
            await self._call_recorded(request, scope, receive, send)
        finally:
            self._inflight -= 1

    async def _call_unsampled(self, parent: SpanContext | None, scope: Scope, receive: Receive,
                              send: Send) -> None:  # fmt: skip
        ledger_token = current_ledger.set(_UNSAMPLED)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        otel_token = otel_context.attach(_runtime.unsampled_context(
            trace_id, new_span_id(), parent.trace_state if parent is not None else None))  # fmt: skip
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(otel_token)
            current_ledger.reset(ledger_token)

    async def _call_recorded(self, request: Request, scope: Scope, receive: Receive, send: Send) -> None:
        root = request.root
        assert root is not None
        ledger_token = current_ledger.set(root)
        otel_token = otel_context.attach(_runtime.request_context(request))
        state = _loop.thread_state()
        watchdog = request.runtime.watchdog
        if state.watched is not watchdog and watchdog is not None:
            watchdog.watch(state)

        async def watched_send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.body":
                if message.get("body"):
                    _chunk(request)
                last = not message.get("more_body", False)
                if last and request.enrich is not None:
                    _enrich(request)  # before the outer instrumentation ends its span on this send
                await send(message)
                if last:
                    request.end = _clock.wall_ns()
                return
            if kind == "http.response.start":
                request.status = message.get("status", 0)
                request.ttfb = _clock.wall_ns()
            await send(message)

        try:
            await Stepped(self.app(scope, receive, watched_send), root)
        except BaseException as exc:
            request.error = exc
            request.cancelled = isinstance(exc, asyncio.CancelledError)
            raise
        finally:
            otel_context.detach(otel_token)
            current_ledger.reset(ledger_token)
            _finish(request)

    def _resolve_runtime(self) -> _runtime.Runtime | None:
        """Nothing configured yet: adopt the given/global SDK provider, or configure()."""
        from tracekit import config

        try:
            runtime = config.runtime_for(self._provider, self.service_name)
        except Exception:
            internal_error("middleware configuration")
            return None
        if self._provider is not None:
            self._runtime = runtime  # its own provider; otherwise follow tracekit.configure()
        return runtime


def _begin(runtime: _runtime.Runtime, scope: Scope) -> Request | SpanContext | None:
    """A request record for ``scope``; when the sampler drops it, the parent (or None)."""
    try:
        active = otel_trace.get_current_span()
        active_context = active.get_span_context()
        enrich = active if active.is_recording() and active_context.is_valid else None
        if enrich is not None:
            parent: SpanContext | None = active_context
        else:
            parent = _traceparent(scope)
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
        request.scope = scope
        request.root_path = scope.get("root_path", "")
        root = Ledger("request", "request", request, None, request.span_id)
        request.root = root
        request.start = root.start
        request.ledgers.append(root)
        return request
    except Exception:
        internal_error("request start")
        return None


MAX_GAPS = 4096  # inter-chunk gaps kept per request; beyond, a uniform reservoir sample


def _chunk(request: Request) -> None:
    now = _clock.wall_ns()
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


def _finish(request: Request) -> None:
    try:
        root = request.root
        if root is not None:
            close(root)
        if request.enrich is not None and request.enrich.is_recording():
            _enrich(request)
        request.runtime.submit(request)
    except Exception:
        internal_error("request finish")


def _enrich(request: Request) -> None:
    """Put the request-level attributes on the server span another instrumentation made."""
    from tracekit import _summary

    try:
        if request.end == 0:
            request.end = _clock.wall_ns()  # provisional: the span ends with this send
        request.enrich.set_attributes(_summary.request_attributes(request))
    except Exception:
        internal_error("enrich server span")


def _traceparent(scope: Scope) -> SpanContext | None:
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

