"""Tasks a request spawns: their steps are the request's work (DESIGN §1, the whole loop).

Real gateways run part of a request in tasks it starts: the upstream call in a task of its
own, a streamed body (Starlette runs it in an anyio task group), spend logging after the
response. A task copies the context it is created in, so a task created while a request's
ledger is current belongs to that request. tracekit installs a task factory on the loop
(:func:`install`, the first time a traced request runs on it) that runs such a task's
coroutine under a tracekit driver, with a ledger of its own: the task's CPU on the loop, its
longest slice and its loop waits are measured like the request's own code, and its slices
are in the loop's busy timeline the loop-wait estimate reads.

That ledger makes no span. When the task ends, its figures are folded into the ledger that
was current when it was created (:func:`fold`), or into the nearest enclosing one still open:
the task's work is the stage's (or the request's) own work. Stages opened inside the task
are children of that ledger already (the context says so).

Tasks created outside any request (the server's own, the application's background tasks) are
the loop's background work (:mod:`tracekit._core.loop_view`). Those another task creates (the
application's: in its lifespan, in a request handler of no traced request, a request's task
still running once the request was handed on) run through a light wrapper that times each of
their steps (:func:`_background`; two CPU-clock reads a step): the CPU of the step outside
traced slices and garbage collection goes to the loop view under the coroutine's name, so a
report can say which background task holds the loop. Tasks made in a callback (a server's
task per request, made as its protocol parses a request) are not wrapped (that cost 6 µs a
request under uvicorn, bench/throughput.py); the creation of every task of no traced request
is timed (:data:`CREATED`), so the middleware knows how long its request's task waited to run
(``tracekit.start_wait_ms``), whether the server made it in a callback (uvicorn) or from its
connection's task (hypercorn).

A factory the application set before tracekit's is kept and called with the wrapped
coroutine; one set after replaces tracekit's (spawned tasks are then seen as background).
"""

from __future__ import annotations

import asyncio
import collections.abc
import weakref
from collections.abc import Generator
from typing import Any, Final

from tracekit._core import clock, event_loop, ledger
from tracekit._core.current import current_ledger, get_ledger
from tracekit._core.driver import Detached, drive
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import SPAWNED, Ledger

MAX_CATCHES: Final = 4  # watchdog catches kept per ledger (tracekit._core.watchdog.MAX_CATCHES)


class SpawnedCoroutine:
    """A spawned task's coroutine, as the task sees it: ``send``/``throw``/``close`` go to a
    driver that times each step into ``led``, the task's ledger (made with the task: the
    request is not handed on before the task ends, see :mod:`tracekit._core.request_record`;
    a task cancelled or closed before it starts closes it at once). Every other attribute
    (``cr_frame``, ``cr_running``, ``__qualname__``, ...) is the wrapped coroutine's, so
    ``Task.get_stack()`` and libraries asking whether a task has started (anyio) see the
    application's coroutine."""

    __slots__ = ("coro", "led", "runner")

    def __init__(self, coro: Any, led: Ledger | None) -> None:
        self.coro = coro
        self.led = led  # None: a task of no request (background, timed: _background)
        self.runner: Generator[Any, Any, Any] | None = None

    def send(self, value: Any) -> Any:
        runner = self.runner
        if runner is None:
            led = self.led
            runner = self.runner = _background(self.coro) if led is None else _run(self.coro, led)
        return runner.send(value)

    def throw(self, *args: Any) -> Any:
        runner = self.runner
        if runner is None:  # not started: the coroutine itself takes it, as without tracekit
            self.runner = _NOT_RUN
            if self.led is not None:
                finish(self.led)
            return self.coro.throw(*args)
        return runner.throw(*args)

    def close(self) -> None:
        runner = self.runner
        if runner is None:
            self.runner = _NOT_RUN
            if self.led is not None:
                finish(self.led)
            self.coro.close()
        else:
            runner.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __iter__(self) -> SpawnedCoroutine:
        return self

    def __await__(self) -> SpawnedCoroutine:
        return self

    def __getattr__(self, name: str) -> Any:
        # cr_frame, cr_running, cr_suspended, cr_await, cr_code, __name__, __qualname__: the
        # wrapped coroutine's (slots are found before this is asked).
        if name in _OWN:  # not set yet: never ask the coroutine (it may not exist either)
            raise AttributeError(name)
        return getattr(self.coro, name)

    def __repr__(self) -> str:
        return repr(self.coro)


