"""The typed fast path of the OTLP JSON Lines reader gives exactly the generic reader's spans.

``typed_spans`` may decline a line (``None``: the generic reader then reads it), but whenever
it accepts one its spans must equal what ``otlp_spans(orjson.loads(line))`` yields, and the
generic reader must have skipped, cut and refused nothing there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import gen_traces
from tracekit.analysis import _otlp_typed
from tracekit.analysis._otlp_json import is_otlp, otlp_spans
from tracekit.analysis._otlp_typed import typed_spans
from tracekit.analysis._source_common import MAX_ARRAY_ITEMS, MAX_VALUE_CHARS, ReadStats
from tracekit.analysis.model import Span

from .test_sources_fuzz import FUZZ, OTLP_PATHS, WRONG, json_values, otlp_doc, replaced


def generic(line: bytes) -> tuple[list[Span], ReadStats] | str:
    """The generic reader's spans of one line, or why it refuses the line."""
    stats = ReadStats()
    try:
        doc = orjson.loads(line)
        if not is_otlp(doc) or "resourceSpans" not in doc:
            return "not a bare TracesData"
        return list(otlp_spans(doc, stats, "line")), stats
    except Exception as exc:  # every refusal, whatever its kind
        return f"{type(exc).__name__}: {exc}"


def check(line: bytes) -> bool:
    """Assert the fast path is exact on ``line``; whether it took the line."""
    attribute_loops_agree(line)
    scanner_agrees(line)
    fast = typed_spans(line)
    if fast is None:
        return False
    reference = generic(line)
    assert not isinstance(reference, str), f"fast path took a line the generic one refuses: {reference}"
    spans, stats = reference
    assert (stats.skipped, stats.truncated) == (0, 0), stats.reasons
    assert fast == spans
    return True


def scanner_agrees(line: bytes) -> bool:
    """Assert the C line scanner (where built), when it takes ``line``, gives the struct
    path's spans: every field, and every attribute value with its type. Whether it took it."""
    if _otlp_typed.scan is None:
        return False
    try:
        line.decode()  # typed_spans checks the UTF-8 before the scanner runs
    except UnicodeDecodeError:
        return False
    scanned = _otlp_typed.scan(line)
    if scanned is None:
        return False
    reference = _otlp_typed.struct_spans(line)
    assert reference is not None, "the scanner took a line the struct path refuses"
    assert [fields(s) for s in scanned] == [fields(s) for s in reference]
    return True


def fields(span: Span) -> list[Any]:
    return [(name, typed(getattr(span, name))) for name in span.__struct_fields__]


def attribute_loops_agree(line: bytes) -> None:
    """Assert the C attribute loop (where built) gives what the Python one gives on every
    attribute list of ``line``: the same keys, values and value types, or the same error."""
    if _otlp_typed.attributes is _otlp_typed.python_attributes:
        return  # the C loop is not built here
    try:
        doc = _otlp_typed._DECODER.decode(line)
    except msgspec.DecodeError:
        return
    for kvs in attribute_lists(doc):
        assert outcome(_otlp_typed.attributes, kvs) == outcome(_otlp_typed.python_attributes, kvs)


def attribute_lists(doc: Any) -> Iterator[Any]:
    for rs in doc.resourceSpans or ():
        if rs.resource is not None and rs.resource.attributes:
            yield rs.resource.attributes
        scopes = rs.scopeSpans if rs.scopeSpans is not msgspec.UNSET else rs.instrumentationLibrarySpans
        for scope in scopes or ():
            for span in scope.spans or ():
                if span.attributes:
                    yield span.attributes


def outcome(attributes: Any, kvs: Any) -> Any:
    """What an attribute loop makes of ``kvs``, with every value's type (1, 1.0 and True
    are equal in Python), or the type of the error it raises."""
    try:
        return typed(attributes(kvs))
    except Exception as exc:
        return type(exc)


def typed(value: Any) -> Any:
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, value)


def test_the_c_attribute_loop_is_used_where_built() -> None:
    # `make test` builds it (TRACEKIT_REQUIRE_COMPILED): a broken build must not pass as one.
    if os.environ.get("TRACEKIT_REQUIRE_COMPILED"):
        assert _otlp_typed.attributes is not _otlp_typed.python_attributes


