"""The process-wide tracing runtime: sampling, hand-off of finished requests, span building.

Finished :class:`~tracekit._request.Request` records are appended to a deque on the request
path (~0.1 µs) and turned into OpenTelemetry ``ReadableSpan`` objects on a background thread
that wakes every ``DRAIN_INTERVAL_S`` (never per request: a wake-up per request would make the
two threads fight for the GIL); only when the builder falls far behind a saturated loop does
the request path build a couple of queued requests itself. The spans then go to the SDK span
processor (a
``BatchSpanProcessor`` exporting on its own thread) and to any active ``tracekit.record()``.

Shutdown is bounded (see "shutdown" below): when the server stops (ASGI lifespan shutdown) and
at exit, tracekit hands on what is queued and waits for the export at most
``shutdown_timeout_ms`` (5 s by default), however dead or slow the collector, then logs once
how many spans were never exported.

Only ``configure()``/``record()`` create a runtime, and they import the SDK; this module
imports the OpenTelemetry API only.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tracekit import _clock
from tracekit._accounting import REQUEST
from tracekit._context import current_ledger
from tracekit._failsafe import internal_error, logger
from tracekit._request import HANDED_ON, Request, new_trace_id

DRAIN_INTERVAL_S = 0.05
# Finished requests waiting for the span-building thread. At WAKE_AT the builder is woken
# early. Past half of MAX_QUEUE it is losing the GIL to a saturated loop (a thread waiting for
# the GIL rarely wins it from one that releases and retakes it around every select): the
# submitting thread then builds the two oldest queued requests itself, so the backlog
# shrinks instead of reaching MAX_QUEUE, where new requests would be dropped (counted in
# Runtime.dropped, logged once): the bound on memory (~0.6 kB a request). The builder thread
# stays the first choice: its work overlaps the loop thread's system calls.
MAX_QUEUE = 8192
WAKE_AT = 1024
HELP_COUNT = 2
# A request that ended while stages it spawned were still open waits for them at most this
# long, then is handed on as it stands: those stages end there, marked unfinished (an async
# generator abandoned unclosed never ends; a background task may run for ever).
LINGER_S = 10.0
# Kubernetes gives a pod 30 s between SIGTERM and SIGKILL, shared with the preStop hook and
# the server's own drain of in-flight requests (LLM streams run for tens of seconds): tracing
# gets a small, fixed slice of it. A reachable collector takes a full queue (2048 spans) in
# well under a second; 5 s is also half the OTLP exporter's own per-export timeout, so one
# stuck export cannot take the whole grace period.
DEFAULT_SHUTDOWN_TIMEOUT_MS = 5000.0
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

    privacy: Any = None  # what spans may carry (tracekit._summary.Privacy); None: the defaults

    def __init__(self, processor: Any, resource: Any, sampler: Any = None,
                 block_threshold_ms: float = 20.0, owns_processor: bool = False) -> None:  # fmt: skip
        self.processor = processor
        self.resource = resource
        self.sampler = sampler
        self.always_on = sampler is None or _is_default_sampler(sampler)
        self.block_threshold_ms = block_threshold_ms
        self.owns_processor = owns_processor
        self.dropped = 0
        self._queue: deque[Request] = deque()
        self._lingering: deque[tuple[float, Request]] = deque()  # (deadline, request), in order
        self._lock = threading.Lock()  # held by a drain (the builder thread's, a flush's)
        self._count_lock = threading.Lock()
        self._helping = 0  # submitters building queued requests right now (see _help)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._scope: Any = None
        self._spans: Any = None  # tracekit._spans, imported on first use (it imports the SDK)
        self.watchdog: Any = None
        self._sync_multi = _sync_multi() if processor is not None else None
        _live.add(self)

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
        if waiting == WAKE_AT:
            self._wake.set()
        elif waiting >= MAX_QUEUE >> 1:
            self._help()
        if self._thread is None:
            self._start_thread()

    def linger(self, request: Request) -> None:
        """``request`` is over but stages it spawned are still open: the last of them to close
        hands it on, or :meth:`_expire` does after ``LINGER_S``."""
        self._lingering.append((time.monotonic() + LINGER_S, request))
        if self._thread is None:
            self._start_thread()

    def _expire(self, everything: bool = False) -> None:
        """Hand on the lingering requests past their deadline (``everything``: all of them),
        their open stages ending now; forget those their last stage handed on."""
        lingering = self._lingering
        now = time.monotonic()
        while lingering:
            deadline, request = lingering[0]
            if request.pending > 0 and deadline > now and not everything:
                return
            lingering.popleft()
            if request.pending > 0:  # read and written with no call between (see _accounting.close)
                request.pending = HANDED_ON
                request.cutoff = _clock.wall_ns()
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

    def flush(self, timeout_ms: float = 30_000) -> bool:
        """Build spans for every queued request now, then flush the span processor.

        Returns within ``timeout_ms`` even when the processor does not (the SDK's batch
        processor ignores its timeout): True when everything was handed on in time.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        self._drain()
        while self._helping and time.monotonic() < deadline:  # another thread is helping
            time.sleep(0.001)
        processor = self.processor
        if processor is None:
            return True
        left = _ms_left(deadline)
        return bounded(lambda: processor.force_flush(left), deadline, "processor flush")

    def shutdown(self, deadline: float | None = None) -> None:
        """Drain, stop the drain thread and (if tracekit created it) the processor, waiting
        for the processor until ``deadline`` (``time.monotonic()``; default: the shutdown
        timeout from now)."""
        self._stopped = True
        self._wake.set()
        self._expire(everything=True)
        self._drain()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.processor is not None and self.owns_processor:
            until = shutdown_deadline() if deadline is None else deadline
            bounded(self.processor.shutdown, until, "processor shutdown")

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="tracekit-spans", daemon=True)
            self._thread = thread
            thread.start()
            register_exit()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(DRAIN_INTERVAL_S)
            self._wake.clear()
            if self._lingering:
                self._expire()
            self._drain()

    def _drain(self) -> None:
        """Build every queued request (under the lock: a flush returns only after the
        builder thread's drain, if one is under way, has delivered what it popped)."""
        with self._lock:
            while self._build_one():
                pass

    def _build_one(self) -> bool:
        """Build and deliver the oldest queued request; False when none is queued."""
        spans_module = self._spans
        if spans_module is None:
            from tracekit import _spans  # the SDK, only once something is recorded

            spans_module = self._spans = _spans
            self._scope = _spans.instrumentation_scope()
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

    def _deliver(self, spans: list[Any]) -> None:
        processor = self.processor
        if processor is not None:
            for target in _processors(processor, self._sync_multi):
                on_end = target.on_end
                for span in spans:
                    try:
                        on_end(span)
                    except Exception:
                        internal_error("span processor")
        for recorder in list(recorders):
            try:
                recorder(spans)
            except Exception:
                internal_error("recorder")


