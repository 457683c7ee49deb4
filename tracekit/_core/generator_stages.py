"""Generator stages: an (async) generator whose iterations are timed as one stage.

A streaming model call is an async generator; a streamed body that Starlette iterates in its
thread pool is a sync one. The stage opens at the first iteration and closes when the
generator is exhausted, fails or is closed. Only the generator's own code is the stage's: it
is bound as the current stage just while an iteration runs, and the time the consumer holds
an item between iterations is ``tracekit.consumer_ms``, not the stage's.

A consumer that stops iterating without closing it (``break`` out of ``async for`` at the
``[DONE]`` event, a common relay) abandons it: the stage closes when the wrapper is released,
at its last item (it did nothing after). Left open, it lasted until its request's linger
ended (1 s): a streamed request showed ~1.2 s of model wait in 150 ms of wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracekit import semconv
from tracekit._core import clock, stage_timing
from tracekit._core.driver import Stepped
from tracekit._core.ledger import Ledger, Site


class _StagedIteration:
    """What the two generator wrappers share: the lazily opened ledger and consumer time."""

    __slots__ = ("_done", "_inner", "_led", "_site", "_yielded_at")

    def __init__(self, inner: Any, site: Site) -> None:
        self._inner = inner
        self._site = site
        self._led: Ledger | None = None
        self._yielded_at = 0
        self._done = False

    def _ledger(self) -> Ledger | None:
        """The stage's ledger, opened at the first iteration; None when not recording."""
        led = self._led
        if led is None:
            led = self._led = stage_timing.open_ledger(self._site, bind=False)
            if led is None:
                self._done = True
                return None
            if self._site.kind == semconv.KIND_MODEL:
                led.set_attribute(semconv.GEN_AI_REQUEST_STREAM, True)
        if self._yielded_at:  # the consumer held the last item until now
            led.consumer += clock.wall_ns() - self._yielded_at
            self._yielded_at = 0
        return led

    def _yielded(self, led: Ledger, now: int) -> None:
        self._yielded_at = now
        if not led.first_item:
            led.first_item = now

    def _finish(self, error: BaseException | None) -> None:
        led = self._led
        if self._done or led is None:
            self._done = True
            return
        self._done = True
        if self._yielded_at:
            led.consumer += clock.wall_ns() - self._yielded_at
        stage_timing.close_ledger(led, error)

    def __del__(self) -> None:
        # Released unclosed (abandoned by its consumer): the stage ended at its last item.
        led = self._led
        if not self._done and led is not None:
            self._done = True
            stage_timing.close_ledger(led, None, self._yielded_at or clock.wall_ns())


class StagedAsyncGenerator(_StagedIteration):
    """An async generator whose iterations are timed as one stage (streaming model calls)."""

    __slots__ = ()

    def __aiter__(self) -> StagedAsyncGenerator:
        return self

    def __anext__(self) -> Any:
        return self._step(self._inner.__anext__())

    def asend(self, value: Any) -> Any:
        return self._step(self._inner.asend(value))

    def athrow(self, *args: Any) -> Any:
        return self._step(self._inner.athrow(*args))

    async def aclose(self) -> None:
        if self._done:
            return
        try:
            await self._step(self._inner.aclose(), closing=True)
        finally:
            self._finish(None)

    async def _step(self, awaitable: Any, closing: bool = False) -> Any:
        led = None if self._done else self._ledger()
        if led is None:
            return await awaitable
        tokens = stage_timing.bind(led)  # only while the generator's own code runs, not the consumer's
        try:
            item = await Stepped(awaitable, led, self._inner)
        except StopAsyncIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        finally:
            stage_timing.unbind(*tokens)
        if not closing:
            self._yielded(led, clock.wall_ns())
        return item


class StagedGenerator(_StagedIteration):
    """A sync generator whose iterations are timed as one stage (e.g. a streamed body that
    Starlette iterates in its thread pool): each ``next()`` is one step, in whatever thread
    runs it; the consumer's time between items is ``tracekit.consumer_ms``."""

    __slots__ = ()

    def __iter__(self) -> StagedGenerator:
        return self

    def __next__(self) -> Any:
        return self._step(self._inner.__next__)

    def send(self, value: Any) -> Any:
        return self._step(self._inner.send, value)

    def throw(self, *args: Any) -> Any:
        return self._step(self._inner.throw, *args)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._finish(None)

    def _step(self, advance: Callable[..., Any], *args: Any) -> Any:
        led = None if self._done else self._ledger()
        if led is None:
            return advance(*args)
        tokens = stage_timing.bind(led)
        stage_timing.step_in(led)
        try:
            item = advance(*args)
        except BaseException as exc:
            stage_timing.step_out(led)
            stage_timing.unbind(*tokens)
            self._finish(None if isinstance(exc, StopIteration) else exc)
            raise
        now = stage_timing.step_out(led)
        stage_timing.unbind(*tokens)
        self._yielded(led, now)
        return item
