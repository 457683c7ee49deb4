"""Helpers for testing code instrumented with tracekit (and tracekit itself).

:class:`FakeClock` replaces tracekit's clock (:mod:`tracekit._core.clock`), so accounting can be
asserted to the exact microsecond::

    with FakeClock() as clock:
        @tracekit.stage("tokenize")
        def tokenize():
            clock.burn(30)      # 30 ms on CPU
            clock.block(5)      # 5 ms blocked off-CPU (e.g. time.sleep)

        @tracekit.stage("model")
        async def model():
            await clock.sleep(100)  # suspended 100 ms (waiting on the model)
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from tracekit._core import clock


class FakeClock:
    """A manual clock: wall time and per-thread CPU time advance only when told.

    Args:
        start_ms: the initial wall reading.
        epoch_ns: the Unix time that wall reading 0 maps to (span timestamps).
    """

    def __init__(self, start_ms: float = 1000.0, epoch_ns: int = 1_700_000_000_000_000_000) -> None:
        self._wall = int(start_ms * 1e6)
        self._cpu: dict[int, int] = {}
        self._epoch = epoch_ns
        self._lock = threading.Lock()

    def wall_ns(self) -> int:
        """Current fake wall time in ns."""
        return self._wall

    def cpu_ns(self) -> int:
        """Current fake CPU time of the calling thread in ns."""
        return self._cpu.get(threading.get_ident(), 0)

    def burn(self, ms: float) -> None:
        """The calling thread runs on CPU for ``ms``: wall and its CPU advance together."""
        ns = int(round(ms * 1e6))
        with self._lock:
            self._wall += ns
            ident = threading.get_ident()
            self._cpu[ident] = self._cpu.get(ident, 0) + ns

    def block(self, ms: float) -> None:
        """The calling thread is blocked off-CPU for ``ms`` (e.g. ``time.sleep``)."""
        self.advance(ms)

    def advance(self, ms: float) -> None:
        """Wall time passes with no CPU on the calling thread (waiting, or others running)."""
        with self._lock:
            self._wall += int(round(ms * 1e6))

    async def sleep(self, ms: float) -> None:
        """Suspend the calling coroutine while ``ms`` of wall time passes: an await of I/O,
        which completes (a callback of the loop's) once this task has yielded."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def complete() -> None:
            self.advance(ms)
            done.set_result(None)

        loop.call_soon(complete)
        await done

    def __enter__(self) -> FakeClock:
        clock.install(self.wall_ns, self.cpu_ns, self._epoch)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        clock.restore()
