"""The compiled build and its plain-Python fallback (tracekit/_native.py).

Each check runs ``import tracekit`` in a fresh interpreter: the choice is made at import."""

from __future__ import annotations

import os
import subprocess
import sys

REPORT = (  # whether the compiled modules are in use, and whether each was read from its .py
    "import importlib, tracekit; from tracekit import _native; print(_native.compiled(), "
    "all(importlib.import_module(name).__file__.endswith('.py') for name in _native.COMPILED))"
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environ, **env}, timeout=60, check=False)  # fmt: skip


def test_pure_python_runs_the_sources_even_where_compiled_modules_exist() -> None:
    run = _python(REPORT + "; from tracekit._core import watchdog; print(watchdog.GIL_FREE_WAIT)",
                  TRACEKIT_PURE_PYTHON="1")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True", "None"]  # no mypyc module, no C poll
    assert run.stderr == ""


def test_compiled_modules_that_fail_to_load_leave_their_sources_in_use() -> None:
    # As if the library were missing or from another build: the first one fails to import.
    failing = f"import sys; sys.modules[{_first()!r}] = None; "
    run = _python(failing + REPORT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]
    assert "running as plain Python: its compiled modules failed to load" in run.stderr
    required = _python(failing + "import tracekit", TRACEKIT_REQUIRE_COMPILED="1")
    assert required.returncode != 0
    assert "ImportError: tracekit: its compiled modules failed to load" in required.stderr


def test_an_unbuilt_checkout_runs_its_sources_and_require_compiled_refuses_it() -> None:
    # tracekit's directories as if nothing in them were compiled: their finders see sources only.
    unbuilt = (
        "import importlib.machinery as m, importlib.util, os, sys; "
        "top = os.path.dirname(importlib.util.find_spec('tracekit').origin); "
        "[sys.path_importer_cache.__setitem__(d, m.FileFinder(d, (m.SourceFileLoader, "
        "m.SOURCE_SUFFIXES))) for d in (top, os.path.join(top, '_core'), os.path.join(top, '_export'))]; "
    )
    run = _python(unbuilt + REPORT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"] and run.stderr == ""  # nothing failed to load
    required = _python(unbuilt + "import tracekit", TRACEKIT_REQUIRE_COMPILED="1")
    assert required.returncode != 0
    assert "TRACEKIT_REQUIRE_COMPILED is set but the compiled request path is not built" in (
        required.stderr)  # fmt: skip


def test_pure_python_is_a_choice_require_compiled_lets_pass() -> None:
    run = _python(REPORT, TRACEKIT_PURE_PYTHON="1", TRACEKIT_REQUIRE_COMPILED="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]


def test_no_analyzer_module_is_compiled() -> None:
    # Only the request path, where the overhead target needs it (docs/performance.md).
    from tracekit import _native

    assert _native.COMPILED and all(name.startswith("tracekit.") for name in _native.COMPILED)
    assert not [name for name in _native.COMPILED if name.startswith("tracekit.analysis")]


def _first() -> str:
    from tracekit import _native

    return _native.COMPILED[0]
