"""The fast path of the OTLP JSON Lines reader: a C line scanner, then typed decoding with msgspec.

``orjson.loads`` builds a dict per span and two per attribute before the generic reader
(:mod:`tracekit.analysis._otlp_json`) converts them. Here, where it is built, the C scanner
(``_otlp_scan.c``, :data:`scan`) goes from a line's bytes straight to the :class:`Span`
objects, and declines what it does not read exactly; msgspec then decodes such a line into the
few typed structs the reader needs, validating types and limits in C and skipping unknown
fields, and :func:`struct_spans` turns them into the very same :class:`Span` objects.

The generic reader stays the reference. The structs accept only what the generic reader
converts without a skip, a cut or an error: a field typed ``X | UnsetType`` refuses ``null``,
attribute values forbid unknown fields, strings longer than the cut, lists longer than the
limits, nested arrays and key-value lists, integers outside 64 bits (orjson reads those as
floats) and ``"NaN"``-style doubles are all refused. For any line with something unusual
:func:`typed_spans` returns ``None`` and the caller reads that line the generic way, so skip
counts, messages and errors never depend on which path read a line (a test compares both on
every field mutation).

Cost: the scanner reads a span in about a third of the structs' time, and msgspec's decode is
about half of ``orjson.loads`` on tracekit's spans (figures in ``docs/performance-analyzer.md``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import accumulate, count
from operator import sub
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import UNSET, Meta, UnsetType

from tracekit import semconv
from tracekit.analysis._otlp_json import _events
from tracekit.analysis._source_common import (
    MAX_ARRAY_ITEMS,
    MAX_ATTRIBUTES,
    MAX_NS,
    MAX_VALUE_CHARS,
    SPAN_ERRORS,
    SPAN_IDS,
    TRACE_IDS,
    BadSpan,
    ReadStats,
    parent_id,
    span_id,
    trace_id,
)
from tracekit.analysis.assembly.request_records import SHARED, share, shared
from tracekit.analysis.model import SPAN_KINDS, Span

__all__ = ["typed_spans"]

_KINDS: dict[object, str] = dict(enumerate(SPAN_KINDS))
_KINDS.update({f"SPAN_KIND_{name.upper()}": name for name in SPAN_KINDS})
_ERROR_CODES = (2, "STATUS_CODE_ERROR")
_fromhex = bytes.fromhex
_ZERO_SPAN = "0" * 16

# What the generic reader takes without cutting: longer values go the generic way (and are cut
# and counted there). Integers as JSON numbers: orjson reads those beyond 64 bits as floats.
_Text = Annotated[str, Meta(max_length=MAX_VALUE_CHARS)]
_Int = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class _Scalar(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    doubleValue: float | UnsetType = UNSET
    stringValue: _Text | UnsetType = UNSET
    intValue: str | _Int | UnsetType = UNSET
    boolValue: bool | UnsetType = UNSET
    bytesValue: _Text | UnsetType = UNSET


class _Array(msgspec.Struct, gc=False):
    values: Annotated[list[_Scalar], Meta(max_length=MAX_ARRAY_ITEMS)] | None = None


class _ScalarKeyValue(msgspec.Struct, gc=False):
    key: str
    value: _Scalar


class _KvList(msgspec.Struct, gc=False):
    values: Annotated[list[_ScalarKeyValue], Meta(max_length=MAX_ATTRIBUTES)] | None = None


class _Value(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    doubleValue: float | UnsetType = UNSET
    stringValue: _Text | UnsetType = UNSET
    intValue: str | _Int | UnsetType = UNSET
    boolValue: bool | UnsetType = UNSET
    arrayValue: _Array | UnsetType = UNSET
    kvlistValue: _KvList | UnsetType = UNSET
    bytesValue: _Text | UnsetType = UNSET


class _KeyValue(msgspec.Struct, gc=False):
    key: str
    value: _Value


_Attributes = Annotated[list[_KeyValue], Meta(max_length=MAX_ATTRIBUTES)]


# The default of _Span.events (one shared object: absent events are an identity check).
_NO_EVENTS = msgspec.Raw(b"null")


class _Status(msgspec.Struct, gc=False):
    code: _Int | str | None = None


class _Span(msgspec.Struct, gc=False):
    traceId: str
    spanId: str
    startTimeUnixNano: str | _Int
    endTimeUnixNano: str | _Int
    parentSpanId: str | None = None
    name: str = ""
    kind: _Int | str | None = 0
    attributes: _Attributes | None = None
    status: _Status | None = None
    # Rare in tracekit's spans: kept as raw JSON and converted by the generic reader.
    events: msgspec.Raw = _NO_EVENTS


class _Scope(msgspec.Struct, gc=False):
    spans: list[_Span] | None = None


class _Resource(msgspec.Struct, gc=False):
    attributes: _Attributes | None = None


class _ResourceSpans(msgspec.Struct, gc=False):
    resource: _Resource | None = None
    scopeSpans: list[_Scope] | UnsetType | None = UNSET
    instrumentationLibrarySpans: list[_Scope] | None = None


class _TracesData(msgspec.Struct, gc=False):
    resourceSpans: list[_ResourceSpans] | UnsetType | None = UNSET


_DECODER = msgspec.json.Decoder(_TracesData)


class _NotExact(Exception):
    """The fast path cannot vouch for this line: the generic reader reads it."""


def typed_spans(line: bytes) -> list[Span] | None:
    """The spans of one OTLP JSON line, or ``None`` when the generic reader must read it.

    Args:
        line: one line of an OTLP JSON Lines file (one ``TracesData``).

    Returns:
        Exactly the spans the generic reader (``otlp_spans(orjson.loads(line), ...)``)
        yields, when it would skip, cut or refuse nothing; else ``None``.
    """
    if not line.isascii():
        try:
            line.decode()  # neither msgspec nor the scanner checks the UTF-8 of what they skip
        except UnicodeDecodeError:
            return None
    if scan is not None:
        spans = scan(line)
        if spans is not None:
            return spans
    return struct_spans(line)


def struct_spans(line: bytes) -> list[Span] | None:
    """:func:`typed_spans` through msgspec's structs (the scanner's reference, and what reads
    the lines it declines); ``line``'s UTF-8 is checked already."""
    if _UNBOUNDED_NESTING and _too_deep(line):
        return None
    try:
        doc = _DECODER.decode(line)
        resource_spans = doc.resourceSpans
        if resource_spans is UNSET:
            return None  # an envelope, Jaeger JSON or an error: the generic reader decides
        out: list[Span] = []
        for rs in resource_spans or ():
            service = _service(rs.resource)
            scopes = rs.scopeSpans
            if scopes is UNSET:
                scopes = rs.instrumentationLibrarySpans
            for scope in scopes or ():
                for raw in scope.spans or ():
                    out.append(_span(raw, service))
    except (msgspec.DecodeError, _NotExact, BadSpan, RecursionError, *SPAN_ERRORS):
        return None
    return out


