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
- async function: every resumption of its coroutine is a step (:mod:`tracekit._core.driver`);
- async generator (a streaming model call): steps inside each ``__anext__``; the time the
  consumer holds an item between iterations is ``tracekit.consumer_ms``, not the stage's;
- sync generator (a streamed body Starlette iterates in its thread pool): each ``next()`` is
  a step, in whatever thread runs it, with consumer time as above;
- ``with`` / ``async with`` block: the enclosing coroutine's steps belong to the block while
  it is open.

Cost: a few µs per stage when recording, span building included (docs/performance.md has the
measured figures, compiled and plain Python); well under 1 µs when the request is not sampled.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, overload

from tracekit import semconv
from tracekit._core import stage_timing
from tracekit._core.driver import Stepped
from tracekit._core.failsafe import internal_error
from tracekit._core.generator_stages import StagedAsyncGenerator, StagedGenerator
from tracekit._core.ledger import Ledger, Site
from tracekit._core.stage_timing import NO_STEP
from tracekit.errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])


class Probe(Protocol):
    """Looks inside recorded stage calls (:mod:`tracekit.integrations.pyinstrument`).

    ``begin`` runs as a recorded sync call, async call or block begins, inside its ledger;
    what it returns (None: not this one) is handed to ``end``, which runs before the ledger
    closes, so attributes it sets reach the span. Neither may raise.
    """

    def begin(self, led: Ledger) -> object | None:
        """Start looking at this call, or return None."""
        ...

    def end(self, led: Ledger, token: object) -> None:
        """Stop looking; ``token`` is what :meth:`begin` returned."""
        ...


#: The installed probe (None: none, the default); read once per recorded stage call.
_probe: Probe | None = None


def set_probe(probe: Probe | None) -> Probe | None:
    """Install ``probe`` (None removes it); returns the one it replaces."""
    global _probe
    previous, _probe = _probe, probe
    return previous

_KINDS = frozenset(semconv.STAGE_KINDS)


def kind_for(name: str, kind: str | None) -> str:
    """The stage kind: ``kind`` if given (validated), else the name if it is a kind, else other."""
    if kind is None:
        return name if name in _KINDS else semconv.KIND_OTHER
    if kind not in _KINDS:
        expected = ", ".join(semconv.STAGE_KINDS)
        raise ConfigurationError(f"unknown stage kind {kind!r}; expected one of {expected}")
    return kind


