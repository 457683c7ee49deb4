"""Where a span's code held the event loop, read from the watchdog's catches.

The recorder writes the first catch as ``tracekit.blocked_at`` (the innermost application
frame) and every catch as a ``tracekit.blocked`` event with its stack. Two things the
attribute alone gets wrong:

- A catch inside an import (``<frozen importlib._bootstrap>`` frames: a module imported on
  the first request) is a one-off start-up cost, not where the stage blocks. The first catch
  outside an import is the stage's location; when every catch was an import, the location
  says so (:data:`IMPORT_PREFIX`), never shows an importlib frame.
- A catch inside the profiler's own frames (pyinstrument, when
  ``tracekit.integrations.pyinstrument`` profiles the call) shows its work, not the stage's:
  the location stands, its library frames are not kept, and a later catch outside it wins.
- The application frame says where, not what: the library frames it was running inside
  (``json/decoder.py``, ``requests/sessions.py``, ``socket.py``) say what the call was, and
  choose the fix. They are kept, shortened, as the record's ``blocked_frames``, without a
  garbage-collector finalizer the catch happened to land in (``__del__``, weakref callbacks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tracekit import semconv
from tracekit.analysis.model import Event

#: The start of a location that is an import on the first request, not a place in the code.
IMPORT_PREFIX = "a module import on the first request"
# Library frames kept per catch: enough to name the call (socket <- http.client <- requests).
_MAX_FRAMES = 6
_IMPORTLIB = "importlib._bootstrap"
_PROFILER = "pyinstrument/"
# The standard library's weakref callbacks (a WeakSet's, a WeakValueDictionary's, finalize's).
_WEAKREF_CALLBACKS = frozenset(
    {("_weakrefset.py", "_remove"), ("weakref.py", "remove"), ("weakref.py", "__call__")}
)
# Everything up to the package directory: ".../site-packages/httpx/_client.py" -> "httpx/_client.py".
_LIBRARY_ROOT = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d+(?:\.\d+)?)/")


def is_import_site(location: str | None) -> bool:
    """Whether a location (``blocked_at``) is an import on the first request."""
    return location is not None and (location.startswith(IMPORT_PREFIX) or _IMPORTLIB in location)


def blocked_site(blocked_at: str | None, events: Sequence[Event]) -> tuple[str | None, str | None]:
    """The location and library frames of a span's first catch outside an import.

    Args:
        blocked_at: the span's ``tracekit.blocked_at`` (the first catch), or ``None``.
        events: the span's events (the catches, with their stacks, are among them).

    Returns:
        ``(location, frames)``: the location as the recorder wrote it, or
        ``"a module import on the first request (PATH)"`` when every catch was an import
        (PATH: the module being executed, when a frame shows it); ``frames``: the catch's
        library frames inside the location, innermost first, one per line, or ``None``.

    Cost: only spans with a catch pay it (a scan of their events).
    """
    catches = [
        (str(e.attributes.get(semconv.BLOCKED_AT) or ""), e.attributes.get(semconv.EVENT_STACK))
        for e in events
        if e.name == semconv.EVENT_BLOCKED
    ]
    if not catches:
        if blocked_at is None:
            return None, None
        catches = [(blocked_at, None)]
    profiled = None
    for where, stack in catches:
        lines = stack.splitlines() if isinstance(stack, str) else []
        if where and not _in_import(where, lines):
            if not _in_profiler(where, lines):
                return where, _inner_frames(where, lines)
            profiled = profiled or where
    if profiled is not None:  # the place stands; what ran there was the profiler's own work
        return profiled, None
    return _import_site(catches), None


def _in_profiler(where: str, lines: list[str]) -> bool:
    # A catch inside pyinstrument's own frames (tracekit.integrations.pyinstrument profiling
    # the call): the stack shows the profiler's work (os.path calls), not the stage's.
    inner = lines[: lines.index(where)] if where in lines else lines
    return any(_PROFILER in line for line in inner)


def _in_import(where: str, lines: list[str]) -> bool:
    return _IMPORTLIB in where or any(_IMPORTLIB in line for line in lines)


def _inner_frames(where: str, lines: list[str]) -> str | None:
    # The stack is innermost first; the location is one of its lines (the innermost
    # application frame): the lines before it are the library code it was running.
    if where not in lines:
        return None
    inner = [_LIBRARY_ROOT.sub("", line) for line in lines[: lines.index(where)]]
    # A finalizer (``__del__``, a weakref callback) runs wherever the garbage collector
    # happened to start: it and what it called are not what the stage's code was doing.
    finalizers = [i for i, line in enumerate(inner) if _is_finalizer(line)]
    if finalizers:
        inner = inner[finalizers[-1] + 1 :]
    return "\n".join(inner[:_MAX_FRAMES]) or None


def _is_finalizer(line: str) -> bool:
    path, _, function = line.rpartition(" in ")
    path = path.rsplit(":", 1)[0]
    return function == "__del__" or (path, function) in _WEAKREF_CALLBACKS


def _import_site(catches: list[tuple[str, object]]) -> str:
    # The innermost frame running a module's top level ("in <module>") is what was imported.
    for _, stack in catches:
        for line in stack.splitlines() if isinstance(stack, str) else []:
            if line.endswith(" in <module>") and _IMPORTLIB not in line:
                return f"{IMPORT_PREFIX} ({_LIBRARY_ROOT.sub('', line).rsplit(':', 1)[0]})"
    return IMPORT_PREFIX
