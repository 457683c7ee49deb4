"""Times every resumption ("step") of a coroutine into a ledger.

``await Stepped(coro, ledger)`` resumes the wrapped coroutine with ``send``/``throw`` exactly
as the awaiting Task would, and yields whatever the coroutine yields (futures, ``None`` for
``sleep(0)``), so the Task sees no difference. Values, exceptions, cancellation
(``CancelledError`` thrown in) and ``close()`` pass through unchanged; tracekit's own
bookkeeping errors are logged once and never reach the app.

The middleware drives each request's application coroutine this way. Async stages and blocks
entered while a driver steps their task need no driver of their own: they switch the open
step to their ledger and back (:func:`tracekit._core.ledger.switch`), and a suspension inside
them ends whichever ledger's step is open then, so the driver resumes that ledger next. A
driver whose step is not nested in another one's is the step's **outermost** driver: it
opens and closes the thread's loop slice (:mod:`tracekit._core.event_loop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Final

from tracekit._core import clock, event_loop, ledger, loop_view
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import SPAWNED, Ledger

_get_running_loop: Final = asyncio._get_running_loop
_current_task: Final = asyncio.current_task


class Stepped:
    """``await Stepped(coro, ledger)`` runs ``coro`` with each step timed into ``ledger``."""

    __slots__ = ("awaiting", "coro", "ledger")

    def __init__(self, coro: Any, ledger: Ledger, awaiting: Any = None) -> None:
        self.coro = coro
        self.ledger = ledger
        self.awaiting = awaiting

    def __await__(self) -> Generator[Any, Any, Any]:
        return drive(self.coro, self.ledger, self.awaiting)


class Detached:
    """What :func:`drive` returns when it stops driving a spawned task whose request was
    handed on: the value or error to resume its coroutine with."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


def drive(coro: Any, led: Ledger, awaiting: Any = None) -> Generator[Any, Any, Any]:
    """Drive ``coro`` step by step, accounting each step to ``led`` (see module doc).

    ``coro`` is anything with ``send``/``throw``/``close`` (a coroutine, an async generator's
    ``asend`` awaitable). ``awaiting`` is what to inspect for a timer deadline when resuming
    (default ``coro``).
    """
    state = event_loop.thread_state()
    loop = _get_running_loop()
    task = None
    if loop is not None:
        task = _current_task(loop)
        try:  # the loop's view (its probe starts with the next outermost slice)
            view = state.view
            if view is None or view.loop is not loop:
                loop_view.view_for(loop, state)
        except Exception:
            internal_error("loop view")
    send, throw = coro.send, coro.throw
    inspect = coro if awaiting is None else awaiting
    cursor = led  # the ledger whose code runs when coro resumes (led, or a stage inside it)
    value: Any = None
    error: BaseException | None = None
    spawned_by = led.request if led.site is SPAWNED else None
    while True:
        if spawned_by is not None and spawned_by.pending < 0:
            # A task of a request already handed on (its linger ended): background from here
            # (tracekit._core.spawned runs the rest).
            return Detached(value, error)
        outermost = False
        try:
            now = clock.wall_ns()
            cpu = event_loop.cpu_now(state, now)  # read together: nothing may allocate in between
            if cursor.suspended_at:
                ledger.resume(cursor, state, inspect, now, cpu)
            if not state.slice_start:
                outermost = True
                event_loop.slice_begin(state, now, cpu, task, loop)
            ledger.step_begin(cursor, state, now, cpu)
        except Exception:
            internal_error("step start")
        try:
            yielded = send(value) if error is None else throw(error)
        except BaseException as exc:  # StopIteration (return) included: pass it through as is
            _end_step(state, led, outermost, False, False)
            if isinstance(exc, StopIteration):
                return exc.value
            raise
        cursor = _end_step(state, led, outermost, True, yielded is None)
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # CancelledError and anything else thrown in by the Task
            value, error = None, exc


def _end_step(state: event_loop.ThreadState, led: Ledger, outermost: bool, suspended: bool,
              ready: bool) -> Ledger:  # fmt: skip
    """End the step open on this thread (``led``'s, or a stage's entered inside it); returns
    its owner, the ledger to resume. ``ready``: the coroutine suspended with a bare yield (the
    task is rescheduled at once)."""
    try:
        end = clock.wall_ns()
        cpu = event_loop.cpu_now(state, end)
        owner = state.top
        if owner is not None:
            ledger.step_end(owner, state, end, cpu, True)
            if suspended:
                owner.suspended_at = end
                owner.suspended_ready = ready
        if outermost:
            event_loop.slice_end(state, end, cpu, True)
            view = state.view
            if view is not None and not state.seq & loop_view.SAMPLE_MASK:
                # tracekit's bookkeeping after a step, measured on one slice in SAMPLE_MASK + 1
                # (a CPU-clock reading is a system call), counted for all of them
                view.tracekit_ns += (clock.cpu_ns() - cpu) * (loop_view.SAMPLE_MASK + 1)
        return owner or led  # None: our step was already closed, bookkeeping went wrong
    except Exception:
        internal_error("step end")
        return led
