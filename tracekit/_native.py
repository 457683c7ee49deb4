"""Which of tracekit's modules are compiled to C (mypyc), and whether they are now.

tracekit is plain Python and runs anywhere as such. At install time ``setup.py`` compiles the
request-path modules below with mypyc when it can (a C compiler is there, and
``TRACEKIT_PURE_PYTHON`` is not set); compiled, a traced request costs about a third less
(docs/performance.md). The ``.py`` files stay the one source: the compiled modules are made
from them, and the test suite runs on both builds.

Writing for the compiler: module-level constants of the compiled modules are ``Final`` (mypyc
keeps them in C variables instead of looking them up in the module's dict), and their classes
declare every attribute (mypyc turns them into C structs).

``TRACEKIT_PURE_PYTHON=1`` at run time makes tracekit import the ``.py`` sources even where
compiled modules exist (to debug, or to compare the two). So does a compiled module that is
older than its source (an edited checkout: ``make`` rebuilds them) or that fails to load; both
are logged once.

This module is read by ``setup.py`` without importing tracekit: keep it free of imports
beyond the standard library.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: The modules mypyc compiles (names relative to the package): the request path (stages,
#: steps, accounting, the per-request record) and span building; and the analyzer's
#: per-span and per-request work: records, statistics, percentiles, the replay and the
#: event-loop index (docs/performance-analyzer.md: 11% fewer instructions a span, 40% for
#: the report). Every other module stays Python: the public wrappers above all, which
#: frameworks inspect (they must be real coroutine functions and classes), and assembly,
#: whose ``Group`` msgspec decodes when workers hand their state on (a compiled class does
#: not give it the field types).
COMPILED = (
    "semconv",
    "_core.event_loop",
    "_core.ledger",
    "_core.request_record",
    "_core.driver",
    "_core.stage_timing",
    "_core.asgi",
    "_export.span_attributes",
    "_export.readable_spans",
    "_export.sdk",
)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
BUILT_FROM = "_compiled_from.txt"  # written by setup.py: "module sha256" per compiled module


def pure_python_requested() -> bool:
    """``TRACEKIT_PURE_PYTHON`` is set: no compiled code (mypyc modules, the C poll) is used."""
    return os.environ.get("TRACEKIT_PURE_PYTHON", "").strip() not in ("", "0")


def load() -> None:
    """Decide, as ``import tracekit`` starts, between the compiled modules and the sources."""
    reason = None
    if pure_python_requested():
        prefer_source()
        return
    stale = _stale()
    if stale:
        reason = f"tracekit/{stale}.py changed since it was compiled (run make to rebuild)"
    else:
        try:
            importlib.import_module("tracekit._core.ledger")
        except ImportError as exc:
            reason = f"its compiled modules failed to load ({exc})"
    if reason is not None:
        for name in COMPILED:
            sys.modules.pop(f"tracekit.{name}", None)
        prefer_source()
        logging.getLogger("tracekit").warning("tracekit: running as plain Python: %s", reason)


def source_path(name: str, package_dir: str = _PACKAGE_DIR) -> str:
    """The ``.py`` file of compiled module ``name`` (``analysis._records``: a subpackage's)."""
    return os.path.join(package_dir, *name.split(".")) + ".py"


def source_digests(package_dir: str = _PACKAGE_DIR) -> dict[str, str]:
    """SHA-256 of each compiled module's source (what ``setup.py`` records as it compiles)."""
    digests = {}
    for name in COMPILED:
        with open(source_path(name, package_dir), "rb") as source:
            digests[name] = hashlib.sha256(source.read()).hexdigest()
    return digests


def _stale(package_dir: str = _PACKAGE_DIR) -> str | None:
    """A compiled module whose source changed since it was compiled (the first), or None.

    ``setup.py`` writes the sources' digests to ``BUILT_FROM`` as it compiles them (an edited
    checkout); an installed wheel has no such file and is never stale. Content, not file
    times: a rebuild leaves unchanged outputs as they were, and a touched file is not a
    changed one. Cost: hashing ~150 kB of source once per process.
    """
    try:
        with open(os.path.join(package_dir, BUILT_FROM)) as recorded:
            built = dict(line.split() for line in recorded if line.strip())
    except (OSError, ValueError):
        return None
    now = source_digests(package_dir)
    return next((name for name in COMPILED if built.get(name) != now[name]), None)


def compiled() -> bool:
    """Whether the compiled modules are the ones in use (all of them)."""
    for name in COMPILED:
        module = sys.modules.get(f"tracekit.{name}")
        if module is None:
            module = importlib.import_module(f"tracekit.{name}")
        if not str(getattr(module, "__file__", "")).endswith((".so", ".pyd")):
            return False
    return True


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` sources before any extension module."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        package, _, name = fullname.partition(".")
        if package != "tracekit" or name not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(name))


def prefer_source() -> None:
    """Import the compiled modules from their ``.py`` files (``TRACEKIT_PURE_PYTHON``)."""
    if not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
