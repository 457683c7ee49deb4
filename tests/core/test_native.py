"""The compiled build (mypyc) and the plain-Python one: both are tracekit, both are tested."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit import _native

ROOT = Path(__file__).resolve().parents[2]


def test_the_compiled_build_is_in_use_where_it_was_built() -> None:
    # `make test` sets TRACEKIT_REQUIRE_COMPILED: a broken or stale build must not pass as
    # a fast one (tracekit falls back to its sources by itself, and says so in a log line).
    if not os.environ.get("TRACEKIT_REQUIRE_COMPILED"):
        pytest.skip("TRACEKIT_REQUIRE_COMPILED is not set (make test sets it)")
    assert _native.compiled(), "the compiled modules are not in use: run `make build`"


def test_the_core_and_analysis_suites_pass_as_plain_python() -> None:
    if not _native.compiled():
        pytest.skip("this run is plain Python already")
    env = dict(os.environ, TRACEKIT_PURE_PYTHON="1")
    env.pop("TRACEKIT_REQUIRE_COMPILED", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import tracekit._native as n, tracekit; print(n.compiled())"],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "False"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/core",
         "tests/analysis", "--deselect",
         "tests/core/test_native.py::test_the_core_and_analysis_suites_pass_as_plain_python"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_a_source_changed_since_it_was_compiled_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "tracekit"
    for name in _native.COMPILED:
        source = Path(_native.source_path(name, str(package)))
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {name}\n")
    assert _native._stale(str(package)) is None  # no record of a build: an installed wheel
    built = "".join(f"{n} {d}\n" for n, d in _native.source_digests(str(package)).items())
    (package / _native.BUILT_FROM).write_text(built)
    assert _native._stale(str(package)) is None
    for edited in (_native.COMPILED[3], "analysis._records"):
        source = _native.source_path(edited, str(package))
        os.utime(source, (time.time() + 60, time.time() + 60))  # touched only
        assert _native._stale(str(package)) is None
        Path(source).write_text("# edited\n")
        assert _native._stale(str(package)) == edited
        Path(source).write_text(f"# {edited}\n")