def test_the_c_line_scanner_is_used_where_built() -> None:
    if os.environ.get("TRACEKIT_REQUIRE_COMPILED"):
        assert _otlp_typed.scan is not None


def test_pure_python_asks_for_the_python_attribute_loop_and_no_scanner() -> None:
    code = (
        "from tracekit.analysis import _otlp_typed as t; "
        "print(t.attributes is t.python_attributes, t.scan is None)"
    )
    env = {**os.environ, "TRACEKIT_PURE_PYTHON": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True True"


def test_generated_traces_all_take_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 3_000)
    lines = path.read_bytes().splitlines()
    assert lines and all(check(line) for line in lines)
    if _otlp_typed.scan is not None:  # and the scanner reads them all, declining none
        assert all(scanner_agrees(line) for line in lines)


def test_the_base_document_takes_the_fast_path() -> None:
    assert check(orjson.dumps(otlp_doc()))
    # Compact or spaced JSON alike, in the scanner too (which leaves span events to the structs).
    doc = otlp_doc()
    assert scanner_agrees(orjson.dumps(doc)) is False
    del doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    for line in (orjson.dumps(doc), json.dumps(doc, indent=1).encode()):
        assert scanner_agrees(line) or _otlp_typed.scan is None


def plain_doc() -> dict[str, Any]:
    """The base document without its span events, which the C scanner leaves to the struct
    path: mutations of this one go through the scanner."""
    doc = otlp_doc()
    del doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    return doc


@pytest.mark.parametrize("path", OTLP_PATHS, ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("make", [otlp_doc, plain_doc], ids=["events", "plain"])
def test_every_field_with_every_wrong_type(path: tuple[Any, ...], make: Any) -> None:
    doc = make()
    try:
        without = replaced(doc, path, None, delete=True)
    except (KeyError, IndexError):
        return  # a path into the events, which the plain document lacks
    check(json.dumps(without).encode())
    for value in WRONG:
        check(json.dumps(replaced(doc, path, value)).encode())


@FUZZ
@given(data=st.data())
def test_random_field_mutations(data: st.DataObject) -> None:
    doc = data.draw(st.sampled_from([otlp_doc, plain_doc]))()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(OTLP_PATHS))
        try:
            doc = replaced(doc, path, data.draw(json_values))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed this path
    check(json.dumps(doc).encode())


def attr_line(value: Any, **span: Any) -> bytes:
    base = plain_doc()
    target = base["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    target["attributes"] = [{"key": "k", "value": value}, {"key": "j", "value": {"intValue": 1}}]
    target.update(span)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    "value",
    [
        {"intValue": str(2**63)}, {"intValue": 2**63 - 1}, {"intValue": 2**63},
        {"intValue": 2**64}, {"intValue": -(2**63) - 1}, {"intValue": " 12 "},
        {"intValue": "1_000"}, {"intValue": "12a"}, {"intValue": "٣"}, {"intValue": 1.0},
        {"doubleValue": "NaN"}, {"doubleValue": "1.5"}, {"doubleValue": 3}, {"doubleValue": 2**70},
        {"doubleValue": 1e308}, {"doubleValue": True}, {"stringValue": "x" * MAX_VALUE_CHARS},
        {"stringValue": "x" * (MAX_VALUE_CHARS + 1)}, {"stringValue": "é ü 😀"},
        {"bytesValue": "AAEC"}, {"boolValue": 1}, {"boolValue": None}, {},
        {"doubleValue": 1.5, "stringValue": "s"}, {"stringValue": "s", "intValue": "3"},
        {"intValue": "3", "boolValue": True}, {"boolValue": True, "arrayValue": {"values": []}},
        {"arrayValue": {"values": [{"intValue": "1"}, {"intValue": 2}, {"intValue": "x"}]}},
        {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "2"}]}},
        {"arrayValue": {"values": [{"stringValue": "a"}, {}, {"doubleValue": 1}]}},
        {"arrayValue": {"values": [{"intValue": "1"}] * (MAX_ARRAY_ITEMS + 1)}},
        {"arrayValue": {"values": [{"arrayValue": {"values": []}}]}},
        {"arrayValue": {"values": None}}, {"arrayValue": {}}, {"arrayValue": None},
        {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}},
                                    {"key": "a", "value": {}}, {"key": "b", "value": {"boolValue": False}}]}},
        {"kvlistValue": {"values": [{"key": "a", "value": {"kvlistValue": {}}}]}},
        {"unknownValue": 1}, {"doubleValue": None}, {"stringValue": None},
    ],
)  # fmt: skip
def test_attribute_values(value: Any) -> None:
    check(attr_line(value))


