"""OTLP JSON (``TracesData`` / ``ExportTraceServiceRequest``) -> :class:`Span`.

The proto3 JSON mapping: ids are hex (case-insensitive), times are nanoseconds as decimal
strings, ``intValue`` is a string, enums may be integers or names, unknown fields are ignored.
This is the hot path of ``tracekit analyze`` on OTLP JSON Lines, so the common attribute
types are converted inline and everything else goes through :func:`_value`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracekit import semconv
from tracekit.analysis._source_common import (
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
    short,
    span_id,
    trace_id,
)
from tracekit.analysis.model import SPAN_KINDS, Event, Span
from tracekit.errors import TraceFormatError

_KINDS: dict[object, str] = dict(enumerate(SPAN_KINDS))
_KINDS.update({f"SPAN_KIND_{name.upper()}": name for name in SPAN_KINDS})
_ERROR_CODES = (2, "STATUS_CODE_ERROR")


def is_otlp(doc: object) -> bool:
    """Whether a parsed document is OTLP JSON (bare, or in Jaeger API v3's ``result``)."""
    if type(doc) is not dict:
        return False
    if "resourceSpans" in doc:
        return True
    result = doc.get("result")
    return type(result) is dict and "resourceSpans" in result


def otlp_spans(doc: dict[str, Any], stats: ReadStats, where: str) -> Iterator[Span]:
    """Yield the spans of one OTLP JSON document, skipping (and counting) malformed ones.

    Args:
        doc: a parsed ``TracesData``, ``ExportTraceServiceRequest`` or ``{"result": ...}``.
        stats: receives skip and truncation counts.
        where: the document's location for messages, e.g. ``"traces.jsonl: line 4"``.

    Returns:
        An iterator of spans in file order.

    Raises:
        TraceFormatError: the document's containers (resourceSpans, scopeSpans, spans)
            are not lists of objects.
    """
    if "resourceSpans" not in doc:
        doc = doc["result"]
    for r, rs in enumerate(_objects(doc.get("resourceSpans"), where, "resourceSpans")):
        here = f"resourceSpans[{r}]"
        service = _service(rs.get("resource"), stats)
        # instrumentationLibrarySpans: the name before OTLP 0.15 (still written by old SDKs).
        scopes = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans"))
        for s, ss in enumerate(_objects(scopes, where, f"{here}.scopeSpans")):
            spans = ss.get("spans")
            if spans is None:
                continue
            if type(spans) is not list:
                raise TraceFormatError(f"{where}: {here}.scopeSpans[{s}].spans is not a list")
            for i, raw in enumerate(spans):
                try:
                    yield _span(raw, service, stats)
                except (BadSpan, *SPAN_ERRORS) as exc:
                    stats.skip(f"{where}: {here}.scopeSpans[{s}].spans[{i}]", exc)


def _objects(value: object, where: str, what: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if type(value) is not list or any(type(item) is not dict for item in value):
        raise TraceFormatError(f"{where}: {what} is not a list of objects")
    return value


def _service(resource: object, stats: ReadStats) -> str:
    if type(resource) is not dict:
        return ""
    try:
        name = attributes(resource.get("attributes"), stats).get(semconv.SERVICE_NAME, "")
    except (BadSpan, *SPAN_ERRORS):
        return ""
    return name if type(name) is str else str(name)


def _span(raw: dict[str, Any], service: str, stats: ReadStats) -> Span:
    # Cache lookups and range checks inline; the helpers run only on a miss or a bad value.
    start = raw["startTimeUnixNano"]
    start = int(start) if type(start) is str else _int(start)
    end = raw["endTimeUnixNano"]
    end = int(end) if type(end) is str else _int(end)
    if not 0 < start <= end <= MAX_NS:
        check_times(start, end)
    tid = raw["traceId"]
    tid = TRACE_IDS.get(tid) or trace_id(tid)
    sid = raw["spanId"]
    sid = SPAN_IDS.get(sid) or span_id(sid)
    pid = raw.get("parentSpanId")
    pid = (SPAN_IDS.get(pid) or parent_id(pid)) if pid else None
    if pid == sid:
        raise BadSpan(f"span {sid} is its own parent")
    name = raw.get("name", "")
    if type(name) is not str:
        raise BadSpan(f"name {short(name)} is not a string")
    status = raw.get("status")
    events = raw.get("events")
    return Span(
        tid,
        sid,
        pid,
        name,
        _KINDS.get(raw.get("kind", 0), "unspecified"),
        start,
        end,
        service,
        attributes(raw.get("attributes"), stats),
        status is not None and status.get("code") in _ERROR_CODES,
        _events(events, stats) if events else [],
    )


def _int(value: object) -> int:
    # proto3 JSON writes 64-bit integers as strings; bool is an int subclass, refuse it.
    if type(value) is str:
        return int(value)
    if type(value) is int:
        return value
    raise BadSpan(f"{short(value)} is not an integer")


def attributes(kvs: object, stats: ReadStats, depth: int = 0) -> dict[str, Any]:
    """Convert an OTLP ``KeyValue`` list to a typed dict (last duplicate wins).

    Args:
        kvs: the ``attributes`` (or ``kvlistValue.values``) list, or None.
        stats: counts truncated values.
        depth: nesting depth of the enclosing value.

    Returns:
        ``{key: value}`` with int, float, bool, str, list and dict values; an attribute
        with an empty value is left out.
    """
    out: dict[str, Any] = {}
    if not kvs:
        return out
    if type(kvs) is not list:
        raise BadSpan("attributes is not a list")
    if len(kvs) > MAX_ATTRIBUTES:
        stats.truncated += 1
        kvs = kvs[:MAX_ATTRIBUTES]
    for kv in kvs:
        key = kv["key"]
        value = kv["value"]
        if type(key) is not str:
            raise BadSpan(f"attribute key {short(key)} is not a string")
        # The scalar cases inline: this loop is most of the reader's time.
        if "doubleValue" in value:
            x = value["doubleValue"]
            if type(x) is not float:
                x = _float(x)
        elif "stringValue" in value:
            x = value["stringValue"]
            if type(x) is not str or len(x) > MAX_VALUE_CHARS:
                x = _string(x, stats)
        elif "intValue" in value:
            x = value["intValue"]
            x = int(x) if type(x) is str else _int(x)
        elif "boolValue" in value:
            x = value["boolValue"]
            if type(x) is not bool:
                raise BadSpan(f"{key}: boolValue {short(x)} is not a boolean")
        else:
            x = _value(value, stats, depth)
            if x is None:
                continue
        out[key] = x
    return out


def _value(value: dict[str, Any], stats: ReadStats, depth: int) -> Any:
    # Any AnyValue, recursively; None for an empty one. Containers first: attributes()
    # and _array() handle the scalars inline and call this mostly for arrays.
    if depth >= MAX_VALUE_DEPTH:
        raise BadSpan("attribute value nested too deeply")
    if "arrayValue" in value:
        return _array(value["arrayValue"].get("values"), stats, depth + 1)
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values"), stats, depth + 1)
    if "doubleValue" in value:
        return _float(value["doubleValue"])
    if "stringValue" in value:
        return _string(value["stringValue"], stats)
    if "intValue" in value:
        return _int(value["intValue"])
    if "boolValue" in value:
        x = value["boolValue"]
        if type(x) is not bool:
            raise BadSpan(f"boolValue {short(x)} is not a boolean")
        return x
    if "bytesValue" in value:
        return _string(value["bytesValue"], stats)  # base64 text, kept as given
    if not value:
        return None
    raise BadSpan(f"unknown attribute value {short(value)}")


def _array(items: object, stats: ReadStats, depth: int) -> list[Any]:
    if not items:
        return []
    if type(items) is not list:
        raise BadSpan("arrayValue.values is not a list")
    if len(items) > MAX_ARRAY_ITEMS:
        stats.truncated += 1
        items = items[:MAX_ARRAY_ITEMS]
    first = items[0]
    if type(first) is dict and "intValue" in first:
        # Integer arrays (tracekit's loop slices) are the common case.
        try:
            return [int(x) if type(x := item["intValue"]) is str else _int(x) for item in items]
        except (KeyError, TypeError, ValueError, BadSpan):
            pass  # mixed or malformed items: take them one by one below
    return [_value(item, stats, depth) for item in items]


def _float(value: object) -> float:
    # JSON has no NaN/Infinity, so proto3 JSON writes them as strings; ints are fine too.
    if type(value) is float:
        return value
    if type(value) is int or type(value) is str:
        return float(value)
    raise BadSpan(f"doubleValue {short(value)} is not a number")


def _string(value: object, stats: ReadStats) -> str:
    if type(value) is not str:
        raise BadSpan(f"{short(value)} is not a string")
    return clip(value, stats) if len(value) > MAX_VALUE_CHARS else value


def _events(raw: object, stats: ReadStats) -> list[Event]:
    if type(raw) is not list:
        raise BadSpan("events is not a list")
    events = []
    for event in raw:
        time_ns = event.get("timeUnixNano", 0)
        if type(time_ns) is not int:
            time_ns = _int(time_ns)
        if not 0 <= time_ns <= MAX_NS:
            raise BadSpan(f"event time {time_ns} out of range")
        name = event.get("name", "")
        if type(name) is not str:
            raise BadSpan(f"event name {short(name)} is not a string")
        events.append(Event(name, time_ns, attributes(event.get("attributes"), stats)))
    return events
