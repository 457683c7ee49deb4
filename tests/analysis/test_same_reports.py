"""The analyzer's reports do not change by accident: ``--format json`` of every real trace file
and of generated gateways (JSON Lines and one OTLP document) is compared with the report the
code gave when it was recorded (``tests/analysis/golden/``).

A change that is meant to change reports re-records them, and the diff of the golden files is
then part of the change for a reviewer to read:

    TRACEKIT_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/analysis/test_same_reports.py
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

import tracekit
from tests.helpers import REAL, gen_traces

GOLDEN = Path(__file__).parent / "golden"
GEN = gen_traces()


def _document(path: Path, n_spans: int, **gateway: object) -> None:
    path.write_bytes(orjson.dumps(GEN.traces_data(list(GEN.Gateway(**gateway).spans(n_spans)))))


GENERATED: dict[str, Callable[[Path], object]] = {
    "gen-5k.jsonl": lambda p: GEN.write_jsonl(p, 5000),
    "gen-busy.jsonl": lambda p: GEN.write_jsonl(p, 4000, rate=60, tokenize_ms=12, seed=3),
    "gen-doc.json": lambda p: _document(p, 3000, seed=5, stream_fraction=0.5),
}
REAL_FILES = sorted(p.name for p in REAL.glob("*.json")) if REAL.is_dir() else []


def _report(path: Path) -> bytes:
    # The generated traces record no host: the replay's cores are given, so that the reports
    # do not depend on the machine running the tests.
    report = tracekit.analyze(str(path), cores=2).to_dict()
    report["source"] = path.name  # where the file was written is not the report's
    return orjson.dumps(report, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def _check(name: str, path: Path) -> None:
    golden = GOLDEN / f"{Path(name).stem}.report.json"
    actual = _report(path)
    if os.environ.get("TRACEKIT_RECORD_GOLDEN"):
        golden.write_bytes(actual)
    assert golden.exists(), f"no golden report for {name}: record it (see the module docstring)"
    assert actual == golden.read_bytes(), f"the report of {name} changed (see the module docstring)"


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_traces_give_the_recorded_report(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    GENERATED[name](path)
    _check(name, path)


@pytest.mark.skipif(not REAL_FILES, reason=f"real trace files not found at {REAL}")
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_traces_give_the_recorded_report(name: str) -> None:
    _check(name, REAL / name)