# msgspec bounds nesting by Python's recursion limit, which from Python 3.12 on is a C stack
# limit well above the generic reader's (orjson refuses more than 1024 levels): it would take
# a line with a deeply nested unknown member that orjson refuses. The C scanner declines
# those itself; the structs check first.
_UNBOUNDED_NESTING = sys.version_info >= (3, 12)
_MAX_NESTING = 1024
_OPENS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[{]}"))


def _too_deep(line: bytes) -> bool:
    # Nesting counted on the brackets alone (those inside strings count too): it can only
    # overestimate, and then the generic reader decides. Cost: a C count per line; a pass
    # over the brackets only for a line with more than 1024 of them (3 ms for 512 spans).
    if line.count(b"[") + line.count(b"{") <= _MAX_NESTING:
        return False
    steps = line.translate(_OPENS, _NOT_BRACKETS)  # 2: opens, 0: closes
    # After i brackets, 2 x opens - i is the depth: the maximum, in C-level iterators.
    deepest: int = max(map(sub, accumulate(steps), count(1)))
    return deepest > _MAX_NESTING


def _service(resource: _Resource | None) -> str:
    if resource is None or not resource.attributes:
        return ""
    name = attributes(resource.attributes).get(semconv.SERVICE_NAME, "")
    return name if type(name) is str else str(name)


def _span(raw: _Span, service: str) -> Span:
    start = int(raw.startTimeUnixNano)  # decimal text in proto3 JSON
    end = int(raw.endTimeUnixNano)
    if not 0 < start <= end <= MAX_NS:
        raise _NotExact
    tid = raw.traceId
    tid = TRACE_IDS.get(tid) or trace_id(tid)
    sid = raw.spanId
    # A span's own id is seen once: check the canonical form (16 lowercase hex digits, not
    # all zeros) in C rather than going through the cache. A non-hex id raises ValueError.
    if len(sid) != 16 or _fromhex(sid).hex() != sid or sid == _ZERO_SPAN:
        sid = SPAN_IDS.get(sid) or span_id(sid)
    pid = raw.parentSpanId
    pid = (SPAN_IDS.get(pid) or parent_id(pid)) if pid else None
    if pid == sid:
        raise _NotExact
    status = raw.status
    events: Any = raw.events
    if events is not _NO_EVENTS:
        events = orjson.loads(memoryview(events))
        if events:
            stats = ReadStats()
            events = _events(events, stats)
            if stats.truncated:
                raise _NotExact
    name = raw.name
    return Span(
        tid,
        sid,
        pid,
        shared(name) or share(name),
        _KINDS.get(raw.kind, "unspecified"),
        start,
        end,
        service,
        attributes(raw.attributes) if raw.attributes else {},
        status is not None and status.code in _ERROR_CODES,
        events if events is not _NO_EVENTS and events else [],
    )


