"""The compiled build of tracekit's request path (mypyc), and the plain-Python fallback.

tracekit is plain Python and runs anywhere as such. Where a C compiler is there, ``setup.py``
(``make build`` in a checkout) also compiles the modules named in ``_compiled_modules.txt``
with mypyc: the request path, whose per-request cost the overhead target is about (stages,
steps, the ledger, the request record, span building; docs/performance.md). That file is the
one list: ``setup.py``, the Makefile and this module read it the same way (names split on
whitespace). The public wrappers (``stage``, ``TracekitMiddleware``) stay Python: frameworks
inspect them, and a compiled function is not a coroutine function to ``inspect``.

The ``.py`` files stay the one source. Python imports an extension module before a source of
the same name, so the compiled modules are used where they exist, except that the sources are
imported instead (``prefer_source``) when

- ``TRACEKIT_PURE_PYTHON=1`` is set (to debug, to compare the builds, to test the plain one;
  the watchdog's C poll is not used either), or
- a compiled module fails to load (built for another tracekit or mypyc): logged once.

``TRACEKIT_REQUIRE_COMPILED=1`` makes ``import tracekit`` fail where the compiled modules are
missing or fail to load, unless ``TRACEKIT_PURE_PYTHON`` asks for the sources: ``make test``
sets it, so that a missing or broken build cannot pass as the compiled one.

Writing for the compiler: module-level constants of the compiled modules are ``Final`` (C
variables instead of module-dict look-ups) and their classes declare every attribute (C
structs).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(_PACKAGE_DIR, "_compiled_modules.txt")) as _listing:
    #: The modules mypyc compiles, e.g. ``tracekit._core.ledger``.
    COMPILED: tuple[str, ...] = tuple(_listing.read().split())


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def pure_python_requested() -> bool:
    """``TRACEKIT_PURE_PYTHON`` is set: no compiled code (mypyc modules, the C poll) is used."""
    return _flag("TRACEKIT_PURE_PYTHON")


def load() -> None:
    """Choose, as ``import tracekit`` starts, between the compiled modules and their sources."""
    if pure_python_requested():
        prefer_source()
    else:
        try:  # one stands for all: the compiled modules share one library (setup.py)
            importlib.import_module(COMPILED[0])
        except (ImportError, AttributeError) as exc:  # AttributeError: another build's library
            for name in COMPILED:
                sys.modules.pop(name, None)
            prefer_source()
            if _flag("TRACEKIT_REQUIRE_COMPILED"):
                raise ImportError(f"tracekit: its compiled modules failed to load ({exc})") from exc
            logging.getLogger("tracekit").warning(
                "tracekit: running as plain Python: its compiled modules failed to load (%s)", exc
            )
        if _flag("TRACEKIT_REQUIRE_COMPILED") and not compiled():
            raise ImportError("tracekit: TRACEKIT_REQUIRE_COMPILED is set but the compiled "
                              "request path is not built (make build)")  # fmt: skip


def compiled() -> bool:
    """Whether the compiled modules are the ones in use (all of them; none is imported)."""
    for name in COMPILED:
        module = sys.modules.get(name)
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
        if not isinstance(getattr(spec, "loader", None), importlib.machinery.ExtensionFileLoader):
            return False
    return True


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` files, ahead of the extension modules beside them."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        if fullname not in COMPILED:
            return None
        source = os.path.join(os.path.dirname(_PACKAGE_DIR), *fullname.split(".")) + ".py"
        return importlib.util.spec_from_file_location(fullname, source)


def prefer_source() -> None:
    """Import the compiled modules from their ``.py`` files from now on."""
    if not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
