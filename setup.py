"""Builds tracekit, compiling its request path with mypyc when it can.

The package metadata is in pyproject.toml; this file adds the compiled build: the modules
named in tracekit/_compiled_modules.txt (tracekit/_native.py says why those), compiled by
mypyc into one library, and the watchdog's C poll (tracekit/_core/_slicewatch.c). Both are
optional: without a C compiler, with TRACEKIT_PURE_PYTHON=1 set, or if mypyc fails,
tracekit installs as plain Python.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def ext_modules() -> list[Extension]:
    if os.environ.get("TRACEKIT_PURE_PYTHON", "").strip() not in ("", "0"):
        return []
    modules = mypyc_modules()
    if os.name == "posix":  # the poll waits on POSIX clocks
        modules.append(
            Extension("tracekit._core._slicewatch", ["tracekit/_core/_slicewatch.c"], optional=True)
        )
    return modules


def mypyc_modules() -> list[Extension]:
    names = (ROOT / "tracekit" / "_compiled_modules.txt").read_text().split()
    sources = [name.replace(".", "/") + ".py" for name in names]
    try:
        from mypyc.build import mypycify

        # Type-check only the compiled modules: what they import is read, not reported on.
        # One library for all (tracekit/_compiled__mypyc), so calls between them stay in C.
        extensions = mypycify(["--follow-imports=silent", *sources], opt_level="3",
                              group_name="tracekit._compiled")  # fmt: skip
    except (Exception, SystemExit) as exc:  # mypyc missing or failing: plain Python
        print(f"setup.py: not compiling tracekit's request path ({exc!r})", file=sys.stderr)
        return []
    # mypy's objects are garbage once the C is written: keep them out of the collector's
    # passes, above all the full one at exit (4-5 s of CPU, a third of a rebuild).
    gc.freeze()
    for extension in extensions:
        extension.optional = True  # no C compiler: build_ext skips it, tracekit stays Python
    return list(extensions)


setup(ext_modules=ext_modules())
