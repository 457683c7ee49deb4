"""What ``tracekit demo`` says beside the report, on recordings of its own runs: the two replays
(the header's validation and a model-server finding's projection) told apart, and the fix's
measured p95 next to the projected one, each before labelled replayed or measured."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from tracekit.analysis.api import analyze
from tracekit.analysis.replay import arrivals
from tracekit.demo.runner import outcome, replay_note

DATA = Path(__file__).parents[1] / "analysis" / "data"


def report_of(name: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / name.removesuffix(".xz")
    path.write_bytes(lzma.decompress((DATA / name).read_bytes()))
    return analyze(str(path), cores=2)


def declined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    # A demo run on a busy host (the gateway's loop slices took 2.2x their CPU), its clients
    # read without their think time (as 4 clients, as before the replay read think times):
    # the replay of the recording as it was is within tolerance (the header: "validated"),
    # the replay with the model server taking one call at a time is not (p95 19% short).
    # Read with the think time, both replays reproduce it; the note is for runs where they
    # do not agree.
    monkeypatch.setattr(arrivals, "_paced", lambda *args: ({}, None))
    return report_of("demo-host-stalls.jsonl.xz", tmp_path)


def test_a_declined_model_server_projection_is_told_apart_from_the_headers_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a word between the two replays they read as a contradiction.
    report = declined(tmp_path, monkeypatch)
    assert report.validation["ok"]
    top = report.findings[0]
    assert top.rule == "serialized-model-calls" and not top.projection
    note = replay_note(report, top)
    assert note is not None and max(len(line) for line in note.splitlines()) <= 100
    words = " ".join(note.split())
    assert f"replayed the recording as it was (p50 {report.validation['p50_error']:+.1%}" in words
    assert "model server taking one call at a time" in words and "without a projection" in words


def test_no_note_where_the_replays_agree(tmp_path: Path) -> None:
    report = report_of("demo-serial-server.jsonl.xz", tmp_path)
    assert all(replay_note(report, f) is None for f in report.findings)


@pytest.mark.parametrize(("after", "where"), [(250.0, "inside"), (380.0, "above"), (100.0, "below")])
def test_the_outcome_labels_each_before_and_places_the_measured_after(tmp_path: Path, after: float,
                                                                     where: str) -> None:  # fmt: skip
    report = report_of("demo-serial-server.jsonl.xz", tmp_path)
    top = report.findings[0]
    (replayed, projected), (low, high) = top.projection["p95_ms"], top.projection["range"]["p95_ms"]
    assert 100 < low < 250 < high < 380  # the cases above are what they say
    comparison = {"routes": [{"latency_ms": {"p95": {"before": 422.0, "after": after}}}]}
    lines = outcome("serialized-model-calls:model", top, comparison, 8)
    assert lines[0] == "the fix of serialized-model-calls:model, p95 latency at 8 clients:"
    assert lines[1].split() == ["measured", "before", "422", "ms", "after", f"{after:.0f}", "ms",
                                f"{100 * (after / 422 - 1):+.1f}%"]  # fmt: skip
    assert lines[2].split()[:8] == ["projected", "(replayed)", "before", f"{replayed:.0f}", "ms",
                                    "after", f"{projected:.0f}", "ms"]  # fmt: skip
    assert f"range {low:.0f}-{high:.0f} ms" in lines[2]
    assert lines[3] == f"  the measured after is {where} the projected range"
    assert f"replayed: {100 * (replayed / 422 - 1):+.1f}% from the measured one" in lines[4]


def test_the_outcome_of_a_fix_without_projection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = declined(tmp_path, monkeypatch)
    comparison = {"routes": [{"latency_ms": {"p95": {"before": 650.0, "after": 344.0}}}]}
    lines = outcome("serialized-model-calls:model", report.findings[0], comparison, 8)
    assert lines[-1] == "  projected            none (the finding's note says why)"
