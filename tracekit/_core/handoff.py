"""Work a request hands to worker threads and processes: its CPU is the request's, off the loop.

A stage that awaits ``asyncio.to_thread(f)``, ``loop.run_in_executor(pool, f)`` or anyio's
``to_thread.run_sync(f)`` waits while ``f`` runs elsewhere; without help that time reads as a
wait, and the fix a finding proposed (move the CPU off the loop) would leave no trace of where
the CPU went. tracekit times ``f`` where it runs, for the ledger current where it was handed
off (a stage, or the request's own code):

- thread pools: ``ThreadPoolExecutor.submit`` (``asyncio.to_thread`` and ``run_in_executor``
  with the default executor or a thread pool, on the stdlib loop and on uvloop) and
  ``anyio.to_thread.run_sync`` (Starlette's and FastAPI's thread pool) run ``f`` as one step
  of a ledger of its own, made when ``f`` starts: its CPU off the loop, with stages ``f``
  calls taking their own share as nested steps;
- process pools: ``ProcessPoolExecutor.submit`` sends ``f`` wrapped in a picklable call that
  reads the worker's thread CPU around it and returns it with the result; the future gets
  the result alone.

That ledger makes no span: it is folded into the one that handed the work off
(:func:`tracekit._core.spawned.finish`), whose ``cpu_off`` grows, so its wait shrinks by as
much (``tracekit.cpu_off_loop_ms``); a thread pool's work that waited for a free worker adds
that wait to its ``queued`` (``tracekit.queue_wait_ms``), not to its io wait. Inside ``f``
the handing ledger is current, as it is in ``asyncio.to_thread``, which copies the context
(``run_in_executor`` does not; tracekit sets its own variable only). Hooks are installed
once per process, by the first runtime; they cost one context-variable read per submission
when nothing records.

Limits: executors that do not go through these ``submit`` methods (a class overriding
``submit`` without calling it), threads started directly, the CPU of a process worker's call
that raised (the exception comes back without it), and work that starts after its request
was handed on for span building (not measured).
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Final

from tracekit._core import clock, spawned, stage_timing
from tracekit._core.current import get_ledger, reset_ledger, set_ledger
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import SPAWNED, Ledger

_thread_submit: Final = ThreadPoolExecutor.submit
_process_submit: Final = ProcessPoolExecutor.submit
_installed = False
_install_lock: Final = threading.Lock()


def _handing() -> Ledger | None:
    """The ledger current here if it belongs to a request still being recorded."""
    led = get_ledger()
    if led is None or led.request is None or led.request.pending <= 0:
        return None
    return led


def _begin(handing: Ledger) -> Ledger | None:
    """A ledger for work ``handing`` handed off, made when the work starts (work that never
    starts, a cancelled future, must not hold its request open); None if the request was
    handed on meanwhile."""
    request = handing.request
    if request is None or request.pending <= 0:
        return None
    led = Ledger(SPAWNED, request, None, handing.span_id)
    led.spawner = handing
    return led


class InThread:
    """``fn`` as a worker thread runs it: one step of a handed-off ledger. With ``queue``,
    the time from its submission to its start (waiting for a free worker) is the ledger's
    queue wait (anyio's wait for its capacity limiter is counted as a lock wait already)."""

    __slots__ = ("fn", "handing", "submitted")

    def __init__(self, fn: Any, handing: Ledger, queue: bool = True) -> None:
        self.fn = fn
        self.handing = handing
        self.submitted = clock.wall_ns() if queue else 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        led = token = None
        try:
            led = _begin(self.handing)
            if led is not None:
                if self.submitted:
                    led.queued = max(0, clock.wall_ns() - self.submitted)
                token = set_ledger(self.handing)
                stage_timing.step_in(led)
        except Exception:
            internal_error("handed-off work start")
        try:
            return self.fn(*args, **kwargs)
        finally:
            if led is not None:
                try:
                    stage_timing.step_out(led)
                    if token is not None:
                        reset_ledger(token)
                    spawned.finish(led)
                except Exception:
                    internal_error("handed-off work end")


class InProcess:
    """``fn`` as a process worker runs it: returns ``(result, thread CPU ns)``. Pickled by
    reference, like ``fn`` itself (a worker process imports tracekit to run it)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        cpu = time.thread_time_ns()
        result = self.fn(*args, **kwargs)
        return result, time.thread_time_ns() - cpu

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return InProcess, (self.fn,)


def _submit_to_thread(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
    handing = _handing()
    if handing is not None:
        fn = InThread(fn, handing)
    return _thread_submit(self, fn, *args, **kwargs)


def _submit_to_process(self: ProcessPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
    handing = _handing()
    if handing is None:
        return _process_submit(self, fn, *args, **kwargs)
    future = _process_submit(self, InProcess(fn), *args, **kwargs)
    # The pool's result thread sets (result, cpu): the future's waiters get the result alone.
    future.set_result = functools.partial(_process_result, future, handing)  # type: ignore[method-assign]
    return future


def _process_result(future: Future[Any], handing: Ledger, value: Any) -> None:
    if not (type(value) is tuple and len(value) == 2):  # not set by the pool from InProcess
        Future.set_result(future, value)
        return
    result, cpu = value
    try:
        led = _begin(handing)
        if led is not None:
            led.cpu_off = cpu
            spawned.finish(led)
    except Exception:
        internal_error("handed-off work end")
    Future.set_result(future, result)


def _anyio_run_sync(original: Any) -> Any:
    @functools.wraps(original)
    async def run_sync(func: Any, *args: Any, **kwargs: Any) -> Any:
        handing = _handing()
        if handing is not None:
            func = InThread(func, handing, queue=False)
        return await original(func, *args, **kwargs)

    run_sync.tracekit_original = original  # type: ignore[attr-defined]
    return run_sync


def install() -> None:
    """Time work handed to thread and process pools from now on (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        ThreadPoolExecutor.submit = _submit_to_thread  # type: ignore[method-assign,assignment]
        ProcessPoolExecutor.submit = _submit_to_process  # type: ignore[method-assign,assignment]
        try:
            import anyio.to_thread
        except ImportError:
            return
        anyio.to_thread.run_sync = _anyio_run_sync(anyio.to_thread.run_sync)
