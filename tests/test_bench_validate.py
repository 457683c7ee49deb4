"""Smoke run of bench/validate.py --quick: one case end to end (servers, load, analyze, compare)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_validate_quick_writes_a_table_row_with_numbers(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/validate.py", "--quick", "--cases", "sequential-independent",
         "--markdown", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| sequential")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:3] == ["closed", "4 clients"]
    # measured p50 "before → after" from compare, and the client-side p50 / p95
    assert re.fullmatch(r"\d+ → \d+", cells[5]), cells[5]
    assert re.fullmatch(r"\d+ → \d+ / \d+ → \d+", cells[12]), cells[12]
    # a projection "before → after (low–high)" with its error, or (a busy host can make the
    # replay decline) the analyzer's reason in the verdict column
    if cells[4] == "—":
        assert cells[11].startswith("declined (replayed as recorded: p50 "), cells[11]
        assert "projections: 0 of 1 cases" in out.read_text()
    else:
        assert re.fullmatch(r"\d+ → \d+ \(\d+–\d+\)", cells[4]), cells[4]
        assert re.fullmatch(r"[+-]\d+%", cells[6]), cells[6]
        assert "projections: 1 of 1 cases" in out.read_text()


def test_a_row_whose_applied_fix_is_not_the_reports_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite applies its case's fix; when the report proposed another (the watchdog caught
    # a blocking call in the HTTP client's frames: an async client), the row says so.
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import validate

    row = {"rule": "blocking-call-on-loop", "load": "closed", "value": 2, "requests": 240,
           "load_avg": 0.5, "before_run": {}, "after_run": {}, "breakdown": None,
           "finding": {"rule": "blocking-call-on-loop", "stage": "lookup"}, "fix_matches": False,
           "note": "the replay could not reproduce this route as recorded"}  # fmt: skip
    assert "the fix applied is not the one the report proposed" in validate.table([row])
    assert validate.summary([row]).endswith("the fix applied is not the report's in 1")
    assert "not the report's" not in validate.summary([{**row, "fix_matches": True}])
