"""The whole event loop: its probe, and what it ran per window (DESIGN §1).

One :class:`LoopView` per event loop a traced request has run on (made by :func:`view_for`
on the loop's thread). It does two things:

**The probe** measures how long work made ready from outside waits for the loop. While
traced work runs on the loop, a timer fires every ``PROBE_S``; its callback makes a second callback
ready (``call_soon``), as an I/O callback (``data_received``) makes the task awaiting the
data ready. The delay from the timer's deadline to the second callback is what a resumption
after I/O waits for the loop, except the timer's own lateness when the loop was idle at the
deadline (the loop sleeps in its poll with millisecond timeouts): then only the second hop
counts. The latest measurement is ``ThreadState.lag``, which the loop-wait estimator reads
(:func:`tracekit._core.event_loop.estimate_loop_wait`); every measurement of a window goes
into its percentiles. Two callbacks per probe, a few µs each: ~0.05% of the loop.

**The window** (:meth:`LoopView.window`, read by the runtime's span-building thread every
``WINDOW_S``) splits the loop thread's CPU time, read from the kernel's per-thread clock, into

- ``requests``: traced work (the outermost slices of requests and of the tasks they spawned,
  :mod:`tracekit._core.spawned`), garbage collection inside them left out;
- ``gc``: collections on the loop thread (:mod:`tracekit._core.gc_pauses`);
- ``tracekit``: tracekit's bookkeeping after each traced step, read with the thread's CPU
  clock on one slice in 64 and scaled (the bookkeeping before a step is inside the step's
  CPU, a fraction of a µs; span building runs on a thread of its own);
- ``background``: the rest: the server's own code (HTTP parsing, writes), tasks and callbacks
  of no request, the loop's own dispatch. Of it, the tasks of no request that another task
  made are named: each of their steps is timed (:mod:`tracekit._core.spawned`), and a window
  gives the ``MAX_TASKS_SHOWN`` coroutines that took the most CPU.

plus the busy share (thread CPU / window wall time), GC pauses by generation, the longest
pause, the requests in flight and the tasks alive, and the time the loop thread was ready to
run but waited for a CPU (the kernel's run-queue delay, ``/proc/self/task/<tid>/schedstat``,
where Linux keeps it): on a host short of CPU that time falls inside steps and waits, and
nothing else tells it from waiting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Final

from tracekit._core import clock, event_loop, gc_pauses
from tracekit._core.failsafe import internal_error
from tracekit._core.gc_pauses import GENERATIONS, Pauses

PROBE_NS: Final = event_loop.PROBE_NS  # the loop-wait estimator reads the period too
PROBE_S: Final = PROBE_NS / 1e9
# tracekit's own CPU after a traced step is read on one outermost slice in SAMPLE_MASK + 1.
SAMPLE_MASK: Final = 63
MAX_LAGS: Final = 1024  # probe measurements kept per window (a probe every 10 ms: 100 a second)
# Background task names counted per window (new names past it are not), and exported.
MAX_BACKGROUND_NAMES: Final = 64
MAX_TASKS_SHOWN: Final = 8


def _runqueue_ns(path: str) -> int:
    # The thread's run-queue delay so far (ns): the second field of its scheduler statistics
    # (Linux: CPU time, run-queue delay, slices); -1 when unknown (elsewhere, or it ended).
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _thread_cpu_clock(ident: int | None) -> int | None:
    """The kernel's CPU clock of thread ``ident`` (readable from any thread), where it has one."""
    try:
        return time.pthread_getcpuclockid(ident or 0)
    except (AttributeError, OSError):
        return None


