"""``tracekit.record()``: capture tracekit's spans in memory, for tests and the demo."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from tracekit._core import current
from tracekit._export import tracing


class Recording:
    """Spans recorded while the ``with tracekit.record() as rec:`` block is open.

    While any recording is open every request is recorded (sampling is bypassed), by every
    middleware, including one given its own ``tracer_provider``. If nothing is configured,
    spans go only here; if tracing is configured, they go there as well.
    """

    def __init__(self) -> None:
        self._spans: list[Any] = []
        self._lock = threading.Lock()
        self._runtime: tracing.Runtime | None = None
        self._created = False

    def __enter__(self) -> Recording:
        runtime = current.active_runtime
        if runtime is None:
            from opentelemetry.sdk.resources import Resource

            from tracekit._core.watchdog import Watchdog
            from tracekit.config import _threshold

            threshold = _threshold(None)
            runtime = tracing.Runtime(None, Resource.create({}), None, threshold)
            runtime.watchdog = Watchdog(threshold)
            tracing.install(runtime)
            self._created = True
        tracing.recorders.append(self._collect)
        self._runtime = runtime
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        runtime = self._runtime
        if runtime is None:
            return
        tracing.build_all()
        tracing.recorders.remove(self._collect)
        if self._created and current.active_runtime is runtime:
            tracing.install(None)
            runtime.shutdown()
        self._runtime = None

    def _collect(self, spans: list[Any]) -> None:
        with self._lock:
            self._spans.extend(spans)

    @property
    def spans(self) -> list[Any]:
        """Every span recorded so far (SDK ``ReadableSpan`` objects), oldest first."""
        if self._runtime is not None:
            tracing.build_all()
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans recorded so far."""
        if self._runtime is not None:
            tracing.build_all()
        with self._lock:
            self._spans.clear()

    def settle(self, timeout_s: float = 5.0) -> bool:
        """Wait until every traced request that has begun is recorded: none still running on
        an event loop, none waiting for tasks it spawned (a server in another thread answers
        the client before it hands the request on).

        Args:
            timeout_s: the longest wait (a request that never ends would hold it forever).

        Returns:
            ``True`` when nothing was left running within ``timeout_s``.

        Cost: a poll every 5 ms while requests run.
        """
        from tracekit._core.loop_view import live_views
        from tracekit._export import shutdown

        deadline = time.monotonic() + timeout_s
        while True:
            # A loop's count drops just before its request is queued (tracekit._core.asgi.leave):
            # the sleep lets that thread finish the few steps between.
            time.sleep(0.005)
            running = any(view.inflight > 0 for view in live_views())
            waiting = any(runtime.has_lingering() for runtime in list(shutdown.runtimes))
            if not (running or waiting) or time.monotonic() > deadline:
                return not (running or waiting)

    def report(self, **options: Any) -> Any:
        """``tracekit.analyze(self.spans, **options)``: the analyzer's report of this recording."""
        from tracekit.analysis.api import analyze

        return analyze(self.spans, **options)


def record() -> Recording:
    """Capture spans in memory: ``with tracekit.record() as rec: ...; rec.spans``.

    Returns:
        A :class:`Recording` (a context manager).
    """
    return Recording()
