"""``TracekitMiddleware``: one SERVER span per HTTP request, with full attribution.

Pure ASGI (never ``BaseHTTPMiddleware``): lifespan and websocket scopes pass through in the
first lines (at lifespan shutdown tracekit first exports its spans, within the shutdown
timeout); per-request state lives in locals and closures, never on ``self``. The app's
coroutine is driven step by step (:mod:`tracekit._core.driver`), so the request's own code (the
handler, the framework) is accounted like a stage; ``send`` is watched for TTFB, TTFT,
inter-chunk latency and the last byte, which ends the span (DESIGN §1).

If a server span is already active (the OpenTelemetry ASGI/FastAPI instrumentation wraps
this middleware, or FastAPI's native telemetry), tracekit adds its attributes to that span and
parents its stages to it instead of making a second server span. A TracekitMiddleware inside
another one (added twice) passes requests through: the outer one records them.

Wrapping a FastAPI app that has native telemetry (0.165+) from outside puts tracekit inside
its middleware stack instead, as ``app.add_middleware(TracekitMiddleware)`` does: FastAPI
makes its server span from the request's headers, not from the current context, so from
outside each request would be two traces (docs/composition.md).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

from tracekit._core import asgi, current
from tracekit._core.driver import Stepped
from tracekit._core.failsafe import internal_error, logger
from tracekit._core.ledger import Ledger
from tracekit._core.request_record import Request
from tracekit._export import shutdown, tracing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
MAX_GAPS = asgi.MAX_GAPS  # inter-chunk gaps kept per request (docs/attributes.md)


class TracekitMiddleware:
    """Trace every HTTP request of ``app`` (see the module docstring).

    Args:
        app: the ASGI application to wrap.
        service_name: used when tracekit has to configure tracing itself (nothing configured
            yet when the first request arrives): ``tracekit.configure(service_name=...)``.
        tracer_provider: an SDK ``TracerProvider`` to send spans to (default: the runtime
            set by ``tracekit.configure()``, else the global provider if it is an SDK one).

    Cost per request (docs/performance.md): a few tens of µs when sampled, about 20 µs when
    not (with four stages: the trace context is still read and propagated).
    """

    def __init__(self, app: ASGIApp, *, service_name: str | None = None,
                 tracer_provider: Any = None) -> None:  # fmt: skip
        self.app = app
        self.service_name = service_name
        self._provider = tracer_provider
        self._runtime: tracing.Runtime | None = None
        self._inflight = 0  # a gauge shared by all requests on purpose (tracekit.inflight)
        self._inside = _move_inside(app, service_name, tracer_provider)  # then only forwards

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._inside or scope["type"] != "http":
            # The server stops: export first (bounded: _export.shutdown); inside, the inner one does.
            if scope["type"] == "lifespan" and not self._inside:
                send = shutdown.lifespan_send(send)
                asgi.watch_loop()  # the tasks the application starts now are named background
            await self.app(scope, receive, send)
            return
        if _traced_already():  # another TracekitMiddleware outside this one records it
            await self.app(scope, receive, send)
            return
        runtime = self._runtime  # set only when given its own tracer_provider
        if runtime is None:
            runtime = current.active_runtime if self._provider is None else None
            if runtime is None:
                runtime = self._resolve_runtime()
        if runtime is None or not runtime.enabled:
            await self.app(scope, receive, send)
            return
        request = asgi.begin(runtime, scope)
        if not isinstance(request, Request):  # not sampled: propagate ids, record nothing
            tokens = asgi.unsampled(request)
            try:
                await self.app(scope, receive, send)
            finally:
                asgi.unbind(tokens)
            return
        bound = asgi.enter(request)
        if bound is None:  # tracekit could not bind the request (logged): run it untraced
            await self.app(scope, receive, send)
            return
        self._inflight += 1
        request.inflight = self._inflight

        async def watched_send(message: Message) -> None:
            kind = message["type"]
            try:
                if kind == "http.response.body":
                    last = asgi.body(request, message)
                    await send(message)
                    if last:
                        asgi.body_sent(request)
                    return
                if kind == "http.response.start":
                    asgi.response_start(request, message)
                await send(message)
                # A file the server sends itself (ASGI extensions): the body, or its last part.
                if kind == "http.response.pathsend" or (
                        kind == "http.response.zerocopysend" and not message.get("more_body")):
                    asgi.body_sent(request)
            except OSError:  # ASGI 2.4: the client has gone (the server's ClientDisconnected)
                asgi.disconnected(request)
                raise

        try:
            await Stepped(self.app(scope, receive, watched_send), cast(Ledger, request.root))
        except BaseException as exc:
            asgi.failed(request, exc)
            raise
        finally:
            self._inflight -= 1
            asgi.leave(request, bound)

    def _resolve_runtime(self) -> tracing.Runtime | None:
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


def _traced_already() -> bool:
    """Whether a TracekitMiddleware further out is recording this request (added twice, or
    around a mounted app that has its own): then this one passes it through, said once.

    Not a request that has answered already: uvicorn re-arms a paused connection's reader
    inside the request reading its body (CPython issue 140947), so the next request on the
    connection starts in that request's context. Read as nested, that request joined the
    previous one's trace, and so did the next, as long as one's work outlived its response
    (a new user's sync endpoints with background work: 56 of 123 guardrail spans of another
    route in their traces). :func:`tracekit._core.spawned.create` reads such a context so."""
    led = current.get_ledger()
    if led is None or led.request is None or led.request.pending <= 0 or led.request.end:
        return False
    global _nested_said
    if not _nested_said:
        _nested_said = True
        logger.warning(
            "tracekit: a TracekitMiddleware runs inside another one (added twice?); the outer "
            "one records each request, the inner one passes it through"
        )
    return True


_nested_said = False


def _move_inside(app: Any, service_name: str | None, tracer_provider: Any) -> bool:
    """Add a TracekitMiddleware to ``app``'s own middleware stack if ``app`` is a FastAPI app
    with native telemetry that has not started (see the module docstring); returns whether
    it did. Added last, it is the outermost of the app's middleware."""
    fastapi = sys.modules.get("fastapi")
    if fastapi is None or not isinstance(app, fastapi.FastAPI) or not hasattr(app, "_native_telemetry"):
        return False
    try:
        app.add_middleware(TracekitMiddleware, service_name=service_name, tracer_provider=tracer_provider)
    except RuntimeError:  # it has started: stay outside, and say what that costs
        logger.warning(
            "tracekit: TracekitMiddleware wraps a FastAPI app that has already started; with "
            "FastAPI's native telemetry on, each request will be two traces. Add it before the "
            "first request, or with app.add_middleware(TracekitMiddleware)"
        )
        return False
    return True
