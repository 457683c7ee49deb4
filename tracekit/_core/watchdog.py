"""The watchdog: names the line that holds the event loop, while it holds it.

A slow step reported after it ends can only point at the next ``await``; the culprit's frame
is gone (why asyncio's debug mode and slow-callback loggers mislead). So a daemon thread
polls each watched loop thread every ``threshold / 2``; when one outermost slice has held
the loop longer than the threshold (default 20 ms), it samples that thread's stack with
``sys._current_frames()`` and records, on the innermost open stage (or the request's own
ledger), ``file:line in function`` plus a short stack. One sample per slice, put off once
when that step began under half the threshold ago (its line would be where the slice is now,
not what held the loop).

Polling without the GIL: a Python thread waiting for the GIL is signalled at every release by
the loop thread (each select/epoll of each loop iteration): a futex wake-up system call on the
loop thread and a futile context switch, thousands a second on a busy healthy loop (the
cost per request is in ``docs/performance.md``). So where the C helper
:mod:`tracekit._core._slicewatch` is built (and its clock is ``time.perf_counter_ns``'s), the
poll runs in C with the GIL released: watched
threads publish their slice start in a one-item ``array('q')`` (``ThreadState.cell``), and
the thread takes the GIL only when a slice has run past the threshold (or a thread was
watched, or once a second to prune). Without it (no compiler, another platform,
``TRACEKIT_PURE_PYTHON=1``), the same poll runs in Python.

Sampling needs the GIL: a loop thread burning pure-Python CPU hands it over every
``sys.getswitchinterval()`` (5 ms), so the sample comes at most that late; a thread blocked
in ``time.sleep`` or I/O has released it already.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import threading
import time
from array import array
from types import FrameType
from typing import Any

from tracekit import _native
from tracekit._core import clock
from tracekit._core.event_loop import ThreadState
from tracekit._core.failsafe import internal_error
from tracekit._export.span_attributes import short_path

MAX_CATCHES = 4  # per ledger
PRUNE_S = 1.0
STACK_DEPTH = 12

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _integration_dirs() -> tuple[str, ...]:
    """Where ``tracekit.integrations`` lives, when not inside the package directory: a
    checkout (and its editable install) keeps it beside ``tracekit/`` (pyproject package-dir).
    Its stage wrappers are on the stack of every stage they wrap, like the middleware's."""
    try:
        spec = importlib.util.find_spec("tracekit.integrations")  # locates it, imports nothing
    except (ImportError, ValueError):
        return ()
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    dirs = {os.path.join(f(d), "") for d in locations for f in (os.path.abspath, os.path.realpath)}
    return tuple(d for d in dirs if not d.startswith(_PACKAGE_DIR))


# tracekit's frames, left out of what a sample or a profile shows (its own work: below).
TRACEKIT_DIRS = (_PACKAGE_DIR, *_integration_dirs())
# tracekit's own work, when it runs on the loop (starting its export thread, building spans,
# writing a trace file): its cost, never an application's block. Its other frames (the
# middleware, stage wrappers, the loop driver) are on every request's stack: left out.
_OWN_WORK_DIRS = tuple(os.path.join(_PACKAGE_DIR, d) + os.sep for d in ("_export", "exporters"))
# ``tracekit demo``'s gateway and model server: applications that ship inside the package.
_DEMO_DIR = os.path.join(_PACKAGE_DIR, "demo") + os.sep
_LIBRARY_DIRS = tuple(
    {p for key in ("stdlib", "platstdlib", "purelib", "platlib")
     if (p := sysconfig.get_paths().get(key))}
)  # fmt: skip


def _gil_free_poll() -> Any:
    """:func:`tracekit._core._slicewatch.wait`, if built, wanted and on ``perf_counter_ns``'s clock."""
    if _native.pure_python_requested():
        return None
    try:
        from tracekit._core import _slicewatch
    except ImportError:
        return None
    skew = abs(_slicewatch.now_ns() - time.perf_counter_ns())
    return _slicewatch.wait if skew < 1_000_000 else None


GIL_FREE_WAIT = _gil_free_poll()


