"""The replay's discrete-event engine: one event loop, a thread pool, a process pool, the GIL.

A request is a *program*: a list of nodes, run in order by a cursor.

========================  =================================================================
``(LOOP, gil, block)``    run on the event-loop thread: ``gil`` ms of CPU holding the GIL,
                          then ``block`` ms holding the loop without CPU or GIL (a blocking
                          call). The loop is a single server with a FIFO ready queue.
``(DELAY, ms)``           wait for something outside the process (I/O, a model server);
                          holds nothing. ``DELAY 0`` is a yield: what follows re-queues.
``(CPU, ms, gil)``        CPU on the thread that holds a :data:`HOLD` slot (a pool worker),
                          holding the GIL when ``gil`` is true.
``(HOLD, key, items)``    take one slot of resource ``key`` (FIFO; the thread pool, the process
                          pool, a model server, a lock), run ``items``, give it back. With a
                          fourth element ``ms``, the slot is given back ``ms`` after it was
                          taken, or when ``items`` end if sooner: a server busy for its own
                          service time, whatever its caller does meanwhile.
``(PAR, branches)``       run each branch (a list of nodes) concurrently; continue when all end.
``(AFTER, items)``        run ``items`` on, detached: work a request leaves on the loop after its
                          response (background tasks, spend logging); its end is not waited for.
========================  =================================================================

CPU sharing (processor sharing, recomputed at every event): every running CPU burst wants one
core. Bursts that hold the GIL share one core between them (the GIL lets one thread run
Python at a time; CPython hands it over every 5 ms switch interval, so several GIL-bound
threads progress like processor sharing at ``1/n`` each); GIL-free bursts (a process pool,
native code that releases the GIL) share the remaining cores. The allocation is max-min fair
over ``cores``: everybody gets ``min(1, cores / n)``, unless that gives the GIL group more
than one core, in which case the GIL group gets one core in total and the GIL-free bursts
share the rest. A loop slice's CPU is a GIL burst, so worker threads running pure Python
slow the loop down, which is the GIL cost of ``asyncio.to_thread`` for pure-Python work.

The host's other load: runnable threads of other processes take part in that sharing like
bursts of their own (the kernel shares the cores between runnable threads). Their number at
an instant is taken as Poisson with mean ``others`` (many independent sources: a load
generator, other services, neighbours), and each rate is its average over that number
(:func:`fair_rates`). The recorded slices already hold what the others cost a lone loop
thread (its run-queue delay is inside their wall time, as blocking), so every rate is divided
by the rate a lone burst gets (:func:`lone_rate`): one burst runs as recorded, and each
further burst of the gateway slows the others as the kernel would on that host.

The loop runs like asyncio's ``_run_once``: an *iteration* runs the callbacks that were ready
when it began; callbacks scheduled meanwhile with ``call_soon`` (a task woken by another
task, a ``sleep(0)``, a worker thread's result via ``call_soon_threadsafe``) join the ready
queue at once, for the next iteration; timers that expire and sockets that become readable
meanwhile (a model's answer, a new request) are only picked up at the start of the next
iteration, after those. A resumption after a :data:`DELAY` (of 1 µs or more), a new request,
and a model-server answer are I/O; the rest is ``call_soon``.

Times are float milliseconds from the start of the replay.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

LOOP = 0
DELAY = 1
CPU = 2
HOLD = 3
PAR = 4
AFTER = 5

Node = tuple[Any, ...]
_EPS = 1e-9
_IO_MS = 0.001  # a DELAY this long or longer is a wait for I/O or a timer, not a yield
_INF = math.inf


def _poisson(mean: float) -> list[float]:
    """P(K = k) of a Poisson count of mean ``mean``, up to a tail under 1e-9."""
    p = math.exp(-mean)
    probs, total, k = [p], p, 0
    while total < 1.0 - 1e-9 and k < 10_000:
        k += 1
        p *= mean / k
        probs.append(p)
        total += p
    return probs


def _fair(cores: int, n_gil: int, n_free: int, others: int) -> tuple[float, float]:
    # Max-min fair shares of ``cores`` between the bursts and ``others`` threads, the GIL
    # group capped at one core: (a GIL burst's rate, a GIL-free burst's rate).
    each = min(1.0, cores / (n_gil + n_free + others))
    if n_gil * each <= 1.0:
        return each, each
    return 1.0 / n_gil, (min(1.0, (cores - 1) / (n_free + others)) if n_free else 0.0)


def fair_rates(cores: int, n_gil: int, n_free: int, others: float) -> tuple[float, float]:
    """The rates of a GIL burst and of a GIL-free burst, averaged over the host's other
    runnable threads (a Poisson count of mean ``others``; exact for ``others`` 0)."""
    if others <= 0:
        return _fair(cores, n_gil, n_free, 0)
    gil = free = 0.0
    for k, p in enumerate(_poisson(others)):
        g, f = _fair(cores, n_gil, n_free, k)
        gil += p * g
        free += p * f
    return gil, free


def lone_rate(cores: int, others: float) -> float:
    """The rate of one burst alone beside the host's other runnable threads."""
    return fair_rates(cores, 1, 0, others)[0]


