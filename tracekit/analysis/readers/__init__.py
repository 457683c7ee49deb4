"""Readers: every trace source tracekit supports, as one stream of normalised spans.

``read_spans(source)`` takes

- a path to an **OTLP JSON** file: a bare ``TracesData`` / ``ExportTraceServiceRequest``,
  JSON Lines with one ``TracesData`` per line (the OTel file exporter, tracekit's ``jsonl``
  exporter), or the Jaeger API v3 ``{"result": {...}}`` envelope;
- a path to a **Jaeger JSON** file: the ``/api/traces`` envelope ``{"data": [...]}``, a bare
  trace, an array of traces (the UI's download), or JSON Lines of those;
- an ``http://`` / ``https://`` URL: the **Jaeger query API** base (``service`` required), or
  with ``project``, **Arize Phoenix**'s REST API (:mod:`tracekit.analysis.readers.phoenix_api`);
- an iterable of in-memory spans: OpenTelemetry SDK ``ReadableSpan`` objects (duck-typed,
  no OpenTelemetry import) or :class:`~tracekit.analysis.model.Span` objects (passed through).

Files may be gzip-compressed (:mod:`tracekit.analysis.readers.files`). JSON Lines are read
one line at a time (:func:`json_lines`, the loop the parallel reader's workers run too), so
memory does not grow with the file. A single JSON document is held whole as bytes, but only
its containers are decoded up front: each span (OTLP) or trace (Jaeger) is parsed when it
is reached, so the memory is about the file's size. OTLP JSON is decoded by msgspec into typed structs
(:mod:`tracekit.analysis.readers.otlp`); Jaeger JSON is parsed by orjson into dicts
(:mod:`tracekit.analysis.readers.jaeger`). A last line cut short (no newline, not JSON: a file
still being written) is skipped and counted (``stats.cut_tail_bytes``); a bad line anywhere
else is an error.

Errors: argument errors (:class:`ConfigurationError`) and a missing, unreadable or directory
path (:class:`SourceNotFoundError`) raise when ``read_spans`` is called; everything else
raises while iterating, as one-line :class:`SourceNotFoundError` / :class:`TraceFormatError`
messages naming the file (and line) or URL; running out of memory is a :class:`SourceError`
saying so. Malformed individual spans are skipped and counted in the stream's
:class:`ReadStats` (``stream.stats.skipped``), never raised.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from tracekit.analysis.model import Span
from tracekit.analysis.readers.common import ReadStats, not_json
from tracekit.analysis.readers.files import check_utf8, file_chunks, guard, json_lines, parse_json
from tracekit.analysis.readers.jaeger import jaeger_document, jaeger_spans
from tracekit.analysis.readers.jaeger_api import fetch, is_url, limits, query_url
from tracekit.analysis.readers.memory import memory_spans
from tracekit.analysis.readers.phoenix_api import phoenix_spans
from tracekit.errors import ConfigurationError, SourceNotFoundError

__all__ = ["FORMATS", "ReadStats", "SpanStream", "detect_format", "json_lines", "read_spans"]

#: What :func:`detect_format` returns for files.
FORMATS = ("otlp-json", "otlp-jsonl", "jaeger-json", "jaeger-jsonl")
_DEFAULT_LOOKBACK = "1h"


class SpanStream(Iterator[Span]):
    """The spans of one source, read lazily as they are iterated.

    Attributes:
        source: what is read, for reports: the path as given, the URL, or ``"memory"``.
        stats: skip and truncation counts and the detected format, filled in as the
            stream is consumed (complete once it is exhausted).
    """

    def __init__(self, spans: Iterator[Span], source: str, stats: ReadStats) -> None:
        self._spans = spans
        self.source = source
        self.stats = stats

    def __iter__(self) -> Iterator[Span]:
        # The underlying generator itself, so that a for loop pays no extra call per span.
        return self._spans

    def __next__(self) -> Span:
        return next(self._spans)

    def close(self) -> None:
        """Stop reading and release the file (also done when the stream is collected)."""
        close = getattr(self._spans, "close", None)
        if close is not None:
            close()


def read_spans(
    source: str | bytes | os.PathLike[str] | Iterable[Any],
    *,
    service: str | None = None,
    lookback: str = _DEFAULT_LOOKBACK,
    limit: int | None = None,
    timeout: float | None = None,
    max_response_mb: float | None = None,
    project: str | None = None,
) -> SpanStream:
    """Read normalised spans from a trace file, a Jaeger query API, Phoenix's REST API, or
    in-memory spans.

    Args:
        source: a path (str, bytes or PathLike; OTLP JSON/JSONL or Jaeger JSON/JSONL,
            optionally gzipped), an
            ``http(s)://`` Jaeger query base URL, or an iterable of SDK spans / Spans.
        service: the service to query (Jaeger API only, and required there).
        lookback: how far back the Jaeger query searches, e.g. ``"1h"``, ``"30m"``, ``"2d"``.
        limit: the most traces the Jaeger query returns (default: Jaeger's own).
        timeout: seconds the whole Jaeger query may take, from connecting to the answer's
            last byte (default 60).
        max_response_mb: the largest Jaeger answer read, in MiB (default 256); for Phoenix,
            over all its pages.
        project: read the URL as Arize Phoenix's REST API, this project's spans (Phoenix's
            default project is ``"default"``); ``lookback``, ``timeout`` and
            ``max_response_mb`` apply, ``service`` and ``limit`` do not.

    Returns:
        A :class:`SpanStream`: an iterator of :class:`Span` with ``.stats`` and ``.source``.
        Cost: on OTLP JSON, a msgspec decode plus the conversion to :class:`Span` (~15 µs
        a span on the benchmark machine, docs/performance-analyzer.md); on Jaeger JSON, an
        orjson parse plus the conversion.

    Raises:
        ConfigurationError: a bad argument (missing service for a URL, query options for a
            file, an unsupported source type).
        SourceNotFoundError: the file is missing, a directory or unreadable; the Jaeger API is
            unreachable, timed out or answered an error (while iterating).
        TraceFormatError: the data is not a trace file, or the Jaeger answer is larger than
            the limit (while iterating).
        SourceError: out of memory while reading (while iterating).
    """
    stats = ReadStats()
    if isinstance(source, str | bytes | os.PathLike):
        name = os.fsdecode(source)
        if is_url(name) and project is not None:
            if service is not None or limit is not None:
                raise ConfigurationError("service and limit apply to a Jaeger query, not Phoenix")
            seconds, max_bytes = limits(timeout, max_response_mb)
            spans = phoenix_spans(name, project, lookback, seconds, max_bytes, stats)
            return SpanStream(guard(spans, name), name, stats)
        if is_url(name):
            url = query_url(name, service, lookback, limit)
            seconds, max_bytes = limits(timeout, max_response_mb)
            spans = _api_spans(url, stats, seconds, max_bytes)
            return SpanStream(guard(spans, url), name, stats)
        _reject_query_options(service, lookback, limit, timeout, max_response_mb, project)
        path = _readable(name)
        return SpanStream(_flat(guard(file_chunks(path, name, stats), name)), name, stats)
    if isinstance(source, bytearray | Mapping) or not isinstance(source, Iterable):
        raise ConfigurationError(
            f"cannot read spans from a {type(source).__name__}: give a path, a Jaeger URL "
            "or an iterable of spans"
        )
    _reject_query_options(service, lookback, limit, timeout, max_response_mb, project)
    stats.format = "memory"
    return SpanStream(memory_spans(source, stats), "memory", stats)


def detect_format(path: str | bytes | os.PathLike[str]) -> str:
    """Which format a trace file holds, from its first document.

    Args:
        path: the file.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        SourceNotFoundError / TraceFormatError: as :func:`read_spans`.
    """
    name = os.fsdecode(path)
    stats = ReadStats()
    chunks = guard(file_chunks(_readable(name), name, stats), name)
    try:
        next(chunks, None)  # the first document (or line) gives the format
    finally:
        chunks.close()
    return stats.format


def _reject_query_options(
    service: str | None,
    lookback: str,
    limit: int | None,
    timeout: float | None,
    max_response_mb: float | None,
    project: str | None = None,
) -> None:
    options = (service, limit, timeout, max_response_mb, project)
    if any(option is not None for option in options) or lookback != _DEFAULT_LOOKBACK:
        raise ConfigurationError(
            "service, project, lookback, limit, timeout and max_response_mb (on the command "
            "line --service, --project, --lookback, --limit, --timeout, --max-response-mb) apply "
            "only to a Jaeger query URL or a Phoenix URL"
        )


def _readable(name: str) -> Path:
    if not name:  # Path("") is the current directory
        raise SourceNotFoundError("empty trace file path")
    path = Path(name)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise SourceNotFoundError(f"{name}: no such file") from None
    except OSError as exc:
        raise SourceNotFoundError(f"{name}: cannot read ({exc.strerror or exc})") from exc
    except ValueError:  # a NUL in the path (from Python; a shell cannot pass one)
        raise SourceNotFoundError(f"{name!r}: not a valid path") from None
    if stat.S_ISDIR(mode):
        raise SourceNotFoundError(f"{name}: is a directory, not a trace file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        # A pipe is fine (``<(zcat traces.jsonl.gz)``); a device or socket is not a file.
        raise SourceNotFoundError(f"{name}: is not a regular file")
    if not os.access(path, os.R_OK):
        raise SourceNotFoundError(f"{name}: cannot read (permission denied)")
    return path


def _api_spans(url: str, stats: ReadStats, timeout: float, max_bytes: int) -> Iterator[Span]:
    body = fetch(url, timeout, max_bytes)
    stats.format = "jaeger-api"
    check_utf8(body, url)
    try:
        spans = jaeger_document(body, stats, url)
    except msgspec.DecodeError as exc:
        raise not_json(body, url, exc) from None
    yield from spans if spans is not None else jaeger_spans(parse_json(body, url, whole=True), stats, url)


def _flat(chunks: Iterator[list[Span]]) -> Iterator[Span]:
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]


