"""The one clock seam (STYLE §6).

Hot-path code calls ``clock.wall_ns()`` and ``clock.cpu_ns()`` through this module, never
``time`` directly, so :class:`tracekit.testing.FakeClock` can replace both and accounting tests
can assert exact microseconds.

- ``wall_ns``: monotonic wall clock (``time.perf_counter_ns``), for durations.
- ``cpu_ns``: CPU time of the *calling thread* (``time.thread_time_ns``): a stage's CPU is the
  CPU of whatever thread ran it, never the process's (other threads' work is not the stage's).
  On Linux it is a system call (~0.5 µs here), the most expensive thing tracekit does per step.
- ``epoch_ns``: converts a ``wall_ns`` reading to Unix-epoch nanoseconds for span timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

wall_ns: Callable[[], int] = time.perf_counter_ns
cpu_ns: Callable[[], int] = time.thread_time_ns
_epoch_offset_ns = time.time_ns() - time.perf_counter_ns()


def epoch_ns(wall: int) -> int:
    """Unix-epoch nanoseconds for a ``wall_ns()`` reading."""
    return wall + _epoch_offset_ns


def install(wall: Callable[[], int], cpu: Callable[[], int], epoch_offset_ns: int) -> None:
    """Replace the clock (used by :class:`tracekit.testing.FakeClock`)."""
    global wall_ns, cpu_ns, _epoch_offset_ns
    wall_ns, cpu_ns, _epoch_offset_ns = wall, cpu, epoch_offset_ns


def restore() -> None:
    """Go back to the real clock."""
    install(time.perf_counter_ns, time.thread_time_ns, time.time_ns() - time.perf_counter_ns())