class _Cursor:
    __slots__ = ("free_ms", "i", "io", "items", "parent", "release", "req")

    def __init__(self, items: Sequence[Node], parent: Any, release: Any, req: int) -> None:
        self.items = items
        self.i = 0
        self.parent = parent  # a _Cursor, a _Join, or None (the request's program)
        self.release = release  # the _Resource this cursor holds a slot of, or None
        self.req = req
        self.io = False  # its next loop step was made ready by I/O or a timer
        self.free_ms: float | None = None  # its slot is given back this long after it is taken


class _Join:
    __slots__ = ("count", "cursor")

    def __init__(self, count: int, cursor: _Cursor) -> None:
        self.count = count
        self.cursor = cursor


_DETACHED = _Join(0, None)  # type: ignore[arg-type]  # the parent of an AFTER node's cursor


class _Resource:
    __slots__ = ("busy", "capacity", "queue", "threaded")

    def __init__(self, capacity: int | None, threaded: bool) -> None:
        self.capacity = capacity
        self.busy = 0
        self.queue: deque[_Cursor] = deque()
        self.threaded = threaded  # a pool: its results come back through call_soon_threadsafe


class _Burst:
    """CPU work in progress: a loop slice's (``block`` is its blocking part that follows) or
    a pool worker's (``block`` is ``None``); ``cursor`` continues when it is done."""

    __slots__ = ("block", "cursor", "gil", "rate", "remaining")

    def __init__(self, work: float, gil: bool, cursor: _Cursor, block: float | None) -> None:
        self.remaining = work
        self.gil = gil
        self.rate = 0.0
        self.cursor = cursor
        self.block = block


