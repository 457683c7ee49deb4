"""The spans of another instrumentation, in a request whose server span tracekit enriches.

When a server span is already active as a request starts (FastAPI's native telemetry, the
OpenTelemetry ASGI or FastAPI instrumentation), tracekit adds its request attributes to that
span and parents its stages to it (:func:`tracekit._core.asgi.begin`). That span, and the
framework's own spans under it (``fastapi.dependencies``, ``fastapi.endpoint``,
``fastapi.serialization``, the ASGI instrumentation's ``http send``), are made and ended by
the other instrumentation's tracer: they reach the span processors of *its* tracer provider
only. Without more, ``tracekit.record()`` and an exporter given to ``configure()`` for
tracekit's spans only would get the stages without their request (docs/composition.md).

So tracekit adds one :class:`ForeignSpans` processor to that provider's processor chain (once
per chain; the application's processors are left as they are). For each span that ends in a
trace a tracekit request is enriching, it queues the span for the runtime's span-building
thread (a dict lookup and a deque append on the thread that ended the span), which hands it
to the active recordings and to those of tracekit's span processors that the chain does not
already hold (:func:`targets`): each span reaches each destination once, and a slow or
broken exporter never runs on the request's thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Any, Final

from opentelemetry.sdk.trace import SpanProcessor

from tracekit import semconv
from tracekit._core.failsafe import logger
from tracekit._export import sdk

# Traces being enriched: trace id -> (the runtime of the request, the enriched span's id).
# An entry goes GRACE_S after the enriched span ends (spans of the trace that end just after
# it, such as the ASGI instrumentation's "http receive" of the client's disconnect, still
# come); one whose span never ends (a server span of an instrumentation that crashed) is
# pushed out, oldest first, past MAX_TRACES.
MAX_TRACES: Final = 16_384
GRACE_S: Final = 1.0
enriched: dict[int, tuple[Any, int]] = {}
# (when to forget it, trace id, enriched span id) of the traces whose enriched span ended.
_ended: deque[tuple[float, int, int]] = deque()
_hook_lock = threading.Lock()
_said: set[str] = set()  # instrumentation scopes already named in the log (once each)
# The processor chains of the tracer providers tracekit.configure() made and installed.
configured_chains: weakref.WeakSet[Any] = weakref.WeakSet()


class ForeignSpans(SpanProcessor):
    """Queues the spans ending in an enriched trace for tracekit's destinations.

    Added by :func:`adopt` to the processor chain of the provider whose span tracekit
    enriches; ``chain`` is that chain (its processors already receive these spans).
    """

    def __init__(self, chain: Any) -> None:
        self.chain = chain

    def on_end(self, span: Any) -> None:
        context = span.context
        entry = enriched.get(context.trace_id)
        if entry is None:
            return
        scope = span.instrumentation_scope
        if scope is not None and scope.name == semconv.SCOPE_NAME:
            return  # tracekit's own spans: its runtime delivers them
        runtime, span_id = entry
        if context.span_id == span_id:  # the enriched span: the request is over
            _ended.append((time.monotonic() + GRACE_S, context.trace_id, span_id))
        runtime.foreign(span, self.chain)


def adopt(runtime: Any, span: Any) -> None:
    """A request of ``runtime`` enriches ``span``: have the rest of its trace reach tracekit.

    Cost on the request path: an identity check and a dict store (the hook is added once
    per chain; ``runtime.composed`` remembers the last chain seen).
    """
    chain = sdk.span_processor_of(span)
    if chain is None:  # not an SDK span: nothing tracekit can observe
        return
    if chain is not runtime.composed:
        if not _hook(chain):
            return
        runtime.composed = chain
        _say(span, chain)
    context = span.get_span_context()
    _forget_ended()
    if len(enriched) >= MAX_TRACES:
        try:
            del enriched[next(iter(enriched))]
        except (StopIteration, KeyError, RuntimeError):  # emptied or changed meanwhile
            pass
    enriched[context.trace_id] = (runtime, context.span_id)


def _forget_ended() -> None:
    """Drop the traces whose enriched span ended more than GRACE_S ago (unless a newer
    request of the same trace enriches a span of its own meanwhile)."""
    if not _ended:  # the common case under no load: no clock read
        return
    now = time.monotonic()
    while _ended and _ended[0][0] <= now:
        try:
            _, trace_id, span_id = _ended.popleft()
        except IndexError:  # emptied meanwhile
            return
        entry = enriched.get(trace_id)
        if entry is not None and entry[1] == span_id:
            enriched.pop(trace_id, None)


def _hook(chain: Any) -> bool:
    """Add a :class:`ForeignSpans` to ``chain`` unless it has one; False: it cannot take one."""
    with _hook_lock:
        if any(isinstance(p, ForeignSpans) for p in sdk.processors(chain, sdk.sync_multi_type())):
            return True
        add = getattr(chain, "add_span_processor", None)
        if add is None:
            return False
        add(ForeignSpans(chain))
        return True


def _say(span: Any, chain: Any) -> None:
    """Say once per instrumentation that its server spans are the ones tracekit enriches.

    FastAPI's native telemetry turns itself on when a global tracer provider exists: when
    that provider is the one ``tracekit.configure()`` installed, turning it on was tracekit's
    side effect, and it costs the app more per request than tracekit does (docs/composition.md):
    a warning, with the way to turn it off. Otherwise the app chose it: an info line.
    """
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", None) or "another instrumentation"
    if name in _said:
        return
    _said.add(name)
    if name == "fastapi" and chain in configured_chains:
        logger.warning(
            "tracekit: FastAPI's native telemetry is on because tracekit.configure() installed "
            "a global tracer provider; tracekit adds its attributes to FastAPI's server spans and "
            "records FastAPI's spans in the same trace. FastAPI(telemetry={'tracing': False}) "
            "leaves the server span to tracekit and saves FastAPI's own cost per request "
            "(docs/composition.md)")  # fmt: skip
    else:
        logger.info("tracekit: the server spans are made by %s; tracekit adds its attributes "
                    "to them and records the whole trace (docs/composition.md)", name)  # fmt: skip


def targets(processor: Any, chain: Any) -> list[Any]:
    """The span processors of a runtime (``processor``) that a span ended in ``chain`` has
    not reached: each of them, its fan-out unwrapped, unless ``chain`` holds it."""
    if processor is None:
        return []
    from tracekit.config import _FanOut

    multi = sdk.sync_multi_type()
    reached = {id(chain)} | {id(p) for p in sdk.processors(chain, multi)}
    out: list[Any] = []
    for outer in sdk.processors(processor, multi):
        for member in (outer.processors if isinstance(outer, _FanOut) else (outer,)):
            for leaf in sdk.processors(member, multi):
                if id(leaf) not in reached and not isinstance(leaf, ForeignSpans):
                    reached.add(id(leaf))
                    out.append(leaf)
    return out


def forget(runtime: Any) -> None:
    """``runtime`` is shut down: its traces are no longer forwarded."""
    for trace_id, (owner, _) in list(enriched.items()):
        if owner is runtime:
            enriched.pop(trace_id, None)
