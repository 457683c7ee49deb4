"""pyinstrument drill-down: which function inside a stage (or a busy loop window) burns the time.

One line turns it on (it is off by default)::

    from tracekit.integrations import pyinstrument
    pyinstrument.enable()                      # every=50, min_ms=5.0, loop=True

What it records:

- **stages**: one call in ``every`` of each stage (sync functions, coroutines, ``with``
  blocks; generator stages are not profiled) runs under a pyinstrument profiler; when the
  call spent at least ``min_ms`` in its own code (pyinstrument's samples of its own async
  context: awaits and other tasks left out), its span gets ``tracekit.profile.hot`` (the
  ``top`` functions with the most self time:
  ``slow_helper (app/text.py:12) self 41.0 ms, total 41.0 ms``), ``tracekit.profile.tree``
  (the call tree, size-bounded), ``tracekit.profile.ms`` and ``tracekit.profile.samples``.
  The analyzer's findings name the hottest function, and the HTML report shows the tree.
- **busy loop windows** (``loop=True``): a callback on each event loop that runs a profiled
  stage checks, every ``window_s``, the loop thread's CPU share and how late it ran; when
  the loop was saturated (``>= loop_busy``) or blocked (late by ``>= block_ms``), the next
  window of the loop thread is profiled whole and the result goes on the next
  ``tracekit.loop`` window span, with ``tracekit.profile.reason``.

One profile runs at a time in the process; a stage call that comes while one runs is not
profiled. Cost (``bench/profile_overhead.py``, docs/integrations.md): nothing for calls not
sampled beyond a counter; a sampled call pays pyinstrument's sampling (a C profile hook on
every Python call and return of that call) plus the summary.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

try:
    from pyinstrument import Profiler
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test
    raise ImportError(
        "tracekit.integrations.pyinstrument needs pyinstrument: pip install 'tracekit[pyinstrument]'"
    ) from exc

from tracekit import semconv
from tracekit._core import clock
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import Ledger, Site
from tracekit._core.watchdog import TRACEKIT_DIRS
from tracekit._export import loop_spans
from tracekit.stage import set_probe

__all__ = ["Profile", "disable", "enable", "summarize"]

#: Characters kept of a call tree: whole lines, under the 2048 kept of any string attribute.
TREE_CHARS: Final = 1800
#: Tree frames below this share of the profile's time are left out.
TREE_MIN_SHARE: Final = 0.02
TREE_DEPTH: Final = 16
_SYNTHETIC_LEAVES: Final = frozenset({"[await]", "[out-of-context]", "[self]"})


@dataclass(frozen=True)
class Profile:
    """A profile's summary, as the span attributes carry it.

    Attributes:
        hot: the hottest functions by self time, one a line (``top`` of them).
        tree: the call tree, one frame a line indented by depth, at most ``TREE_CHARS``.
        ms: sampled time in the profiled code, awaits left out.
        samples: samples behind it.
    """

    hot: str
    tree: str
    ms: float
    samples: int

    def attributes(self) -> dict[str, Any]:
        """The span attributes (names in :mod:`tracekit.semconv`)."""
        return {semconv.PROFILE_HOT: self.hot, semconv.PROFILE_TREE: self.tree,
                semconv.PROFILE_MS: self.ms, semconv.PROFILE_SAMPLES: self.samples}  # fmt: skip


# --- summarising pyinstrument's samples -------------------------------------------------------
def _identifier(frame_info: str) -> str:
    return frame_info.split("\x01", 1)[0]


def _label(frame_info: str) -> str:
    identifier, *attributes = frame_info.split("\x01")
    function, _, rest = identifier.partition("\x00")
    path, _, line = rest.partition("\x00")
    owner = next((a[1:] for a in attributes if a.startswith("c")), None)
    name = f"{owner}.{function}" if owner else function
    return f"{name} ({_short(path)}:{line})" if not path.startswith("<") else f"{name} ({path})"


def _short(path: str) -> str:
    # Library paths from the package on; application paths relative to the working directory.
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _own(frame_info: str) -> bool:
    # tracekit's own frames (the stage wrappers) are left out of what a profile shows.
    path = _identifier(frame_info).split("\x00")[1:2]
    return bool(path) and path[0].startswith(TRACEKIT_DIRS)


def summarize(records: Sequence[tuple[Sequence[str], float]], start_stack: Sequence[str],
              top: int = 5) -> Profile | None:  # fmt: skip
    """Summarise pyinstrument frame records (``Session.frame_records``: root-first stacks of
    frame infos, and the seconds each stands for).

    Frames above the profile's start (``start_stack``, the profiler's ``start_call_stack``)
    are cut, keeping the last one (the function a ``with`` block runs in); samples ending in
    an await are waits, not the code's time, and are left out; tracekit's own frames are
    skipped. None when no sample is left.
    """
    start = [_identifier(f) for f in start_stack]
    self_s: dict[str, float] = {}
    total_s: dict[str, float] = {}
    labels: dict[str, str] = {}
    tree: dict[str, Any] = {}  # identifier -> [seconds, children]
    seconds = 0.0
    samples = 0
    for stack, t in records:
        if not stack or _identifier(stack[-1]).split("\x00")[0] in _SYNTHETIC_LEAVES:
            continue
        cut = 0
        while cut < len(start) and cut < len(stack) and _identifier(stack[cut]) == start[cut]:
            cut += 1
        frames = [f for f in stack[max(0, cut - 1):] if not _own(f)]
        if not frames:
            continue
        seconds += t
        samples += 1
        seen: set[str] = set()
        level = tree
        for info in frames:
            key = _identifier(info)
            labels.setdefault(key, _label(info))
            if key not in seen:
                seen.add(key)
                total_s[key] = total_s.get(key, 0.0) + t
            node = level.setdefault(key, [0.0, {}])
            node[0] += t
            level = node[1]
        leaf = _identifier(frames[-1])
        self_s[leaf] = self_s.get(leaf, 0.0) + t
    if not samples:
        return None
    ranked = sorted(self_s, key=lambda k: (-self_s[k], labels[k]))[:top]
    hot = "\n".join(f"{labels[k]} self {self_s[k] * 1e3:.1f} ms, total {total_s[k] * 1e3:.1f} ms"
                    for k in ranked)  # fmt: skip
    lines: list[str] = []
    _render(tree, labels, seconds * TREE_MIN_SHARE, 0, lines, [0])
    return Profile(hot, "\n".join(lines), seconds * 1e3, samples)


def _render(level: dict[str, Any], labels: dict[str, str], floor: float, depth: int,
            lines: list[str], size: list[int]) -> None:  # fmt: skip
    for key, (t, children) in sorted(level.items(), key=lambda kv: -kv[1][0]):
        if t < floor or depth >= TREE_DEPTH:
            continue
        line = f"{'  ' * depth}{t * 1e3:.1f} ms {labels[key]}"
        if size[0] + len(line) + 1 > TREE_CHARS:
            return
        size[0] += len(line) + 1
        lines.append(line)
        _render(children, labels, floor, depth + 1, lines, size)


# --- stages ------------------------------------------------------------------------------------
class _Busy:
    """One profile at a time in the process (pyinstrument allows one per async context and
    thread anyway, and it bounds the cost)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = False

    def take(self) -> bool:
        with self._lock:
            if self.held:
                return False
            self.held = True
            return True

    def give(self) -> None:
        self.held = False


