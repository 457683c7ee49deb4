"""The loop view's windows as spans: one ``tracekit.loop`` span per event loop and window.

A window span is a trace of its own (a root INTERNAL span) whose start and end are the
window's and whose attributes are :meth:`tracekit._core.loop_view.LoopView.window`'s figures
in milliseconds (names in :mod:`tracekit.semconv`, meaning in ``docs/attributes.md``). A
window in which the loop ran no traced request and was busy less than ``MIN_BUSY`` of the
time (or was not running: its thread's CPU was not the loop's) is left out: an idle gateway
exports nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, Status, StatusCode

from tracekit import semconv
from tracekit._core import clock
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import MS
from tracekit._core.loop_view import LoopView
from tracekit._core.request_record import new_span_id, new_trace_id
from tracekit._export import sdk
from tracekit._percentile import percentile

MIN_BUSY: Final = 0.05
_OK: Final = Status(StatusCode.UNSET)

#: More attributes for a window span, from integrations (tracekit.integrations.pyinstrument's
#: loop profiles): each is called with the loop and the window's start and end (wall ns of
#: tracekit's clock) on the span-building thread, and returns attributes or None.
window_extras: list[Callable[[Any, int, int], dict[str, Any] | None]] = []


def window_attributes(window: dict[str, Any]) -> dict[str, Any]:
    """The span attributes of one window (:meth:`LoopView.window`)."""
    wall = max(1, window["end"] - window["start"])
    lags = sorted(window["lags"])
    counts = window["gc_counts"]
    attrs: dict[str, Any] = {
        semconv.LOOP_THREAD: window["thread"],
        semconv.LOOP_PID: os.getpid(),  # worker processes share a thread name
        semconv.LOOP_BUSY_RATIO: min(1.0, window["thread_cpu"] / wall),
        semconv.LOOP_CPU_MS: window["thread_cpu"] / MS,
        semconv.LOOP_REQUESTS_CPU_MS: window["requests"] / MS,
        semconv.LOOP_GC_CPU_MS: window["gc"] / MS,
        semconv.LOOP_TRACEKIT_CPU_MS: window["tracekit"] / MS,
        semconv.LOOP_BACKGROUND_CPU_MS: window["background"] / MS,
        semconv.LOOP_GC_MS: window["gc_wall"] / MS,
        semconv.LOOP_GC_COUNTS: list(counts),
        semconv.LOOP_INFLIGHT: window["inflight"],
        semconv.LOOP_PROBES: len(lags),
    }
    if sum(counts):
        attrs[semconv.LOOP_GC_MAX_MS] = window["gc_longest"] / MS
        attrs[semconv.LOOP_GC_MAX_CPU_MS] = window["gc_longest_cpu"] / MS
        attrs[semconv.LOOP_GC_MAX_GENERATION] = window["gc_longest_gen"]
    if lags:
        attrs[semconv.LOOP_LAG_P50_MS] = percentile(lags, 0.5) / MS
        attrs[semconv.LOOP_LAG_P95_MS] = percentile(lags, 0.95) / MS
        attrs[semconv.LOOP_LAG_MAX_MS] = lags[-1] / MS
    if window["tasks"] >= 0:
        attrs[semconv.LOOP_TASKS] = window["tasks"]
    if window["runqueue"] >= 0:
        attrs[semconv.LOOP_RUNQUEUE_MS] = window["runqueue"] / MS
    tasks = window.get("background_tasks")
    if tasks:
        attrs[semconv.LOOP_BACKGROUND_TASKS] = [name for name, _ in tasks]
        attrs[semconv.LOOP_BACKGROUND_TASKS_CPU_MS] = [cpu / MS for _, cpu in tasks]
    return attrs


def build(view: LoopView, resource: Any, scope: Any) -> ReadableSpan | None:
    """The span of ``view``'s window ending now, or None (nothing to say, or no CPU clock)."""
    window = view.window()
    if window is None:
        return None
    wall = max(1, window["end"] - window["start"])
    if not window["requests"] and not window["inflight"] and (
            window["thread_cpu"] < MIN_BUSY * wall or not view.loop.is_running()):  # fmt: skip
        return None
    attrs = window_attributes(window)
    for extra in window_extras:
        try:
            attrs.update(extra(view.loop, window["start"], window["end"]) or {})
        except Exception:
            internal_error("loop window extra attributes")
    offset = clock.epoch_ns(0)
    context = sdk.span_context(new_trace_id(), new_span_id(), None)
    return sdk.readable_span(semconv.LOOP_SPAN, context, None, resource, attrs,
                             (), SpanKind.INTERNAL, _OK, window["start"] + offset,
                             window["end"] + offset, scope)  # fmt: skip
