"""The process-wide tracing runtime: sampling, hand-off of finished requests, span building.

Finished :class:`~tracekit._core.request_record.Request` records are appended to a deque on the request
path (~0.1 µs) and turned into OpenTelemetry ``ReadableSpan`` objects on a background thread
that wakes every ``DRAIN_INTERVAL_S`` (never per request: a wake-up per request would make the
two threads fight for the GIL); only when the builder falls far behind (a host with no core
for it, a slow span processor) does the request path build a couple of queued requests
itself. The spans then go to the SDK span processor (a ``BatchSpanProcessor`` exporting on
its own thread) and to any active ``tracekit.record()``.

A loop thread that never blocks starves any other thread of the GIL: CPython 3.11 signals a
waiting thread at every release (each ``select``), the waiter wakes too late to take it, and
it waits again with its 5 ms switch timer restarted; the builder returned from its sleeps
21-43 ms late (median; p90 up to 319 ms) while the loop paid a futex wake-up per release
(``bench/gil_hand_over.py --starved``, docs/performance.md). So the loop thread hands the GIL
over: a request finishing after the builder's wait is over blocks until the builder holds the
GIL (:meth:`Runtime._hand_over_gil`), and the builder gives it back after ``SLICE_S`` of
building, to be handed it again. On a loop with idle time the builder takes the GIL itself
and no hand-over happens.

Shutdown is bounded: :mod:`tracekit._export.shutdown`.

Only ``configure()``/``record()`` create a runtime, and they import the SDK; this module
imports the OpenTelemetry API only.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tracekit import semconv
from tracekit._core import clock, current, handoff
from tracekit._core.failsafe import internal_error, logger
from tracekit._core.request_record import HANDED_ON, Request
from tracekit._export import shutdown

DRAIN_INTERVAL_S = 0.05
# The builder builds this long at most before it gives the GIL back (below the interpreter's
# 5 ms switch interval, after which the loop would take it back and the builder would starve
# again), and waits as long before it asks for the GIL again.
SLICE_S = 0.002
# A finishing request hands the GIL over once the builder is this late: on a loop with idle
# time the builder has taken it by then.
LATE_S = 0.001
# How long a hand-over waits for the builder to take the GIL (it is runnable: the wait ends in
# microseconds unless the host has no core for it).
HAND_OVER_WAIT_S = 0.002
# The loop view's window (tracekit._core.loop_view): one tracekit.loop span per loop this often.
LOOP_WINDOW_S = 1.0
# Finished requests waiting for the span-building thread. At WAKE_AT the builder is handed the
# GIL early. Past half of MAX_QUEUE it is falling behind anyway (a host with no core for it,
# a slow span processor): the
# submitting thread then builds the two oldest queued requests itself, so the backlog
# shrinks instead of reaching MAX_QUEUE, where new requests would be dropped (counted in
# Runtime.dropped, logged once): the bound on memory (~0.6 kB a request). The builder thread
# stays the first choice: its work overlaps the loop thread's system calls.
MAX_QUEUE = 8192
WAKE_AT = 1024
HELP_COUNT = 2
# A request that ended while stages or tasks it spawned were still open waits for them at
# most this long, then is handed on as it stands: those stages end there, marked unfinished
# (an async generator abandoned unclosed never ends; a background task may run for ever),
# and the tasks run on as the loop's background work. Spend logging and callbacks after the
# response take milliseconds; a task a request starts to run for ever (a cache refresher
# started lazily) is background after this long: its work until then is the request's.
LINGER_S = 1.0
_NEVER = float("inf")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class Runtime:
    """Where finished requests go: an SDK span processor and/or in-memory recorders.

    Args:
        processor: an SDK ``SpanProcessor`` (``on_end``, ``force_flush``, ``shutdown``) or None.
        resource: the SDK ``Resource`` for built spans.
        sampler: an SDK ``Sampler``; None means parent-based always-on.
        block_threshold_ms: the watchdog samples the loop's stack past this slice length.
    """

    privacy: Any = None  # what spans may carry (tracekit._export.span_attributes.Privacy); None: the defaults

    def __init__(self, processor: Any, resource: Any, sampler: Any = None,
                 block_threshold_ms: float = 20.0, owns_processor: bool = False) -> None:  # fmt: skip
        from tracekit._export import sdk  # the SDK: a runtime is made once something records

        self.processor = processor
        self.resource = resource
        # The host's CPUs, for a server span another instrumentation owns (its resource is
        # not this one): tracekit._core.asgi.enrich adds them to it.
        known = getattr(resource, "attributes", None) or {}
        self.host_cpus = {k: known[k] for k in (semconv.HOST_CPUS, semconv.PROCESS_CPUS) if k in known}
        self.sampler = sampler
        self.always_on = sampler is None or sdk.is_default_sampler(sampler)
        self.block_threshold_ms = block_threshold_ms
        self.owns_processor = owns_processor
        self.dropped = 0
        self.hand_overs = 0  # the GIL handed to the builder thread (_hand_over_gil) ...
        self.hand_overs_missed = 0  # ... and those it did not take within HAND_OVER_WAIT_S
        self._queue: deque[Request] = deque()
        # Spans of other instrumentation in traces this runtime's requests enrich, with the
        # processor chain they ended in (tracekit._export.composition), for the builder thread.
        self._foreign: deque[tuple[Any, Any]] = deque()
        self.composed: Any = None  # the processor chain last hooked (composition.adopt)
        self._lingering: deque[tuple[float, Request]] = deque()  # (deadline, request), in order
        self._thread: threading.Thread | None = None
        self._threads_afresh()
        self._stopped = False
        self._scope: Any = None
        self._spans: Any = None  # tracekit._export.readable_spans, imported on first use (it imports the SDK)
        self.watchdog: Any = None
        self._window_at = time.monotonic()  # when the last loop windows were built
        self._processors = sdk.processors  # the processors to hand spans to (see sdk.processors)
        self._hand_over = sdk.hand_over  # a request's spans to one of them (in one go if it can)
        self._sync_multi = sdk.sync_multi_type() if processor is not None else None
        shutdown.runtimes.add(self)
        handoff.install()  # work requests hand to thread and process pools is timed from now on

    @property
    def enabled(self) -> bool:
        """Whether anything receives spans."""
        return self.processor is not None or bool(recorders)

    # --- sampling ---------------------------------------------------------------------------
    def sample(self, trace_id: int, parent: SpanContext | None, name: str) -> bool:
        """The sampling decision for a new request or standalone stage tree."""
        if recorders:
            return True  # tests and the demo record everything
        if self.always_on:
            return parent is None or parent.trace_flags.sampled
        try:
            ctx = otel_trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
            result = self.sampler.should_sample(ctx, trace_id, name, otel_trace.SpanKind.SERVER)
            return bool(result.decision.is_sampled())
        except Exception:
            internal_error("sampler")
            return True

    # --- hand-off ---------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue a finished request for span building (request path: cheap, never blocks)."""
        request.pending = HANDED_ON  # a stage opened under it from now on is a tree of its own
        queue = self._queue
        waiting = len(queue)
        if waiting >= MAX_QUEUE:
            request.release()
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("tracekit: span building cannot keep up; dropping traces (counted)")
            return
        queue.append(request)
        due_at = self._due_at
        if due_at != _NEVER and (waiting == WAKE_AT or time.monotonic() > due_at):
            self._hand_over_gil()
        elif waiting >= MAX_QUEUE >> 1:
            self._help()
        if self._thread is None:
            self._start_thread()

    def compose(self, span: Any) -> None:
        """A request enriches ``span``, another instrumentation's server span: the spans of
        that trace are to reach this runtime's destinations too (request path, guarded)."""
        try:
            from tracekit._export import composition

            composition.adopt(self, span)
        except Exception:
            internal_error("composition")

    def foreign(self, span: Any, chain: Any) -> None:
        """Queue another instrumentation's ended span for this runtime's destinations
        (called on the thread that ended it: an append; delivered by the builder thread)."""
        foreign = self._foreign
        if self._stopped or len(foreign) >= MAX_QUEUE:
            return
        foreign.append((span, chain))
        if self._thread is None:
            self._start_thread()

    def linger(self, request: Request) -> None:
        """``request`` is over but stages it spawned are still open: the last of them to close
        hands it on, or :meth:`_expire` does after ``LINGER_S``."""
        self._lingering.append((time.monotonic() + LINGER_S, request))
        if self._thread is None:
            self._start_thread()

    def has_lingering(self) -> bool:
        """Whether a request over is still waiting for stages it spawned (or to be forgotten)."""
        return bool(self._lingering)

    def expire_lingering(self, everything: bool = False) -> None:
        """Hand on the lingering requests past their deadline (``everything``: all of them),
        their open stages ending now; forget those their last stage handed on."""
        lingering = self._lingering
        now = time.monotonic()
        while lingering:
            deadline, request = lingering[0]
            if request.pending > 0 and deadline > now and not everything:
                return
            lingering.popleft()
            if request.pending > 0:  # read and written with no call between (see tracekit._core.ledger.close)
                request.pending = HANDED_ON
                request.cutoff = clock.wall_ns()
                self.submit(request)

    def _help(self) -> None:
        """Build the oldest queued requests here (the builder is falling behind).

        Without the builder's lock: a builder starved of the GIL may hold it for as long as
        the loop keeps the GIL. ``_helping`` counts helpers at work, for :meth:`flush`."""
        with self._count_lock:
            self._helping += 1
        try:
            for _ in range(HELP_COUNT):
                if not self._build_one():
                    break
        finally:
            with self._count_lock:
                self._helping -= 1

    def build(self, timeout_ms: float = 30_000) -> None:
        """Build spans for every queued request and the loop's window now, and hand them to
        the processor and the recordings, without waiting for the processor's exports."""
        deadline = time.monotonic() + timeout_ms / 1000
        self._drain()
        self._loop_windows()
        while self._helping and time.monotonic() < deadline:  # another thread is helping
            time.sleep(0.001)

    def flush(self, timeout_ms: float = 30_000) -> bool:
        """Build spans for every queued request now, then flush the span processor.

        Returns within ``timeout_ms`` even when the processor does not (the SDK's batch
        processor ignores its timeout): True when everything was handed on in time.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        self.build(timeout_ms)
        processor = self.processor
        if processor is None:
            return True
        left = shutdown.ms_left(deadline)
        return shutdown.bounded(lambda: processor.force_flush(left), deadline, "processor flush")

    def shutdown(self, deadline: float | None = None) -> None:
        """Drain, stop the drain thread and (if tracekit created it) the processor, waiting
        for the processor until ``deadline`` (``time.monotonic()``; default: the shutdown
        timeout from now)."""
        self._stopped = True
        self._wake.set()
        self.expire_lingering(everything=True)
        self._drain()
        if self.composed is not None:  # it enriched other instrumentation's spans
            from tracekit._export import composition

            composition.forget(self)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.processor is not None and self.owns_processor:
            until = shutdown.deadline() if deadline is None else deadline
            shutdown.bounded(self.processor.shutdown, until, "processor shutdown")

    def _threads_afresh(self) -> None:
        """The builder thread's state, none started (also in a forked child, where only the
        thread that forked runs: the builder is the parent's, and a lock another thread held
        at the fork stays held; the child's first finished request starts its own builder)."""
        self._lock = threading.Lock()  # held by a drain (the builder thread's, a flush's)
        self._count_lock = threading.Lock()
        self._helping = 0  # submitters building queued requests right now (see _help)
        self._wake = threading.Event()
        # When the builder thread's wait or its slice of building ends, plus LATE_S (monotonic):
        # past it, the builder is waiting for the GIL. Set by the builder thread, and by a
        # hand-over (when to hand over again if the builder has not said).
        self._due_at = _NEVER
        self._running = threading.Event()  # set by the builder thread once it holds the GIL
        self._thread = None

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="tracekit-spans", daemon=True)
            self._thread = thread
            thread.start()
            shutdown.register_exit()

    def _hand_over_gil(self) -> None:
        """The builder thread is due (or the backlog reached ``WAKE_AT``), or was stopped
        mid-slice: wake it and block, the GIL released, until it holds the GIL (it sets
        ``_running`` when its wait ends, and after each request it builds)."""
        self.hand_overs += 1
        # Due again after a slice's time unless the builder, once it runs, says when: within
        # a slice it may wait for the GIL again (an import's file reads, a processor's writes).
        self._due_at = time.monotonic() + SLICE_S + LATE_S
        running = self._running
        running.clear()
        self._wake.set()
        if not running.wait(HAND_OVER_WAIT_S):
            self.hand_overs_missed += 1
            thread = self._thread
            if thread is None or not thread.is_alive():  # stopped
                self._due_at = _NEVER

    def _run(self) -> None:
        wait_s = DRAIN_INTERVAL_S
        running = self._running
        while not self._stopped:
            self._due_at = time.monotonic() + wait_s + LATE_S
            self._wake.wait(wait_s)
            self._due_at = _NEVER  # (the lingering requests handed on are submitted from here)
            running.set()
            self._wake.clear()
            if self._lingering:
                self.expire_lingering()
            until = time.monotonic() + SLICE_S
            self._due_at = until + LATE_S  # past it, the loop took the GIL back mid-slice
            unfinished = self._drain(until)
            wait_s = SLICE_S if unfinished else DRAIN_INTERVAL_S
            if time.monotonic() - self._window_at >= LOOP_WINDOW_S:
                self._loop_windows()
        self._due_at = _NEVER

    def _drain(self, until: float = _NEVER) -> bool:
        """Build every queued request, or those until ``until`` (monotonic; then True), under
        the lock: a flush returns only after the builder thread's drain, if one is under way,
        has delivered what it popped."""
        running = self._running
        with self._lock:
            while self._build_one():
                if not running.is_set():  # a hand-over waits for this thread to hold the GIL
                    running.set()
                if time.monotonic() > until:
                    return True
            foreign = self._foreign
            while foreign:
                span, chain = foreign.popleft()
                self._deliver_foreign(span, chain)
        return False

    def _build_one(self) -> bool:
        """Build and deliver the oldest queued request; False when none is queued."""
        spans_module = self._spans or self._span_module()
        try:
            request = self._queue.popleft()
        except IndexError:
            return False
        try:
            spans = spans_module.build(request, self.resource, self._scope)
        except Exception:
            internal_error("span building")
            return True
        finally:
            request.release()
        self._deliver(spans)
        return True

    def _span_module(self) -> Any:
        """:mod:`tracekit._export.readable_spans`, imported on first use (it imports the SDK)."""
        from tracekit._export import readable_spans

        self._spans = readable_spans
        self._scope = readable_spans.instrumentation_scope()
        return readable_spans

    def _loop_windows(self) -> None:
        """A ``tracekit.loop`` span per loop for the window ending now (the active runtime
        only: the loop views are the process's)."""
        self._window_at = time.monotonic()
        if current.active_runtime is not self:
            return
        from tracekit._core.loop_view import live_views
        from tracekit._export import loop_spans

        if self._spans is None:
            self._span_module()
        spans = []
        for view in live_views():
            try:
                span = loop_spans.build(view, self.resource, self._scope)
            except Exception:
                internal_error("loop window")
                continue
            if span is not None:
                spans.append(span)
        if spans:
            self._deliver(spans)

    def _deliver_foreign(self, span: Any, chain: Any) -> None:
        """Hand another instrumentation's span to the recordings and to the processors of
        this runtime that its own chain does not hold (composition.targets)."""
        from tracekit._export import composition

        try:
            destinations = composition.targets(self.processor, chain)
        except Exception:
            internal_error("composition")
            destinations = []
        for target in destinations:
            try:
                target.on_end(span)
            except Exception:
                internal_error("span processor")
        for recorder in list(recorders):
            try:
                recorder([span])
            except Exception:
                internal_error("recorder")

    def _deliver(self, spans: list[Any]) -> None:
        processor = self.processor
        if processor is not None:
            for target in self._processors(processor, self._sync_multi):
                self._hand_over(target, spans)
        for recorder in list(recorders):
            try:
                recorder(spans)
            except Exception:
                internal_error("recorder")


# --- the process-wide runtime ---------------------------------------------------------------
# Open tracekit.record() captures. Process-wide, not per runtime, so that a middleware given
# its own tracer_provider is recorded too.
recorders: list[Callable[[list[Any]], None]] = []


def _after_fork_in_child() -> None:
    for runtime in list(shutdown.runtimes):
        runtime._threads_afresh()


os.register_at_fork(after_in_child=_after_fork_in_child)


def build_all() -> None:
    """Build and deliver everything queued in every runtime, without flushing the exporters
    (what a recording reads: a collector that is down must not hold it)."""
    for runtime in list(shutdown.runtimes):
        runtime.build()


def flush_all() -> None:
    """Build and deliver everything queued in every runtime (what a recording reads)."""
    for runtime in list(shutdown.runtimes):
        runtime.flush()


def install(runtime: Runtime | None) -> Runtime | None:
    """Make ``runtime`` the one recording (:data:`tracekit._core.current.active_runtime`);
    returns the previous one."""
    previous: Runtime | None = current.active_runtime
    current.active_runtime = runtime
    return previous
