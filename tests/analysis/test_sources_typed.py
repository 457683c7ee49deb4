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
    fast = typed_spans(line)
    if fast is None:
        return False
    reference = generic(line)
    assert not isinstance(reference, str), f"fast path took a line the generic one refuses: {reference}"
    spans, stats = reference
    assert (stats.skipped, stats.truncated) == (0, 0), stats.reasons
    assert fast == spans
    return True


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


def test_pure_python_asks_for_the_python_attribute_loop() -> None:
    code = "from tracekit.analysis import _otlp_typed as t; print(t.attributes is t.python_attributes)"
    env = {**os.environ, "TRACEKIT_PURE_PYTHON": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True"


def test_generated_traces_all_take_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 3_000)
    lines = path.read_bytes().splitlines()
    assert lines and all(check(line) for line in lines)


def test_the_base_document_takes_the_fast_path() -> None:
    assert check(orjson.dumps(otlp_doc()))


@pytest.mark.parametrize("path", OTLP_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_every_field_with_every_wrong_type(path: tuple[Any, ...]) -> None:
    doc = otlp_doc()
    check(json.dumps(replaced(doc, path, None, delete=True)).encode())
    for value in WRONG:
        check(json.dumps(replaced(doc, path, value)).encode())


@FUZZ
@given(data=st.data())
def test_random_field_mutations(data: st.DataObject) -> None:
    doc = otlp_doc()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(OTLP_PATHS))
        try:
            doc = replaced(doc, path, data.draw(json_values))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed this path
    check(json.dumps(doc).encode())


def attr_line(value: Any, **span: Any) -> bytes:
    base = otlp_doc()
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
    # This test's figure: 1,089 bytes a span; 2,284 with the sharing in _otlp_typed reverted.
    assert per_span < 1_600, f"{per_span:.0f} bytes held per span"

