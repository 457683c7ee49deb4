"""Opening and closing stage ledgers, and timing their code: what every form of
``tracekit.stage`` shares.

A stage's ledger is opened under the current one (:data:`tracekit._core.current.current_ledger`),
or as the root of a tree of its own when no request is being traced (a "standalone" stage:
its parent is the application's current OpenTelemetry span, if any). Bound ledgers become
the current one until they close, so nested stages find their parent and outgoing calls
propagate the innermost stage (:class:`tracekit._core.active_span.LedgerSpan`).

How the code is timed (see also :mod:`tracekit._core.driver`):

- a sync call is one step, nested in whatever step is open on its thread;
- an async stage or a block entered while a tracekit driver steps its task takes the open
  step over (:func:`tracekit._core.ledger.switch`) and hands it back when it leaves; an async
  stage entered anywhere else gets a driver of its own;
- a block entered inside a sync call takes the call's step over the same way (sync code
  cannot suspend);
- a block entered in a task that no driver steps (a child task of ``asyncio.gather``, say)
  keeps wall time only: its suspensions could not be seen, and a step left open across one
  would be charged with other tasks' work.

Everything here runs on the request path: a bookkeeping failure is logged once
(:func:`tracekit._core.failsafe.internal_error`) and never reaches the application.
"""

from __future__ import annotations

import asyncio
from contextvars import Token
from typing import Final

from opentelemetry import context as otel_context

from tracekit import semconv
from tracekit._core import active_span, clock, event_loop, ledger, request_record
from tracekit._core.current import get_ledger, reset_ledger, set_ledger
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import Ledger, Site
from tracekit._core.request_record import new_span_id

_get_running_loop: Final = asyncio._get_running_loop
_current_task: Final = asyncio.current_task
# enter()'s "outer" for a stage that takes no step: an async stage that drives itself, or a
# block that keeps wall time only.
NO_STEP: Final = Ledger(Site("no step", "other"), None, None, 0)


def open_ledger(site: Site, bind: bool = True, start: int = 0) -> Ledger | None:
    """Start a ledger for ``site`` under the current one; None when nothing is recorded.

    Args:
        site: what the ledger accounts for.
        bind: make it the current ledger until :func:`close_ledger`.
        start: its start time (default: now).
    """
    parent = get_ledger()
    if parent is None:  # a stage outside any request: a tree of its own
        request = request_record.standalone_request()
        if request is None:
            return None
    else:
        request = parent.request
        if request is None:  # the request is not sampled
            return None
        if request.pending < 0:  # opened after its request was handed on (work it spawned)
            request = request_record.late_request(request, parent.span_id)
            parent = None
    led = Ledger(site, request, parent, new_span_id(), start)
    if parent is None:  # the root of a tree of its own
        request.span_id = led.span_id
        request.root = led
        if bind:
            led.otel_token = otel_context.attach(active_span.request_context(request))
    if bind:
        led.token = set_ledger(led)
    return led


def close_ledger(led: Ledger, error: BaseException | None, end: int = 0) -> None:
    """Close ``led`` at ``end`` (default: now) and unbind it; hand its request on if it was
    the last ledger open (a request whose spawned work outlived it, or a standalone tree),
    or, a standalone tree's root closing before stages it spawned, let it linger; never
    raises."""
    try:
        if error is not None:
            led.error = error  # before the close: the close may hand the record on
        request = led.request
        if led.parent is None and request is not None:  # a standalone tree's root
            request.start = led.start
            request.end = end = end or clock.wall_ns()
        last = ledger.close(led, end)
        if led.otel_token is not None:
            otel_context.detach(led.otel_token)  # type: ignore[arg-type]
        if led.token is not None:
            reset_ledger(led.token)
            led.token = None
        if request is not None:
            if last:
                request.runtime.submit(request)
            elif led.parent is None:
                request.runtime.linger(request)
    except Exception:
        internal_error("stage close")


# --- sync calls: one step, nested in the open one -------------------------------------------
def step_in(led: Ledger) -> int:
    """Begin a step of ``led`` nested in the step open on this thread (a sync call, or one
    ``next()`` of a sync generator stage); outside any step it is an outermost slice.
    Returns the wall time it began.

    The two clocks are read back to back, after every allocation: a garbage collection
    between them would be in the step's wall time and not in its CPU time, and so counted
    as its parent's CPU as well (issue 11)."""
    state = led.state = event_loop.thread_state()
    led.sync_call = True
    now = clock.wall_ns()
    cpu = event_loop.cpu_now(state, now)
    led.owns_slice = state.top is None and not state.slice_start
    if led.owns_slice:
        event_loop.slice_begin(state, now, cpu)
    ledger.step_begin(led, state, now, cpu)
    return now


