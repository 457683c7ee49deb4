"""What the trace reader says about bytes that are not UTF-8, and about a file still being
written (its last line cut short), in one pass and in the parallel reader alike."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import gen_traces
from tracekit.analysis import api
from tracekit.analysis.readers import parallel, read_spans
from tracekit.analysis.readers.parallel import Settings, analyze_plan, plan_file
from tracekit.cli import main
from tracekit.errors import TraceFormatError

SETTINGS = Settings(slo=None, route=None)


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """OTLP JSON Lines of ~2,000 spans, 40 a line, without their newlines."""
    path = tmp_path_factory.mktemp("lines") / "t.jsonl"
    gen_traces().write_jsonl(path, 2_000, batch_size=40)
    return path.read_bytes().splitlines()


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def in_parallel(path: Path, workers: int = 3) -> Any:
    plan = plan_file(str(path), str(path), workers=workers, min_range_bytes=1)
    assert plan is not None and len(plan.bounds) == workers + 1
    return analyze_plan(plan, SETTINGS)[1]


def error(read: Any) -> str:
    with pytest.raises(TraceFormatError) as caught:
        read()
    return str(caught.value)


# --- invalid UTF-8 --------------------------------------------------------------------------
BAD = b"\xc3\x28"  # a lead byte followed by one that cannot continue it


def test_invalid_utf8_in_a_json_lines_line_is_named_by_line_and_byte(
    lines: list[bytes], tmp_path: Path
) -> None:
    at = lines[30].index(b'"name":"') + len(b'"name":"')
    lines = [*lines[:30], lines[30][:at] + BAD + lines[30][at:], *lines[31:]]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    expected = f"{path}: line 31: not valid JSON (invalid UTF-8 at byte {at + 1} of the line)"
    assert error(lambda: list(read_spans(path))) == expected
    assert error(lambda: in_parallel(path)) == expected
    code, out, err = run_main("analyze", str(path))
    assert (code, out, err) == (2, "", f"tracekit: error: {expected}\n")


def test_invalid_utf8_on_the_first_line(lines: list[bytes], tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"x": "' + BAD + b'"}\n' + b"\n".join(lines))
    assert error(lambda: list(read_spans(path))) == (
        f"{path}: line 1: not valid JSON (invalid UTF-8 at byte 8 of the line)"
    )


@pytest.mark.parametrize("pretty", [False, True], ids=["one line", "pretty-printed"])
def test_invalid_utf8_in_a_document_is_named_by_its_offset(
    lines: list[bytes], tmp_path: Path, pretty: bool
) -> None:
    doc = orjson.loads(lines[0])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][7]["name"] = "MARK"
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if pretty else 0)
    at = data.index(b"MARK")
    path = tmp_path / "t.json"
    path.write_bytes(data.replace(b"MARK", BAD))
    message = error(lambda: list(read_spans(path)))
    assert message == f"{path}: not valid JSON (invalid UTF-8 at byte {at + 1})"
    assert "surrogates" not in message


def test_a_valid_multibyte_text_is_no_error(lines: list[bytes], tmp_path: Path) -> None:
    # A character cut by the reader's 1 MiB pieces is still one character.
    doc = orjson.loads(lines[0])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] = "é" * 600_000
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(doc))
    assert sum(1 for _ in read_spans(path)) == 40


# --- a file still being written -------------------------------------------------------------
def being_written(lines: list[bytes], path: Path, cut: int) -> bytes:
    """Write ``lines`` as a file whose last line has only its first ``cut`` bytes so far."""
    tail = lines[-1][:cut]
    path.write_bytes(b"\n".join(lines[:-1]) + b"\n" + tail)
    return tail


@pytest.mark.parametrize("cut", [1, 1000, -1], ids=["one byte", "1000 bytes", "all but one"])
def test_an_incomplete_last_line_is_skipped_and_counted(
    lines: list[bytes], tmp_path: Path, cut: int
) -> None:
    path = tmp_path / "t.jsonl"
    tail = being_written(lines, path, cut)
    stream = read_spans(path)
    assert sum(1 for _ in stream) == 40 * (len(lines) - 1)
    assert stream.stats.cut_tail_bytes == len(tail)
    found = in_parallel(path)
    assert (found.spans, found.stats.cut_tail_bytes) == (40 * (len(lines) - 1), len(tail))


def test_an_incomplete_last_line_gives_one_warning(
    lines: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.jsonl"
    tail = being_written(lines, path, 1000)
    warning = "skipped an incomplete last line (1,000 bytes): is the file still being written?"
    monkeypatch.setenv(parallel.ENV_WORKERS, "1")
    # The cut line held the server spans of traces whose stages came before it: a second
    # line says those stages are not requests (docs/composition.md).
    orphans = ("5 stage spans in 2 traces have no request (SERVER) span in the input, so they "
               "are not counted as requests: was the server span exported elsewhere? "
               "(docs/composition.md)")  # fmt: skip
    code, out, err = run_main("analyze", str(path), "--format", "json")
    assert code == 0 and orjson.loads(out)["spans"] == 40 * (len(lines) - 1)
    assert err == f"tracekit: warning: {warning}\ntracekit: warning: {orphans}\n"
    assert len(tail) == 1000
    single = api.analyze(path)
    assert single.warnings == [warning, orphans]
    monkeypatch.setattr(parallel, "MIN_RANGE_BYTES", 1)
    monkeypatch.setenv(parallel.ENV_WORKERS, "3")
    assert api.analyze(path).to_dict() == single.to_dict()


def test_a_complete_last_line_without_a_newline_is_read(lines: list[bytes], tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    total = 40 * (len(lines) - 1) + len(orjson.loads(lines[-1])["resourceSpans"][0]["scopeSpans"][0]["spans"])
    stream = read_spans(path)
    assert sum(1 for _ in stream) == total and stream.stats.cut_tail_bytes == 0
    found = in_parallel(path)
    assert (found.spans, found.stats.cut_tail_bytes) == (total, 0)


@pytest.mark.parametrize("where", ["middle", "last, with its newline"])
def test_a_line_cut_short_anywhere_else_is_still_an_error(
    lines: list[bytes], tmp_path: Path, where: str
) -> None:
    k = len(lines) // 2 if where == "middle" else len(lines) - 1
    cut = [*lines[:k], lines[k][:500], *lines[k + 1 :]]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(cut) + b"\n")
    expected = f"{path}: line {k + 1}: truncated JSON (ends after 501 bytes)"
    assert error(lambda: list(read_spans(path))) == expected
    assert error(lambda: in_parallel(path)) == expected


def test_a_two_line_file_whose_second_line_is_being_written(
    lines: list[bytes], tmp_path: Path
) -> None:
    # Not a pretty-printed document: the first line is JSON on its own.
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines[0] + b"\n" + lines[1][:77])
    stream = read_spans(path)
    assert sum(1 for _ in stream) == 40
    assert (stream.stats.format, stream.stats.cut_tail_bytes) == ("otlp-jsonl", 77)


# --- what a file of nothing readable says ---------------------------------------------------
def _jaeger(spans: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"data": [{"traceID": "a" * 32, "spans": spans,
                                   "processes": {"p1": {"serviceName": "s", "tags": []}}}]})  # fmt: skip


def _jaeger_span(span_id: str, **fields: Any) -> dict[str, Any]:
    return {"traceID": "a" * 32, "spanID": span_id, "operationName": "GET /x", "references": [],
            "startTime": 1_700_000_000_000_000, "duration": 5_000, "tags": [],
            "processID": "p1", **fields}  # fmt: skip


def test_a_file_whose_every_span_is_malformed_is_an_error_not_an_empty_report(tmp_path: Path) -> None:
    # A new user's file: one span without its start time read "No requests found", exit 0.
    path = tmp_path / "bad.json"
    broken = _jaeger_span("b" * 16)
    del broken["startTime"]
    path.write_bytes(_jaeger([broken]))
    code, out, err = run_main("analyze", str(path))
    assert code == 2 and out == ""
    assert err.strip() == (f"tracekit: error: {path}: no span could be read (1 skipped; the first: "
                           f"{path}: data[0].spans[0]: no 'startTime')")  # fmt: skip


def test_one_malformed_span_among_good_ones_is_a_warning_in_the_singular(tmp_path: Path) -> None:
    path = tmp_path / "one-bad.json"
    broken = _jaeger_span("c" * 16)
    del broken["startTime"]
    path.write_bytes(_jaeger([_jaeger_span("b" * 16), broken]))
    code, out, err = run_main("analyze", str(path))
    assert code == 0 and out
    assert "skipped 1 malformed span (first: " in err and "no 'startTime'" in err
    assert "KeyError" not in err


def test_a_json_null_is_named_as_json_names_it(tmp_path: Path) -> None:
    path = tmp_path / "null.json"
    path.write_bytes(b"null")
    code, _, err = run_main("analyze", str(path))
    assert code == 2 and err.strip().endswith("neither OTLP JSON nor Jaeger JSON (JSON null)")


# --- spans exported twice -------------------------------------------------------------------
def test_spans_exported_twice_are_counted_once_with_one_warning(
    lines: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each batch written twice, as a provider with two processors to one file writes it.
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    once.write_bytes(b"\n".join(lines) + b"\n")
    twice.write_bytes(b"".join(line + b"\n" + line + b"\n" for line in lines))
    monkeypatch.setenv(parallel.ENV_WORKERS, "1")
    want = api.analyze(once)
    assert not want.warnings
    got = api.analyze(twice)
    assert got.warnings == [
        f"{want.spans:,} spans repeated a span id already read in their trace, and were "
        "counted once: was each span exported twice (two exporters or processors writing to "
        "the same place)?"
    ]
    assert got.requests == want.requests and got.routes == want.routes
    monkeypatch.setattr(parallel, "MIN_RANGE_BYTES", 1)
    monkeypatch.setenv(parallel.ENV_WORKERS, "3")
    assert api.analyze(twice).to_dict() == got.to_dict()
