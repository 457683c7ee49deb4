"""The bounded flush when the server stops and at exit (issue 11).

Left to the SDK, an exit waits for the export up to 30 s (its provider's atexit shutdown waits
that long for the batch processor, a timeout nobody can set), while the processor exports what
is queued batch by batch: a collector refusing connections holds each batch for its retries,
one that accepts and never answers for ``OTEL_EXPORTER_OTLP_TIMEOUT``. And uvicorn ends the
process by re-raising SIGTERM once it has stopped: atexit handlers never run, and the spans
still queued would be lost, silently. So tracekit flushes when the server stops (the ASGI
lifespan shutdown: :func:`lifespan_send`) and again at exit; each step waits at most
``shutdown_timeout_ms``, and once one has given up (the collector did not take the spans in
time), the later ones do not wait again. What was never exported is counted and logged once.

This module knows the runtimes only as what they register here (:data:`runtimes`): it imports
neither the SDK nor :mod:`tracekit._export.tracing`.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from tracekit._core.failsafe import internal_error, logger

# Kubernetes gives a pod 30 s between SIGTERM and SIGKILL, shared with the preStop hook and
# the server's own drain of in-flight requests (LLM streams run for tens of seconds): tracing
# gets a small, fixed slice of it. A reachable collector takes a full queue (2048 spans) in
# well under a second; 5 s is also half the OTLP exporter's own per-export timeout, so one
# stuck export cannot take the whole grace period.
DEFAULT_SHUTDOWN_TIMEOUT_MS = 5000.0
shutdown_timeout_ms: float = DEFAULT_SHUTDOWN_TIMEOUT_MS  # configure(shutdown_timeout_ms=...)
_gave_up = False  # a shutdown step ran out of time; reset when a server starts
_reported = 0  # spans (and requests) not exported, as last logged
# tracekit's export processors (tracekit._export.batch), which count what they never exported
exports: weakref.WeakSet[Any] = weakref.WeakSet()
# Every tracing runtime (tracekit._export.tracing.Runtime registers itself).
runtimes: weakref.WeakSet[Any] = weakref.WeakSet()


def deadline() -> float:
    """When a shutdown step starting now must stop waiting (``time.monotonic()``)."""
    return time.monotonic() + (0.0 if _gave_up else shutdown_timeout_ms / 1000)


def bounded(call: Callable[[], object], deadline: float, what: str) -> bool:
    """Run ``call`` on a daemon thread and wait for it until ``deadline`` at most (a stuck
    export holds that thread, never the caller). True when it returned in time and not False."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception:
            result.append(False)
            internal_error(what)

    thread = threading.Thread(target=run, name="tracekit-flush", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    return bool(result) and result[0] is not False


def lifespan_send(send: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap an ASGI lifespan ``send``: flush before the server hears that shutdown is
    complete (uvicorn may kill the process right after), within the shutdown timeout."""

    async def watched(message: Any) -> None:
        global _gave_up
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "lifespan.startup.complete":
            _gave_up = False  # a server starts: its shutdown gets the whole timeout again
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            try:
                flush_for_shutdown()
            except Exception:
                internal_error("shutdown flush")
        await send(message)

    return watched


def flush_for_shutdown(stop: bool = False) -> None:
    """One shutdown step: build and export everything queued, waiting at most the shutdown
    timeout (blocking: the server is stopping), then log what was never exported (once);
    ``stop``: the process exits, stop the runtimes too."""
    global _gave_up
    started = time.monotonic()
    until = deadline()
    for runtime in list(runtimes):
        runtime.expire_lingering(everything=True)  # requests still waiting for stages they spawned
        if not runtime.flush(ms_left(until)):
            _gave_up = True  # later steps (at exit: the SDK provider's shutdown) do not wait
        if stop:
            runtime.shutdown(until)
    report_unexported(time.monotonic() - started)


def register_exit() -> None:
    """(Re-)register the exit hook, last: atexit runs the last registered first, and the
    hook must run before the SDK provider's own, whose processors take what it drains."""
    atexit.unregister(_exit)
    atexit.register(_exit)


def _exit() -> None:
    flush_for_shutdown(stop=True)


def report_unexported(waited_s: float) -> None:
    """Log how many spans never reached the exporter (failed, dropped from a full queue, or
    still queued when shutdown gave up), and requests never traced; once for each new loss."""
    global _reported
    spans = sum(processor.unexported() for processor in list(exports))
    requests = sum(runtime.dropped for runtime in list(runtimes))
    if spans + requests <= _reported:
        return
    _reported = spans + requests
    total = sum(processor.received for processor in list(exports))
    untraced = f" and {requests} requests were not traced" if requests else ""
    logger.warning(
        "tracekit: %d of %d spans were never exported (collector unreachable or too slow, or "
        "the export queue full)%s; shutdown waited %.1f s (limit: shutdown_timeout_ms / "
        "TRACEKIT_SHUTDOWN_TIMEOUT_MS = %g ms)",
        spans, total, untraced, waited_s, shutdown_timeout_ms)  # fmt: skip


def ms_left(deadline: float) -> float:
    return max(0.0, (deadline - time.monotonic()) * 1000)
