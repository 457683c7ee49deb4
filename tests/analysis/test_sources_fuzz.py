"""Adversarial input for the readers: only Span objects or one-line TracekitErrors come out.

Malformed and hostile files (wrong types in every field, bad ids, cycles, negative durations,
huge values, deep nesting, random bytes, truncated real files) must never raise anything but
a TracekitError, never hang, and every span that does come out must be normalised.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.analysis.model import Span
from tracekit.analysis.readers import ReadStats, read_spans
from tracekit.errors import TracekitError

from .test_sources import REAL, assert_normalised, jaeger_span, otlp_attrs, traces_data

# Each example is a small file read in well under a second; the deadline catches runaway
# work (and leaves room for a loaded CI machine), the thread join in consume() a real hang.
FUZZ = settings(
    max_examples=80,
    deadline=3000,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
HANG_S = 20.0
REAL_FILES = sorted(REAL.glob("*.json")) if REAL.is_dir() else []

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
WRONG = [
    None,
    True,
    -1,
    2**70,
    float("nan"),
    "",
    "x",
    "0" * 40,
    [],
    {"a": 1},
    [{"key": "k"}],
    {"stringValue": 1},
]


def consume(source: Any) -> tuple[list[Span], ReadStats | None]:
    """Read everything from ``source`` in a thread; fail on a hang or a non-tracekit error."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            stream = read_spans(source)
            outcome["stats"] = stream.stats
            outcome["spans"] = list(stream)
        except BaseException as exc:  # the assertions below sort them
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"read_spans did not finish within {HANG_S} s"
    error = outcome.get("error")
    if error is not None:
        assert isinstance(error, TracekitError), f"{type(error).__name__}: {error}"
        assert str(error) and "\n" not in str(error)
        return [], None
    for span in outcome["spans"]:
        assert_normalised(span)
    return outcome["spans"], outcome["stats"]