class _StageProbe:
    """The :class:`tracekit.stage.Probe` that profiles sampled stage calls."""

    def __init__(self, every: int, min_ms: float, interval: float, top: int, busy: _Busy,
                 on_loop: Any) -> None:  # fmt: skip
        self.every = every
        self.min_ms = min_ms
        self.interval = interval
        self.top = top
        self.busy = busy
        self.on_loop = on_loop  # called with the running loop, to watch it (or None)
        self.calls: dict[Site, int] = {}

    def begin(self, led: Ledger) -> object | None:
        try:
            site = led.site
            n = self.calls.get(site, 0)
            self.calls[site] = n + 1
            if self.on_loop is not None:
                loop = asyncio._get_running_loop()
                if loop is not None:
                    self.on_loop(loop)
            if n % self.every or not self.busy.take():
                return None
            try:
                profiler = Profiler(interval=self.interval, async_mode="strict")
                profiler.start(caller_frame=sys._getframe(1))
            except Exception:
                self.busy.give()
                raise
            return profiler
        except Exception:
            internal_error("pyinstrument stage start")
            return None

    def end(self, led: Ledger, token: object) -> None:
        try:
            assert isinstance(token, Profiler)
            try:
                session = token.stop()
            finally:
                self.busy.give()
            profile = summarize(session.frame_records, session.start_call_stack, self.top)
            if profile is not None and profile.ms >= self.min_ms:
                for key, value in profile.attributes().items():
                    led.set_attribute(key, value)
        except Exception:
            internal_error("pyinstrument stage end")


