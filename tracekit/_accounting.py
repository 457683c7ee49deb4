"""The ledger: where a stage's (or a request's own) wall time went (DESIGN §1).

A :class:`Ledger` is filled step by step on the hot path with integer nanoseconds and plain
counters; nothing here touches OpenTelemetry. :func:`components` turns a closed ledger into
the ``tracekit.*`` millisecond figures, off the hot path.

Split of a ledger's wall time, each nanosecond counted once::

    wall = cpu + wait + loop_wait + children + consumer

- ``cpu``: thread CPU of the ledger's own steps; a nested stage's step CPU is subtracted from
  the step that contains it (``nested_cpu``), so CPU is exclusive.
- ``children``: wall time covered by direct child stages (union of their intervals).
- ``consumer``: async-generator stages only: time the consumer held a yielded item.
- ``loop_wait``: estimated by :mod:`tracekit._loop` at each resumption.
- ``wait``: the rest: suspended waiting on I/O / the model, or blocked off-CPU in a sync call.
"""

from __future__ import annotations

from typing import Any

from tracekit import _clock, _loop

MS = 1e6
SLICE_NOTE_NS = 1_000_000  # slices/waits at least this long are kept for the loop timeline
MAX_NOTES = 32  # per ledger; the longest are kept


class Ledger:
    """Accounting for one stage (or the request's own code, ``kind="request"``).

    Fields set on every ledger are slots; rarely used ones (notes, watchdog catches, extra
    attributes, errors, generator timing) default to the class attributes below and get an
    instance value only when used, so creating a ledger stays cheap.
    """

    __slots__ = (
        "__dict__",
        "active_children",
        "child_spans",
        "cpu_off",
        "cpu_on",
        "end",
        "function",
        "kind",
        "loop_wait",
        "max_block",
        "name",
        "namespace",
        "nested_cpu",
        "parent",
        "prev_top",
        "request",
        "span_id",
        "start",
        "step_c0",
        "step_t0",
        "steps",
        "suspended_at",
    )  # fmt: skip

    consumer = 0  # async generators: ns the consumer held yielded items
    slices: list[tuple[int, int]] | None = None  # (start, duration) >= 1 ms, on the loop
    waits: list[tuple[int, int]] | None = None  # (ready, duration) >= 1 ms
    blocked: list[tuple[int, float, str, str]] | None = None  # watchdog catches
    attributes: dict[str, Any] | None = None
    error: BaseException | None = None
    first_item = 0  # async generators: wall_ns of the first yielded item

    def __init__(self, name: str, kind: str, request: Any, parent: Ledger | None,
                 span_id: int, function: str | None = None,
                 namespace: str | None = None) -> None:  # fmt: skip
        self.name = name
        self.kind = kind
        self.function = function
        self.namespace = namespace
        self.request = request
        self.parent = parent
        self.span_id = span_id
        self.start = _clock.wall_ns()
        self.end = self.cpu_on = self.cpu_off = self.loop_wait = self.max_block = 0
        self.steps = self.active_children = self.suspended_at = 0
        self.step_t0 = self.step_c0 = self.nested_cpu = 0
        self.prev_top: Ledger | None = None
        self.child_spans: list[tuple[int, int]] | None = None  # direct children's (start, end)
        if parent is not None:
            parent.active_children += 1

    def set_attribute(self, key: str, value: Any) -> None:
        """Attach an extra attribute to this stage's span (GenAI, tokens, ...)."""
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value


def step_begin(led: Ledger, state: _loop.ThreadState, now: int) -> None:
    """Open a step of ``led`` on the thread whose state is ``state``, at wall time ``now``.

    Every step reads the thread's CPU clock at its start and end (a system call each). A
    cheaper inference of a nested step's start from the enclosing step's reading was tried and
    dropped: on a host short of CPU the enclosing code's wall time is not CPU time, and the
    nested stage was then under-counted (tests/core/test_stage.py, exclusive-CPU test).
    """
    prev = led.prev_top = state.top
    state.top = led
    led.nested_cpu = 0
    led.step_t0 = now
    if prev is None:
        state.slice_start = now
        state.seq += 1
    led.step_c0 = _clock.cpu_ns()


def step_end(led: Ledger, state: _loop.ThreadState, on_loop: bool) -> int:
    """Close the open step of ``led``; returns the wall time it ended."""
    cpu = _clock.cpu_ns() - led.step_c0
    end = _clock.wall_ns()
    start = led.step_t0
    prev = led.prev_top
    state.top = prev
    led.prev_top = None
    own = cpu - led.nested_cpu
    led.steps += 1
    if prev is None:
        state.slice_start = 0
        if on_loop:
            _loop.record_slice(state, start, end)
    else:
        prev.nested_cpu += cpu
    if on_loop:
        led.cpu_on += own
        held = end - start
        if held > led.max_block:
            led.max_block = held
        if held >= SLICE_NOTE_NS:
            led.slices = _note(led.slices, start, held)
    else:
        led.cpu_off += own
    return end


def resume(led: Ledger, state: _loop.ThreadState, awaiting: Any) -> int:
    """Account a suspended coroutine's resumption; returns the wall time (the step's start)."""
    now = _clock.wall_ns()
    suspended = led.suspended_at
    if suspended and not led.active_children:
        waited = _loop.estimate_loop_wait(state, suspended, now, awaiting)
        if waited:
            led.loop_wait += waited
            if waited >= SLICE_NOTE_NS:
                led.waits = _note(led.waits, now - waited, waited)
    led.suspended_at = 0
    return now


def close(led: Ledger) -> None:
    """End ``led`` now and report its interval to its parent."""
    led.end = end = _clock.wall_ns()
    parent = led.parent
    if parent is not None:
        parent.active_children -= 1
        if parent.child_spans is None:
            parent.child_spans = []
        parent.child_spans.append((led.start, end))


def _note(notes: list[tuple[int, int]] | None, start: int, duration: int) -> list[tuple[int, int]]:
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


def components(led: Ledger, end: int | None = None) -> dict[str, float]:
    """The ledger's split of its wall time, in float milliseconds (see module doc)."""
    start = led.start
    wall = (end if end is not None else led.end) - start
    if wall < 0:
        wall = 0
    spans = led.child_spans
    children = covered_ns(spans, start, start + wall) if spans else 0
    cpu_on, cpu_off = led.cpu_on, led.cpu_off
    cpu = cpu_on + cpu_off
    free = wall - children - led.consumer - cpu
    if free < 0:
        free = 0
    loop_wait = led.loop_wait if led.loop_wait < free else free
    return {
        "wall": wall / MS, "cpu": cpu / MS, "cpu_on": cpu_on / MS, "cpu_off": cpu_off / MS,
        "wait": (free - loop_wait) / MS, "loop_wait": loop_wait / MS, "children": children / MS,
        "consumer": led.consumer / MS, "max_block": led.max_block / MS,
    }  # fmt: skip