_OWN: Final = frozenset(("coro", "led", "runner"))
collections.abc.Coroutine.register(SpawnedCoroutine)


def _run(coro: Any, led: Ledger) -> Generator[Any, Any, Any]:
    """Drive ``coro`` with its ledger, closed and folded when it ends, or when its request
    is handed on while it runs (it is then background work: :func:`_background`)."""
    try:
        result = yield from drive(coro, led)
    finally:
        finish(led)
    if type(result) is Detached:
        return (yield from _background(coro, result.value, result.error))
    return result


def _background(coro: Any, value: Any = None,
                error: BaseException | None = None) -> Generator[Any, Any, Any]:  # fmt: skip
    """Run a background task's coroutine as its Task would (from ``value`` or ``error``,
    when it ran traced until then); on a loop with a view, each step's CPU less the traced
    slices and the garbage collections that ran inside it goes to the view under the
    coroutine's name (:meth:`tracekit._core.loop_view.LoopView.background_step`). (Timing one
    step in 16 and scaling it read a task's CPU 11-39% off per run, and over a window's
    whole background in some windows.)"""
    state = event_loop.thread_state()
    name = _name(coro)
    send, throw = coro.send, coro.throw
    while True:
        # Not inside a traced slice (the CPU is the slice's then).
        timed = state.view is not None and not state.slice_start
        before = _readings(state) if timed else None
        try:
            yielded = send(value) if error is None else throw(error)
        except StopIteration as exc:
            return exc.value
        finally:
            if before is not None:
                _timed(state, name, before)
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # CancelledError and anything else thrown in by the Task
            value, error = None, exc


def _readings(state: event_loop.ThreadState) -> tuple[int, int, int]:
    """(thread CPU, traced CPU, GC CPU outside traced slices) on this thread, ns."""
    gc = state.gc
    return clock.cpu_ns(), state.busy_cpu, gc.cpu - gc.in_slices if gc is not None else 0


def _timed(state: event_loop.ThreadState, name: str, before: tuple[int, int, int]) -> None:
    """A timed background step ended: its own CPU to the loop view."""
    try:
        after = _readings(state)
        cpu = (after[0] - before[0]) - (after[1] - before[1]) - (after[2] - before[2])
        view = state.view
        if view is not None and cpu > 0:
            view.background_step(name, cpu)
    except Exception:
        internal_error("background task")


def _name(coro: Any) -> str:
    """``module.qualname`` of a coroutine (its ``__qualname__`` alone when its module is
    unknown: a coroutine-like object of a library)."""
    qualname = str(getattr(coro, "__qualname__", None) or type(coro).__qualname__)
    frame = getattr(coro, "cr_frame", None)
    module = frame.f_globals.get("__name__") if frame is not None else None
    return f"{module}.{qualname}" if isinstance(module, str) else qualname


def _not_run() -> Generator[Any, Any, Any]:
    """The runner of a coroutine that was closed or thrown into before it started."""
    yield from ()


_NOT_RUN: Final = _not_run()


def finish(led: Ledger) -> None:
    """The spawned task ended: fold its ledger, close it, hand the request on if it was the
    request's last open ledger."""
    try:
        fold(led)
        if ledger.close(led):
            request = led.request
            if request is not None:
                request.runtime.submit(request)
    except Exception:
        internal_error("spawned task end")


def fold_open(request: Any) -> None:
    """The response is complete: fold what the request's tasks still running have done so
    far into its ledgers (:func:`fold`). From here their CPU is the request's after its
    response (:func:`tracekit._core.ledger.answered`); a task folded only when it ends could
    end after the request's spans were built, and what it ran before the response was lost
    (a proxy's logging tasks: 20% of its requests' CPU on the loop)."""
    for led in request.ledgers:
        if led.site is SPAWNED and not led.end:
            fold(led)


