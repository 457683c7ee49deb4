"""A trace file that is one JSON document, read in about its own size of memory.

Parsed whole, a document becomes dicts of ~12 times its size (a 200 MB OTLP file took
2.3 GB). Here msgspec decodes it only down to its span lists (OTLP) or trace lists (Jaeger):
each span or trace stays raw JSON, a view of the document's bytes, and is parsed when the
iterator reaches it -- an OTLP span through the typed structs of the JSON Lines fast path
(:mod:`tracekit.analysis._otlp_typed`), else the generic reader's conversion, as a line's are.
The decoding checks the JSON as it goes and stops at the first error having built nothing,
which is also what refuses garbage cheaply.

The result is exactly the generic reader's (``otlp_spans`` / ``jaeger_spans`` of
``orjson.loads(data)``): the same spans, skips, cuts and messages, for every document of the
usual shape; the readers return ``None`` for any other shape, which the caller then reads the
generic way (tiny or wrong documents: a bare Jaeger trace, an API error, a container of the
wrong type). A test compares both on every field mutation.

msgspec does not check the UTF-8 of what it skips: the caller checks the whole document with
:func:`utf8_error` first.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from tracekit.analysis._jaeger_json import _trace_spans
from tracekit.analysis._otlp_json import _service as generic_service
from tracekit.analysis._otlp_json import _span as generic_span
from tracekit.analysis._otlp_typed import _UNBOUNDED_NESTING, _NotExact, _Span, _span, _too_deep
from tracekit.analysis._source_common import SPAN_ERRORS, BadSpan, ReadStats, loads, one_line
from tracekit.analysis.model import Span
from tracekit.errors import TraceFormatError

__all__ = ["jaeger_document", "not_json", "otlp_document", "utf8_error"]

# UTF-8 is checked a MiB at a time, so that a large document is not copied into a str.
_PIECE = 2**20
_NULL = msgspec.Raw(b"null")
# A Raw member's value when it is absent.
_ABSENT = msgspec.Raw(b"")


# --- OTLP -----------------------------------------------------------------------------------
class _LazyScope(msgspec.Struct, gc=False):
    spans: list[msgspec.Raw] | None = None


class _LazyResourceSpans(msgspec.Struct, gc=False):
    resource: msgspec.Raw = _NULL
    scopeSpans: list[_LazyScope] | UnsetType | None = UNSET
    instrumentationLibrarySpans: list[_LazyScope] | None = None


class _LazyResult(msgspec.Struct, gc=False):
    resourceSpans: list[_LazyResourceSpans] | UnsetType | None = UNSET


class _LazyTracesData(msgspec.Struct, gc=False):
    resourceSpans: list[_LazyResourceSpans] | UnsetType | None = UNSET
    result: _LazyResult | UnsetType = UNSET  # the Jaeger API v3 envelope


_OTLP_DECODER = msgspec.json.Decoder(_LazyTracesData)
_SPAN_DECODER = msgspec.json.Decoder(_Span)


def otlp_document(data: bytes | bytearray, stats: ReadStats, where: str) -> Iterator[Span] | None:
    """The spans of a whole OTLP JSON document, each decoded only when it is reached.

    Args:
        data: the document, its UTF-8 checked already.
        stats: receives skip and truncation counts.
        where: the document's location for messages.

    Returns:
        An iterator of spans in file order; ``None`` when ``data`` is not OTLP, or its
        containers are not all of the expected types.

    Raises:
        msgspec.DecodeError: ``data`` is not JSON (at once; :func:`not_json` words it).
        TraceFormatError: a span is not JSON after all (while iterating: nested deeper than
            orjson reads).
    """
    try:
        doc = _OTLP_DECODER.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None
    resource_spans = doc.resourceSpans
    if resource_spans is UNSET:
        if doc.result is UNSET or doc.result.resourceSpans is UNSET:
            return None  # not OTLP: Jaeger JSON, an API error, something else
        resource_spans = doc.result.resourceSpans
    return _otlp_spans(resource_spans or [], stats, where)


def _otlp_spans(
    resource_spans: list[_LazyResourceSpans], stats: ReadStats, where: str
) -> Iterator[Span]:
    # The generic reader's walk (otlp_spans), over raw spans.
    for r, rs in enumerate(resource_spans):
        here = f"resourceSpans[{r}]"
        service = generic_service(_parse(rs.resource, where, here), stats)
        scopes = rs.scopeSpans
        if scopes is UNSET:
            scopes = rs.instrumentationLibrarySpans
        for s, scope in enumerate(scopes or ()):
            for i, raw in enumerate(scope.spans or ()):
                at = f"{here}.scopeSpans[{s}].spans[{i}]"
                try:
                    yield _otlp_span(raw, service, stats, where, at)
                except (BadSpan, *SPAN_ERRORS) as exc:
                    stats.skip(f"{where}: {at}", exc)


def _otlp_span(raw: msgspec.Raw, service: str, stats: ReadStats, where: str, at: str) -> Span:
    # The structs, as for a line; anything unusual goes the generic way, for this span only.
    if not (_UNBOUNDED_NESTING and _too_deep(bytes(raw))):
        try:
            return _span(_SPAN_DECODER.decode(raw), service)
        except (msgspec.DecodeError, _NotExact, BadSpan, RecursionError, *SPAN_ERRORS):
            pass
    return generic_span(_parse(raw, where, at), service, stats)


# --- Jaeger ---------------------------------------------------------------------------------
class _JaegerDocument(msgspec.Struct, gc=False):
    """Jaeger's ``{"data": [trace, ...]}`` down to its traces; the other members mark a
    document of another shape."""

    data: list[msgspec.Raw] | UnsetType | None = UNSET
    spans: msgspec.Raw = _ABSENT
    resourceSpans: msgspec.Raw = _ABSENT
    result: msgspec.Raw = _ABSENT


_JAEGER_DECODER = msgspec.json.Decoder(_JaegerDocument | list[msgspec.Raw])


def jaeger_document(
    data: bytes | bytearray, stats: ReadStats, where: str
) -> Iterator[Span] | None:
    """The spans of a Jaeger envelope or array of traces, each trace parsed when reached.

    Args, Returns and Raises: as :func:`otlp_document` (``None`` also for a bare trace, a
    document that also has OTLP members, and a ``data`` that is not a list).
    """
    try:
        doc = _JAEGER_DECODER.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None
    if isinstance(doc, list):
        return _jaeger_spans(doc, "[{}]", stats, where)
    if type(doc.data) is not list or any(
        member is not _ABSENT for member in (doc.spans, doc.resourceSpans, doc.result)
    ):
        return None
    return _jaeger_spans(doc.data, "data[{}]", stats, where)


def _jaeger_spans(
    traces: list[msgspec.Raw], label: str, stats: ReadStats, where: str
) -> Iterator[Span]:
    for t, raw in enumerate(traces):
        here = f"{where}: {label.format(t)}"
        yield from _trace_spans(_parse(raw, where, label.format(t)), stats, here)


def _parse(raw: msgspec.Raw, where: str, at: str) -> Any:
    try:
        return loads(memoryview(raw))
    except orjson.JSONDecodeError as exc:  # a ValueError, which would skip a span instead
        raise TraceFormatError(f"{where}: not valid JSON ({exc.msg} in {at})") from exc


# --- errors ---------------------------------------------------------------------------------
def utf8_error(data: bytes | bytearray | memoryview) -> int | None:
    """The offset of the first byte of ``data`` that is not UTF-8, or ``None``.

    Cost: nothing for ASCII; else a decode, a MiB at a time (a document is never copied
    into a str).
    """
    if not isinstance(data, memoryview) and data.isascii():
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for at in range(0, len(view), _PIECE):
        held = len(decoder.getstate()[0])  # the start of a character split by the cut
        try:
            decoder.decode(view[at : at + _PIECE], final=at + _PIECE >= len(view))
        except UnicodeDecodeError as exc:
            return at - held + exc.start
    return None


# msgspec's words for malformed JSON: "JSON is malformed: <reason> (byte <offset>)".
_MALFORMED = re.compile(r"JSON is malformed: (.+) \(byte (\d+)\)")


def not_json(data: bytes | bytearray, where: str, exc: msgspec.DecodeError) -> TraceFormatError:
    """msgspec's refusal of ``data``, in the words and units of the line reader's messages
    (``truncated JSON``; ``not valid JSON (... at line L column C)``)."""
    text = str(exc)
    if text == "Input data was truncated":
        return TraceFormatError(f"{where}: truncated JSON (ends after {len(data)} bytes)")
    found = _MALFORMED.fullmatch(text)
    if found is None:
        return TraceFormatError(f"{where}: not valid JSON ({one_line(text, 120)})")
    at = int(found[2])
    line = data.count(b"\n", 0, at) + 1
    column = at - data.rfind(b"\n", 0, at)
    return TraceFormatError(f"{where}: not valid JSON ({found[1]} at line {line} column {column})")
