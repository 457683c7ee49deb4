"""In-memory spans -> :class:`Span`: OpenTelemetry SDK ``ReadableSpan`` objects, duck-typed.

The analyzer imports no OpenTelemetry (DESIGN §6, STYLE "core boundary"), so this reads the
attributes a ``ReadableSpan`` has: ``context.trace_id``/``span_id`` (ints), ``parent`` (a
SpanContext or None), ``name``, ``kind`` (an enum with ``.name``), ``start_time``/``end_time``
(epoch ns), ``attributes``, ``events``, ``status.status_code`` and ``resource.attributes``.
:class:`Span` objects are passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import Event, Span
from tracekit.analysis.readers.common import (
    KIND_BY_NAME,
    MAX_NS,
    MAX_VALUE_CHARS,
    SPAN_ERRORS,
    BadSpan,
    ReadStats,
    check_times,
    clip,
    resource_extra,
    short,
    with_resource,
)


def memory_spans(items: Iterable[object], stats: ReadStats) -> Iterator[Span]:
    """Yield each in-memory span as a :class:`Span`, skipping (and counting) what is not one.

    Args:
        items: ReadableSpan-like objects and/or :class:`Span` objects.
        stats: receives skip and truncation counts.

    Returns:
        An iterator of spans in the order given.
    """
    for i, item in enumerate(items):
        if type(item) is Span:
            yield item
            continue
        try:
            yield _span(item, stats)
        except (BadSpan, *SPAN_ERRORS) as exc:
            stats.skip(f"memory: span {i} ({type(item).__name__})", exc)


def _span(item: Any, stats: ReadStats) -> Span:
    context = item.context
    parent = item.parent
    start, end = item.start_time, item.end_time
    if end is None:
        raise BadSpan(f"span {item.name!r} has not ended")
    if type(start) is not int or type(end) is not int:
        raise BadSpan("start_time/end_time are not integer nanoseconds")
    check_times(start, end)
    name = item.name
    if type(name) is not str:
        raise BadSpan(f"name {short(name)} is not a string")
    resource = item.resource
    resource_attributes = resource.attributes if resource is not None else {}
    service = resource_attributes.get(semconv.SERVICE_NAME, "")
    sid = _hex(context.span_id, 16)
    pid = None if parent is None else _hex(parent.span_id, 16)
    if pid == sid:
        raise BadSpan(f"span {sid} is its own parent")
    span = Span(
        _hex(context.trace_id, 32),
        sid,
        pid,
        name,
        KIND_BY_NAME.get(item.kind.name.lower(), "unspecified"),
        start,
        end,
        service if type(service) is str else str(service),
        _attributes(item.attributes, stats),
        item.status.status_code.name == "ERROR",
        [_event(event, stats) for event in item.events or ()],
    )
    return with_resource(span, resource_extra(resource_attributes))


def _hex(value: object, width: int) -> str:
    if type(value) is not int or not 0 < value < 1 << (4 * width):
        raise BadSpan(f"id {short(value)} is not a valid {width}-digit id")
    return f"{value:0{width}x}"


def _attributes(attributes: Mapping[str, Any] | None, stats: ReadStats) -> dict[str, Any]:
    # The SDK stores sequence attributes as tuples; the model's are lists.
    out: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        if type(key) is not str:
            raise BadSpan(f"attribute key {short(key)} is not a string")
        if isinstance(value, tuple | list):
            value = list(value)
        elif type(value) is str and len(value) > MAX_VALUE_CHARS:
            value = clip(value, stats)
        out[key] = value
    return out


def _event(event: Any, stats: ReadStats) -> Event:
    time_ns = event.timestamp
    if type(time_ns) is not int or not 0 <= time_ns <= MAX_NS:
        raise BadSpan(f"event time {short(time_ns)} is not epoch nanoseconds")
    return Event(str(event.name), time_ns, _attributes(event.attributes, stats))
