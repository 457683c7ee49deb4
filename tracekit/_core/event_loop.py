"""Per-thread step state, the event loop's busy slices, and the loop-wait estimator.

Every instrumented *step* (one resumption of a stage's or request's coroutine, or one sync
stage call) that starts while no other step is open on its thread is an **outermost slice**:
on the event-loop thread it is a stretch of time during which the loop ran our code and
nothing else. Those slices go into a ring buffer per thread, and are what the loop-wait
estimator reads (DESIGN §1).

Loop-wait estimator (documented with its bias and measured accuracy in docs/attributes.md):
when a suspended coroutine resumes at ``resumed`` after suspending at ``suspended``:

1. If no outermost slice ended during the suspension, the loop ran none of our code
   meanwhile: loop_wait = 0 (uninstrumented callbacks are invisible; bias: low).
2. If the coroutine was waiting on a timer (``asyncio.sleep``), its ready time is known
   exactly: suspended + delay (read from the suspended ``sleep`` frame, which works on both
   the stdlib loop and uvloop). loop_wait = resumed - max(ready, suspended), or 0 when no
   slice ended after the deadline (the loop was idle then: the rest is timer lateness).
3. Otherwise (I/O, a future set by another task), the ready time is unknowable: if the loop
   was busy right up to the resumption (the last slice ended less than ``GAP_NS`` before it),
   take the contiguous busy run ending there, clipped to the suspension, and assume the
   readiness arrived uniformly within it: loop_wait = run / 2. Unbiased for one long
   blocking slice; overestimates when the run is many short callbacks, because the loop
   serves readiness between callbacks, not only at the end of the run.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Final

from tracekit._core import clock

if TYPE_CHECKING:
    from tracekit._core.ledger import Ledger

# A CPU-clock reading within this many ns of wall time after the last real one on the same
# thread is inferred from it (see cpu_now).
CPU_REUSE_NS: Final = 20_000
RING: Final = 256  # outermost slices remembered per thread; the estimator looks back at most this far
GAP_NS: Final = 1_000_000  # busy slices closer than this count as one busy run (loop dispatch, select)

_SLEEP_CODE: Final = asyncio.sleep.__code__


class ThreadState:
    """What one thread is running now, and its recent outermost slices (loop threads).

    Each field has one writer: ``top`` (the innermost open step) is written by
    :mod:`tracekit._core.ledger` as steps begin and end; ``watched`` and ``cell`` by the
    watchdog (:mod:`tracekit._core.watchdog`); everything else by this module.
    """

    __slots__ = ("cell", "cpu_at", "cpu_last", "ident", "loop", "name", "ring_end", "ring_i",
                 "ring_start", "seq", "slice_start", "task", "top", "watched")  # fmt: skip

    def __init__(self) -> None:
        thread = threading.current_thread()
        self.ident = thread.ident
        self.name = thread.name
        self.top: Ledger | None = None  # innermost ledger with an open step on this thread
        self.slice_start = 0  # wall_ns when the open outermost slice began, 0 when none
        # The task whose coroutine a tracekit driver is stepping right now (None: none is):
        # an async stage entered in that task's step needs no driver of its own.
        self.task: object = None
        # The running loop of that task, while ``task`` is set: asking asyncio for it again
        # (``_get_running_loop``) is a getpid system call per call on Python 3.11.
        self.loop: Any = None
        self.cpu_at = -CPU_REUSE_NS - 1  # wall ns of the last real CPU-clock reading (cpu_now)
        self.cpu_last = 0  # that reading
        self.seq = 0  # number of outermost slices begun, for the watchdog's staleness check
        self.ring_start = [0] * RING
        self.ring_end = [0] * RING
        self.ring_i = 0
        self.watched: object = None  # the watchdog sampling this thread (see _watchdog.py)
        # Where a watchdog polling without the GIL reads slice_start: an array('q') of one
        # item, None when no such watchdog watches this thread (see _watchdog.py).
        self.cell: Any = None


_local: Final = threading.local()


def thread_state() -> ThreadState:
    """This thread's state, created on first use."""
    try:
        state: ThreadState = _local.state
    except AttributeError:
        state = _local.state = ThreadState()
    return state


