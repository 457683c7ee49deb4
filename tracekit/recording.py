"""``tracekit.record()``: capture tracekit's spans in memory, for tests and the demo."""

from __future__ import annotations

import threading
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
        tracing.flush_all()
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
            tracing.flush_all()
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans recorded so far."""
        if self._runtime is not None:
            tracing.flush_all()
        with self._lock:
            self._spans.clear()

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