# --- busy loop windows -------------------------------------------------------------------------
class _LoopWatch:
    """Profiles the next window of a loop thread that was saturated or blocked; finished
    profiles wait here for the loop's next ``tracekit.loop`` window span."""

    def __init__(self, window_s: float, loop_busy: float, block_ms: float, interval: float,
                 top: int, busy: _Busy) -> None:  # fmt: skip
        self.window_s = window_s
        self.loop_busy = loop_busy
        self.block_ms = block_ms
        self.interval = interval
        self.top = top
        self.busy = busy
        self.watched: set[int] = set()
        self.finished: dict[int, list[tuple[int, dict[str, Any]]]] = {}  # id(loop) -> profiles
        self.stopped = False

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        key = id(loop)
        if key in self.watched or self.stopped:
            return
        self.watched.add(key)
        self._arm(loop, time.perf_counter(), time.thread_time())

    def _arm(self, loop: asyncio.AbstractEventLoop, wall: float, cpu: float) -> None:
        if not self.stopped and not loop.is_closed():
            loop.call_later(self.window_s, self._check, loop, wall + self.window_s, wall, cpu)

    def _check(self, loop: asyncio.AbstractEventLoop, due: float, wall0: float, cpu0: float) -> None:
        try:
            wall, cpu = time.perf_counter(), time.thread_time()
            busy = (cpu - cpu0) / max(wall - wall0, 1e-9)
            late_ms = (wall - due) * 1e3
            reason = None
            if busy >= self.loop_busy:
                reason = f"saturated: loop thread busy {busy:.0%} of the last {self.window_s:g} s"
            elif late_ms >= self.block_ms:
                reason = f"blocked: a {self.window_s:g} s timer ran {late_ms:.0f} ms late"
            if reason is not None and self.busy.take():
                profiler = Profiler(interval=self.interval, async_mode="disabled")
                try:
                    profiler.start(caller_frame=sys._getframe(0))
                except Exception:
                    self.busy.give()
                    raise
                loop.call_later(self.window_s, self._stop, loop, profiler, reason)
                return
        except Exception:
            internal_error("pyinstrument loop check")
        self._arm(loop, time.perf_counter(), time.thread_time())

    def _stop(self, loop: asyncio.AbstractEventLoop, profiler: Profiler, reason: str) -> None:
        try:
            try:
                session = profiler.stop()
            finally:
                self.busy.give()
            # The whole thread was sampled: cut only what every sample shares (the loop's
            # run_forever), keeping its last frame.
            profile = summarize(session.frame_records, _shared_stem(session.frame_records), self.top)
            if profile is not None:
                attrs = profile.attributes()
                attrs[semconv.PROFILE_REASON] = reason
                pending = self.finished.setdefault(id(loop), [])
                pending.append((clock.wall_ns(), attrs))
                del pending[:-4]  # bounded: windows nobody exports are dropped
        except Exception:
            internal_error("pyinstrument loop stop")
        self._arm(loop, time.perf_counter(), time.thread_time())

    def window_attributes(self, loop: Any, start: int, end: int) -> dict[str, Any] | None:
        """A finished profile for ``loop``'s window ending at ``end`` (tracekit's wall ns),
        taken off the queue: the first window ending after the profile did gets it."""
        pending = self.finished.get(id(loop))
        if not pending or pending[0][0] > end:
            return None
        return pending.pop(0)[1]


def _shared_stem(records: Sequence[tuple[Sequence[str], float]]) -> list[str]:
    stacks = [r[0] for r in records if r[0]]
    if not stacks:
        return []
    stem = [_identifier(f) for f in stacks[0]]
    for stack in stacks[1:]:
        n = 0
        while n < len(stem) and n < len(stack) and _identifier(stack[n]) == stem[n]:
            n += 1
        del stem[n:]
    return stem


# --- switching it on and off -------------------------------------------------------------------
_installed: tuple[_StageProbe, _LoopWatch | None] | None = None


def enable(every: int = 50, *, min_ms: float = 5.0, interval_ms: float = 1.0, top: int = 5,
           loop: bool = True, window_s: float = 1.0, loop_busy: float = 0.9,
           block_ms: float = 100.0) -> None:  # fmt: skip
    """Profile one stage call in ``every`` (per stage), and busy loop windows.

    Args:
        every: profile the 1st, ``every+1``-th, ... call of each stage (1: every call).
        min_ms: attach a call's profile only when it sampled at least this much time in
            the stage's own code (awaits left out).
        interval_ms: pyinstrument's sampling interval.
        top: functions listed in ``tracekit.profile.hot``.
        loop: also profile loop windows after one that was saturated or blocked.
        window_s: the loop check's period, and a profiled window's length.
        loop_busy: a window whose loop-thread CPU share reaches this is saturated.
        block_ms: a window whose check ran this late is blocked.

    Raises:
        ValueError: a bad argument.
    """
    global _installed
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every!r}")
    for name, value in (("min_ms", min_ms), ("interval_ms", interval_ms), ("window_s", window_s),
                        ("loop_busy", loop_busy), ("block_ms", block_ms)):  # fmt: skip
        positive = name in ("interval_ms", "window_s")
        if not isinstance(value, (int, float)) or value < 0 or (positive and value <= 0):
            raise ValueError(f"{name} must be a number >= 0 (> 0 for interval_ms, window_s), got {value!r}")
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    disable()
    busy = _Busy()
    interval = interval_ms / 1e3
    watch = _LoopWatch(window_s, loop_busy, block_ms, interval, top, busy) if loop else None
    probe = _StageProbe(every, min_ms, interval, top, busy, watch.watch if watch else None)
    set_probe(probe)
    if watch is not None:
        loop_spans.window_extras.append(watch.window_attributes)
    _installed = (probe, watch)


def disable() -> None:
    """Stop profiling (a profile in progress finishes)."""
    global _installed
    if _installed is None:
        return
    probe, watch = _installed
    _installed = None
    previous = set_probe(None)
    if previous is not probe:  # another probe replaced ours since: keep it
        set_probe(previous)
    if watch is not None:
        watch.stopped = True
        if watch.window_attributes in loop_spans.window_extras:
            loop_spans.window_extras.remove(watch.window_attributes)
