"""Times every resumption ("step") of a coroutine, and sync calls, into a ledger.

:func:`drive` is a generator used as ``__await__``: it resumes the wrapped coroutine with
``send``/``throw`` exactly as the awaiting Task would, and yields whatever the coroutine
yields (futures, ``None`` for ``sleep(0)``), so the Task sees no difference. Values,
exceptions, cancellation (``CancelledError`` thrown in) and ``close()`` pass through
unchanged; tracekit's own bookkeeping errors are logged once and never reach the app.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from tracekit import _accounting, _clock, _loop
from tracekit._accounting import Ledger
from tracekit._failsafe import internal_error


class Stepped:
    """``await Stepped(coro, ledger)`` runs ``coro`` with each step timed into ``ledger``."""

    __slots__ = ("awaiting", "coro", "ledger")

    def __init__(self, coro: Any, ledger: Ledger, awaiting: Any = None) -> None:
        self.coro = coro
        self.ledger = ledger
        self.awaiting = awaiting

    def __await__(self) -> Generator[Any, Any, Any]:
        return drive(self.coro, self.ledger, self.awaiting)


def drive(coro: Any, led: Ledger, awaiting: Any = None) -> Generator[Any, Any, Any]:
    """Drive ``coro`` step by step, accounting each step to ``led`` (see module doc).

    ``coro`` is anything with ``send``/``throw``/``close`` (a coroutine, an async generator's
    ``asend`` awaitable). ``awaiting`` is what to inspect for a timer deadline when resuming
    (default ``coro``). A ``with stage(...)`` block opened inside the coroutine takes over its
    steps while open: the step's owner is whatever ledger is on top when it suspends.
    """
    state = _loop.thread_state()
    send, throw = coro.send, coro.throw
    inspect = coro if awaiting is None else awaiting
    cursor = led  # the ledger that owns this coroutine's steps (led, or an open block)
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            now = _accounting.resume(cursor, state, inspect) if cursor.suspended_at else _clock.wall_ns()
            _accounting.step_begin(cursor, state, now)
        except Exception:
            internal_error("step start")
        try:
            yielded = send(value) if error is None else throw(error)
        except BaseException as exc:  # StopIteration (return) included: pass it through as is
            _end_step(state, led, suspended=False)
            if isinstance(exc, StopIteration):
                return exc.value
            raise
        cursor = _end_step(state, led, suspended=True)
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # CancelledError and anything else thrown in by the Task
            value, error = None, exc


def _end_step(state: _loop.ThreadState, led: Ledger, suspended: bool) -> Ledger:
    """End the open step (``led``'s, or a block's opened inside it); returns its owner."""
    owner = state.top
    try:
        if owner is None:  # our step was already closed: bookkeeping went wrong somewhere
            return led
        end = _accounting.step_end(owner, state, on_loop=True)
        if suspended:
            owner.suspended_at = end
        return owner
    except Exception:
        internal_error("step end")
        return led