class Simulation:
    """One process: its event loop, its pools, its GIL, and ``cores`` CPU cores.

    Args:
        cores: CPU cores the process (and its process pool) may use, >= 1.
        others: the host's other runnable threads, on average (see the module docstring).
        capacities: slots per :data:`HOLD` resource key; ``None`` means unlimited. A key not
            listed is unlimited.
        pools: the keys that are worker pools (threads, processes).

    Cost: O(log events) per event (a heap), plus O(running CPU bursts) per event for the
    processor sharing; bursts are few (the loop's slice and the pools' busy workers). Events
    are the program nodes: about 2 per loop step and 1 per delay.
    """

    def __init__(
        self,
        cores: int,
        capacities: dict[str, int | None],
        pools: frozenset[str] = frozenset(),
        others: float = 0.0,
    ) -> None:
        self._pools = pools
        self.cores = cores
        self.others = others
        self._alone = lone_rate(cores, others)  # as recorded
        self._rates: dict[tuple[int, int], tuple[float, float]] = {}  # by (GIL, GIL-free) bursts
        self.now = 0.0
        self._capacities = capacities
        self._resources: dict[str, _Resource] = {}
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._ready: deque[tuple[_Cursor, float, float]] = deque()
        self._io_ready: deque[tuple[_Cursor, float, float]] = deque()  # for the next iteration
        self._batch = 0  # callbacks left in the current iteration
        self._loop_busy = False
        self._bursts: list[_Burst] = []
        self._cpu_t = 0.0
        self._rates_stale = False
        self._programs: Sequence[Sequence[Node]] = ()
        self._ends: list[float] = []
        self._first: list[float] = []
        self._on_end: Callable[[int, float], None] | None = None

    def run(
        self,
        programs: Sequence[Sequence[Node]],
        arrivals: Sequence[float | None],
        on_end: Callable[[int, float], None] | None = None,
    ) -> list[float]:
        """Run the programs to completion.

        Args:
            programs: one program per request.
            arrivals: start time of each request (ms); ``None`` for requests that
                ``on_end`` starts later with :meth:`start` (closed-loop clients).
            on_end: called as ``on_end(request_index, end_ms)`` when a request ends.

        Returns:
            The end time (ms) of every request (``nan`` if it never started).
        """
        self._programs = programs
        self._ends = [math.nan] * len(programs)
        self._first = [math.nan] * len(programs)
        self._on_end = on_end
        for index, arrival in enumerate(arrivals):
            if arrival is not None:
                self._at(arrival, self._arrive, index)
        self._main()
        return self._ends

    @property
    def first_run(self) -> list[float]:
        """When each request's code first ran on the loop (its recorded start, in tracekit's
        terms: the server span starts inside the request's first step); ``nan`` if never."""
        return self._first

    def start(self, index: int, at: float) -> None:
        """Start request ``index`` at time ``at`` (>= now), from an ``on_end`` callback."""
        self._at(max(at, self.now), self._arrive, index)

    # --- event machinery --------------------------------------------------------------
    def _at(self, time: float, fn: Callable[[Any], None], arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, arg))

    def _main(self) -> None:
        # The hot loop: one pass per event. Next CPU completion: the earliest
        # ``remaining / rate`` among running bursts (rates recomputed after any change).
        heap = self._heap
        heappop = heapq.heappop
        while True:
            bursts = self._bursts
            next_cpu = _INF
            if bursts:
                if self._rates_stale:
                    self._share()
                best = _INF
                for burst in bursts:
                    rate = burst.rate
                    if rate > 0:
                        t = burst.remaining / rate
                        if t < best:
                            best = t
                next_cpu = self._cpu_t + (best if best > 0.0 else 0.0)
            next_event = heap[0][0] if heap else _INF
            if next_cpu <= next_event:
                if next_cpu == _INF:
                    return
                self._advance(next_cpu)
                self._finish_bursts()
            else:
                self._advance(next_event)
                _, _, fn, arg = heappop(heap)
                fn(arg)

    def _advance(self, time: float) -> None:
        dt = time - self._cpu_t
        if dt > 0:
            for burst in self._bursts:
                burst.remaining -= burst.rate * dt
        self._cpu_t = time
        self.now = time

    # --- CPU sharing ------------------------------------------------------------------
    def _add_burst(self, work: float, gil: bool, cursor: _Cursor, block: float | None) -> None:
        self._bursts.append(_Burst(work, gil, cursor, block))
        self._rates_stale = True

    def _share(self) -> None:
        self._rates_stale = False
        bursts = self._bursts
        n_gil = 0
        for burst in bursts:
            if burst.gil:
                n_gil += 1
        n_free = len(bursts) - n_gil
        rates = self._rates.get((n_gil, n_free))
        if rates is None:
            gil, free = fair_rates(self.cores, n_gil, n_free, self.others)
            rates = self._rates[(n_gil, n_free)] = (gil / self._alone, free / self._alone)
        gil_rate, free_rate = rates
        for burst in bursts:
            burst.rate = gil_rate if burst.gil else free_rate

    def _finish_bursts(self) -> None:
        keep: list[_Burst] = []
        done: list[_Burst] = []
        for burst in self._bursts:
            (done if burst.remaining <= _EPS else keep).append(burst)
        if not done:  # float rounding: finish the one closest to its end
            closest = min(self._bursts, key=lambda b: b.remaining)
            done = [closest]
            keep = [b for b in self._bursts if b is not closest]
        self._bursts = keep
        self._rates_stale = True
        for burst in done:
            if burst.block is None:
                self._step(burst.cursor)  # a pool worker's CPU: its program goes on
            else:
                self._loop_cpu_done(burst.cursor, burst.block)

    # --- the event loop ---------------------------------------------------------------
    def _enqueue(self, cursor: _Cursor, gil: float, block: float) -> None:
        entry = (cursor, gil, block)
        io, cursor.io = cursor.io, False
        if not self._loop_busy:  # the loop sleeps in select(): it wakes for this at once
            self._ready.append(entry)
            self._iterate()
        elif io:
            self._io_ready.append(entry)
        else:
            self._ready.append(entry)

    def _iterate(self) -> None:
        # A new iteration: timers and I/O that became ready join after the call_soon ones.
        if self._io_ready:
            self._ready.extend(self._io_ready)
            self._io_ready.clear()
        self._batch = len(self._ready)
        self._loop_next()

    def _loop_next(self) -> None:
        if self._batch <= 0:
            if self._ready or self._io_ready:
                self._iterate()
            else:
                self._loop_busy = False
            return
        self._batch -= 1
        self._loop_busy = True
        cursor, gil, block = self._ready.popleft()
        first = self._first
        if first[cursor.req] != first[cursor.req]:  # nan: its first step
            first[cursor.req] = self.now
        if gil > 0:
            self._add_burst(gil, True, cursor, block)
        else:
            self._loop_cpu_done(cursor, block)

    def _loop_cpu_done(self, cursor: _Cursor, block: float) -> None:
        if block > 0:
            self._at(self.now + block, self._loop_done, cursor)
        else:
            self._loop_done(cursor)

    def _loop_done(self, cursor: _Cursor) -> None:
        # The request continues first (more loop work it schedules waits for the next
        # iteration), then the loop runs the next callback of this iteration.
        self._step(cursor)
        self._loop_next()

    # --- running programs -------------------------------------------------------------
    def _arrive(self, index: int) -> None:
        program = self._programs[index]
        if not program or program[0][0] != LOOP:
            self._first[index] = self.now
        cursor = _Cursor(program, None, None, index)
        cursor.io = True  # a new request arrives on a socket
        self._step(cursor)

    def _wake(self, cursor: _Cursor) -> None:
        cursor.io = True
        self._step(cursor)

    def _resource(self, key: str) -> _Resource:
        res = self._resources.get(key)
        if res is None:
            res = self._resources[key] = _Resource(self._capacities.get(key), key in self._pools)
        return res

    def _step(self, cursor: _Cursor) -> None:
        while True:
            items = cursor.items
            if cursor.i >= len(items):
                self._end(cursor)
                return
            node = items[cursor.i]
            cursor.i += 1
            tag = node[0]
            if tag == LOOP:
                self._enqueue(cursor, node[1], node[2])
                return
            if tag == DELAY:
                wake = self._wake if node[1] >= _IO_MS else self._step
                self._at(self.now + node[1], wake, cursor)
                return
            if tag == CPU:
                self._add_burst(node[1], node[2], cursor, None)
                return
            if tag == HOLD:
                res = self._resource(node[1])
                child = _Cursor(node[2], cursor, res, cursor.req)
                if len(node) > 3:
                    child.free_ms = node[3]
                if res.capacity is None or res.busy < res.capacity:
                    res.busy += 1
                    self._taken(child)
                    cursor = child
                    continue
                res.queue.append(child)
                return
            if tag == AFTER:
                self._at(self.now, self._step, _Cursor(node[1], _DETACHED, None, cursor.req))
                continue
            # PAR
            branches = node[1]
            join = _Join(len(branches), cursor)
            for branch in branches:
                self._at(self.now, self._step, _Cursor(branch, join, None, cursor.req))
            return

    def _taken(self, cursor: _Cursor) -> None:
        # A slot was taken for ``cursor``: one it holds for a set time is given back then.
        if cursor.free_ms is not None:
            self._at(self.now + cursor.free_ms, self._free, cursor)

    def _free(self, cursor: _Cursor) -> None:
        res = cursor.release
        if res is not None:  # not given back already (its items ended first)
            cursor.release = None
            res.busy -= 1
            if res.queue:
                res.busy += 1
                waiting = res.queue.popleft()
                self._taken(waiting)
                self._at(self.now, self._step, waiting)

    def _end(self, cursor: _Cursor) -> None:
        res = cursor.release
        self._free(cursor)
        parent = cursor.parent
        if parent is None:
            self._ends[cursor.req] = self.now
            if self._on_end is not None:
                self._on_end(cursor.req, self.now)
        elif parent is _DETACHED:
            return
        elif isinstance(parent, _Join):
            parent.count -= 1
            if parent.count == 0:
                self._step(parent.cursor)  # gather's waiter is woken with call_soon
        else:
            # A pool's result comes back through call_soon_threadsafe; otherwise whatever
            # woke the held work's last step (a model's answer: I/O) wakes the parent.
            parent.io = False if res is not None and res.threaded else cursor.io
            self._step(parent)