def fold(led: Ledger) -> None:
    """Add a spawned task's figures to the nearest still-open ledger of its spawner's line
    (the spawner, else its enclosing stages, else the request's root), and clear them (a task
    still running is folded at its request's response, then again at its end)."""
    target: Ledger | None = led.spawner
    while target is not None and target.end and target.parent is not None:
        target = target.parent
    if target is None:
        return
    target.cpu_on += led.cpu_on
    target.cpu_off += led.cpu_off
    target.loop_wait += led.loop_wait
    target.steps += led.steps
    if led.max_block > target.max_block:
        target.max_block = led.max_block
    if led.gc:
        target.gc += led.gc
    if led.queued:
        target.queued += led.queued
    if led.child_consumer:
        target.child_consumer += led.child_consumer
    if led.slices:
        for start, held in led.slices:
            target.slices = ledger.note(target.slices, start, held)
    if led.waits:
        for ready, waited in led.waits:
            target.waits = ledger.note(target.waits, ready, waited)
    if led.blocked:  # the watchdog's catches, as many as it keeps for one ledger
        if target.blocked is None:
            target.blocked = []
        room = MAX_CATCHES - len(target.blocked)
        if room > 0:
            target.blocked.extend(led.blocked[:room])
    led.cpu_on = led.cpu_off = led.loop_wait = led.steps = led.gc = led.queued = led.child_consumer = 0
    led.slices = led.waits = led.blocked = None


#: When tasks of no traced request (a server's task per request among them) were created, by
#: id(task), with the task (weakly: an id can be reused once a task is gone): the middleware
#: reads its request's (tracekit._core.asgi.enter). Bounded: cleared past the cap.
CREATED: Final[dict[int, tuple[int, Any]]] = {}
MAX_CREATED: Final = 4096


def create(loop: asyncio.AbstractEventLoop, coro: Any, previous: Any, **options: Any) -> Any:
    """Create a task for ``coro`` (through ``previous``, the factory set before tracekit's,
    if any), its coroutine driven when the task belongs to a traced request."""
    timed = False  # a task of no traced request: maybe a server's task for one
    try:
        context = options.get("context")
        spawner = get_ledger() if context is None else context.get(current_ledger, None)
        request = spawner.request if spawner is not None else None
        # Not a request the sampler dropped, nor one already handed on for span building; nor
        # a callback's that inherited the context of a request that has answered (uvicorn
        # re-arms a paused connection's reader in the request's context, CPython issue 140947:
        # the next request's task on the connection was that request's, its start wait lost).
        if (spawner is not None and request is not None and request.pending > 0
                and not (request.end and asyncio.current_task(loop) is None)):  # fmt: skip
            led = Ledger(SPAWNED, request, None, spawner.span_id)
            led.spawner = spawner
            coro = SpawnedCoroutine(coro, led)
        elif asyncio.current_task(loop) is None:
            timed = True  # a server's task per request, made as it read one (uvicorn)
        else:
            # A task of no traced request, created by a task: the application's background
            # work (named), or a server's task per request made by its connection's task
            # (hypercorn), whose creation is timed as well.
            timed = True
            if hasattr(coro, "send"):
                coro = SpawnedCoroutine(coro, None)
    except Exception:
        internal_error("spawned task")
    task = asyncio.Task(coro, loop=loop, **options) if previous is None else previous(loop, coro, **options)
    if timed:
        try:
            if len(CREATED) >= MAX_CREATED:
                CREATED.clear()
            CREATED[id(task)] = (clock.wall_ns(), weakref.ref(task))
        except Exception:  # a task factory's object that takes no weak reference
            internal_error("spawned task")
    return task


def created_at(task: Any) -> int:
    """When the server made ``task`` in a callback (wall ns; 0: not known), forgotten then."""
    entry = CREATED.pop(id(task), None)
    return entry[0] if entry is not None and entry[1]() is task else 0


class TaskFactory:
    """The loop's task factory while tracekit watches it (chains the one set before)."""

    __slots__ = ("previous",)

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> Any:
        return create(loop, coro, self.previous, **options)


def install(loop: asyncio.AbstractEventLoop) -> bool:
    """Make ``loop``'s task factory tracekit's (idempotent; chains an existing one); returns
    whether it is (False: the loop refused it, logged)."""
    try:
        previous = loop.get_task_factory()
        if not isinstance(previous, TaskFactory):
            loop.set_task_factory(TaskFactory(previous))
        return True
    except Exception:
        internal_error("task factory")
        return True  # logged once: not asked again