class Stage:
    """A named stage: decorate a function with it, or open it with ``with``/``async with``."""

    __slots__ = ("_blocks", "_site", "kind", "name")

    def __init__(self, name: str, kind: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("stage name must be a non-empty string")
        self.name = name
        self.kind = kind_for(name, kind)
        self._site = Site(name, self.kind)  # blocks; decorated functions get their own
        # Open blocks of this stage, per task/thread context (safe to share one Stage object).
        self._blocks: ContextVar[list[Any] | None] = ContextVar(f"tracekit.block.{name}", default=None)

    def __repr__(self) -> str:
        return f"stage({self.name!r}, kind={self.kind!r})"

    # --- decorator ------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"stage({self.name!r}) decorates a function, got {type(fn).__name__}")
        def site(shape: str) -> Site:
            return Site(self.name, self.kind, getattr(fn, "__qualname__", self.name),
                        getattr(fn, "__module__", None), shape)  # fmt: skip

        if inspect.isasyncgenfunction(fn):
            return _wrap_async_gen(fn, site(semconv.SHAPE_ASYNC_GENERATOR))
        if inspect.isgeneratorfunction(fn):
            return _wrap_gen(fn, site(semconv.SHAPE_GENERATOR))
        if inspect.iscoroutinefunction(fn):
            return _wrap_async(fn, site(semconv.SHAPE_COROUTINE))
        return _wrap_sync(fn, site(semconv.SHAPE_FUNCTION))

    # --- with / async with ----------------------------------------------------------------
    def __enter__(self) -> Stage:
        try:
            opened = stage_timing.enter(self._site, True)
            entry: list[Any] = [opened, None, None]
            entry[1] = self._blocks.set(entry)
            probe = _probe
            if probe is not None and opened is not None:
                entry[2] = probe.begin(opened[0])
        except Exception:
            internal_error("block enter")
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            entry = self._blocks.get()
            if entry is None:
                return
            opened, token, looking = entry
            self._blocks.reset(token)
            if opened is not None:
                led, outer = opened
                if looking is not None and _probe is not None:
                    _probe.end(led, looking)
                stage_timing.leave(led, outer, exc)
        except Exception:
            internal_error("block exit")

    async def __aenter__(self) -> Stage:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


#: Calls of one sync stage in flight at once (recursion, or a few threads) that need nothing
#: more. Each call has a wrapper frame the undecorated function would not have, and a
#: recursive function must reach the depth it reaches undecorated, traced or not (issue 11):
#: past this many calls, the interpreter's recursion limit is raised by a frame per call
#: (by all of them at the first), and given back when the stage is down to this many again
#: (not by each call: the deepest ones are too deep to lower the limit). Changed with C calls
#: only, inline: at the limit, calling a Python function would fail.
FREE_CALLS = 16
_limit_lock = threading.Lock()
_getrecursionlimit = sys.getrecursionlimit
_setrecursionlimit = sys.setrecursionlimit


def _wrap_sync(fn: F, site: Site) -> F:
    call_begin, call_end = stage_timing.call_begin, stage_timing.call_end
    call_end_counting = stage_timing.call_end_counting
    count_tokens = site.kind == semconv.KIND_TOKENIZE
    in_flight = 0  # calls of fn in flight, over all threads
    granted = 0  # recursion-limit frames added for them

    @functools.wraps(fn)
    def sync_stage(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, granted
        in_flight += 1
        if in_flight > FREE_CALLS:
            frames = 1 if in_flight > FREE_CALLS + 1 else in_flight
            with _limit_lock:
                _setrecursionlimit(_getrecursionlimit() + frames)
                granted += frames
        try:
            led = call_begin(site)
            if led is None:
                return fn(*args, **kwargs)
            probe = _probe
            looking = probe.begin(led) if probe is not None else None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                if looking is not None:
                    probe.end(led, looking)  # type: ignore[union-attr]
                call_end(led, exc)
                raise
            if looking is not None:
                probe.end(led, looking)  # type: ignore[union-attr]
            if count_tokens:
                call_end_counting(led, result)
            else:
                call_end(led, None)
            return result
        finally:
            in_flight -= 1
            if in_flight == FREE_CALLS and granted:
                with _limit_lock:
                    _setrecursionlimit(_getrecursionlimit() - granted)
                    granted = 0

    return sync_stage  # type: ignore[return-value]


def _wrap_async(fn: F, site: Site) -> F:
    enter, leave = stage_timing.enter, stage_timing.leave

    @functools.wraps(fn)
    async def async_stage(*args: Any, **kwargs: Any) -> Any:
        opened = enter(site, False)
        if opened is None:
            return await fn(*args, **kwargs)
        led, outer = opened
        probe = _probe
        looking = probe.begin(led) if probe is not None else None
        try:
            if outer is NO_STEP:  # its task is not driven: drive it here
                result = await Stepped(fn(*args, **kwargs), led)
            else:
                result = await fn(*args, **kwargs)
        except BaseException as exc:
            if looking is not None:
                probe.end(led, looking)  # type: ignore[union-attr]
            leave(led, outer, exc)
            raise
        if looking is not None:
            probe.end(led, looking)  # type: ignore[union-attr]
        leave(led, outer, None)
        return result

    return async_stage  # type: ignore[return-value]


def _wrap_gen(fn: F, site: Site) -> F:
    @functools.wraps(fn)
    def gen_stage(*args: Any, **kwargs: Any) -> StagedGenerator:
        return StagedGenerator(fn(*args, **kwargs), site)

    return gen_stage  # type: ignore[return-value]


def _wrap_async_gen(fn: F, site: Site) -> F:
    @functools.wraps(fn)
    def async_gen_stage(*args: Any, **kwargs: Any) -> StagedAsyncGenerator:
        return StagedAsyncGenerator(fn(*args, **kwargs), site)

    return async_gen_stage  # type: ignore[return-value]


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