class Watchdog:
    """Samples watched loop threads' stacks while one slice holds the loop too long."""

    def __init__(self, threshold_ms: float = 20.0) -> None:
        self.threshold_ns = int(threshold_ms * 1e6)
        # thread ident -> its state; states of threads that ended are pruned every PRUNE_S
        self._watched: dict[int, ThreadState] = {}
        self._pruned_at = 0.0
        self._sampled: dict[int, int] = {}  # thread ident -> slice seq already sampled
        self._put_off: dict[int, int] = {}  # thread ident -> slice seq whose sample was put off
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.wakes = 0  # times the thread held the GIL to poll (tests check the GIL-free poll)
        self.gil_free_wait = GIL_FREE_WAIT  # None: poll in Python (set before the first watch)
        # The GIL-free poll: [stop, generation]; a change ends a wait (see _slicewatch.c).
        self._control = array("q", [0, 0])
        self._reported: dict[int, int] = {}  # thread ident -> last slice start the C poll gave

    def watch(self, state: ThreadState) -> None:
        """Watch the loop thread owning ``state`` (idempotent); starts the thread lazily."""
        with self._lock:
            self._watched[state.ident or 0] = state
            state.watched = self
            if self.gil_free_wait is not None and state.cell is None:
                state.cell = array("q", [state.slice_start])
            self._control[1] += 1  # the running wait picks the new cell up
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tracekit-watchdog", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop polling (the thread exits within one interval)."""
        self._stop.set()
        self._control[0] = 1

    def _run(self) -> None:
        interval = max(self.threshold_ns / 2e9, 0.001)
        if self.gil_free_wait is not None:
            self._run_gil_free(self.gil_free_wait, int(interval * 1e9))
            return
        while not self._stop.wait(interval):
            self.wakes += 1
            self._check(list(self._watched.values()))
            if time.monotonic() - self._pruned_at > PRUNE_S:
                self._prune()

    def _run_gil_free(self, wait: Any, interval_ns: int) -> None:
        max_wait_ns = int(PRUNE_S * 1e9)
        while not self._stop.is_set():
            with self._lock:
                watched = [(state, state.cell) for state in self._watched.values()]
            states = [state for state, cell in watched if cell is not None]
            cells = tuple(cell for _, cell in watched if cell is not None)
            seen = array("q", [self._reported.get(state.ident or 0, 0) for state in states])
            try:
                over = wait(cells, seen, self._control, self.threshold_ns, interval_ns, max_wait_ns)
            except Exception:  # never expected; the Python poll still works
                internal_error("watchdog poll")
                self.gil_free_wait = None
                self._run()
                return
            self.wakes += 1
            for i in over:  # one report per slice (its start), whatever the check below says
                self._reported[states[i].ident or 0] = seen[i]
            later = self._check([states[i] for i in over])
            while later and not self._stop.wait(interval_ns / 1e9):  # samples put off
                later = self._check(later)
            if time.monotonic() - self._pruned_at > PRUNE_S:
                self._prune()

    def _check(self, states: list[ThreadState]) -> list[ThreadState]:
        """Sample each of these threads whose open slice is past the threshold (once a slice);
        returns those whose sample :meth:`_sample` put off."""
        now = clock.wall_ns()
        later = []
        for state in states:
            start = state.slice_start
            if not start or now - start < self.threshold_ns:
                continue
            if self._sampled.get(state.ident or 0) != state.seq and not self._sample(state, start, now):
                later.append(state)
        return later

    def _prune(self) -> None:
        """Forget the states of threads that ended (a loop per thread pool worker, say)."""
        self._pruned_at = time.monotonic()
        alive = {thread.ident for thread in threading.enumerate()}
        with self._lock:
            for ident in [i for i in self._watched if i not in alive]:
                del self._watched[ident]
                self._sampled.pop(ident, None)
                self._put_off.pop(ident, None)
                self._reported.pop(ident, None)

    def _sample(self, state: ThreadState, start: int, now: int) -> bool:
        """Record where ``state``'s thread is on its innermost open step; False when put off:
        that step began late in the slice (under half the threshold ago), so its line is where
        the slice is now, not what held the loop (a guardrail then the model call's start, run
        back to back in one step, blamed the model call's socket check in a new user's run).
        The poll samples again one interval later, whatever runs then (a loop calling a short
        stage again and again is that stage's doing); a slice that ends first gets no sample."""
        seq = state.seq
        ident = state.ident or 0
        frame = sys._current_frames().get(ident)
        ledger = state.top
        if frame is None or ledger is None:
            return True
        if now - max(ledger.step_t0, start) < self.threshold_ns // 2 and self._put_off.get(ident) != seq:
            self._put_off[ident] = seq
            return False
        frames, own = _stack(frame)
        if state.seq != seq or state.top is not ledger:
            return True  # the slice ended while we looked
        self._sampled[state.ident or 0] = seq
        if not frames or own:
            return True
        blamed = _blame(frames)
        stack = "\n".join(f"{short_path(f)}:{line} in {name}" for f, line, name in frames)
        catches = ledger.blocked
        if catches is None:
            catches = ledger.blocked = []
        if len(catches) < MAX_CATCHES:
            catches.append((clock.wall_ns(), (now - start) / 1e6, blamed, stack))
        return True


def _stack(frame: FrameType | None) -> tuple[list[tuple[str, int, str]], bool]:
    """Innermost-first (file, line, function) without tracekit's frames, and whether the
    thread was in tracekit's own work (inside any application frame there is)."""
    frames: list[tuple[str, int, str]] = []
    own: bool | None = None  # decided by the innermost frame that is tracekit's work or the app's
    while frame is not None and len(frames) < STACK_DEPTH:
        filename = frame.f_code.co_filename
        if filename.startswith(TRACEKIT_DIRS) and not filename.startswith(_DEMO_DIR):
            if own is None and filename.startswith(_OWN_WORK_DIRS):
                own = True
        else:
            frames.append((filename, frame.f_lineno or 0, frame.f_code.co_name))
            if own is None and _is_application(filename):
                own = False
        frame = frame.f_back
    return frames, bool(own)


def _is_application(filename: str) -> bool:
    return filename.startswith(_DEMO_DIR) or (
        not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<"))


def _blame(frames: list[tuple[str, int, str]]) -> str:
    """The innermost application frame (not the stdlib's or an installed package's)."""
    for filename, line, name in frames:
        if _is_application(filename):
            return f"{short_path(filename)}:{line} in {name}"
    filename, line, name = frames[0]
    return f"{short_path(filename)}:{line} in {name}"