def python_attributes(kvs: list[_KeyValue]) -> dict[str, Any]:
    """Typed attribute values, as the generic reader's ``attributes`` makes them.

    :func:`attributes` is this, or the same loop in C where it is built
    (``_otlp_attributes.c``, same order and results: the tests compare both).

    Keys and short string values are shared strings
    (:func:`~tracekit.analysis.assembly.request_records.share`):
    the decoder makes a new string for every one, and a span waits in the assembly window
    for ~10,000 more, so sharing them there and then halves the memory a span holds and
    lets the later lookups by key compare identities.

    Cost: one pass; a double or a string (the common values) is one or two field reads.
    """
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        # The generic reader's order: double, string, int, bool, then the rest. The structs
        # have already checked the types and lengths.
        x: Any = value.doubleValue
        if x is UNSET:
            x = value.stringValue
            if x is not UNSET:
                x = shared(x) or share(x)
            else:
                x = value.intValue
                if x is not UNSET:
                    if type(x) is str:
                        x = int(x)
                else:
                    x = value.boolValue
                    if x is UNSET:
                        x = _value(value)
                        if x is None:
                            continue
        key = kv.key
        out[shared(key) or share(key)] = x
    return out


def _c_attributes() -> Callable[[list[_KeyValue]], dict[str, Any]] | None:
    # The C loop, where built and wanted (TRACEKIT_PURE_PYTHON unset), else None.
    from tracekit import _native

    if _native.pure_python_requested():
        return None
    try:
        from tracekit.analysis import _otlp_attributes

        _otlp_attributes.configure(
            _KeyValue, _Value, _Array, _Scalar, UNSET, SHARED, share, _value
        )
    except (ImportError, TypeError):  # not built, or msgspec laid its structs out otherwise
        return None
    return _otlp_attributes.attributes


def _value(value: _Value | _Scalar) -> Any:
    # Past double and string, in the generic reader's order; None for an empty value.
    x: Any = value.intValue
    if x is not UNSET:
        return int(x) if type(x) is str else x
    x = value.boolValue
    if x is not UNSET:
        return x
    if type(value) is _Value:
        if type(value.arrayValue) is _Array:
            return _array(value.arrayValue.values)
        if type(value.kvlistValue) is _KvList:
            kvs = value.kvlistValue.values or ()
            return {kv.key: x for kv in kvs if (x := _scalar(kv.value)) is not None}
    x = value.bytesValue
    return None if x is UNSET else x  # base64 text, kept as given


def _scalar(value: _Scalar) -> Any:
    x: Any = value.doubleValue
    if x is UNSET:
        x = value.stringValue
        if x is UNSET:
            x = _value(value)
    return x


def _array(items: list[_Scalar] | None) -> list[Any]:
    if not items:
        return []
    if items[0].intValue is not UNSET:
        # Integer arrays (tracekit's loop slices) are the common case.
        try:
            return [int(x) if type(x := item.intValue) is str else x.__index__() for item in items]  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass  # mixed items: one by one, as the generic reader does
    return [_scalar(item) for item in items]


#: The attribute loop: in C where built (:func:`python_attributes` is the reference).
attributes: Callable[[list[_KeyValue]], dict[str, Any]] = _c_attributes() or python_attributes


#: Slots of each of the scanner's two string caches (texts, ids): ~80 bytes a string held.
SCAN_CACHE_SLOTS = 4096


def configure_scanner(cache_slots: int = SCAN_CACHE_SLOTS) -> None:
    """(Re)configure the C scanner, emptying its caches; ``cache_slots``: a power of two."""
    from tracekit.analysis import _otlp_scan
    from tracekit.analysis.assembly.request_records import _SHARE_MAX_CHARS

    _otlp_scan.configure(
        Span, SHARED, share, _KINDS,
        _SHARE_MAX_CHARS, MAX_VALUE_CHARS, MAX_ATTRIBUTES, MAX_ARRAY_ITEMS, cache_slots,
    )  # fmt: skip


def _scanner() -> Callable[[bytes], list[Span] | None] | None:
    # The C line scanner, where built and wanted (TRACEKIT_PURE_PYTHON unset), else None.
    from tracekit import _native

    if _native.pure_python_requested():
        return None
    try:
        from tracekit.analysis import _otlp_scan

        configure_scanner()
    except ImportError:  # not built
        return None
    return _otlp_scan.scan


#: The line scanner: straight from the bytes to the spans, in C where built; it declines
#: (``None``) what only the structs read exactly, and :func:`struct_spans` reads that.
scan: Callable[[bytes], list[Span] | None] | None = _scanner()