def _processors(processor: Any, sync_multi: type | None) -> tuple[Any, ...]:
    """The processors to hand spans to: those of the SDK's synchronous multi-processor (a
    provider's ``add_span_processor`` chain) directly, one call per span fewer, else it.

    Read at every delivery, so processors the application adds later receive spans too.
    """
    if sync_multi is not None and type(processor) is sync_multi:
        inner = getattr(processor, "_span_processors", None)
        if type(inner) is tuple:
            return inner
    return (processor,)


def _sync_multi() -> type | None:
    try:
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    except ImportError:  # the API alone: nothing records, nothing to unwrap
        return None
    return SynchronousMultiSpanProcessor


def _is_default_sampler(sampler: Any) -> bool:
    try:
        return bool(sampler.get_description() == "ParentBased{root:AlwaysOnSampler,"
                    "remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,"
                    "localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}")
    except Exception:
        return False


# --- the process-wide runtime ---------------------------------------------------------------
current: Runtime | None = None
# Open tracekit.record() captures. Process-wide, not per runtime, so that a middleware given
# its own tracer_provider is recorded too.
recorders: list[Callable[[list[Any]], None]] = []
_live: weakref.WeakSet[Runtime] = weakref.WeakSet()  # every runtime, for flush_all()


def flush_all() -> None:
    """Build and deliver everything queued in every runtime (what a recording reads)."""
    for runtime in list(_live):
        runtime.flush()


# --- shutdown ------------------------------------------------------------------------------
# Left to the SDK, an exit waits for the export up to 30 s (its provider's atexit shutdown
# waits that long for the batch processor, a timeout nobody can set), while the processor
# exports what is queued batch by batch: a collector refusing connections holds each batch
# ~7 s (retries with backoff), one that accepts and never answers OTEL_EXPORTER_OTLP_TIMEOUT
# (10 s). And uvicorn kills the process by re-raising SIGTERM once it has stopped: atexit
# handlers never run, the spans still queued are lost, silently. So tracekit flushes when the
# server stops (the ASGI lifespan shutdown: lifespan_send) and again at exit; each step waits
# at most shutdown_timeout_ms, and once one has given up (the collector did not take the spans
# in time), the later ones do not wait again.
shutdown_timeout_ms: float = DEFAULT_SHUTDOWN_TIMEOUT_MS  # configure(shutdown_timeout_ms=...)
_gave_up = False  # a shutdown step ran out of time; reset when a server starts
_reported = 0  # spans (and requests) not exported, as last logged
# tracekit's export processors (tracekit.exporters._batch), which count what they never exported
exports: weakref.WeakSet[Any] = weakref.WeakSet()