@pytest.mark.parametrize(
    "span",
    [
        {"kind": True}, {"kind": 2.0}, {"kind": "SPAN_KIND_CLIENT"}, {"kind": None}, {"kind": 99},
        {"kind": 2**70}, {"status": {"code": 2.0}}, {"status": {"code": "STATUS_CODE_ERROR"}},
        {"status": {"code": True}}, {"status": {}}, {"status": None}, {"status": []},
        {"events": None}, {"events": []}, {"events": {}}, {"events": [1]},
        {"events": [{"timeUnixNano": "5", "name": "e", "attributes": [{"key": "a", "value": {}}]}]},
        {"events": [{"timeUnixNano": -5}]},
        {"parentSpanId": ""}, {"parentSpanId": "0000000000000000"}, {"parentSpanId": 0},
        {"parentSpanId": "00F067AA0BA902B7"}, {"spanId": "00F067AA0BA902B7"},
        {"spanId": "0f067aa0ba902b7"}, {"spanId": "0000000000000000"}, {"spanId": "b7ad6b7169203331"},
        {"spanId": "zz"}, {"traceId": "0AF7651916CD43DD8448EB211C80319C"},
        {"startTimeUnixNano": "3000", "endTimeUnixNano": "2000"}, {"startTimeUnixNano": 0},
        {"startTimeUnixNano": " 2000"}, {"endTimeUnixNano": str(2**64)}, {"name": None},
        {"name": 5}, {"attributes": None}, {"attributes": {}}, {"unknown": [1, {"x": "y"}]},
        {"~tracekit.service": "forged", "~tracekit.error": True},
    ],
)  # fmt: skip
def test_span_fields(span: dict[str, Any]) -> None:
    check(attr_line({"stringValue": "v"}, **span))


def test_bytes_the_fast_decoder_skips_are_checked_like_orjson_does() -> None:
    line = orjson.dumps(otlp_doc())
    # An unknown field with invalid UTF-8, a lone surrogate, or nested too deeply: orjson
    # refuses the line, so the fast path must not take it.
    for extra in (b'"zz":"\xff",', b'"zz":"\\ud800",', b'"zz":' + b"[" * 1100 + b"]" * 1100 + b","):
        mutated = line.replace(b'{"resourceSpans"', b"{" + extra + b'"resourceSpans"', 1)
        assert typed_spans(mutated) is None
        assert isinstance(generic(mutated), str)
    # Valid non-ASCII text and repeated keys are fine (the last one wins in both).
    assert check(line.replace(b'"name":"root"', b'"name":"r\xc3\xa9","name":"root"'))


def test_the_structs_refuse_what_orjson_finds_nested_too_deeply(tmp_path: Path) -> None:
    # From Python 3.12 msgspec's nesting limit is far above orjson's 1024: the struct path
    # checks the depth itself there (a conservative count of the brackets).
    line = orjson.dumps(plain_doc())
    for depth in (1000, 1023, 1024, 1100):
        mutated = line.replace(b'{"resourceSpans"', b'{"zz":' + b"[" * depth + b"]" * depth
                               + b',"resourceSpans"', 1)  # fmt: skip
        assert _otlp_typed._too_deep(mutated) == isinstance(generic(mutated), str), depth
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 600, batch_size=512)  # as the core's exporter writes
    big = max(path.read_bytes().splitlines(), key=len)
    assert big.count(b"[") + big.count(b"{") > 1024 and not _otlp_typed._too_deep(big)


