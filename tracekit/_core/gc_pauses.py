"""Garbage collections: timed on the thread that runs them, never a stage's CPU (DESIGN §1).

CPython collects on whichever thread allocates past a threshold, inside whatever code runs
there: a stage's step, the server's code, tracekit's own bookkeeping. A ``gc.callbacks``
hook times each collection (wall and thread CPU) on that thread and

- hands the pause to the innermost open step the way a nested step's time is handed back
  (``nested_cpu``/``nested_wall``): the step's own CPU leaves it out, and the ledger books
  it as ``gc`` (``tracekit.gc_ms``), a part of its wall time of its own;
- counts it for the thread (:class:`Pauses`): the loop view reports the collections per
  window by generation, their total and the longest (:mod:`tracekit._core.loop_view`).

Installed while a runtime records (:func:`install`, idempotent); the hook costs two clock
reads per collection.
"""

from __future__ import annotations

import gc
from typing import Any, Final

from tracekit._core import clock, event_loop, ledger
from tracekit._core.failsafe import internal_error

GENERATIONS: Final = 3


class Pauses:
    """The collections run on one thread (written by that thread only, in the hook)."""

    __slots__ = ("c0", "count", "cpu", "in_slices", "longest", "longest_cpu", "longest_gen", "t0", "wall")

    def __init__(self) -> None:
        self.t0 = self.c0 = 0  # readings when the collection under way began (0: none)
        self.wall = self.cpu = 0  # totals, ns
        self.in_slices = 0  # CPU of those that ran inside an outermost traced slice, ns
        self.count = [0] * GENERATIONS
        # The longest so far: the collection that took the most CPU (a busy host can stretch
        # a tiny one's wall time by descheduling the thread), its wall ns and generation.
        self.longest_cpu = 0
        self.longest = 0
        self.longest_gen = 0


def _hook(phase: str, info: dict[str, Any]) -> None:
    try:
        state = event_loop.thread_state()
        pauses = state.gc
        if pauses is None:
            pauses = state.gc = Pauses()
        if phase == "start":
            pauses.t0 = clock.wall_ns()
            pauses.c0 = clock.cpu_ns()
            return
        if not pauses.t0:  # installed during a collection
            return
        cpu = clock.cpu_ns()
        end = clock.wall_ns()
        held = end - pauses.t0
        spent = cpu - pauses.c0
        pauses.t0 = 0
        if spent > held:
            spent = held
        if spent < 0:
            spent = 0
        # A fresh reading: the next step boundary within CPU_REUSE_NS infers from it.
        state.cpu_at = end
        state.cpu_last = cpu
        generation = info.get("generation", 0)
        if not 0 <= generation < GENERATIONS:
            generation = GENERATIONS - 1
        pauses.count[generation] += 1
        pauses.wall += held
        state.gc_wall += held
        event_loop.GC_CLOCK.wall += held
        pauses.cpu += spent
        if spent > pauses.longest_cpu or (spent == pauses.longest_cpu and held > pauses.longest):
            pauses.longest_cpu = spent
            pauses.longest = held
            pauses.longest_gen = generation
        if state.slice_start:
            pauses.in_slices += spent
        top = state.top
        if top is not None:  # like a nested step: out of the open step's own CPU
            top.nested_cpu += spent
            top.nested_wall += held
            if not ledger.answered(top, top.step_t0):
                top.gc += held
    except Exception:
        internal_error("gc timing")


def install() -> None:
    """Time every collection from now on (idempotent)."""
    if _hook not in gc.callbacks:
        gc.callbacks.append(_hook)


def uninstall() -> None:
    """Stop timing collections."""
    while _hook in gc.callbacks:
        gc.callbacks.remove(_hook)
