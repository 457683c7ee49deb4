"""Arize Phoenix's REST API: ``GET {base}/v1/projects/{project}/spans``, page by page.

Phoenix (``arize-phoenix``, tested with 20.26.1) keeps the spans it received over OTLP and
answers ``{"data": [span, ...], "next_cursor": "..." | null}``; each span is
``{"name", "context": {"trace_id", "span_id"}, "parent_id", "span_kind", "start_time",
"end_time", "status_code", "attributes", "events"}`` with ISO 8601 times (microseconds) and
flat, typed attributes. Pages are asked for oldest first (``sort=start_time&order=asc``), so
a trace's spans arrive together, as assembly's bounded window wants.

What Phoenix does not keep, and how the reader makes up for it:

- the OpenTelemetry span kind: a span with HTTP *server* attributes (``http.route``,
  ``url.path``, or the old ``http.target``) is read as SERVER, one with ``url.full`` (an HTTP
  client's) as CLIENT, the rest as INTERNAL;
- resource attributes: no ``service.name`` (the project stands for it) and no
  ``tracekit.process.cpus`` (give ``--cores`` for the projections);
- ``openinference.span.kind`` moves out of the attributes into ``span_kind``: it is put back.

The fetch is bounded like Jaeger's (:mod:`.jaeger_api`): one deadline for all pages, and one
limit on the bytes read over all pages. Every failure is one line naming the URL.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import Event, Span
from tracekit.analysis.readers.common import (
    MAX_VALUE_CHARS,
    SPAN_ERRORS,
    BadSpan,
    ReadStats,
    check_times,
    clip,
    loads,
    one_line,
    parent_id,
    short,
    span_id,
    trace_id,
)
from tracekit.analysis.readers.jaeger_api import get, lookback_seconds
from tracekit.errors import ConfigurationError, SourceNotFoundError, TraceFormatError

#: Spans asked for per page (Phoenix's REST API accepts up to 1000).
PAGE_SPANS = 1000
DEFAULT_PROJECT = "default"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SERVER_KEYS = (semconv.HTTP_ROUTE, semconv.URL_PATH, semconv.HTTP_TARGET_OLD)


def spans_url(base: str, project: str, lookback: str, cursor: str | None = None) -> str:
    """The URL of one page of a project's spans that started within ``lookback``.

    Args:
        base: Phoenix's base URL, e.g. ``http://localhost:6006``.
        project: the project's name (``openinference.project.name``; ``default`` otherwise).
        lookback: how far back, e.g. ``"1h"``, ``"30m"``, ``"2d"``.
        cursor: the previous page's ``next_cursor``.

    Raises:
        ConfigurationError: an empty project or a bad lookback.
    """
    if not project or not isinstance(project, str):
        raise ConfigurationError(f"{base}: a Phoenix read needs a project name (--project)")
    start = time.time() - lookback_seconds(lookback)
    params: dict[str, Any] = {
        "limit": PAGE_SPANS,
        "sort": "start_time",
        "order": "asc",
        "start_time": datetime.fromtimestamp(start, timezone.utc).isoformat(),
    }
    if cursor:
        params["cursor"] = cursor
    root = base.rstrip("/")
    return f"{root}/v1/projects/{urllib.parse.quote(project, safe='')}/spans?{urllib.parse.urlencode(params)}"


def phoenix_spans(
    base: str, project: str, lookback: str, timeout: float, max_bytes: int, stats: ReadStats
) -> Iterator[Span]:
    """Yield every span of ``project`` from the Phoenix at ``base``, page after page.

    Args:
        base: Phoenix's base URL.
        project: the project.
        lookback: how far back.
        timeout: seconds the whole read (all pages) may take.
        max_bytes: the most bytes read over all pages.
        stats: receives skip and truncation counts.

    Raises (while iterating):
        SourceNotFoundError: unreachable, past the deadline, an unknown project, non-200.
        TraceFormatError: an answer that is not a page of spans, or more than ``max_bytes``.
    """
    stats.format = "phoenix-api"
    end = time.monotonic() + timeout
    cursor: str | None = None
    read = 0
    while True:
        url = spans_url(base, project, lookback, cursor)
        left = end - time.monotonic()
        if left <= 0:
            raise SourceNotFoundError(
                f"{url}: Phoenix did not answer within {timeout:g} s (see --timeout)"
            )
        body = get(url, left, max_bytes - read, "Phoenix", deadline_s=timeout)
        read += len(body)
        try:
            page = loads(body)
        except ValueError as exc:
            text = one_line(bytes(body[:80]).decode("utf-8", "replace"), 80)
            raise TraceFormatError(f"{url}: the answer is not JSON: {text!r}") from exc
        data = page.get("data") if type(page) is dict else None
        if type(data) is not list:
            raise TraceFormatError(f"{url}: the answer is not a page of Phoenix spans")
        for i, item in enumerate(data):
            try:
                yield _span(item, stats)
            except (BadSpan, *SPAN_ERRORS) as exc:
                stats.skip(f"{url}: span {i}", exc)
        cursor = page.get("next_cursor")
        if not cursor or not data:
            return
        if type(cursor) is not str:
            raise TraceFormatError(f"{url}: next_cursor {short(cursor)} is not a string")


def _span(item: dict[str, Any], stats: ReadStats) -> Span:
    context = item["context"]
    start, end = _ns(item["start_time"]), _ns(item["end_time"])
    check_times(start, end)
    name = item["name"]
    if type(name) is not str:
        raise BadSpan(f"name {short(name)} is not a string")
    attributes = _attributes(item.get("attributes"), stats)
    kind = item.get("span_kind")
    if type(kind) is str and kind != "UNKNOWN":
        attributes.setdefault(semconv.OPENINFERENCE_SPAN_KIND, kind)
    sid = span_id(context["span_id"])
    pid = parent_id(item.get("parent_id"))
    if pid == sid:
        raise BadSpan(f"span {sid} is its own parent")
    events = [_event(event, stats) for event in item.get("events") or ()]
    return Span(trace_id(context["trace_id"]), sid, pid, name, _kind(attributes), start, end,
                "", attributes, item.get("status_code") == "ERROR", events)  # fmt: skip


def _kind(attributes: dict[str, Any]) -> str:
    if any(key in attributes for key in _SERVER_KEYS):
        return "server"
    return "client" if semconv.URL_FULL in attributes else "internal"


def _ns(text: object) -> int:
    if type(text) is not str:
        raise BadSpan(f"time {short(text)} is not an ISO 8601 string")
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _attributes(attributes: object, stats: ReadStats) -> dict[str, Any]:
    if attributes is None:
        return {}
    if type(attributes) is not dict:
        raise BadSpan(f"attributes {short(attributes)} are not an object")
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if type(value) is str and len(value) > MAX_VALUE_CHARS:
            value = clip(value, stats)
        elif type(value) is dict:  # a nested value the analyzer has no use for
            continue
        out[key] = value
    return out


def _event(event: Any, stats: ReadStats) -> Event:
    return Event(str(event["name"]), _ns(event["timestamp"]), _attributes(event.get("attributes"), stats))
