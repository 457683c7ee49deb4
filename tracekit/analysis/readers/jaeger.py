"""Jaeger JSON (query API v1, UI upload and download) -> :class:`Span`.

Shapes: the ``/api/traces`` envelope ``{"data": [trace, ...], "errors": ...}``, a bare trace
``{"traceID", "spans", "processes"}``, or an array of traces. Times are integer microseconds,
ids are hex with leading zeros dropped, the kind and the error flag are tags.

Traces are parsed with orjson into dicts, one at a time: :func:`jaeger_document` decodes a
whole file (or a Jaeger API answer) only down to its list of traces (msgspec, each trace a
view of the bytes), so that reading it costs about its size in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from tracekit.analysis.model import Event, Span
from tracekit.analysis.readers.common import (
    KIND_BY_NAME,
    MAX_ATTRIBUTES,
    MAX_NS,
    MAX_VALUE_CHARS,
    SPAN_ERRORS,
    BadSpan,
    ReadStats,
    check_times,
    clip,
    loads,
    one_line,
    parent_id,
    resource_extra,
    short,
    span_id,
    trace_id,
    with_resource,
)
from tracekit.errors import TraceFormatError

_KIND_TAG = "span.kind"
_ERROR_TAG = "error"
_FORMAT_TAG = "internal.span.format"  # Jaeger's own bookkeeping, not the application's
_EVENT_FIELD = "event"  # OTel -> Jaeger conversion puts the event name in this log field


def is_jaeger(doc: object) -> bool:
    """Whether a parsed document is Jaeger JSON (envelope, bare trace, or array of traces)."""
    if type(doc) is list:
        return True
    return type(doc) is dict and ("data" in doc or "spans" in doc)


def jaeger_spans(doc: Any, stats: ReadStats, where: str) -> Iterator[Span]:
    """Yield the spans of a Jaeger JSON document, skipping (and counting) malformed ones.

    Args:
        doc: a parsed envelope, bare trace, or array of traces.
        stats: receives skip and truncation counts.
        where: the document's location for messages.

    Returns:
        An iterator of spans in file order.

    Raises:
        TraceFormatError: the envelope, a trace or its span list has the wrong shape.
    """
    if type(doc) is dict and "spans" not in doc:
        traces = doc.get("data")
        if traces is None:
            errors = one_line(str(doc.get("errors")), 200)
            raise TraceFormatError(f"{where}: Jaeger envelope holds no data (errors: {errors})")
        if type(traces) is not list:
            raise TraceFormatError(f"{where}: Jaeger envelope 'data' is not a list")
        label = "data[{}]"
    elif type(doc) is list:
        traces, label = doc, "[{}]"
    else:
        traces, label = [doc], "trace"
    for t, trace in enumerate(traces):
        yield from _trace_spans(trace, stats, f"{where}: {label.format(t)}")


# A Raw member's value when it is absent (one object: absence is an identity check).
_ABSENT = msgspec.Raw(b"")


class _JaegerDocument(msgspec.Struct, gc=False):
    """Jaeger's ``{"data": [trace, ...]}`` down to its traces; the other members mark a
    document of another shape."""

    data: list[msgspec.Raw] | UnsetType | None = UNSET
    spans: msgspec.Raw = _ABSENT
    resourceSpans: msgspec.Raw = _ABSENT
    result: msgspec.Raw = _ABSENT

_DOCUMENT = msgspec.json.Decoder(_JaegerDocument | list[msgspec.Raw])


def jaeger_document(data: bytes | bytearray, stats: ReadStats, where: str) -> Iterator[Span] | None:
    """The spans of a Jaeger envelope or array of traces, each trace parsed when reached.

    Args:
        data: the document, its UTF-8 checked already (msgspec does not check what it skips).
        stats: receives skip and truncation counts.
        where: the document's place for messages.

    Returns:
        An iterator of spans in file order; ``None`` for a document of another shape (a bare
        trace, one that also has OTLP members, a ``data`` that is not a list, not an object
        or array), which :func:`jaeger_spans` reads parsed whole (or refuses).

    Raises:
        msgspec.DecodeError: ``data`` is not JSON (at once).
        TraceFormatError: a trace is not JSON after all (while iterating: nested deeper than
            orjson reads).
    """
    try:
        doc = _DOCUMENT.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None
    if isinstance(doc, list):
        return _raw_traces(doc, "[{}]", stats, where)
    if type(doc.data) is not list or any(
        member is not _ABSENT for member in (doc.spans, doc.resourceSpans, doc.result)
    ):
        return None
    return _raw_traces(doc.data, "data[{}]", stats, where)


def _raw_traces(
    traces: list[msgspec.Raw], label: str, stats: ReadStats, where: str
) -> Iterator[Span]:
    for t, raw in enumerate(traces):
        at = label.format(t)
        try:
            trace = loads(memoryview(raw))
        except orjson.JSONDecodeError as exc:  # a ValueError, which would skip a span instead
            raise TraceFormatError(f"{where}: not valid JSON ({exc.msg} in {at})") from exc
        yield from _trace_spans(trace, stats, f"{where}: {at}")


def _trace_spans(trace: object, stats: ReadStats, where: str) -> Iterator[Span]:
    if type(trace) is not dict:
        raise TraceFormatError(f"{where} is not a Jaeger trace object")
    spans = trace.get("spans")
    if type(spans) is not list:
        raise TraceFormatError(f"{where}: 'spans' is not a list")
    processes = trace.get("processes")
    services = _services(processes)
    extras = _extras(processes, stats)
    default_trace = trace.get("traceID")
    for i, raw in enumerate(spans):
        try:
            span = _span(raw, default_trace, services, stats)
            own = raw.get("process")  # a process embedded in the span (another exporter's form)
            found = _extras({"": own}, stats) if own is not None else extras
            yield with_resource(span, found.get("" if own is not None else raw.get("processID", "")))
        except (BadSpan, *SPAN_ERRORS) as exc:
            stats.skip(f"{where}.spans[{i}]", exc)


def _services(processes: object) -> dict[str, str]:
    if type(processes) is not dict:
        return {}
    return {
        pid: _service_name(process)
        for pid, process in processes.items()
        if type(pid) is str and type(process) is dict
    }


def _extras(processes: object, stats: ReadStats) -> dict[str, dict[str, Any]]:
    # Jaeger's process tags are the OTLP resource's attributes: the ones the analyzer reads.
    if type(processes) is not dict:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for pid, process in processes.items():
        tags = process.get("tags") if type(process) is dict else None
        if type(pid) is str and type(tags) is list:
            try:
                extra = resource_extra(_fields(tags, stats))
            except (BadSpan, *SPAN_ERRORS):
                extra = None
            if extra is not None:
                out[pid] = extra
    return out


def _service_name(process: object) -> str:
    name = process.get("serviceName", "") if type(process) is dict else ""
    return name if type(name) is str else ""


def _span(
    raw: dict[str, Any], default_trace: object, services: dict[str, str], stats: ReadStats
) -> Span:
    start = _int(raw["startTime"]) * 1000
    duration = _int(raw["duration"]) * 1000
    if duration < 0:
        raise BadSpan(f"negative duration ({duration} ns)")
    end = start + duration
    check_times(start, end)
    name = raw.get("operationName", "")
    if type(name) is not str:
        raise BadSpan(f"operationName {short(name)} is not a string")
    attrs, kind, error = _tags(raw.get("tags"), stats)
    process = raw.get("process")
    if process is not None:
        service = _service_name(process)
    else:
        service = services.get(raw.get("processID", ""), "")
    logs = raw.get("logs")
    sid = span_id(raw["spanID"])
    pid = _parent(raw)
    if pid == sid:
        raise BadSpan(f"span {sid} is its own parent")
    return Span(
        trace_id(raw.get("traceID", default_trace)),
        sid,
        pid,
        name,
        kind,
        start,
        end,
        service,
        attrs,
        error,
        _events(logs, stats) if logs else [],
    )


def _int(value: object) -> int:
    if type(value) is int:
        return value
    raise BadSpan(f"{short(value)} is not an integer number of microseconds")


def _parent(raw: dict[str, Any]) -> str | None:
    # The parent is the CHILD_OF reference; a span with only FOLLOWS_FROM links hangs off
    # the first of them. Some exporters write a flat parentSpanID instead.
    refs = raw.get("references")
    if not refs:
        return parent_id(raw.get("parentSpanID"))
    follows = None
    for ref in refs:
        ref_type = ref.get("refType", "CHILD_OF")
        if ref_type == "CHILD_OF":
            return parent_id(ref["spanID"])
        if follows is None and ref_type == "FOLLOWS_FROM":
            follows = ref
    return None if follows is None else parent_id(follows["spanID"])


def _tags(tags: object, stats: ReadStats) -> tuple[dict[str, Any], str, bool]:
    # Span tags: the span.kind and error tags become the span's kind and error flag.
    kind = "unspecified"
    error = False
    attrs = _fields(tags, stats)
    if _KIND_TAG in attrs:
        value = attrs.pop(_KIND_TAG)
        kind = KIND_BY_NAME.get(value, kind) if type(value) is str else kind
    if _ERROR_TAG in attrs:
        value = attrs.pop(_ERROR_TAG)
        error = value is True or (type(value) is str and value.lower() == "true")
    attrs.pop(_FORMAT_TAG, None)
    return attrs, kind, error


def _fields(tags: object, stats: ReadStats) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if not tags:
        return attrs
    if type(tags) is not list:
        raise BadSpan("tags is not a list")
    if len(tags) > MAX_ATTRIBUTES:
        stats.truncated += 1
        tags = tags[:MAX_ATTRIBUTES]
    for tag in tags:
        key = tag["key"]
        if type(key) is not str:
            raise BadSpan(f"tag key {short(key)} is not a string")
        attrs[key] = _tag_value(tag, stats)
    return attrs


def _tag_value(tag: dict[str, Any], stats: ReadStats) -> Any:
    value = tag["value"]
    kind = tag.get("type", "string")
    vtype = type(value)
    if vtype is str:
        if kind == "int64":
            return int(value)
        if kind == "float64":
            return float(value)
        if kind == "bool":
            return value.lower() == "true"
        return clip(value, stats) if len(value) > MAX_VALUE_CHARS else value
    if vtype is bool or vtype is int:
        return float(value) if kind == "float64" else value
    if vtype is float:
        return value
    raise BadSpan(f"tag {tag['key']}: value {short(value)} is not a scalar")


def _events(logs: object, stats: ReadStats) -> list[Event]:
    if type(logs) is not list:
        raise BadSpan("logs is not a list")
    events = []
    for log in logs:
        time_ns = _int(log["timestamp"]) * 1000
        if not 0 <= time_ns <= MAX_NS:
            raise BadSpan(f"log timestamp {time_ns} out of range")
        attrs = _fields(log.get("fields"), stats)
        name = attrs.pop(_EVENT_FIELD, "log")
        events.append(Event(name if type(name) is str else str(name), time_ns, attrs))
    return events
