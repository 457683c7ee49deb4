"""Trace text cannot write code into a proposed fix: a stage name, a function name or a
``blocked_at`` location that tries to end a string or a comment stays inside it."""

from __future__ import annotations

import inspect
import io
import tokenize

import pytest

from tracekit.analysis.rules import fixes

HOSTILE = 'x")\nimport os; os.system("id")\n#\r\u2028'
FIXES = [f for name, f in inspect.getmembers(fixes, inspect.isfunction)
         if not name.startswith("_") and f.__module__ == fixes.__name__]  # fmt: skip


def _arguments(fn: object) -> list[object]:
    values: list[object] = []
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        values.append(3 if p.annotation in ("int", int) else HOSTILE)
    return values


@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f.__name__)
def test_hostile_names_stay_inside_strings_and_comments(fix: object) -> None:
    if fix is fixes.unblock:  # the blocked_at of each kind of blocking call
        cases = [(HOSTILE, None, at + HOSTILE) for at in ("time.sleep ", "requests ", "cuda ", "")]
    else:
        cases = [tuple(_arguments(fix))]
    for args in cases:
        _, code = fix(*args)  # type: ignore[operator]
        names = {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                 if t.type == tokenize.NAME}  # fmt: skip
        assert "system" not in names, code
