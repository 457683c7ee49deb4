"""The ledger: where a stage's (or a request's own) wall time went (DESIGN §1).

A :class:`Ledger` is filled step by step on the hot path with integer nanoseconds and plain
counters; nothing here touches OpenTelemetry. :func:`split` turns a closed ledger into its
components, off the hot path.

Split of a ledger's wall time, each nanosecond counted once::

    wall = cpu + wait + loop_wait + queued + children + consumer + gc

- ``cpu``: thread CPU of the ledger's own steps; a nested stage's step CPU is subtracted from
  the step that contains it (``nested_cpu``), so CPU is exclusive.
- ``children``: wall time covered by direct child stages (union of their intervals), less
  the time async-generator children spent with their consumer (the parent's code, mostly).
- ``consumer``: async-generator stages only: time the consumer held a yielded item.
- ``gc``: garbage collections that ran in the ledger's own steps (:mod:`tracekit._core.gc_pauses`),
  and those of other threads its steps waited out for the GIL (:func:`step_end`).
- ``queued``: suspended on a lock, semaphore, condition or queue: waiting for other tasks of
  the process (:func:`tracekit._core.event_loop.waits_on`), not for I/O, until they
  let go (the rest of the suspension, ready, is loop wait); not a queue's receiving end while
  tasks the ledger's code spawned still run (its own work: their figures are folded into it).
- ``loop_wait``: estimated by :mod:`tracekit._core.event_loop` at each resumption.
- ``wait``: the rest: suspended waiting on I/O / the model, or blocked off-CPU in a sync call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from tracekit import semconv
from tracekit._core import clock, event_loop

if TYPE_CHECKING:
    from tracekit._core.request_record import Request

MS: Final = 1e6
SLICE_NOTE_NS: Final = 1_000_000  # slices/waits at least this long are kept for the loop timeline
MAX_NOTES: Final = 32  # per ledger; the longest are kept
# A checkpoint resumed this close before a wait for I/O is part of that wait (resume).
CHECKPOINT_GAP_NS: Final = 200_000


class Site:
    """What a ledger accounts for: a stage (name, kind, the wrapped callable), or a request's
    own code. Made once per decorated function or ``Stage``, shared by all their ledgers.

    Attributes:
        template: its spans' attributes, to copy: the fixed ones (stage name and kind, code
            location), then the keys of the figures every stage span has, set to zero until
            span building writes them (a copy of a dict is much cheaper than building one key
            by key).
    """

    __slots__ = ("client_call", "function", "kind", "name", "namespace", "shape", "template")

    def __init__(self, name: str, kind: str, function: str | None = None,
                 namespace: str | None = None, shape: str = semconv.SHAPE_BLOCK,
                 client_call: bool = False) -> None:  # fmt: skip
        self.name = name
        self.kind = kind
        # A call to another service (an HTTP client's request to the model server): its span
        # is a CLIENT span, as OpenTelemetry's client conventions (GenAI's included) ask.
        self.client_call = client_call
        self.function = function
        self.namespace = namespace
        self.shape = shape
        template: dict[str, Any] = {semconv.STAGE: name, semconv.STAGE_KIND: kind,
                                    semconv.STAGE_SHAPE: shape}  # fmt: skip
        template[semconv.OPENINFERENCE_SPAN_KIND] = semconv.OPENINFERENCE_KIND_BY_STAGE.get(
            kind, semconv.OPENINFERENCE_CHAIN)
        if function:
            template[semconv.CODE_FUNCTION] = function
            if namespace:
                template[semconv.CODE_NAMESPACE] = namespace
        for key in (semconv.WALL_MS, semconv.CPU_MS, semconv.WAIT_MS, semconv.LOOP_WAIT_MS,
                    semconv.MAX_BLOCK_MS):  # fmt: skip
            template[key] = 0.0
        template[semconv.ON_LOOP] = False
        template[semconv.STEPS] = 0
        self.template = template


REQUEST: Final = Site("request", "request")  # the site of every request's root ledger
# The site of every spawned task's ledger (tracekit._core.spawned): folded into the ledger
# that spawned it, never a span of its own.
SPAWNED: Final = Site("spawned task", "task")


class Ledger:
    """Accounting for one stage (or the request's own code: ``site is REQUEST``).

    Creating one is on the hot path (once per stage call), so ``__init__`` sets only what is
    read before it is written: ``step_t0``, ``step_c0``, ``nested_cpu``, ``nested_wall`` and
    ``prev_top`` are first written by :func:`step_begin`. Rarely used
    fields (notes, watchdog catches, extra attributes, errors, generator timing) default to
    the class attributes below and get an instance value only when used.
    """

    __slots__ = (
        "__dict__",
        "active_children",
        "checkpoint_at",
        "checkpoint_wait",
        "child_spans",
        "cpu_off",
        "cpu_on",
        "end",
        "loop_wait",
        "max_block",
        "nested_cpu",
        "nested_wall",
        "others_gc0",
        "owns_slice",
        "parent",
        "prev_top",
        "request",
        "site",
        "span_id",
        "start",
        "state",
        "step_c0",
        "step_t0",
        "steps",
        "suspended_at",
        "suspended_ready",
        "sync_call",
        "token",
    )  # fmt: skip

    # Written by step_begin before anything reads them (not initialised by __init__).
    step_t0: int  # wall ns when the open step began
    step_c0: int  # thread CPU ns when the open step began
    others_gc0: int  # other threads' collections' wall ns then (event_loop.others_gc_ns)
    nested_cpu: int  # CPU of nested stages' steps inside the open step (subtracted from it)
    nested_wall: int  # wall time of those nested steps (the open step's own CPU fits in the rest)
    prev_top: Ledger | None  # what was on top of the thread's step stack before this step
    state: event_loop.ThreadState  # the thread a step-taking stage runs on (tracekit._core.stage_timing)
    owns_slice: bool  # a sync call's step began the thread's outermost slice (tracekit._core.stage_timing)

    consumer = 0  # async generators: ns the consumer held yielded items
    gc = 0  # ns of garbage collection inside its own steps (tracekit._core.gc_pauses)
    queued = 0  # ns suspended on a lock, semaphore, condition or queue (waiting for other tasks)
    # ns its async-generator children spent with their consumer (this ledger's code, mostly):
    # inside their intervals, not covered by them (see split).
    child_consumer = 0
    spawner: Ledger | None = None  # a spawned task's ledger: the ledger current when it was created
    slices: list[tuple[int, int]] | None = None  # (start, duration) >= 1 ms, on the loop
    waits: list[tuple[int, int]] | None = None  # (ready, duration) >= 1 ms
    blocked: list[tuple[int, float, str, str]] | None = None  # watchdog catches
    attributes: dict[str, Any] | None = None
    error: BaseException | None = None
    first_item = 0  # async generators: wall_ns of the first yielded item
    otel_token: object = None  # a stage outside any request: its attached OTel context

    def __init__(self, site: Site, request: Request | None, parent: Ledger | None, span_id: int,
                 start: int = 0) -> None:  # fmt: skip
        self.site = site
        self.request = request
        self.parent = parent
        self.span_id = span_id
        self.start = start or clock.wall_ns()
        self.end = self.cpu_on = self.cpu_off = self.loop_wait = self.max_block = 0
        self.steps = self.active_children = self.suspended_at = 0
        # Its coroutine suspended already ready to resume (a bare yield: ``asyncio.sleep(0)``,
        # anyio's checkpoints): the task is rescheduled at once, all of the suspension is loop wait.
        self.suspended_ready = False
        # The last checkpoint (bare yield) since the last other suspension: when it suspended
        # and the loop wait booked for it, its whole length (0: none), see resume().
        self.checkpoint_at = self.checkpoint_wait = 0
        # A sync call's ledger (tracekit._core.stage_timing.step_in): code running while its step is
        # open is synchronous, so a block entered there can take the step over.
        self.sync_call = False
        self.child_spans: list[tuple[int, int]] | None = None  # direct children's (start, end)
        self.token: Any = None  # the current_ledger token while bound (tracekit._core.stage_timing)
        if parent is not None:
            parent.active_children += 1
        if request is not None:
            request.ledgers.append(self)
            request.pending += 1

    def set_attribute(self, key: str, value: Any) -> None:
        """Attach an extra attribute to this stage's span (GenAI, tokens, ...)."""
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value


def step_begin(led: Ledger, state: event_loop.ThreadState, now: int, cpu: int) -> None:
    """Open a step of ``led`` on the thread whose state is ``state`` at wall time ``now`` and
    thread CPU time ``cpu``, nested in the step open there (if any).

    Every step boundary reads the thread's CPU clock (a system call): a step begins with the
    readings that ended the previous one when control switches between ledgers, but a nested
    step's start is never inferred from the enclosing step's readings: on a host short of CPU
    the enclosing code's wall time is not CPU time, and the nested stage would be under-counted
    (tests/core/test_stage.py, exclusive-CPU test).
    """
    led.prev_top = state.top
    state.top = led
    led.nested_cpu = led.nested_wall = 0
    led.step_t0 = now
    led.step_c0 = cpu
    led.others_gc0 = event_loop.others_gc_ns(state)


def step_end(led: Ledger, state: event_loop.ThreadState, now: int, cpu: int, on_loop: bool) -> None:
    """Close the open step of ``led`` at wall time ``now`` and thread CPU time ``cpu``.

    A thread cannot use more CPU than the wall time that passes, so a step's CPU is at most
    its wall time, and its own CPU at most the wall time outside its nested steps. Readings
    can say more: a CPU reading inferred by :func:`tracekit._core.event_loop.cpu_now` is high by up to
    ``CPU_REUSE_NS``, and a garbage collection can fall between a step's wall and CPU
    readings. Bounding each step here keeps every nanosecond counted once: a stage's CPU plus
    its children's wall time never exceeds its wall time (tests/hostile/recorder/test_timing_invariants.py).
    """
    held = now - led.step_t0
    spent = cpu - led.step_c0
    if spent > held:
        spent = held
    # Collections on other threads held the GIL this step then waited for: GC, not blocking
    # (a new user's sync endpoints' 127 ms generation-2 collections in worker threads read as a
    # blocking call in the streamed model stage on the loop). At most the step's own time
    # off CPU: a collection that ended in the step may have begun before it.
    late = answered(led, led.step_t0)
    others = event_loop.others_gc_ns(state) - led.others_gc0
    if others > 0:
        off_cpu = (held - led.nested_wall) - (spent - led.nested_cpu)
        if others > off_cpu:
            others = off_cpu if off_cpu > 0 else 0
        led.nested_wall += others
        if not late:
            led.gc += others
    else:
        others = 0
    prev = led.prev_top
    state.top = prev
    led.prev_top = None
    led.steps += 1
    if prev is not None:
        prev.nested_cpu += spent
        prev.nested_wall += held
        prev.others_gc0 += others  # booked here, not again in the outer step
    own = spent - led.nested_cpu
    free = held - led.nested_wall
    if own > free:
        own = free
    if late:
        # After the response a stall behind other threads' collections has no GC bucket
        # (the request's span is over): it is left out of the slice the code held.
        held -= others
        request = led.request
        assert request is not None
        request.after_cpu += own
        if not on_loop:
            request.after_cpu_off += own
        own = 0
    if on_loop:
        led.cpu_on += own
        if held > led.max_block:
            led.max_block = held
        if held >= SLICE_NOTE_NS:
            led.slices = note(led.slices, led.step_t0, held)
    else:
        led.cpu_off += own


def answered(led: Ledger, since: int) -> bool:
    """Whether ``led`` is the request's own code or a task it spawned, and its request's
    response was complete at ``since`` (a step's start, a suspension): what it does from
    there is after the request span (work a request leaves behind on the loop: Starlette's
    background tasks, spend logging, clean-up). Its CPU goes to the request's
    ``after_cpu``; its waits and GC pauses are no part of the span. A stage's span is its
    own, whenever it runs."""
    request = led.request
    if request is None or not request.end or since < request.end:
        return False
    site = led.site
    return site is REQUEST or site is SPAWNED


def book_open_steps(state: event_loop.ThreadState, request: Any) -> None:
    """Book the steps of ``request`` open on this thread up to now: each ends and begins again
    with the same readings (innermost first, then outermost first), so their CPU so far is in
    their ledgers. For a server span another instrumentation ends while the request's last
    step still runs (FastAPI's native telemetry ends it on the response's last send)."""
    chain: list[Ledger] = []
    led = state.top
    while led is not None and led.request is request:
        chain.append(led)
        led = led.prev_top
    if not chain:
        return
    now = clock.wall_ns()
    cpu = event_loop.cpu_now(state, now)
    for led in chain:
        step_end(led, state, now, cpu, True)
    for led in reversed(chain):
        step_begin(led, state, now, cpu)


def switch(state: event_loop.ThreadState, outer: Ledger | None, inner: Ledger | None,
           on_loop: bool) -> int:  # fmt: skip
    """End ``outer``'s open step and begin ``inner``'s with the same readings (either may be
    None); returns the wall time. Used where control passes from one ledger's code to
    another's without leaving the thread: entering and leaving blocks and async stages."""
    now = clock.wall_ns()
    cpu = event_loop.cpu_now(state, now)
    if outer is not None:
        step_end(outer, state, now, cpu, on_loop)
    if inner is not None:
        step_begin(inner, state, now, cpu)
    return now


def resume(led: Ledger, state: event_loop.ThreadState, awaiting: Any, now: int, cpu: int = -1) -> None:
    """Account the resumption at ``now`` (the thread's CPU then: ``cpu``, -1 if not known) of
    ``led``'s coroutine, suspended since ``led.suspended_at``.

    A suspension is one of: ready at once (a bare yield: a checkpoint): all loop wait; on a
    lock, semaphore or queue: the loop wait the estimator gives, the rest queue wait; anything
    else (I/O, mostly): the loop wait the estimator gives, the rest wait. A checkpoint taken
    right before waiting for I/O is part of that wait, not loop wait (and not noted as one):
    anyio's stream yields once after each write, and after the request's body is written the
    model is already working. Only the last checkpoint is: the ones before it come before a
    step that may still write (anyio's yield after the headers comes before the body is sent,
    and the server waits for the body).
    """
    suspended = led.suspended_at
    led.suspended_at = 0
    if led.active_children or answered(led, suspended):
        return
    held = now - suspended
    if led.suspended_ready:
        waited = held
        led.checkpoint_at = suspended
        led.checkpoint_wait = held
    else:
        waited = event_loop.estimate_loop_wait(state, suspended, now, awaiting, cpu)
        primitive = event_loop.waits_on(awaiting) if held >= event_loop.QUEUE_MIN_NS else None
        # A queue's receiving end while tasks the ledger's code spawned still run waits for its
        # own work (Starlette's BaseHTTPMiddleware receives what its call_next task sends: the
        # whole request read as queue wait, on top of that work).
        if primitive is not None and not (event_loop.is_receive(primitive) and _spawned_running(led)):
            # Queue wait until the other task let go; from then on this one was ready, and
            # the time until the loop resumed it is loop wait (as for any suspension).
            led.queued += held - waited
            led.checkpoint_wait = 0
        elif led.checkpoint_wait:
            checkpoint = led.checkpoint_wait
            led.checkpoint_wait = 0
            if suspended - (led.checkpoint_at + checkpoint) < CHECKPOINT_GAP_NS:  # right before it
                led.loop_wait -= checkpoint
                noted = (led.checkpoint_at, checkpoint)
                if led.waits is not None and noted in led.waits:
                    led.waits.remove(noted)
    if waited:
        led.loop_wait += waited
        if waited >= SLICE_NOTE_NS:
            led.waits = note(led.waits, now - waited, waited)


def _spawned_running(led: Ledger) -> bool:
    """Whether a task that ``led``'s code (or a stage inside it) spawned is still running."""
    request = led.request
    if request is None:
        return False
    for other in request.ledgers:
        if other.site is SPAWNED and not other.end:
            spawner = other.spawner
            while spawner is not None and spawner is not led:
                spawner = spawner.parent
            if spawner is led:
                return True
    return False


def close(led: Ledger, end: int = 0) -> bool:
    """End ``led`` at ``end`` (default: now) and report its interval to its parent; returns
    whether it was the last open ledger of its request (which is then to be handed on)."""
    led.end = end = end or clock.wall_ns()
    parent = led.parent
    if parent is not None:
        parent.active_children -= 1
        if parent.child_spans is None:
            parent.child_spans = [(led.start, end)]
        else:
            parent.child_spans.append((led.start, end))
        if led.consumer:
            parent.child_consumer += led.consumer
    request = led.request
    if request is None:
        return False
    # Read and written with no call between (no switch of threads can fall there under the
    # GIL), so of two threads closing a request's last two ledgers only one sees zero.
    left = request.pending - 1
    request.pending = left
    return left == 0


def note(notes: list[tuple[int, int]] | None, start: int, duration: int) -> list[tuple[int, int]]:
    """Add ``(start, duration)`` to a bounded list of notes, keeping the longest ``MAX_NOTES``."""
    if notes is None:
        return [(start, duration)]
    if len(notes) < MAX_NOTES:
        notes.append((start, duration))
    else:  # keep the longest: replace the shortest if this one is longer
        shortest = min(range(MAX_NOTES), key=lambda i: notes[i][1])
        if notes[shortest][1] < duration:
            notes[shortest] = (start, duration)
    return notes


def covered_ns(spans: list[tuple[int, int]] | None, start: int, end: int) -> int:
    """Length of the union of ``spans`` clipped to [start, end]."""
    if not spans:
        return 0
    total = 0
    cursor = start
    for s, e in sorted(spans):
        s = max(s, cursor)
        e = min(e, end)
        if e > s:
            total += e - s
            cursor = e
    return total


def cpu_of(led: Ledger) -> int:
    """The ledger's CPU in ns: never negative (a step between inferred clock readings can be
    off by up to ``event_loop.CPU_REUSE_NS``, see :func:`tracekit._core.event_loop.cpu_now`)."""
    cpu = led.cpu_on + led.cpu_off
    return cpu if cpu > 0 else 0


def split(led: Ledger, end: int) -> tuple[int, int, int, int]:
    """``(wall, children, wait, loop_wait)`` of ``led`` ended at ``end``, in ns (module doc).

    ``cpu`` is ``led.cpu_on + led.cpu_off``; ``consumer``, ``gc`` and ``queued`` are the
    ledger's, as recorded.
    """
    start = led.start
    wall = end - start
    if wall < 0:
        wall = 0
    spans = led.child_spans
    children = covered_ns(spans, start, start + wall) - led.child_consumer if spans else 0
    if children < 0:
        children = 0
    free = wall - children - led.consumer - cpu_of(led) - led.gc - led.queued
    if free < 0:
        free = 0
    loop_wait = led.loop_wait if led.loop_wait < free else free
    return wall, children, free - loop_wait, loop_wait
