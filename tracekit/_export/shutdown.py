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
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

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
    """Run ``call`` on a runner thread and wait for it until ``deadline`` at most (a stuck
    export holds that thread, never the caller). True when it returned in time and not False."""
    if getattr(_on_runner, "active", False):
        # Nested (a processor's flush inside the runtime's): the outer caller's wait bounds it.
        return _attempt(call, what) is not False
    runner = _Runner.take()
    if runner is None:  # every runner is stuck and no thread can start (interpreter exit)
        return False
    done = threading.Event()
    result: list[object] = []

    def run() -> None:
        result.append(_attempt(call, what))
        done.set()

    runner.calls.put(run)
    done.wait(max(0.0, deadline - time.monotonic()))
    return bool(result) and result[0] is not False


def _attempt(call: Callable[[], object], what: str) -> object:
    try:
        return call()
    except Exception:
        internal_error(what)
        return False


_on_runner = threading.local()


class _Runner:
    """A daemon thread that runs bounded calls one at a time and waits, idle, for the next.
    Python 3.12 refuses to start a thread once the interpreter is exiting, where the atexit
    flush needs one most: an idle runner started before (:func:`register_exit`) takes it. A
    call that outlives its wait keeps its runner; the next call takes another."""

    _idle: ClassVar[list[_Runner]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tracekit-flush", daemon=True).start()

    @classmethod
    def take(cls) -> _Runner | None:
        """An idle runner, or a new one; None when neither is to be had."""
        with cls._lock:
            if cls._idle:
                return cls._idle.pop()
        try:
            return cls()
        except RuntimeError:  # "can't create new thread at interpreter shutdown" (3.12)
            return None

    @classmethod
    def keep_one(cls) -> None:
        """Start an idle runner if there is none, while threads can still start."""
        with cls._lock:
            if cls._idle:
                return
        runner = cls()
        with cls._lock:
            cls._idle.append(runner)

    @classmethod
    def after_fork(cls) -> None:
        """In a forked child: the parent's runners are not running here (only the thread that
        forked is); start the child's own."""
        cls._lock = threading.Lock()
        had = bool(cls._idle)
        cls._idle = []
        if had:
            try:
                cls.keep_one()
            except Exception:
                internal_error("flush thread after fork")

    def _serve(self) -> None:
        _on_runner.active = True
        while True:
            self.calls.get()()
            with self._lock:
                self._idle.append(self)


os.register_at_fork(after_in_child=_Runner.after_fork)


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
    _Runner.keep_one()  # for the exit hooks, where Python 3.12 starts no thread


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
