"""OTLP JSON -> :class:`Span`: the one reader of OTLP JSON, on msgspec's typed decoding.

It reads ``TracesData`` / ``ExportTraceServiceRequest``, bare or in the Jaeger API v3 envelope
``{"result": {...}}``, as the proto3 JSON mapping writes them: ids in hex (any case), 64-bit
integers (times in nanoseconds, ``intValue``) as decimal strings or JSON numbers, doubles as
numbers or as strings (``"NaN"``, ``"Infinity"``), enums as integers or names; unknown
fields are ignored.

msgspec decodes the JSON straight into the structs of
:mod:`~tracekit.analysis.readers.otlp_schema`, which hold only what the analyzer reads,
checking every type as it goes and skipping unknown fields in C. Its lax mode
(``strict=False``) reads numbers given as strings, as proto3 JSON allows for integers and
doubles (it also takes ``1`` or ``"true"`` for a bool). The conversion to :class:`Span` then
normalises ids and times, applies the value limits of :mod:`tracekit.analysis.readers.common`
(cuts are counted), and shares repeated strings
(:func:`~tracekit.analysis.assembly.request_records.share`: a span waits in the assembly
window for ~10,000 more, and one shared string per distinct key or short text halves what it
holds).

One decoding, at two granularities:

- :func:`line_spans` decodes a JSON Lines line whole. It is the fast path, taken by every
  line whose spans are all well formed, and returns ``None`` for any other line.
- :func:`otlp_spans` decodes the containers with each span left as raw JSON, then each span
  on its own, so that a malformed span is skipped and counted (naming where it is and why)
  and the others are read. It reads the lines :func:`line_spans` declines and every file
  that is one document, whose spans are then never all held as objects at once: reading it
  costs about the document's size, where dicts of it took ~12 times that.

A span is skipped for a field of the wrong type, a bad id or time, or an attribute value
nested deeper than ``MAX_VALUE_DEPTH``; a container (``resourceSpans``, ``scopeSpans``,
``spans``) of the wrong type is an error for the whole document; a ``resource`` that cannot
be read only costs the spans their service name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
from msgspec import UNSET, Raw

from tracekit import semconv
from tracekit.analysis.assembly.request_records import share, shared
from tracekit.analysis.model import SPAN_KINDS, Event, Span
from tracekit.analysis.readers.common import (
    MAX_ARRAY_ITEMS,
    MAX_ATTRIBUTES,
    MAX_NS,
    MAX_VALUE_CHARS,
    MAX_VALUE_DEPTH,
    SPAN_ERRORS,
    SPAN_IDS,
    TRACE_IDS,
    BadSpan,
    ReadStats,
    check_times,
    clip,
    parent_id,
    resource_extra,
    short,
    span_id,
    trace_id,
    with_resource,
)
from tracekit.analysis.readers.otlp_schema import (
    ABSENT,
    CONTAINERS,
    ENVELOPE,
    JSON_CHECK,
    LINE,
    RESOURCE,
    SPAN,
    AnyValue,
    KeyValue,
    OtlpEvent,
    OtlpSpan,
    RawResourceSpans,
    Resource,
)
from tracekit.errors import TraceFormatError

__all__ = ["attributes", "line_spans", "otlp_spans"]

_fromhex = bytes.fromhex
_ZERO_SPAN = "0" * 16
_KINDS: dict[object, str] = dict(enumerate(SPAN_KINDS))
_KINDS.update({f"SPAN_KIND_{name.upper()}": name for name in SPAN_KINDS})
_ERROR_CODES = (2, "STATUS_CODE_ERROR")


# --- the two granularities --------------------------------------------------------------------
def line_spans(line: bytes | bytearray, stats: ReadStats) -> list[Span] | None:
    """The spans of one JSON Lines line of OTLP JSON, decoded whole: the fast path.

    Args:
        line: the line.
        stats: receives the count of cut values (skips never happen here).

    Returns:
        The line's spans in file order; ``None`` when the line needs :func:`otlp_spans` or
        another reader: a span to skip, a type msgspec refuses, invalid UTF-8, not OTLP,
        not JSON.

    Cost: msgspec's decode plus the conversion, ~15 µs a span of tracekit's as plain Python,
    of which the decode is ~6 µs (docs/performance-analyzer.md).
    """
    if not line.isascii():
        try:
            line.decode()  # msgspec does not check the UTF-8 of what it skips
        except UnicodeDecodeError:
            return None
    truncated = stats.truncated
    try:
        doc = LINE.decode(line)
        resource_spans = doc.resourceSpans
        if resource_spans is UNSET:
            if doc.result is UNSET or doc.result.resourceSpans is UNSET:
                return None
            resource_spans = doc.result.resourceSpans
        out: list[Span] = []
        for rs in resource_spans or ():
            service, extra = _service(rs.resource, stats)
            scopes = rs.scopeSpans
            if scopes is UNSET:
                scopes = rs.instrumentationLibrarySpans
            for scope in scopes or ():
                for raw in scope.spans or ():
                    out.append(with_resource(_span(raw, service, stats), extra))
    except (msgspec.DecodeError, BadSpan, RecursionError, *SPAN_ERRORS):
        stats.truncated = truncated  # otlp_spans counts them again
        return None
    return out


def otlp_spans(
    data: bytes | bytearray, stats: ReadStats, where: str
) -> Iterator[Span] | None:
    """The spans of an OTLP JSON document or line, each span decoded when it is reached.

    Args:
        data: the JSON, its UTF-8 checked already (msgspec does not check what it skips).
        stats: receives skip and cut counts.
        where: the document's place for messages, e.g. ``"traces.jsonl: line 4"``.

    Returns:
        An iterator of the spans in file order, malformed spans skipped and counted;
        ``None`` when ``data`` is not OTLP JSON (another object, or not an object).

    Raises:
        msgspec.DecodeError: ``data`` is not JSON (at once; ``not_json`` words it).
        TraceFormatError: ``data`` is JSON, but a container is not a list or not an object
            (at once).
    """
    try:
        doc = CONTAINERS.decode(data)
    except msgspec.ValidationError as exc:
        _not_otlp(exc, data, where, "")
        return None
    resource_spans = doc.resourceSpans
    if resource_spans is UNSET:
        if doc.result is ABSENT:
            return None
        try:
            envelope = ENVELOPE.decode(doc.result)
        except msgspec.ValidationError as exc:
            _not_otlp(exc, data, where, "result.")
            return None
        resource_spans = envelope.resourceSpans
        if resource_spans is UNSET:
            return None
    return _each_span(resource_spans or [], stats, where)


def _each_span(
    resource_spans: list[RawResourceSpans], stats: ReadStats, where: str
) -> Iterator[Span]:
    for r, rs in enumerate(resource_spans):
        here = f"resourceSpans[{r}]"
        try:
            resource = RESOURCE.decode(rs.resource)
        except msgspec.ValidationError:
            resource = None
        service, extra = _service(resource, stats)
        scopes = rs.scopeSpans
        if scopes is UNSET:
            scopes = rs.instrumentationLibrarySpans
        for s, scope in enumerate(scopes or ()):
            for i, raw in enumerate(scope.spans or ()):
                try:
                    yield with_resource(_span(_decoded(raw), service, stats), extra)
                except (BadSpan, *SPAN_ERRORS) as exc:
                    stats.skip(f"{where}: {here}.scopeSpans[{s}].spans[{i}]", exc)


def _decoded(raw: Raw) -> OtlpSpan:
    try:
        return SPAN.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadSpan(_why(exc)) from None


# msgspec's words for a value of the wrong type: "Expected `array | null`, got `int` - at
# `$.resourceSpans[0]`" (no " - at ..." when the value itself is of the wrong type).
_MISMATCH = re.compile(r"Expected `([^`]+)`, got `([^`]+)`(?: - at `\$\.?(.*)`)?")
_TYPES = {"array": "a list", "object": "an object"}


def _not_otlp(exc: msgspec.ValidationError, data: bytes | bytearray, where: str, prefix: str) -> None:
    # Raise for a container of the wrong type, naming it; return for a value that is not an
    # object (not OTLP: other readers may take it).
    found = _MISMATCH.fullmatch(str(exc))
    if found is None or not found[3]:
        return
    # msgspec stops at the first value of the wrong type: data that is not JSON at all
    # further on is that first (msgspec.DecodeError).
    JSON_CHECK.decode(data)
    expected = found[1].split(" | ")[0]
    what = _TYPES.get(expected, expected)
    raise TraceFormatError(f"{where}: {prefix}{found[3]} is not {what}") from None


def _why(exc: msgspec.ValidationError) -> str:
    # Why a span was skipped: "attributes[3].value.boolValue is str, not bool".
    found = _MISMATCH.fullmatch(str(exc))
    if found is None:
        return str(exc)
    return f"{found[3] or 'the span'} is {found[2]}, not {found[1]}"


# --- conversion to Span -----------------------------------------------------------------------
def _service(resource: Resource | None, stats: ReadStats) -> tuple[str, dict[str, Any] | None]:
    # The service name, and the resource attributes the analyzer copies onto request spans.
    if resource is None or not resource.attributes:
        return "", None
    try:
        attrs = attributes(resource.attributes, stats)
    except (BadSpan, *SPAN_ERRORS):
        return "", None
    name = attrs.get(semconv.SERVICE_NAME, "")
    return (name if type(name) is str else str(name)), resource_extra(attrs)


def _span(raw: OtlpSpan, service: str, stats: ReadStats) -> Span:
    start = raw.startTimeUnixNano
    end = raw.endTimeUnixNano
    if not 0 < start <= end <= MAX_NS:
        check_times(start, end)
    # The id caches inline: the helpers run only on a miss (and raise on a bad id).
    tid = raw.traceId
    tid = TRACE_IDS.get(tid) or trace_id(tid)
    # A span's own id is mostly seen once: a canonical one (16 lowercase hex digits, not all
    # zeros) is checked in two C calls instead of going through the cache.
    sid = raw.spanId
    try:
        canonical = len(sid) == 16 and _fromhex(sid).hex() == sid and sid != _ZERO_SPAN
    except ValueError:  # not hex: span_id() says so
        canonical = False
    if not canonical:
        sid = SPAN_IDS.get(sid) or span_id(sid)
    pid = raw.parentSpanId
    if pid:
        pid = SPAN_IDS.get(pid) or parent_id(pid)
        if pid == sid:
            raise BadSpan(f"span {sid} is its own parent")
    else:
        pid = None
    name = raw.name
    status = raw.status
    kvs = raw.attributes
    events = raw.events
    return Span(
        tid,
        sid,
        pid,
        shared(name) or share(name),
        _KINDS.get(raw.kind, "unspecified"),
        start,
        end,
        service,
        attributes(kvs, stats) if kvs else {},
        status is not None and status.code in _ERROR_CODES,
        _events(events, stats) if events else [],
    )


def attributes(kvs: list[KeyValue], stats: ReadStats, depth: int = 0) -> dict[str, Any]:
    """A typed attribute dict from decoded ``KeyValue``s (the last duplicate wins).

    Args:
        kvs: the ``attributes`` (or ``kvlistValue.values``) list.
        stats: counts cut values and lists.
        depth: nesting depth of the enclosing value.

    Returns:
        ``{key: value}`` with int, float, bool, str, list and dict values; an attribute with
        an empty value is left out. Keys and texts up to 200 characters are shared strings.

    Raises:
        BadSpan / ValueError: a value nested too deeply, an integer or double text that is
        not a number.

    Cost: one pass, most of the reader's Python; a double or a text is one or two field
    reads.
    """
    if len(kvs) > MAX_ATTRIBUTES:
        stats.truncated += 1
        kvs = kvs[:MAX_ATTRIBUTES]
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        # double, string, int, bool: what tracekit writes, first; then the rest.
        x: Any = value.doubleValue
        if x is UNSET:
            x = value.stringValue
            if x is not UNSET:
                x = clip(x, stats) if len(x) > MAX_VALUE_CHARS else shared(x) or share(x)
            else:
                x = value.intValue
                if x is UNSET:
                    x = value.boolValue
                    if x is UNSET:
                        x = _value(value, stats, depth)
                        if x is None:
                            continue
        key = kv.key
        out[shared(key) or share(key)] = x
    return out


def _value(value: AnyValue, stats: ReadStats, depth: int) -> Any:
    # Any value, containers first; None for an empty one.
    if depth >= MAX_VALUE_DEPTH:
        raise BadSpan("attribute value nested too deeply")
    if value.arrayValue is not UNSET:
        return _array(value.arrayValue.values, stats, depth + 1)
    if value.kvlistValue is not UNSET:
        kvs = value.kvlistValue.values
        return attributes(kvs, stats, depth + 1) if kvs else {}
    x: Any = value.doubleValue
    if x is not UNSET:
        return x
    x = value.stringValue
    if x is not UNSET:
        return _text(x, stats)
    x = value.intValue
    if x is not UNSET:
        return x
    x = value.boolValue
    if x is not UNSET:
        return x
    x = value.bytesValue
    return None if x is UNSET else _text(x, stats)


def _array(items: list[AnyValue] | None, stats: ReadStats, depth: int) -> list[Any]:
    if not items:
        return []
    if len(items) > MAX_ARRAY_ITEMS:
        stats.truncated += 1
        items = items[:MAX_ARRAY_ITEMS]
    if items[0].intValue is not UNSET:
        # Integer arrays (tracekit's loop slices) are the common case.
        ints = [item.intValue for item in items]
        if UNSET not in ints:
            return ints
    return [_value(item, stats, depth) for item in items]


def _text(value: str, stats: ReadStats) -> str:
    return clip(value, stats) if len(value) > MAX_VALUE_CHARS else value


def _events(events: list[OtlpEvent], stats: ReadStats) -> list[Event]:
    out = []
    for event in events:
        time_ns = event.timeUnixNano
        if not 0 <= time_ns <= MAX_NS:
            raise BadSpan(f"event time {short(time_ns)} out of range")
        kvs = event.attributes
        out.append(Event(event.name, time_ns, attributes(kvs, stats) if kvs else {}))
    return out