def write(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def dump(doc: Any) -> bytes:
    # The stdlib writes what orjson refuses (ints beyond 64 bits, NaN): hostile input too.
    return json.dumps(doc).encode()


def otlp_doc() -> dict[str, Any]:
    spans = [
        {
            "traceId": "0af7651916cd43dd8448eb211c80319c",
            "spanId": "b7ad6b7169203331",
            "parentSpanId": "",
            "name": "root",
            "kind": 2,
            "startTimeUnixNano": "1000",
            "endTimeUnixNano": "5000",
            "status": {"code": 2},
            "attributes": otlp_attrs({"s": "v", "i": 1, "d": 1.5, "b": True, "a": [1, 2]}),
            "events": [{"timeUnixNano": "2000", "name": "e", "attributes": otlp_attrs({"k": 1})}],
        },
        {
            "traceId": "0af7651916cd43dd8448eb211c80319c",
            "spanId": "00f067aa0ba902b7",
            "parentSpanId": "b7ad6b7169203331",
            "name": "child",
            "kind": 1,
            "startTimeUnixNano": "2000",
            "endTimeUnixNano": "3000",
            "attributes": [],
        },
    ]
    return traces_data(spans)


def jaeger_doc() -> dict[str, Any]:
    child_of = [{"refType": "CHILD_OF", "traceID": "abc", "spanID": "1"}]
    tags = [
        {"key": "span.kind", "type": "string", "value": "server"},
        {"key": "n", "type": "int64", "value": 3},
        {"key": "error", "type": "bool", "value": True},
    ]
    logs = [
        {
            "timestamp": 1_700_000_000_000_001,
            "fields": [{"key": "event", "type": "string", "value": "x"}],
        }
    ]
    return {
        "data": [
            {
                "traceID": "abc",
                "processes": {"p1": {"serviceName": "svc", "tags": []}},
                "spans": [
                    jaeger_span("1", [], processID="p1", tags=tags, logs=logs),
                    jaeger_span("2", child_of, processID="p1"),
                ],
            }
        ]
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key/index path inside a JSON value."""
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def replaced(doc: Any, path: tuple[Any, ...], new: Any, delete: bool = False) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return doc


OTLP_PATHS = list(paths(otlp_doc()))
JAEGER_PATHS = list(paths(jaeger_doc()))


# --- wrong types in every field -------------------------------------------------------------
BASES = [(otlp_doc, OTLP_PATHS), (jaeger_doc, JAEGER_PATHS)]


@pytest.mark.parametrize(("make", "all_paths"), BASES, ids=["otlp", "jaeger"])
def test_every_field_with_every_wrong_type(tmp_path: Path, make: Any, all_paths: Any) -> None:
    base = make()
    good, _ = consume(write(tmp_path, "base.json", dump(base)))
    assert len(good) == 2
    outcomes = 0
    for path in all_paths:
        for i, new in enumerate([*WRONG, None]):
            doc = replaced(base, path, new, delete=i == len(WRONG))
            spans, stats = consume(write(tmp_path, "t.json", dump(doc)))
            assert len(spans) <= 2
            outcomes += stats is not None and stats.skipped > 0
    assert outcomes > len(all_paths)  # many mutations are skipped spans, not whole-file errors


@FUZZ
@given(data=st.data())
def test_random_field_mutations(tmp_path: Path, data: st.DataObject) -> None:
    make, all_paths = data.draw(st.sampled_from(BASES))
    doc = make()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(all_paths))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # path gone after a mutation
            doc = replaced(doc, path, data.draw(json_values))
    consume(write(tmp_path, "t.json", dump(doc)))


# --- ids, parents, durations ----------------------------------------------------------------
@FUZZ
@given(
    trace=st.text("0123456789abcdefABCDEF xyz-", max_size=40),
    span=st.text("0123456789abcdefABCDEF xyz-", max_size=20),
)
def test_ids_of_any_length(tmp_path: Path, trace: str, span: str) -> None:
    doc = replaced(
        replaced(otlp_doc(), ("resourceSpans", 0, "scopeSpans", 0, "spans", 1, "traceId"), trace),
        ("resourceSpans", 0, "scopeSpans", 0, "spans", 1, "spanId"),
        span,
    )
    spans, stats = consume(write(tmp_path, "t.json", dump(doc)))
    assert stats is not None and len(spans) + stats.skipped == 2
    valid = all(c in "0123456789abcdefABCDEF" for c in trace + span)
    kept = (
        valid
        and 0 < len(trace) <= 32
        and 0 < len(span) <= 16
        and trace.strip("0") != ""
        and span.strip("0") != ""
    )
    assert (len(spans) == 2) == kept
    if kept:
        assert spans[1].trace_id == trace.lower().rjust(32, "0")
        assert spans[1].span_id == span.lower().rjust(16, "0")


def test_cycles_self_parents_and_missing_parents(tmp_path: Path) -> None:
    tid = "1" * 32

    def span(sid: str, parent: str) -> dict[str, Any]:
        return {
            "traceId": tid,
            "spanId": sid,
            "parentSpanId": parent,
            "name": sid,
            "startTimeUnixNano": "10",
            "endTimeUnixNano": "20",
        }

    cycle = [
        span("a" * 16, "b" * 16),
        span("b" * 16, "a" * 16),
        span("c" * 16, "c" * 16),
        span("d" * 16, "e" * 16),
    ]
    chain = [span(f"{i + 1:016x}", f"{i:016x}" if i else "") for i in range(5000)]
    spans, stats = consume(write(tmp_path, "t.json", orjson.dumps(traces_data(cycle + chain))))
    assert stats is not None and stats.skipped == 1  # only the span that is its own parent
    assert [s.parent_id for s in spans[:3]] == ["b" * 16, "a" * 16, "e" * 16]
    assert len(spans) == 3 + 5000


@FUZZ
@given(
    start=st.integers(-(2**66), 2**66), duration=st.integers(-(2**66), 2**66), as_text=st.booleans()
)
def test_times_and_durations(tmp_path: Path, start: int, duration: int, as_text: bool) -> None:
    end = start + duration
    doc = otlp_doc()
    child = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    child["startTimeUnixNano"] = str(start) if as_text else start
    child["endTimeUnixNano"] = str(end) if as_text else end
    spans, stats = consume(write(tmp_path, "t.json", dump(doc)))
    assert stats is not None
    assert (len(spans) == 2) == (0 < start <= end < 2**64)


# --- huge, deep, random, truncated ------------------------------------------------------------
def test_huge_attribute_values(tmp_path: Path) -> None:
    doc = otlp_doc()
    root = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    root["attributes"] += [
        {"key": "prompt", "value": {"stringValue": "p" * 4_000_000}},
        {"key": "blob", "value": {"bytesValue": "A" * 2_000_000}},
        {"key": "many", "value": {"arrayValue": {"values": [{"intValue": "1"}] * 200_000}}},
    ] + [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(5000)]
    spans, stats = consume(write(tmp_path, "t.json", orjson.dumps(doc)))
    assert stats is not None and len(spans) == 2 and stats.truncated >= 1
    attrs = spans[0].attributes
    assert len(attrs) <= 1024 and all(len(str(v)) < 100_000 for v in attrs.values())
    jaeger = jaeger_doc()
    jaeger["data"][0]["spans"][0]["tags"].append(
        {"key": "prompt", "type": "string", "value": "j" * 3_000_000}
    )
    spans, stats = consume(write(tmp_path, "j.json", orjson.dumps(jaeger)))
    assert stats is not None and stats.truncated == 1
    assert len(spans[0].attributes["prompt"]) < 70_000


@pytest.mark.parametrize("depth", [1, 31, 33, 200, 400, 2000])
def test_deeply_nested_attribute_values(tmp_path: Path, depth: int) -> None:
    # Written as text: the stdlib encoder would itself recurse too deeply.
    opening = [
        b'{"arrayValue": {"values": [',
        b'{"kvlistValue": {"values": [{"key": "k", "value": ',
    ]
    closing = [b"]}}", b"}]}}"]
    value = (
        b"".join(opening[i % 2] for i in range(depth))
        + b'{"stringValue": "leaf"}'
        + b"".join(closing[i % 2] for i in reversed(range(depth)))
    )
    marker = b'"DEEP"'
    doc = otlp_doc()
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = [
        {"key": "deep", "value": "DEEP"}
    ]
    spans, _ = consume(write(tmp_path, "t.json", dump(doc).replace(marker, value)))
    if depth <= 32:
        assert len(spans) == 2 and "deep" in spans[0].attributes
    else:
        assert len(spans) <= 1  # skipped (too deep for tracekit) or refused (too deep for JSON)


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deeply_nested_documents(tmp_path: Path, depth: int) -> None:
    for opener, closer in ((b"[", b"]"), (b'{"a":', b"}")):
        assert consume(write(tmp_path, "t.json", opener * depth + b"1" + closer * depth))[0] == []
    wrapped = b'{"resourceSpans": ' + b"[" * depth + b"]" * depth + b"}"
    assert consume(write(tmp_path, "u.json", wrapped))[0] == []


@FUZZ
@given(
    content=st.binary(max_size=3000),
    prefix=st.sampled_from(
        [b"", b'{"resourceSpans": [', b'{"data": [{"spans": [', b"\x1f\x8b", b"\xef\xbb\xbf{"]
    ),
)
def test_random_bytes(tmp_path: Path, content: bytes, prefix: bytes) -> None:
    consume(write(tmp_path, "t.json", prefix + content))


@pytest.mark.skipif(not REAL_FILES, reason=f"real trace files not found at {REAL}")
@FUZZ
@given(data=st.data())
def test_truncated_real_files(tmp_path: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(REAL_FILES))
    content = source.read_bytes()
    cut = data.draw(st.integers(0, len(content) - 1))
    spans, _ = consume(write(tmp_path, source.name, content[:cut]))
    assert spans == [] or cut >= len(content.rstrip())  # a truncated document yields nothing


@pytest.mark.skipif(not REAL_FILES, reason=f"real trace files not found at {REAL}")
@FUZZ
@given(cut=st.integers(0, 10_000), lines=st.integers(1, 6))
def test_truncated_jsonl(tmp_path: Path, cut: int, lines: int) -> None:
    line = orjson.dumps(orjson.loads((REAL / "otlp-hotrod-n-plus-one-serial.json").read_bytes()))
    content = (line + b"\n") * lines
    cut = min(cut * 100, len(content))
    spans, _ = consume(write(tmp_path, "t.jsonl", content[:cut]))
    assert len(spans) <= 40 * lines and len(spans) % 40 == 0


# --- in-memory objects ---------------------------------------------------------------------
@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                "context",
                "parent",
                "name",
                "kind",
                "start_time",
                "end_time",
                "attributes",
                "events",
                "status",
                "resource",
            ]
        ),
        json_values,
        max_size=10,
    )
)
def test_odd_in_memory_objects(fields: dict[str, Any]) -> None:
    good = types.SimpleNamespace(
        context=types.SimpleNamespace(trace_id=1, span_id=2),
        parent=None,
        name="n",
        kind=types.SimpleNamespace(name="SERVER"),
        start_time=1,
        end_time=2,
        attributes={},
        events=[],
        status=types.SimpleNamespace(status_code=types.SimpleNamespace(name="OK")),
        resource=types.SimpleNamespace(attributes={"service.name": "s"}),
    )
    odd = types.SimpleNamespace(**{**vars(good), **fields})
    spans, stats = consume([good, odd, 7, "span", None])
    assert stats is not None and len(spans) + stats.skipped == 5 and len(spans) >= 1
