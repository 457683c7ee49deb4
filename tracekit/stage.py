"""``tracekit.stage``: one stage of the request path, as a decorator or a ``with`` block.

Three forms (STYLE §8)::

    @tracekit.stage                       # bare: name (and kind) from the function's name
    async def tokenize(text): ...

    @tracekit.stage("model", kind="model")  # sync or async functions, async generators
    async def stream_completion(req): ...

    with tracekit.stage("guardrail"): ...   # and ``async with``

Each stage becomes an INTERNAL span whose wall time is split into cpu / wait / loop_wait
(DESIGN §1, docs/attributes.md). Kind defaults from the name when it is one of ``tokenize``,
``guardrail``, ``model``, ``serialize``; else ``kind=`` or ``other``.

How each form is timed:

- sync function: one step around the call, in whatever thread runs it (``on_loop`` is true
  when that thread runs an event loop);
- async function: every resumption of its coroutine is a step (:mod:`tracekit._steps`);
- async generator (a streaming model call): steps inside each ``__anext__``; the time the
  consumer holds an item between iterations is ``tracekit.consumer_ms``, not the stage's;
- sync generator (a streamed body Starlette iterates in its thread pool): each ``next()`` is
  a step, in whatever thread runs it, with consumer time as above;
- ``with`` / ``async with`` block: the enclosing coroutine's steps belong to the block while
  it is open.

Cost: ~3–5 µs per stage when recording, plus ~1.5 µs per step; ~0.3 µs when the request is
not sampled; nothing is exported or allocated for spans on the request path.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context

from tracekit import _accounting, _clock, _loop, _runtime, semconv
from tracekit._accounting import Ledger
from tracekit._context import current_ledger
from tracekit._failsafe import internal_error
from tracekit._request import new_span_id
from tracekit._steps import Stepped
from tracekit.errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])

_KINDS = frozenset(semconv.STAGE_KINDS)
_get_running_loop = asyncio._get_running_loop

_Opened = tuple[Ledger, "Token[Ledger | None] | None", object]


def kind_for(name: str, kind: str | None) -> str:
    """The stage kind: ``kind`` if given (validated), else the name if it is a kind, else other."""
    if kind is None:
        return name if name in _KINDS else semconv.KIND_OTHER
    if kind not in _KINDS:
        expected = ", ".join(semconv.STAGE_KINDS)
        raise ConfigurationError(f"unknown stage kind {kind!r}; expected one of {expected}")
    return kind


def _open(name: str, kind: str, function: str | None, namespace: str | None,
          bind: bool = True) -> _Opened | None:  # fmt: skip
    """Start a stage ledger under the current one; None when nothing is being recorded.

    With ``bind`` the ledger becomes the current one until :func:`_close` (nested stages
    find their parent through it, and so does the request's OpenTelemetry current span:
    see :class:`tracekit._runtime.LedgerSpan`).
    """
    parent = current_ledger.get()
    otel_token = None
    if parent is None:  # a stage outside any request: a tree of its own
        request = _runtime.standalone_request()
        if request is None:
            return None
        led = Ledger(name, kind, request, None, new_span_id(), function, namespace)
        request.span_id = led.span_id
        request.start = led.start
        request.root = led
        request.ledgers.append(led)
        if not bind:
            return led, None, None
        otel_token = otel_context.attach(_runtime.request_context(request))
    elif parent.request is None:  # the request is not sampled
        return None
    else:
        led = Ledger(name, kind, parent.request, parent, new_span_id(), function, namespace)
        parent.request.ledgers.append(led)
        if not bind:
            return led, None, None
    return led, current_ledger.set(led), otel_token


def _bind(led: Ledger) -> tuple[Token[Ledger | None], object]:
    otel_token = None
    if led.parent is None:
        otel_token = otel_context.attach(_runtime.request_context(led.request))
    return current_ledger.set(led), otel_token


def _unbind(ledger_token: Token[Ledger | None] | None, otel_token: object) -> None:
    if otel_token is not None:
        otel_context.detach(otel_token)  # type: ignore[arg-type]
    if ledger_token is not None:
        current_ledger.reset(ledger_token)


def _close(opened: _Opened, error: BaseException | None) -> None:
    led, ledger_token, otel_token = opened
    try:
        _accounting.close(led)
        if error is not None:
            led.error = error
        _unbind(ledger_token, otel_token)
        if led.parent is None:  # a stage outside any request: its tree is complete
            led.request.end = led.end
            led.request.runtime.submit(led.request)
    except Exception:
        internal_error("stage close")


def _count_tokens(result: Any) -> int | None:
    """Token count of a tokenizer's result (HF Encoding, list of Encodings, list of ids)."""
    ids = getattr(result, "ids", None)
    if isinstance(ids, list):
        return len(ids)
    if isinstance(result, list) and result:
        first = result[0]
        if isinstance(first, int):
            return len(result)
        if isinstance(getattr(first, "ids", None), list):
            return sum(len(item.ids) for item in result)
    return None