@pytest.mark.parametrize(
    "doc",
    [
        {"result": otlp_doc()},
        {"resourceSpans": None},
        {"resourceSpans": []},
        {"resourceSpans": [{"instrumentationLibrarySpans": otlp_doc()["resourceSpans"][0]["scopeSpans"]}]},
        {"resourceSpans": [{"scopeSpans": None, "instrumentationLibrarySpans": []}]},
        {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"intValue": 5}}]},
                            "scopeSpans": otlp_doc()["resourceSpans"][0]["scopeSpans"]}]},
        {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"intValue": "x"}}]},
                            "scopeSpans": otlp_doc()["resourceSpans"][0]["scopeSpans"]}]},
        {"resourceSpans": [{"resource": [], "scopeSpans": []}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": None}, {"spans": {}}]}]},
        [otlp_doc()],
    ],
)  # fmt: skip
def test_documents(doc: Any) -> None:
    check(json.dumps(doc).encode())


def test_envelopes_and_other_formats_are_left_to_the_generic_reader() -> None:
    assert typed_spans(orjson.dumps({"result": otlp_doc()})) is None
    assert typed_spans(orjson.dumps({"data": []})) is None
    assert typed_spans(b"not json") is None


def test_a_held_span_shares_its_attribute_keys_and_short_texts(tmp_path: Path) -> None:
    # A span waits in the assembly window for ~10,000 more: the decoder's fresh copy of every
    # key and repeated text (names, kinds, code locations) would double what it holds.
    import tracemalloc

    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 3_000)
    lines = path.read_bytes().splitlines()
    typed_spans(lines[0])  # the shared strings exist before measuring
    tracemalloc.start()
    try:
        held = [span for line in lines for span in typed_spans(line) or ()]
        per_span = tracemalloc.get_traced_memory()[0] / len(held)
    finally:
        tracemalloc.stop()
    first, second = [s for s in held if s.name == held[0].name][:2]
    assert list(first.attributes) == list(second.attributes)
    assert all(a is b for a, b in zip(first.attributes, second.attributes, strict=True))
    assert first.name is second.name
    # This test's figures: 1,223 bytes a span through the C scanner, 1,259 through the
    # structs; 2,284 with the sharing in _otlp_typed reverted (measured when it was added).
    assert per_span < 1_600, f"{per_span:.0f} bytes held per span"


# --- the C line scanner: what it reads itself, and what it leaves to the struct path --------
def scanner_case(edit: Any) -> bytes:
    doc = plain_doc()
    rs = doc["resourceSpans"][0]
    edit(doc, rs, rs["scopeSpans"][0]["spans"][1])
    return json.dumps(doc, ensure_ascii=False).encode()


ODD = {"odd": [1, -2.5, 0, "s", True, False, None, {}, [], {"a": {"b": [{}]}}]}

SCANNED = {
    "unknown members everywhere": lambda d, rs, sp: (
        d.update(ODD), rs.update(ODD), rs["resource"].update(ODD), rs["scopeSpans"][0].update(ODD),
        sp.update(ODD, status={"code": 1, **ODD}, links=[ODD]),
        sp.update(attributes=[{"key": "k", "x": 1, "value": {"arrayValue": {"values": [], **ODD}}}]),
    ),
    "no parent": lambda d, rs, sp: sp.update(parentSpanId=None),
    "all-zero parent": lambda d, rs, sp: sp.update(parentSpanId="0" * 16),
    "kind by name": lambda d, rs, sp: sp.update(kind="SPAN_KIND_CLIENT"),
    "unknown kind": lambda d, rs, sp: sp.update(kind=99),
    "kind null": lambda d, rs, sp: sp.update(kind=None),
    "no kind": lambda d, rs, sp: sp.pop("kind"),
    "error by name": lambda d, rs, sp: sp.update(status={"code": "STATUS_CODE_ERROR", "message": "m"}),
    "status null": lambda d, rs, sp: sp.update(status=None),
    "times as numbers": lambda d, rs, sp: sp.update(startTimeUnixNano=2000, endTimeUnixNano=2**63 - 1),
    "largest time": lambda d, rs, sp: sp.update(endTimeUnixNano=str(2**64 - 1)),
    "attributes null": lambda d, rs, sp: sp.update(attributes=None),
    "resource null": lambda d, rs, sp: rs.update(resource=None),
    "resource without attributes": lambda d, rs, sp: rs.update(resource={}),
    "no scopes": lambda d, rs, sp: d["resourceSpans"].append({"resource": {}, "scopeSpans": None}),
    "values": lambda d, rs, sp: sp.update(attributes=[
        {"key": "n", "value": {"intValue": -(2**63)}}, {"key": "t", "value": {"intValue": "-007"}},
        {"key": "d", "value": {"doubleValue": 3}}, {"key": "e", "value": {"doubleValue": 2.5e-7}},
        {"key": "z", "value": {"doubleValue": -0.0}}, {"key": "u", "value": {"stringValue": "é ü 😀"}},
        {"key": "long", "value": {"stringValue": "x" * 300}}, {"key": "n", "value": {"boolValue": False}},
        {"key": "mixed", "value": {"arrayValue": {"values": [
            {"intValue": "1"}, {"doubleValue": 2.5}, {"stringValue": "s"}, {"boolValue": True}]}}},
        {"key": "none", "value": {"arrayValue": {"values": None}}},
        {"key": "empty", "value": {"arrayValue": {}}},
    ]),
}  # fmt: skip