def cpu_now(state: ThreadState, now: int) -> int:
    """The thread's CPU time at wall time ``now`` (a step boundary).

    Reading the thread CPU clock is a system call (~0.5 µs here), and steps come in bursts: a
    request's stages begin and end microseconds apart. Within ``CPU_REUSE_NS`` of wall time
    after the last real reading on this thread, the reading is inferred as that one plus the
    wall time since: the CPU the thread used in that window is at most the window, so the
    inferred value is high by at most ``CPU_REUSE_NS`` (only if the thread was descheduled
    inside it) and the error never accumulates: it is anchored on a real reading, and a step
    that lasts longer than the window ends with a real one.
    """
    since = now - state.cpu_at
    if 0 <= since <= CPU_REUSE_NS:
        return state.cpu_last + since
    cpu = clock.cpu_ns()
    state.cpu_at = now
    state.cpu_last = cpu
    return cpu


def slice_begin(state: ThreadState, now: int, task: object = None, loop: Any = None) -> None:
    """An outermost slice begins: a driven step (``task``, run by ``loop``, is the task whose
    coroutine a tracekit driver steps), or a sync stage called outside any step."""
    state.slice_start = now
    state.task = task
    state.loop = loop
    state.seq += 1
    cell = state.cell
    if cell is not None:
        cell[0] = now


def slice_end(state: ThreadState, end: int, on_loop: bool) -> None:
    """The open outermost slice ends; on a loop thread it is remembered for the estimator."""
    start = state.slice_start
    state.slice_start = 0
    state.task = state.loop = None
    cell = state.cell
    if cell is not None:
        cell[0] = 0
    if on_loop:
        record_slice(state, start, end)


def record_slice(state: ThreadState, start: int, end: int) -> None:
    """Remember one outermost slice (ring buffer, overwrites the oldest)."""
    i = state.ring_i % RING
    state.ring_start[i] = start
    state.ring_end[i] = end
    state.ring_i += 1


def sleep_ready_ns(awaiting: Any, suspended: int) -> int | None:
    """Ready time of a coroutine suspended in ``asyncio.sleep``, else None.

    Follows the chain of ``cr_await`` (coroutines), ``ag_await`` (async generators) and
    ``gi_yieldfrom`` down to the innermost awaitable; if that is the ``asyncio.sleep``
    coroutine, its frame's ``delay`` gives the deadline.
    """
    node = getattr(awaiting, "cr_await", None) or getattr(awaiting, "ag_await", None)
    for _ in range(64):  # bounded: a hostile or cyclic chain must not hang the request
        if node is None:
            return None
        if getattr(node, "cr_code", None) is _SLEEP_CODE:
            frame = node.cr_frame
            delay = frame.f_locals.get("delay") if frame is not None else None
            if isinstance(delay, (int, float)) and delay > 0:
                return suspended + int(delay * 1e9)
            return None
        node = (
            getattr(node, "cr_await", None)
            or getattr(node, "gi_yieldfrom", None)
            or getattr(node, "ag_await", None)
        )
    return None


def estimate_loop_wait(state: ThreadState, suspended: int, resumed: int, awaiting: Any) -> int:
    """Estimated ns the resumed coroutine was ready but the loop was busy (see module doc)."""
    count = min(state.ring_i, RING)
    if count == 0:
        return 0
    last = (state.ring_i - 1) % RING
    ends, starts = state.ring_end, state.ring_start
    if ends[last] <= suspended:
        return 0
    ready = sleep_ready_ns(awaiting, suspended)
    if ready is not None:
        if ends[last] <= ready:  # the loop went idle before the deadline: timer lateness only
            return 0
        return max(0, resumed - max(ready, suspended))
    if resumed - ends[last] > GAP_NS:
        return 0
    run_start = starts[last]
    for back in range(1, count):
        j = (last - back) % RING
        if ends[j] <= suspended or ends[j] < run_start - GAP_NS:
            break
        run_start = min(run_start, starts[j])
    run_start = max(run_start, suspended)
    return max(0, resumed - run_start) // 2