def shutdown_deadline() -> float:
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
    deadline = shutdown_deadline()
    for runtime in list(_live):
        runtime._expire(everything=True)  # requests still waiting for stages they spawned
        if not runtime.flush(_ms_left(deadline)):
            _gave_up = True  # later steps (at exit: the SDK provider's shutdown) do not wait
        if stop:
            runtime.shutdown(deadline)
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
    requests = sum(runtime.dropped for runtime in list(_live))
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


def _ms_left(deadline: float) -> float:
    return max(0.0, (deadline - time.monotonic()) * 1000)


def install(runtime: Runtime | None) -> Runtime | None:
    """Make ``runtime`` the active one; returns the previous one."""
    global current
    previous, current = current, runtime
    return previous


class LedgerSpan(NonRecordingSpan):
    """The OpenTelemetry "current span" for the whole of a recorded request.

    Attached once per request instead of once per stage: its span context is computed when
    someone asks (a propagator injecting ``traceparent``, an instrumentation starting a
    child span) from tracekit's own context variable, so it is always the innermost open
    stage of this request in this task or thread. When tracekit enriches a server span made
    by other instrumentation, calls that record (``set_attribute``...) made at the request's
    top level go to that span.
    """

    def __init__(self, request: Request, delegate: Any = None) -> None:
        # NonRecordingSpan.__init__ only stores a SpanContext; ours is built when asked for.
        self._request = request
        self._delegate = delegate

    def get_span_context(self) -> SpanContext:
        led = current_ledger.get()
        request = self._request
        # The innermost stage of this request (its root ledger has the request's span id).
        span_id = led.span_id if led is not None and led.request is request else request.span_id
        return SpanContext(request.trace_id, span_id, False, _SAMPLED, request.trace_state)

    def _target(self) -> Any:
        led = current_ledger.get()
        at_top = led is None or led.request is not self._request or led.site is REQUEST
        return self._delegate if at_top else None

    def is_recording(self) -> bool:
        target = self._target()
        return bool(target is not None and target.is_recording())

    def set_attribute(self, key: str, value: Any) -> None:
        target = self._target()
        if target is not None:
            target.set_attribute(key, value)

    def set_attributes(self, attributes: Any) -> None:
        target = self._target()
        if target is not None:
            target.set_attributes(attributes)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        target = self._target()
        if target is not None:
            target.add_event(name, attributes, timestamp)

    def record_exception(self, exception: BaseException, attributes: Any = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:  # fmt: skip
        target = self._target()
        if target is not None:
            target.record_exception(exception, attributes, timestamp, escaped)

    def set_status(self, status: Any, description: str | None = None) -> None:
        target = self._target()
        if target is not None:
            target.set_status(status, description)


def request_context(request: Request) -> Context:
    """The OpenTelemetry context to attach for the whole of ``request``."""
    return otel_trace.set_span_in_context(LedgerSpan(request, request.enrich))


def unsampled_context(trace_id: int, span_id: int, trace_state: Any) -> Context:
    """Context for a request the sampler dropped: ids still propagate, flagged not sampled."""
    span_context = SpanContext(trace_id, span_id, False, _NOT_SAMPLED, trace_state)
    return otel_trace.set_span_in_context(NonRecordingSpan(span_context))


def late_request(request: Request, parent_span_id: int) -> Request:
    """A record for a stage opened under ``request`` after it was handed on (work the request
    spawned, starting late): a tree of its own in the same trace, under ``parent_span_id``."""
    return Request(request.runtime, request.trace_id, parent_span_id, False, request.trace_state,
                   server=False)  # fmt: skip


def standalone_request() -> Request | None:
    """A request record for a stage opened outside any request, or None if not recording.

    Its parent is the application's current OpenTelemetry span, if any.
    """
    runtime = current
    if runtime is None or not runtime.enabled:
        return None
    current_context = otel_trace.get_current_span().get_span_context()
    parent = current_context if current_context.is_valid else None
    trace_id = parent.trace_id if parent else new_trace_id()
    if not runtime.sample(trace_id, parent, "stage"):
        return None
    request = Request(runtime, trace_id, parent.span_id if parent else None,
                      bool(parent and parent.is_remote), parent.trace_state if parent else None,
                      server=False)  # fmt: skip
    return request
