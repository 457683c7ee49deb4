"""Trace text cannot write code into a proposed fix: a stage name, a function name or a
``blocked_at`` location that tries to end a string or a comment stays inside it."""

from __future__ import annotations

import inspect
import io
import tokenize

import pytest

from tracekit import semconv
from tracekit.analysis.assembly.blocked_sites import IMPORT_PREFIX
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.stage_code import StageCode

HOSTILE = 'x")\nimport os; os.system("id")\n#\r\u2028'
FIXES = [f for name, f in inspect.getmembers(fixes, inspect.isfunction)
         if not name.startswith("_") and f.__module__ == fixes.__name__]  # fmt: skip


def _codes() -> list[StageCode]:
    # Every shape, every kind of call the location can name, the names all hostile.
    return [
        StageCode(stage=HOSTILE, kind=HOSTILE, function=HOSTILE, qualname=HOSTILE + qualname,
                  shape=shape, blocked_at=at + HOSTILE, frames=at + HOSTILE)
        for shape in (None, *semconv.STAGE_SHAPES)
        for at in ("time.sleep ", "requests ", "cuda ", "", IMPORT_PREFIX)
        for qualname in ("", ".method", ".<locals>.f")
    ]  # fmt: skip


def _cases(fn: object) -> list[list[object]]:
    cases: list[list[object]] = [[]]
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        if p.annotation in ("StageCode", StageCode):
            cases = [[*case, code] for case in cases for code in _codes()]
        else:
            value = 3 if p.annotation in ("int", int) else HOSTILE
            cases = [[*case, value] for case in cases]
    return cases


@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f.__name__)
def test_hostile_names_stay_inside_strings_and_comments(fix: object) -> None:
    for args in _cases(fix):
        _, code = fix(*args)  # type: ignore[operator]
        names = {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                 if t.type == tokenize.NAME}  # fmt: skip
        assert "system" not in names, code