class LoopView:
    """One event loop: its probe (run on the loop's thread) and its window counters."""

    def __init__(self, loop: asyncio.AbstractEventLoop, state: event_loop.ThreadState) -> None:
        self.loop = loop
        self.state = state
        self.thread_name = state.name
        self.cpu_clock = _thread_cpu_clock(state.ident)
        # Made on the loop's thread: its own scheduler statistics.
        self.schedstat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self.inflight = 0  # traced requests running on this loop now (written on the loop thread)
        self.factory = False  # tracekit's task factory is installed (tracekit._core.asgi)
        self.tracekit_ns = 0  # tracekit's bookkeeping after traced steps, sampled (tracekit._core.driver)
        # Background tasks' CPU this window by coroutine name, ns (tracekit._core.spawned).
        self.background: dict[str, int] = {}
        self.probing = False
        self._busy_at_schedule = 0
        self.deadline = 0
        self.fired = 0
        self.lags: list[int] = []  # this window's probe measurements, ns
        self.tasks = -1  # tasks alive, counted by the first probe of a window (-1: not yet)
        self._count_tasks = True
        # The previous window's readings (read and written by the span-building thread only).
        self._at = clock.wall_ns()
        self._cpu = self._read_cpu()
        self._busy_cpu = state.busy_cpu
        self._tracekit = 0
        self._gc = _gc_snapshot(state.gc)
        self._runqueue = _runqueue_ns(self.schedstat)

    # --- the probe (loop thread) ------------------------------------------------------------
    def request_started(self) -> None:
        """A traced request begins on this loop: count it, and probe while any runs."""
        self.inflight += 1
        self.start_probe()

    def request_ended(self) -> None:
        self.inflight -= 1

    def start_probe(self) -> None:
        """Probe while traced work runs on this loop (traced requests in flight, or traced
        steps since the last probe)."""
        if not self.probing and not self.loop.is_closed():
            self.probing = True
            try:
                self._schedule()
            except Exception:  # not this loop's thread, or the loop stopped: next time
                self.probing = False

    def _schedule(self) -> None:
        self.deadline = self.state.probe_due = clock.wall_ns() + PROBE_NS
        self._busy_at_schedule = self.state.busy_wall
        self.loop.call_later(PROBE_S, self._fire)

    def _fire(self) -> None:
        try:
            self.fired = clock.wall_ns()
            self.loop.call_soon(self._hop)
        except Exception:
            self.probing = False
            internal_error("loop probe")

    def _hop(self) -> None:
        try:
            now = clock.wall_ns()
            state = self.state
            # The loop was busy at the deadline if traced work ran past it (or runs now): the
            # timer's lateness was queueing. Otherwise it was the poll's timeout rounding.
            busy = state.slice_start != 0 or state.last_end > self.deadline
            lag = now - (self.deadline if busy and self.fired > self.deadline else self.fired)
            state.lag = lag
            state.lag_at = now
            state.probe_due = 0
            if len(self.lags) < MAX_LAGS:
                self.lags.append(lag)
            if self._count_tasks:
                self._count_tasks = False
                self.tasks = len(asyncio.all_tasks(self.loop))
            if self.inflight > 0 or state.busy_wall != self._busy_at_schedule:
                self._schedule()
            else:  # nothing traced ran since the last probe: stop until something does
                self.probing = False
                state.lag = 0
        except Exception:
            self.probing = False
            internal_error("loop probe")

    def background_step(self, name: str, cpu: int) -> None:
        """A background task's step took ``cpu`` ns outside traced work."""
        background = self.background
        if name in background or len(background) < MAX_BACKGROUND_NAMES:
            background[name] = background.get(name, 0) + cpu

    # --- the window (span-building thread) --------------------------------------------------
    def _read_cpu(self) -> int:
        if self.cpu_clock is None:
            return 0
        try:
            return time.clock_gettime_ns(self.cpu_clock)
        except OSError:  # the loop's thread has ended
            self.cpu_clock = None
            return 0

    def window(self) -> dict[str, Any] | None:
        """What the loop ran since the last call: ``start``/``end`` (wall ns) and the figures
        of the module doc (ns, counts); None when the thread's CPU clock cannot be read."""
        end = clock.wall_ns()
        cpu = self._read_cpu()
        if self.cpu_clock is None:
            return None
        state = self.state
        busy_cpu = state.busy_cpu
        tracekit = self.tracekit_ns
        gc_now = _gc_snapshot(state.gc)
        lags, self.lags = self.lags, []
        tasks_cpu, self.background = self.background, {}
        tasks, self.tasks = self.tasks, -1
        runqueue_now = _runqueue_ns(self.schedstat)
        runqueue = -1
        if runqueue_now >= 0 and self._runqueue >= 0:
            runqueue = runqueue_now - self._runqueue
        self._runqueue = runqueue_now
        self._count_tasks = True
        start = self._at
        thread_cpu = cpu - self._cpu
        gc = [now - before for now, before in zip(gc_now, self._gc, strict=True)]
        gc_cpu, gc_in_slices, gc_wall = gc[0], gc[1], gc[2]
        requests = max(0, busy_cpu - self._busy_cpu - gc_in_slices)
        own = tracekit - self._tracekit
        self._at, self._cpu, self._busy_cpu, self._tracekit, self._gc = end, cpu, busy_cpu, tracekit, gc_now
        pauses = state.gc
        longest = pauses.longest if pauses is not None else 0
        longest_cpu = pauses.longest_cpu if pauses is not None else 0
        longest_gen = pauses.longest_gen if pauses is not None else 0
        if pauses is not None:
            # Read and reset here, per window (a pause ending between the two is lost: the
            # loop thread writes it, this is the one other write, on a rarely used field).
            pauses.longest = pauses.longest_cpu = 0
        return {
            "start": start, "end": end, "thread_cpu": thread_cpu, "requests": requests,
            "gc": gc_cpu, "gc_wall": gc_wall, "tracekit": own,
            "background": max(0, thread_cpu - requests - gc_cpu - own),
            "gc_counts": gc[3:], "gc_longest": longest,
            "gc_longest_cpu": longest_cpu, "gc_longest_gen": longest_gen,
            "lags": lags, "inflight": self.inflight, "tasks": tasks, "runqueue": runqueue,
            "thread": self.thread_name,
            "background_tasks": sorted(tasks_cpu.items(), key=_most_cpu)[:MAX_TASKS_SHOWN],
        }  # fmt: skip


def _most_cpu(item: tuple[str, int]) -> int:
    return -item[1]


def _gc_snapshot(pauses: Pauses | None) -> list[int]:
    if pauses is None:
        return [0, 0, 0] + [0] * GENERATIONS
    return [pauses.cpu, pauses.in_slices, pauses.wall, *pauses.count]


_lock: Final = threading.Lock()
views: list[LoopView] = []  # every loop view made in this process (the runtime reads them)


def view_for(loop: asyncio.AbstractEventLoop, state: event_loop.ThreadState) -> LoopView:
    """The view of ``loop`` (running on the thread whose state is ``state``), made on first use
    (garbage collections are timed from then on)."""
    view: LoopView | None = state.view
    if view is None or view.loop is not loop:
        gc_pauses.install()
        view = state.view = LoopView(loop, state)
        with _lock:
            views[:] = [v for v in views if not v.loop.is_closed()]
            views.append(view)
    return view


def live_views() -> list[LoopView]:
    """The views of loops not closed (forgetting the others)."""
    with _lock:
        views[:] = [v for v in views if not v.loop.is_closed()]
        return list(views)