def step_out(led: Ledger) -> int:
    """End the step :func:`step_in` began; returns the wall time."""
    end = clock.wall_ns()
    state = led.state
    cpu = event_loop.cpu_now(state, end)
    loop = on_loop(state)
    ledger.step_end(led, state, end, cpu, loop)
    if led.owns_slice:
        event_loop.slice_end(state, end, cpu, loop)
    return end


def on_loop(state: event_loop.ThreadState) -> bool:
    """Whether this thread is running an event loop now (``state``: its state)."""
    return state.task is not None or _get_running_loop() is not None


def call_begin(site: Site) -> Ledger | None:
    """Open a sync stage and begin its one step (the call); None when not recording."""
    try:
        led = open_ledger(site, True)
        if led is not None:
            led.start = step_in(led)  # the call's step and the stage begin together
        return led
    except Exception:
        internal_error("stage start")
        return None


def call_end(led: Ledger, error: BaseException | None) -> None:
    """End a sync stage's step (the call) and close the stage."""
    end = 0
    try:
        end = step_out(led)
    except Exception:
        internal_error("stage end")
    close_ledger(led, error, end)


def call_end_counting(led: Ledger, result: object) -> None:
    """:func:`call_end` for a tokenize stage that returned ``result``: its token count goes
    on the span (``tracekit.tokens``) when the result is one tokenizers make."""
    try:
        tokens = token_count(result)
        if tokens is not None:
            led.set_attribute(semconv.TOKENS, tokens)
    except Exception:
        internal_error("token count")
    call_end(led, None)


def token_count(result: object) -> int | None:
    """Token count of a tokenizer's result: a list of ids, an HF ``Encoding`` (``.ids``), or
    a list of those; None for anything else."""
    if isinstance(result, list):
        if not result:
            return None
        first = result[0]
        if isinstance(first, int):
            return len(result)
        if isinstance(getattr(first, "ids", None), list):
            return sum(len(item.ids) for item in result)
        return None
    ids = getattr(result, "ids", None)
    return len(ids) if isinstance(ids, list) else None


# --- async stages and blocks: take the open step over, or drive it ---------------------------
def enter(site: Site, block: bool) -> tuple[Ledger, Ledger | None] | None:
    """Open an async stage (``block`` false) or a block: ``(ledger, outer)``, where ``outer``
    is the ledger whose step it took over (None if none was open), or :data:`NO_STEP` when
    it takes no step (see the module doc); None when not recording."""
    try:
        state = event_loop.thread_state()
        stepped = state.task
        # A driver steps a task on this thread: its loop is known (asking asyncio costs a
        # system call on 3.11). The running task may still be another (an eager task).
        loop = state.loop if stepped is not None else _get_running_loop()
        if loop is None:
            steps = block  # sync code outside any loop: no suspension can hide in a block
        else:
            # The open step is this task's, or a sync call's: nothing can suspend inside it.
            top = state.top
            steps = top is not None and (stepped is _current_task(loop) or (block and top.sync_call))
        if not steps:
            led = open_ledger(site)
            return None if led is None else (led, NO_STEP)
        now = clock.wall_ns()
        cpu = event_loop.cpu_now(state, now)
        led = open_ledger(site, True, now)
        if led is None:
            return None
        outer = state.top
        if outer is not None:
            ledger.step_end(outer, state, now, cpu, loop is not None)
        ledger.step_begin(led, state, now, cpu)
        led.state = state
        led.sync_call = block and (outer is None or outer.sync_call)  # a block in sync code
        return led, outer
    except Exception:
        internal_error("stage start")
        return None


def leave(led: Ledger, outer: Ledger | None, error: BaseException | None) -> None:
    """Close what :func:`enter` opened, handing the step back to ``outer``."""
    end = 0
    try:
        # Not on top: left from outside its step (coroutine close(), an unbalanced exit).
        if outer is not NO_STEP and led.state.top is led:
            end = ledger.switch(led.state, led, outer, on_loop(led.state))
    except Exception:
        internal_error("stage end")
    close_ledger(led, error, end)


def bind(led: Ledger) -> tuple[Token[Ledger | None], object]:
    """Make ``led`` current (generator stages, for each iteration); returns what to unbind."""
    otel_token = None
    if led.parent is None and led.request is not None:
        otel_token = otel_context.attach(active_span.request_context(led.request))
    return set_ledger(led), otel_token


def unbind(ledger_token: Token[Ledger | None] | None, otel_token: object) -> None:
    """Undo :func:`bind`."""
    if otel_token is not None:
        otel_context.detach(otel_token)  # type: ignore[arg-type]
    if ledger_token is not None:
        reset_ledger(ledger_token)
