"""The OTLP JSON decoder (msgspec's typed decoding, tracekit/analysis/readers/otlp.py): what it
makes of every value type, every span field and every document shape, against expected values.

Each case is read twice, as a file that is one document (decoded span by span) and as the
second line of a JSON Lines file (decoded whole, or span by span when a span is skipped):
both must give the expected spans, counts and messages.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import gen_traces
from tracekit.analysis.model import Event, Span
from tracekit.analysis.readers import read_spans
from tracekit.analysis.readers.common import MAX_ARRAY_ITEMS, MAX_ATTRIBUTES, MAX_VALUE_CHARS, ReadStats
from tracekit.analysis.readers.otlp import line_spans
from tracekit.errors import TraceFormatError

from .test_sources_fuzz import FUZZ, otlp_doc

SKIPPED = "skipped"  # the span is skipped and counted
ABSENT = "absent"  # the attribute is left out
CLEAN = orjson.dumps(otlp_doc())


def read_both(tmp_path: Path, line: bytes) -> tuple[list[Span], ReadStats] | str:
    """The spans and read statistics of ``line`` (or the error message), the same read as a
    document and as a JSON Lines line."""
    outcomes = []
    files = (("doc.json", line, 0), ("lines.jsonl", CLEAN + b"\n" + line + b"\n", 2))
    for name, content, skip in files:
        path = tmp_path / name
        path.write_bytes(content)

        stream = read_spans(path)
        try:
            spans = list(stream)[skip:]
        except TraceFormatError as exc:
            outcomes.append(placed(str(exc), path))
            continue
        stream.stats.reasons = [placed(reason, path) for reason in stream.stats.reasons]
        stream.stats.format = ""
        outcomes.append((spans, stream.stats))
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


def placed(text: str, path: Path) -> str:
    # The same place in both files: "F" for the document, "F" for its line too.
    return text.replace(str(path), "F").replace("F: line 2", "F")


def plain_doc() -> dict[str, Any]:
    doc = otlp_doc()
    del doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    return doc


def child_line(value: Any = None, **span: Any) -> bytes:
    """The base document with span 1's attributes ``k`` (``value``) and ``j`` (1), and ``span``'s
    fields replaced."""
    doc = plain_doc()
    target = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    value = {"stringValue": "v"} if value is None else value
    target["attributes"] = [{"key": "k", "value": value}, {"key": "j", "value": {"intValue": 1}}]
    target.update(span)
    return json.dumps(doc).encode()


def child(tmp_path: Path, line: bytes) -> tuple[Span | str, ReadStats]:
    """Span 1 of ``line`` (or SKIPPED), and the read statistics."""
    outcome = read_both(tmp_path, line)
    assert not isinstance(outcome, str), outcome
    spans, stats = outcome
    assert spans[0].name == "root"
    if len(spans) == 1:
        assert stats.skipped == 1 and "spans[1]" in stats.reasons[0]
        return SKIPPED, stats
    assert len(spans) == 2 and stats.skipped == 0
    return spans[1], stats


# --- attribute values -----------------------------------------------------------------------
CUT = "x" * MAX_VALUE_CHARS + "…[1 more characters cut by tracekit]"
VALUES = [
    ({"intValue": str(2**63)}, 2**63), ({"intValue": 2**63 - 1}, 2**63 - 1), ({"intValue": 2**64}, 2**64),
    ({"intValue": -(2**63) - 1}, -(2**63) - 1), ({"intValue": "-12"}, -12), ({"intValue": " 12 "}, SKIPPED),
    ({"intValue": "-007"}, SKIPPED), ({"intValue": "12a"}, SKIPPED), ({"intValue": 1.0}, 1),
    ({"intValue": 1.5}, SKIPPED), ({"intValue": None}, SKIPPED),
    ({"doubleValue": "1.5"}, 1.5), ({"doubleValue": 3}, 3.0), ({"doubleValue": 2**70}, float(2**70)),
    ({"doubleValue": 1e308}, 1e308), ({"doubleValue": -0.0}, -0.0), ({"doubleValue": "Infinity"}, math.inf),
    ({"doubleValue": True}, SKIPPED), ({"doubleValue": None}, SKIPPED), ({"doubleValue": "many"}, SKIPPED),
    ({"stringValue": "x" * MAX_VALUE_CHARS}, "x" * MAX_VALUE_CHARS),
    ({"stringValue": "x" * (MAX_VALUE_CHARS + 1)}, CUT),
    ({"stringValue": "é ü 😀"}, "é ü 😀"), ({"stringValue": 'say "hi"\n'}, 'say "hi"\n'),
    ({"stringValue": None}, SKIPPED),
    ({"bytesValue": "AAEC"}, "AAEC"), ({"boolValue": False}, False), ({"boolValue": "true"}, True),
    ({"boolValue": "yes"}, SKIPPED), ({}, ABSENT),
    ({"doubleValue": 1.5, "stringValue": "s"}, 1.5), ({"stringValue": "s", "intValue": "3"}, "s"),
    ({"intValue": "3", "boolValue": True}, 3), ({"boolValue": True, "arrayValue": {"values": []}}, True),
    ({"arrayValue": {"values": [{"intValue": "1"}, {"intValue": 2}, {"intValue": "-3"}]}}, [1, 2, -3]),
    ({"arrayValue": {"values": [{"intValue": "1"}, {"intValue": 2}, {"intValue": "x"}]}}, SKIPPED),
    ({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "2"}]}}, [1, "2"]),
    ({"arrayValue": {"values": [{"stringValue": "a"}, {}, {"doubleValue": 1}, {"boolValue": True}]}},
     ["a", None, 1.0, True]),
    ({"arrayValue": {"values": [{"intValue": "1"}] * (MAX_ARRAY_ITEMS + 1)}}, [1] * MAX_ARRAY_ITEMS),
    ({"arrayValue": {"values": [{"arrayValue": {"values": [{"intValue": "4"}]}}]}}, [[4]]),
    ({"arrayValue": {"values": None}}, []), ({"arrayValue": {}}, []), ({"arrayValue": None}, SKIPPED),
    ({"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}, {"key": "a", "value": {}},
                                 {"key": "b", "value": {"boolValue": False}}]}}, {"a": 1, "b": False}),
    ({"kvlistValue": {"values": [{"key": "a", "value": {"kvlistValue": {}}}]}}, {"a": {}}),
    ({"unknownValue": 1}, SKIPPED), ({"stringValue": "s", "unknownValue": 1}, SKIPPED),
]  # fmt: skip


@pytest.mark.parametrize(("value", "expected"), VALUES, ids=[json.dumps(v)[:50] for v, _ in VALUES])
def test_attribute_values(tmp_path: Path, value: Any, expected: Any) -> None:
    span, stats = child(tmp_path, child_line(value))
    if expected == SKIPPED:
        assert span == SKIPPED
        return
    assert isinstance(span, Span)
    assert span.attributes.pop("j") == 1
    if expected == ABSENT:
        assert span.attributes == {}
        return
    got = span.attributes["k"]
    assert (got, type(got)) == (expected, type(expected))
    if type(expected) is float:
        assert math.copysign(1, got) == math.copysign(1, expected)  # -0.0 stays negative
    assert stats.truncated == (expected in (CUT, [1] * MAX_ARRAY_ITEMS))


def test_not_a_number_double() -> None:
    # proto3 JSON writes NaN as a string; NaN != NaN, so apart from the table.
    spans = line_spans(child_line({"doubleValue": "NaN"}), ReadStats())
    assert spans is not None and math.isnan(spans[1].attributes["k"])


# --- span fields ----------------------------------------------------------------------------
SPAN_ID, PARENT_ID = "00f067aa0ba902b7", "b7ad6b7169203331"
FIELDS = [
    ({"kind": "SPAN_KIND_CLIENT"}, "kind", "client"), ({"kind": 3}, "kind", "client"),
    ({"kind": None}, "kind", "unspecified"), ({"kind": 99}, "kind", "unspecified"),
    ({"kind": 2**70}, "kind", "unspecified"), ({"kind": True}, "kind", SKIPPED),
    ({"kind": 2.5}, "kind", SKIPPED),
    ({"status": {"code": "STATUS_CODE_ERROR"}}, "error", True), ({"status": {"code": 2}}, "error", True),
    ({"status": {"code": 1, "message": "m"}}, "error", False), ({"status": {}}, "error", False),
    ({"status": None}, "error", False), ({"status": {"code": 2.5}}, "error", SKIPPED),
    ({"status": {"code": True}}, "error", SKIPPED), ({"status": []}, "error", SKIPPED),
    ({"events": None}, "events", []), ({"events": []}, "events", []), ({"events": {}}, "events", SKIPPED),
    ({"events": [1]}, "events", SKIPPED), ({"events": [{"timeUnixNano": -5}]}, "events", SKIPPED),
    ({"events": [{"timeUnixNano": "5", "name": "e", "attributes": [{"key": "a", "value": {}}]}]}, "events",
     [Event("e", 5, {})]),
    ({"events": [{"timeUnixNano": 6, "attributes": [{"key": "a", "value": {"intValue": "2"}}]}]}, "events",
     [Event("", 6, {"a": 2})]),
    ({"parentSpanId": ""}, "parent_id", None), ({"parentSpanId": "0000000000000000"}, "parent_id", None),
    ({"parentSpanId": None}, "parent_id", None),
    ({"parentSpanId": "ABCDEF"}, "parent_id", "0000000000abcdef"),
    ({"parentSpanId": 0}, "parent_id", SKIPPED), ({"parentSpanId": SPAN_ID.upper()}, "parent_id", SKIPPED),
    ({"spanId": SPAN_ID.upper()}, "span_id", SPAN_ID), ({"spanId": SPAN_ID[1:]}, "span_id", SPAN_ID),
    ({"spanId": "0" * 16}, "span_id", SKIPPED), ({"spanId": PARENT_ID}, "span_id", SKIPPED),
    ({"spanId": "zz"}, "span_id", SKIPPED), ({"spanId": "1" * 17}, "span_id", SKIPPED),
    ({"traceId": "0AF7651916CD43DD8448EB211C80319C"}, "trace_id", "0af7651916cd43dd8448eb211c80319c"),
    ({"traceId": "ab"}, "trace_id", "0" * 30 + "ab"), ({"traceId": 5}, "trace_id", SKIPPED),
    ({"startTimeUnixNano": "3000", "endTimeUnixNano": "2000"}, "start_ns", SKIPPED),
    ({"startTimeUnixNano": 0}, "start_ns", SKIPPED), ({"startTimeUnixNano": " 2000"}, "start_ns", SKIPPED),
    ({"startTimeUnixNano": 2500}, "start_ns", 2500), ({"startTimeUnixNano": "2500.5"}, "start_ns", SKIPPED),
    ({"startTimeUnixNano": "soon"}, "start_ns", SKIPPED), ({"startTimeUnixNano": True}, "start_ns", SKIPPED),
    ({"endTimeUnixNano": str(2**64 - 1)}, "end_ns", 2**64 - 1),
    ({"endTimeUnixNano": str(2**64)}, "end_ns", SKIPPED),
    ({"name": None}, "name", SKIPPED), ({"name": 5}, "name", SKIPPED), ({"name": "é"}, "name", "é"),
    ({"attributes": None}, "attributes", {}), ({"attributes": []}, "attributes", {}),
    ({"attributes": {}}, "attributes", SKIPPED), ({"attributes": [{"key": "k"}]}, "attributes", SKIPPED),
    ({"attributes": [{"key": 1, "value": {}}]}, "attributes", SKIPPED),
    ({"unknown": [1, {"x": "y"}], "flags": 257}, "name", "child"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "name", "expected"), FIELDS, ids=[json.dumps(f)[:50] for f, _, _ in FIELDS]
)
def test_span_fields(tmp_path: Path, fields: dict[str, Any], name: str, expected: Any) -> None:
    span, _ = child(tmp_path, child_line(**fields))
    if expected == SKIPPED:
        assert span == SKIPPED
    else:
        assert isinstance(span, Span) and getattr(span, name) == expected


def test_more_attributes_than_the_limit_are_cut_and_counted(tmp_path: Path) -> None:
    many = [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(MAX_ATTRIBUTES + 1)]
    span, stats = child(tmp_path, child_line(attributes=many))
    assert isinstance(span, Span) and list(span.attributes) == [f"k{i}" for i in range(MAX_ATTRIBUTES)]
    assert stats.truncated == 1


def test_a_skip_names_the_span_and_the_field(tmp_path: Path) -> None:
    _, stats = child(tmp_path, child_line({"boolValue": "yes"}))
    assert stats.reasons == [
        "F: resourceSpans[0].scopeSpans[0].spans[1]: attributes[0].value.boolValue is str, not bool"
    ]
    _, stats = child(tmp_path, child_line(spanId="zz"))
    assert stats.reasons == ["F: resourceSpans[0].scopeSpans[0].spans[1]: id 'zz' is not hex"]


@FUZZ
@given(
    x=st.floats(allow_nan=False),
    i=st.integers(-(2**63), 2**64),
    start=st.integers(1, 2**64 - 1),
)
def test_numbers_are_read_exactly(x: float, i: int, start: int) -> None:
    line = child_line(
        startTimeUnixNano=str(start), endTimeUnixNano=str(2**64 - 1),
        attributes=[{"key": "a", "value": {"intValue": i}}, {"key": "b", "value": {"intValue": str(i)}},
                    {"key": "c", "value": {"doubleValue": x}}],
    )  # fmt: skip
    spans = line_spans(line, ReadStats())
    assert spans is not None
    got = spans[1]
    assert got.attributes == {"a": i, "b": i, "c": x} and got.start_ns == start
    assert [type(v) for v in got.attributes.values()] == [int, int, float]


# --- documents ------------------------------------------------------------------------------
SCOPES = otlp_doc()["resourceSpans"][0]["scopeSpans"]
DOCUMENTS = [
    ({"result": otlp_doc()}, (2, 0)), ({"result": otlp_doc(), "resourceSpans": None}, (0, 0)),
    ({"resourceSpans": None}, (0, 0)), ({"resourceSpans": []}, (0, 0)),
    ({"resourceSpans": [{"instrumentationLibrarySpans": SCOPES}]}, (2, 0)),
    ({"resourceSpans": [{"scopeSpans": None, "instrumentationLibrarySpans": SCOPES}]}, (0, 0)),
    ({"resourceSpans": [{"resource": [], "scopeSpans": SCOPES}]}, (2, 0)),
    ({"resourceSpans": [{"resource": None, "scopeSpans": [{"spans": None}, {}]}]}, (0, 0)),
    ({"resourceSpans": [{"scopeSpans": [{"spans": [1, None, "x", {}]}]}]}, (0, 4)),
    ({"resourceSpans": {"a": 1}}, "F: resourceSpans is not a list"),
    ({"resourceSpans": [None]}, "F: resourceSpans[0] is not an object"),
    ({"resourceSpans": [{"scopeSpans": [{"spans": None}, {"spans": {}}]}]},
     "F: resourceSpans[0].scopeSpans[1].spans is not a list"),
    ({"result": {"resourceSpans": 5}}, "F: result.resourceSpans is not a list"),
    ({"result": 5}, "F: neither OTLP JSON nor Jaeger JSON (an object with keys result)"),
    ([otlp_doc()], "F: [0]: 'spans' is not a list"),
    ({"data": None, "errors": [{"msg": "x"}]}, "F: Jaeger envelope holds no data (errors: [{'msg': 'x'}])"),
    ({"data": 5}, "F: Jaeger envelope 'data' is not a list"),
    ({"data": [None]}, "F: data[0] is not a Jaeger trace object"),
    ({"error": {"message": "gone"}}, "F: holds a Jaeger API error, not traces: gone"),
    ({}, "F: neither OTLP JSON nor Jaeger JSON (an empty object)"),
    (42, "F: neither OTLP JSON nor Jaeger JSON (a JSON number)"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "expected"), DOCUMENTS, ids=[json.dumps(d)[:40] for d, _ in DOCUMENTS])
def test_documents(tmp_path: Path, doc: Any, expected: tuple[int, int] | str) -> None:
    outcome = read_both(tmp_path, json.dumps(doc).encode())
    if isinstance(expected, str):
        assert outcome == expected
    else:
        assert not isinstance(outcome, str), outcome
        spans, stats = outcome
        assert (len(spans), stats.skipped) == expected


@pytest.mark.parametrize(("name", "expected"), [(5, "5"), ("x", ""), ([], "")])
def test_the_service_name(tmp_path: Path, name: Any, expected: str) -> None:
    # An integer service.name is written out; one that cannot be read costs only the name.
    value = {"intValue": name} if not isinstance(name, list) else {"arrayValue": name}
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": value}]},
                              "scopeSpans": SCOPES}]}  # fmt: skip
    outcome = read_both(tmp_path, json.dumps(doc).encode())
    assert not isinstance(outcome, str)
    assert [span.service for span in outcome[0]] == [expected, expected]


def test_what_the_fast_path_leaves_to_the_span_by_span_reading() -> None:
    stats = ReadStats()
    assert line_spans(CLEAN, stats) is not None
    assert line_spans(orjson.dumps({"result": otlp_doc()}), stats) is not None
    for other in (b'{"data": []}', b"[1]", b"not json", child_line({"boolValue": "yes"}), b'{"a": "\xff"}'):
        assert line_spans(other, stats) is None
    assert stats == ReadStats()  # nothing counted for a line read again


def test_bytes_msgspec_skips_are_checked(tmp_path: Path) -> None:
    # msgspec does not check what it skips: invalid UTF-8 in an unknown member is still an
    # error for the line; a lone surrogate too.
    for extra, message in ((b'"zz":"\xff",', "not valid JSON (invalid UTF-8 at byte 8 of the line)"),
                           (b'"zz":"\\ud800",', "JSON")):  # fmt: skip
        line = CLEAN.replace(b'{"resourceSpans"', b"{" + extra + b'"resourceSpans"', 1)
        path = tmp_path / "t.jsonl"
        path.write_bytes(CLEAN + b"\n" + line + b"\n")
        with pytest.raises(TraceFormatError, match="line 2: ") as caught:
            list(read_spans(path))
        assert message in str(caught.value)
    # Valid non-ASCII text and repeated members are fine (the last one wins).
    line = CLEAN.replace(b'"name":"root"', b'"name":"r\xc3\xa9","name":"root"')
    spans = line_spans(line, ReadStats())
    assert spans is not None and spans[0].name == "root"


# --- tracekit's own files -------------------------------------------------------------------
def test_generated_traces_take_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 3_000)
    stats = ReadStats()
    counts = [line_spans(line, stats) for line in path.read_bytes().splitlines()]
    assert all(spans is not None for spans in counts)
    assert sum(map(len, counts)) == sum(1 for _ in read_spans(path)) >= 3_000  # type: ignore[arg-type]
    assert stats == ReadStats()


def test_a_held_span_shares_its_attribute_keys_and_short_texts(tmp_path: Path) -> None:
    # A span waits in the assembly window for ~10,000 more: the decoder's fresh copy of every
    # key and repeated text (names, kinds, code locations) would double what it holds.
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 3_000)
    lines = path.read_bytes().splitlines()
    line_spans(lines[0], ReadStats())  # the shared strings exist before measuring
    tracemalloc.start()
    try:
        held = [span for line in lines for span in line_spans(line, ReadStats()) or ()]
        per_span = tracemalloc.get_traced_memory()[0] / len(held)
    finally:
        tracemalloc.stop()
    first, second = [s for s in held if s.name == held[0].name][:2]
    assert list(first.attributes) == list(second.attributes)
    assert all(a is b for a, b in zip(first.attributes, second.attributes, strict=True))
    assert first.name is second.name
    assert per_span < 1_600, f"{per_span:.0f} bytes held per span"