class Stage:
    """A named stage: decorate a function with it, or open it with ``with``/``async with``."""

    __slots__ = ("_blocks", "kind", "name")

    def __init__(self, name: str, kind: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("stage name must be a non-empty string")
        self.name = name
        self.kind = kind_for(name, kind)
        # Open blocks of this stage, per task/thread context (safe to share one Stage object).
        self._blocks: ContextVar[list[Any] | None] = ContextVar(f"tracekit.block.{name}", default=None)

    def __repr__(self) -> str:
        return f"stage({self.name!r}, kind={self.kind!r})"

    # --- decorator ------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"stage({self.name!r}) decorates a function, got {type(fn).__name__}")
        if inspect.isasyncgenfunction(fn):
            return self._wrap_async_gen(fn)
        if inspect.isgeneratorfunction(fn):
            return self._wrap_gen(fn)
        if inspect.iscoroutinefunction(fn):
            return self._wrap_async(fn)
        return self._wrap_sync(fn)

    def _identity(self, fn: Callable[..., Any]) -> tuple[str, str | None]:
        return getattr(fn, "__qualname__", self.name), getattr(fn, "__module__", None)

    def _wrap_sync(self, fn: F) -> F:
        name, kind = self.name, self.kind
        function, namespace = self._identity(fn)
        count_tokens = kind == semconv.KIND_TOKENIZE

        @functools.wraps(fn)
        def sync_stage(*args: Any, **kwargs: Any) -> Any:
            opened = _open(name, kind, function, namespace)
            if opened is None:
                return fn(*args, **kwargs)
            led = opened[0]
            state = _loop.thread_state()
            on_loop = _get_running_loop() is not None
            _accounting.step_begin(led, state, _clock.wall_ns())
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                _accounting.step_end(led, state, on_loop)
                _close(opened, exc)
                raise
            _accounting.step_end(led, state, on_loop)
            if count_tokens:
                tokens = _count_tokens(result)
                if tokens is not None:
                    led.set_attribute(semconv.TOKENS, tokens)
            _close(opened, None)
            return result

        return sync_stage  # type: ignore[return-value]

    def _wrap_async(self, fn: F) -> F:
        name, kind = self.name, self.kind
        function, namespace = self._identity(fn)

        @functools.wraps(fn)
        async def async_stage(*args: Any, **kwargs: Any) -> Any:
            opened = _open(name, kind, function, namespace)
            if opened is None:
                return await fn(*args, **kwargs)
            try:
                result = await Stepped(fn(*args, **kwargs), opened[0])
            except BaseException as exc:
                _close(opened, exc)
                raise
            _close(opened, None)
            return result

        return async_stage  # type: ignore[return-value]

    def _wrap_gen(self, fn: F) -> F:
        name, kind = self.name, self.kind
        function, namespace = self._identity(fn)

        @functools.wraps(fn)
        def gen_stage(*args: Any, **kwargs: Any) -> StagedGenerator:
            return StagedGenerator(fn(*args, **kwargs), name, kind, function, namespace)

        return gen_stage  # type: ignore[return-value]

    def _wrap_async_gen(self, fn: F) -> F:
        name, kind = self.name, self.kind
        function, namespace = self._identity(fn)

        @functools.wraps(fn)
        def async_gen_stage(*args: Any, **kwargs: Any) -> StagedAsyncGenerator:
            return StagedAsyncGenerator(fn(*args, **kwargs), name, kind, function, namespace)

        return async_gen_stage  # type: ignore[return-value]

    # --- with / async with ----------------------------------------------------------------
    def __enter__(self) -> Stage:
        try:
            opened = _open(self.name, self.kind, None, None)
            outer = _switch_in(opened[0]) if opened is not None else None
            entry: list[Any] = [opened, outer, None]
            entry[2] = self._blocks.set(entry)
        except Exception:
            internal_error("block enter")
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            entry = self._blocks.get()
            if entry is None:
                return
            opened, outer, token = entry
            self._blocks.reset(token)
            if opened is not None:
                _switch_out(opened[0], outer)
                _close(opened, exc)
        except Exception:
            internal_error("block exit")

    async def __aenter__(self) -> Stage:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def _switch_in(led: Ledger) -> Ledger | None:
    """A block opens: the step open on this thread (if any) now belongs to the block."""
    state = _loop.thread_state()
    outer = state.top
    on_loop = _get_running_loop() is not None
    if outer is not None:
        now = _accounting.step_end(outer, state, on_loop)
    else:
        now = _clock.wall_ns()
    _accounting.step_begin(led, state, now)
    return outer


def _switch_out(led: Ledger, outer: Ledger | None) -> None:
    """A block closes: its step ends and the enclosing owner's step resumes."""
    state = _loop.thread_state()
    if state.top is not led:  # closed from another step than it was opened in: nothing open
        return
    on_loop = _get_running_loop() is not None
    now = _accounting.step_end(led, state, on_loop)
    if outer is not None:
        _accounting.step_begin(outer, state, now)


class _StagedIteration:
    """What the two generator wrappers share: the lazily opened ledger and consumer time."""

    __slots__ = ("_done", "_identity", "_inner", "_opened", "_yielded_at")

    def __init__(self, inner: Any, name: str, kind: str, function: str | None,
                 namespace: str | None) -> None:  # fmt: skip
        self._inner = inner
        self._identity = (name, kind, function, namespace)
        self._opened: _Opened | None = None
        self._yielded_at = 0
        self._done = False

    def _ledger(self) -> Ledger | None:
        """The stage's ledger, opened at the first iteration; None when not recording."""
        opened = self._opened
        if opened is None:
            opened = self._opened = _open(*self._identity, bind=False)
            if opened is None:
                self._done = True
                return None
            if self._identity[1] == semconv.KIND_MODEL:
                opened[0].set_attribute(semconv.GEN_AI_REQUEST_STREAM, True)
        led = opened[0]
        if self._yielded_at:  # the consumer held the last item until now
            led.consumer += _clock.wall_ns() - self._yielded_at
            self._yielded_at = 0
        return led

    def _yielded(self, led: Ledger, now: int) -> None:
        self._yielded_at = now
        if not led.first_item:
            led.first_item = now

    def _finish(self, error: BaseException | None) -> None:
        if self._done or self._opened is None:
            self._done = True
            return
        self._done = True
        if self._yielded_at:
            self._opened[0].consumer += _clock.wall_ns() - self._yielded_at
        _close(self._opened, error)


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
        tokens = _bind(led)  # only while the generator's own code runs, not the consumer's
        try:
            item = await Stepped(awaitable, led, self._inner)
        except StopAsyncIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        finally:
            _unbind(*tokens)
        if not closing:
            self._yielded(led, _clock.wall_ns())
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
        tokens = _bind(led)
        state = _loop.thread_state()
        on_loop = _get_running_loop() is not None
        _accounting.step_begin(led, state, _clock.wall_ns())
        try:
            item = advance(*args)
        except BaseException as exc:
            _accounting.step_end(led, state, on_loop)
            _unbind(*tokens)
            self._finish(None if isinstance(exc, StopIteration) else exc)
            raise
        now = _accounting.step_end(led, state, on_loop)
        _unbind(*tokens)
        self._yielded(led, now)
        return item


@overload
def stage(name: F, *, kind: str | None = None) -> F: ...
@overload
def stage(name: str | None = None, *, kind: str | None = None) -> Stage: ...


def stage(name: Any = None, *, kind: str | None = None) -> Any:
    """A stage of the request path (see the module docstring for the forms and the cost).

    Args:
        name: the stage name (``tokenize``, ``guardrail``, ``model``, ``serialize`` set the
            kind too); or, used bare as ``@stage``, the function itself (name = its ``__name__``).
        kind: one of ``tokenize``/``guardrail``/``model``/``serialize``/``other``.

    Returns:
        A :class:`Stage` (decorator and context manager), or the wrapped function when used bare.

    Raises:
        ConfigurationError: empty name or unknown kind (a ValueError).
    """
    if callable(name):
        return Stage(name.__name__, kind)(name)
    if name is None:
        raise ConfigurationError("stage() needs a name, or use it bare as @stage")
    return Stage(name, kind)
