"""Per-thread step state, the event loop's busy slices, and the loop-wait estimator.

Every instrumented *step* (one resumption of a stage's or request's coroutine, or one sync
stage call) that starts while no other step is open on its thread is an **outermost slice**:
on the event-loop thread it is a stretch of time during which the loop ran our code and
nothing else. The estimator reads when the last one ended, and the loop view their totals
(DESIGN §1).

Loop-wait estimator (documented with its bias and measured accuracy in docs/attributes.md):
when a suspended coroutine resumes at ``resumed`` after suspending at ``suspended``:

0. If the coroutine suspended with a bare yield (``asyncio.sleep(0)``, anyio's checkpoints),
   its task was rescheduled at once: the whole suspension is loop wait (exact; decided by
   :func:`tracekit._core.ledger.resume`, from what the driver saw it yield).
1. If no outermost slice ended during the suspension, the loop ran none of our code
   meanwhile: loop_wait = 0 (uninstrumented callbacks are invisible; bias: low).
2. If the coroutine was waiting on a timer (``asyncio.sleep``), its ready time is known
   exactly: suspended + delay (read from the suspended ``sleep`` frame, which works on both
   the stdlib loop and uvloop). loop_wait = resumed - max(ready, suspended), or 0 when no
   slice ended after the deadline (the loop was idle then: the rest is timer lateness).
3. Otherwise (I/O, a future set by another task), the ready time is not recorded anywhere.
   If the loop was busy right up to the resumption (the last slice ended less than
   ``GAP_NS`` before it), the coroutine waited for the loop as long as work made ready from
   outside waits there now: the loop probe's latest measurement if it was made during the
   suspension or in the probe period before it (``PROBE_NS``; ``ThreadState.lag``,
   :mod:`tracekit._core.loop_view`: a timer whose callback makes a second callback ready,
   as an I/O callback makes a task ready), or the time the probe's pending timer has been
   overdue if that is longer: work made ready then is still waiting, as the resumed
   coroutine did (the latest measurement predates it). Of a traced slice that held the loop
   across the timer's deadline only half its time after the deadline counts (one long block:
   the readiness came at an unknown point of it). Never longer than the busy run ending at
   the resumption (clipped to the suspension). Otherwise the loop was idle when the
   readiness came: loop_wait = 0. And when the loop thread was off-CPU for most of the gap
   (over ``IDLE_GAP_NS``) between the last traced slice and the resumption, the loop was
   idle (or its thread preempted) there: readiness that came in the gap waited at most for
   the untraced work the loop ran in it, its CPU in the gap, not for a lag measured before
   it (a reply that came after another request's block, with the loop idle meanwhile).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING, Any, Final

from tracekit._core import clock

if TYPE_CHECKING:
    from tracekit._core.ledger import Ledger

# A CPU-clock reading within this many ns of wall time after the last real one on the same
# thread is inferred from it (see cpu_now).
CPU_REUSE_NS: Final = 20_000
# A loop that ran no traced slice this long before a resumption was idle then, or running a
# little untraced work (the server's callbacks, the probe): the readiness came then, when the
# probe (every 10 ms while traced work runs) would have seen a busy loop.
GAP_NS: Final = 10_000_000
# A gap between the last traced slice and a resumption longer than this is read by the loop
# thread's CPU in it: mostly off-CPU, the loop was idle (see the module docstring).
IDLE_GAP_NS: Final = 1_000_000
# The loop probe's period (tracekit._core.loop_view runs it): a measurement from the period
# before a suspension began still speaks for it.
PROBE_NS: Final = 10_000_000
# Suspensions at least this long are checked for what they waited on (a lock, a queue, ...).
QUEUE_MIN_NS: Final = 1_000_000

_SLEEP_CODE: Final = asyncio.sleep.__code__


class ThreadState:
    """What one thread is running now, and its recent outermost slices (loop threads).

    Each field has one writer: ``top`` (the innermost open step) is written by
    :mod:`tracekit._core.ledger` as steps begin and end; ``watched`` and ``cell`` by the
    watchdog (:mod:`tracekit._core.watchdog`); ``gc`` by :mod:`tracekit._core.gc_pauses`;
    ``lag`` and ``view`` by :mod:`tracekit._core.loop_view`; everything else by this module.
    """

    __slots__ = ("block_due", "block_end", "busy_cpu", "busy_wall", "cell", "cpu_at", "cpu_last",
                 "gc", "gc_wall", "ident", "lag", "lag_at", "last_end", "last_end_cpu", "loop", "name",
                 "probe_due", "run_start", "seq", "slice_c0", "slice_start", "task", "top", "view",
                 "watched")  # fmt: skip

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
        self.slice_c0 = 0  # thread CPU ns when the open outermost slice began
        # Loop threads: CPU and wall time of all outermost slices so far (tracekit._core.loop_view
        # reads them per window).
        self.busy_cpu = self.busy_wall = 0
        # The loop's recent queueing delay (ns) for work made ready from outside, measured by
        # the loop probe (tracekit._core.loop_view): what an I/O resumption waits for the loop.
        self.lag = 0
        self.lag_at = 0  # when it was measured (wall ns)
        self.gc: Any = None  # garbage collections on this thread (tracekit._core.gc_pauses.Pauses)
        self.gc_wall = 0  # their wall ns so far (GC_CLOCK less this: other threads' collections)
        self.view: Any = None  # the loop view of the loop this thread runs (tracekit._core.loop_view)
        self.last_end = 0  # wall ns when the last outermost slice on a loop thread ended
        self.last_end_cpu = -1  # thread CPU ns then (-1: not known)
        self.run_start = 0  # when the busy run it ends began (slices less than GAP_NS apart)
        # When the loop probe's pending timer is due (0: none pending); a resumption after it
        # with the probe not yet run has waited for the loop at least since then.
        self.probe_due = 0
        # The end of the traced slice that held the loop across the probe deadline
        # ``block_due`` (the estimator counts half of that slice's time after the deadline).
        self.block_due = self.block_end = 0
        self.watched: object = None  # the watchdog sampling this thread (see _watchdog.py)
        # Where a watchdog polling without the GIL reads slice_start: an array('q') of one
        # item, None when no such watchdog watches this thread (see _watchdog.py).
        self.cell: Any = None


class GcClock:
    """Wall ns of the garbage collections so far on every thread of the process (written by
    :mod:`tracekit._core.gc_pauses`'s hook, under the GIL). A collection holds the GIL from
    start to end: a step of another thread that needs it waits the collection out."""

    __slots__ = ("wall",)

    def __init__(self) -> None:
        self.wall = 0


GC_CLOCK: Final = GcClock()


def others_gc_ns(state: ThreadState) -> int:
    """Wall ns of the collections run so far on threads other than ``state``'s."""
    return GC_CLOCK.wall - state.gc_wall


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


def slice_begin(state: ThreadState, now: int, cpu: int, task: object = None, loop: Any = None) -> None:
    """An outermost slice begins at wall time ``now``, thread CPU ``cpu``: a driven step
    (``task``, run by ``loop``, is the task whose coroutine a tracekit driver steps), or a sync
    stage called outside any step."""
    state.slice_start = now
    state.slice_c0 = cpu
    view = state.view
    if view is not None and not view.probing:  # traced work again: probe the loop
        view.start_probe()
    state.task = task
    state.loop = loop
    state.seq += 1
    cell = state.cell
    if cell is not None:
        cell[0] = now


def slice_end(state: ThreadState, end: int, cpu: int, on_loop: bool) -> None:
    """The open outermost slice ends (wall ``end``, thread CPU ``cpu``); on a loop thread it
    is remembered for the estimator and counted as the loop's traced work."""
    start = state.slice_start
    state.slice_start = 0
    state.task = state.loop = None
    cell = state.cell
    if cell is not None:
        cell[0] = 0
    if on_loop:
        record_slice(state, start, end, cpu)
        state.busy_cpu += cpu - state.slice_c0


def record_slice(state: ThreadState, start: int, end: int, cpu: int = -1) -> None:
    """Count one outermost slice of a loop thread (``start`` to ``end``, wall ns; the thread's
    CPU ns at its end, -1 if not known)."""
    if start - state.last_end > GAP_NS:
        state.run_start = start
    state.last_end = end
    state.last_end_cpu = cpu
    state.busy_wall += end - start
    due = state.probe_due
    if start < due < end:
        state.block_due = due
        state.block_end = end


def _awaited(node: Any) -> Any:
    """What ``node`` (a coroutine, generator or async generator) awaits, or None."""
    return (
        getattr(node, "cr_await", None)
        or getattr(node, "gi_yieldfrom", None)
        or getattr(node, "ag_await", None)
    )


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
        node = _awaited(node)
    return None


_sync_codes: frozenset[Any] = frozenset()
_receive_codes: frozenset[Any] = frozenset()
_sync_codes_anyio = False


def _synchronization_codes() -> frozenset[Any]:
    """The code of the coroutines that wait for another task of the process: asyncio's and,
    once imported, anyio's locks, semaphores, conditions and queues (not events: anyio's
    sockets wait for data on an ``asyncio.Event``); of those, the receiving ends of queues
    in ``_receive_codes``."""
    global _sync_codes, _receive_codes, _sync_codes_anyio
    anyio_backend = sys.modules.get("anyio._backends._asyncio")
    if _sync_codes and (_sync_codes_anyio or anyio_backend is None):
        return _sync_codes
    functions: list[Any] = [asyncio.Lock.acquire, asyncio.Semaphore.acquire, asyncio.Condition.wait,
                            asyncio.Queue.get, asyncio.Queue.put]  # fmt: skip
    receives: list[Any] = [asyncio.Queue.get]
    if anyio_backend is not None:
        memory = sys.modules.get("anyio.streams.memory")
        functions += [getattr(anyio_backend, name).__dict__.get(method) for name, method in
                      (("Lock", "acquire"), ("Semaphore", "acquire"),
                       ("CapacityLimiter", "acquire_on_behalf_of"))]  # fmt: skip
        if memory is not None:
            functions += [memory.MemoryObjectReceiveStream.receive, memory.MemoryObjectSendStream.send]
            receives.append(memory.MemoryObjectReceiveStream.receive)
        _sync_codes_anyio = True
    _receive_codes = frozenset(f.__code__ for f in receives if hasattr(f, "__code__"))
    _sync_codes = frozenset(f.__code__ for f in functions if hasattr(f, "__code__"))
    return _sync_codes


def waits_on(awaiting: Any) -> Any:
    """The code of the lock, semaphore, condition or queue operation the coroutine
    ``awaiting`` is suspended on (waiting for another task of this process: queue wait, not
    I/O), or None."""
    codes = _synchronization_codes()
    node = getattr(awaiting, "cr_await", None) or getattr(awaiting, "ag_await", None)
    for _ in range(64):  # bounded: a hostile or cyclic chain must not hang the request
        if node is None:
            return None
        code = getattr(node, "cr_code", None)
        if code in codes:
            return code
        node = _awaited(node)
    return None


def is_receive(code: Any) -> bool:
    """Whether ``code`` (of :func:`waits_on`) is a queue's receiving end."""
    return code in _receive_codes


def estimate_loop_wait(state: ThreadState, suspended: int, resumed: int, awaiting: Any, cpu: int = -1) -> int:
    """Estimated ns the resumed coroutine was ready but the loop was busy (see module doc);
    ``cpu``: the loop thread's CPU ns at ``resumed`` (-1: not known)."""
    last_end = state.last_end
    if last_end <= suspended:
        return 0
    ready = sleep_ready_ns(awaiting, suspended)
    if ready is not None:
        if last_end <= ready:  # the loop went idle before the deadline: timer lateness only
            return 0
        return max(0, resumed - max(ready, suspended))
    if resumed - last_end > GAP_NS:
        return 0
    # Measured during the suspension, or in the probe period before it began: a suspension
    # shorter than the period (a stream's next chunk) mostly contains no measurement.
    lag = state.lag if state.lag_at > suspended - PROBE_NS else 0
    due = state.probe_due
    if due and resumed - due > lag:
        # The probe's timer overdue: work made ready by then waits still. A slice that held the
        # loop across the deadline counts half (the readiness came at an unknown point of it).
        overdue = resumed - due
        if state.block_due == due:
            overdue -= (min(state.block_end, resumed) - due) // 2
        if overdue > lag:
            lag = overdue
    run = resumed - max(state.run_start, suspended)
    if lag > run:
        lag = run
    gap = resumed - last_end
    if gap > IDLE_GAP_NS and cpu >= 0 and state.last_end_cpu >= 0:
        gap_cpu = cpu - state.last_end_cpu
        if gap_cpu >= 0 and 2 * gap_cpu < gap and gap_cpu < lag:
            return gap_cpu
    return lag
