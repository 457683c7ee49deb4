"""Builds tracekit, compiling its request-path modules with mypyc when it can.

The package metadata is in pyproject.toml; this file only adds the compiled modules (listed in
tracekit/_native.py, which explains why) and three C helpers: the watchdog's poll
(tracekit/_core/_slicewatch.c), the OTLP reader's line scanner (tracekit/analysis/_otlp_scan.c) and
its attribute loop (tracekit/analysis/_otlp_attributes.c).
They are optional: without a C compiler, or with TRACEKIT_PURE_PYTHON=1 set, or if mypyc
fails, tracekit installs as plain Python.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    """The COMPILED tuple of tracekit/_native.py, read without importing tracekit."""
    tree = ast.parse((ROOT / "tracekit" / "_native.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            return [f"tracekit/{name.replace('.', '/')}.py" for name in ast.literal_eval(node.value)]
    raise SystemExit("setup.py: tracekit/_native.py has no COMPILED tuple")


def record_sources() -> None:
    """Write what the compiled modules are made from (tracekit/_native.py, BUILT_FROM): a
    checkout whose sources change afterwards runs them as plain Python until rebuilt."""
    spec = importlib.util.spec_from_file_location("_native", ROOT / "tracekit" / "_native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    lines = [f"{name} {digest}\n" for name, digest in native.source_digests(str(ROOT / "tracekit")).items()]
    (ROOT / "tracekit" / native.BUILT_FROM).write_text("".join(lines))


def ext_modules() -> list[object]:
    if os.environ.get("TRACEKIT_PURE_PYTHON", "").strip() not in ("", "0"):
        return []
    return mypyc_modules() + c_modules()


def c_modules() -> list[object]:
    """The C helpers, optional like the rest: the OTLP reader's line scanner and attribute loop
    (tracekit/analysis/_otlp_scan.c, _otlp_attributes.c) and the watchdog's GIL-free poll
    (tracekit/_core/_slicewatch.c; POSIX)."""
    from setuptools import Extension

    modules = [
        Extension("tracekit.analysis._otlp_attributes", ["tracekit/analysis/_otlp_attributes.c"],
                  optional=True),
        Extension("tracekit.analysis._otlp_scan", ["tracekit/analysis/_otlp_scan.c"],
                  optional=True),
    ]  # fmt: skip
    if os.name == "posix":
        modules.append(
            Extension("tracekit._core._slicewatch", ["tracekit/_core/_slicewatch.c"], optional=True)
        )
    return modules


def mypyc_modules() -> list[object]:
    try:
        from mypyc.build import mypycify

        # Type-check only the compiled modules: what they import is read, not reported on.
        extensions = mypycify(["--follow-imports=silent", *compiled_modules()], opt_level="3",
                              group_name="tracekit")  # the shared library: tracekit__mypyc
    except (Exception, SystemExit) as exc:  # mypyc missing or failing: plain Python
        print(f"setup.py: not compiling tracekit's hot path ({exc!r})", file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # no C compiler: build_ext skips it, tracekit stays Python
    record_sources()
    return list(extensions)


setup(ext_modules=ext_modules())