DECLINED = {
    "span events": lambda d, rs, sp: sp.update(events=[]),
    "an escape": lambda d, rs, sp: sp.update(name='say "hi"'),
    "a duplicate member": None,  # bytes below
    "resource after the spans": lambda d, rs, sp: rs.update(resource=rs.pop("resource")),
    "instrumentationLibrarySpans": lambda d, rs, sp: rs.update(instrumentationLibrarySpans=[]),
    "uppercase id": lambda d, rs, sp: sp.update(spanId="00F067AA0BA902B7"),
    "short id": lambda d, rs, sp: sp.update(parentSpanId="abc"),
    "two value fields": lambda d, rs, sp: sp.update(attributes=[
        {"key": "k", "value": {"stringValue": "s", "intValue": "1"}}]),
    "kvlist value": lambda d, rs, sp: sp.update(attributes=[{"key": "k", "value": {"kvlistValue": {}}}]),
    "empty value": lambda d, rs, sp: sp.update(attributes=[{"key": "k", "value": {}}]),
    "a large int": lambda d, rs, sp: sp.update(attributes=[{"key": "k", "value": {"intValue": "9" * 19}}]),
    "a spaced int text": lambda d, rs, sp: sp.update(attributes=[{"key": "k", "value": {"intValue": " 1"}}]),
    "an exponent in an int": lambda d, rs, sp: sp.update(startTimeUnixNano=2e3),
    "a deep unknown member": lambda d, rs, sp: sp.update(odd=json.loads("[" * 70 + "]" * 70)),
    "service.name not a text": lambda d, rs, sp: rs["resource"].update(attributes=[
        {"key": "service.name", "value": {"intValue": 5}}]),
}  # fmt: skip


@pytest.mark.skipif(_otlp_typed.scan is None, reason="the C scanner is not built here")
@pytest.mark.parametrize("edit", SCANNED.values(), ids=SCANNED.keys())
def test_the_scanner_reads_these_itself(edit: Any) -> None:
    line = scanner_case(edit)
    assert scanner_agrees(line), "declined"
    assert check(line)


@pytest.mark.skipif(_otlp_typed.scan is None, reason="the C scanner is not built here")
@pytest.mark.parametrize("name", DECLINED.keys())
def test_the_scanner_leaves_these_to_the_struct_path(name: str) -> None:
    edit = DECLINED[name]
    if edit is None:
        line = scanner_case(lambda d, rs, sp: None).replace(
            b'"name": "child"', b'"name": "a", "name": "child"'
        )
    else:
        line = scanner_case(edit)
    assert _otlp_typed.scan is not None and _otlp_typed.scan(line) is None
    check(line)  # and the struct path, then the generic reader, read it exactly


@pytest.mark.skipif(_otlp_typed.scan is None, reason="the C scanner is not built here")
@FUZZ
@given(
    x=st.floats(allow_nan=False, allow_infinity=False),
    i=st.integers(-(2**63), 2**63 - 1),
    start=st.integers(1, 2**64 - 1),
)
def test_the_scanner_converts_numbers_as_the_structs_do(x: float, i: int, start: int) -> None:
    line = attr_line(
        {"doubleValue": x}, startTimeUnixNano=str(start), endTimeUnixNano=str(2**64 - 1),
        attributes=[{"key": "a", "value": {"intValue": i}}, {"key": "b", "value": {"intValue": str(i)}},
                    {"key": "c", "value": {"doubleValue": x}}],
    )  # fmt: skip
    assert scanner_agrees(line)
    assert check(line)
