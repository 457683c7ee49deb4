"""Readers: every trace source tracekit supports, as one stream of normalised spans.

``read_spans(source)`` takes

- a path to an **OTLP JSON** file: a bare ``TracesData`` / ``ExportTraceServiceRequest``,
  JSON Lines with one ``TracesData`` per line (the OTel file exporter, tracekit's ``jsonl``
  exporter), or the Jaeger API v3 ``{"result": {...}}`` envelope;
- a path to a **Jaeger JSON** file: the ``/api/traces`` envelope ``{"data": [...]}``, a bare
  trace, an array of traces (the UI's download), or JSON Lines of those;
- an ``http://`` / ``https://`` URL: the **Jaeger query API** base (``service`` required);
- an iterable of in-memory spans: OpenTelemetry SDK ``ReadableSpan`` objects (duck-typed,
  no OpenTelemetry import) or :class:`~tracekit.analysis.model.Span` objects (passed through).

Files may be gzip-compressed. JSON Lines are read one line at a time (:func:`json_lines`,
the loop the parallel reader's workers run too), so memory does not grow with the file. A
single JSON document is held whole as bytes, but only its containers are decoded up front:
each span (OTLP) or trace (Jaeger) is parsed when it is reached, so the memory is about the
file's size. OTLP JSON is decoded by msgspec into typed structs
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

import contextlib
import gzip
import itertools
import os
import stat
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

import msgspec
import orjson

from tracekit.analysis.model import Span
from tracekit.analysis.readers.common import (
    SPAN_ERRORS,
    NotJson,
    ReadStats,
    loads,
    not_json,
    one_line,
    utf8_error,
)
from tracekit.analysis.readers.jaeger import is_jaeger, jaeger_document, jaeger_spans
from tracekit.analysis.readers.jaeger_api import fetch, is_url, limits, query_url
from tracekit.analysis.readers.memory import memory_spans
from tracekit.analysis.readers.otlp import line_spans, otlp_spans
from tracekit.errors import (
    ConfigurationError,
    SourceError,
    SourceNotFoundError,
    TraceFormatError,
    TracekitError,
)

__all__ = ["FORMATS", "ReadStats", "SpanStream", "detect_format", "read_spans"]

#: What :func:`detect_format` returns for files.
FORMATS = ("otlp-json", "otlp-jsonl", "jaeger-json", "jaeger-jsonl")
_DEFAULT_LOOKBACK = "1h"
_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
# A possibly long first line is read a MiB at a time.
_PIECE = 2**20
# A single document's spans are handed on in runs of this many.
_RUN = 4096
# Decodes any JSON value to a view of it: checks the JSON, builds nothing.
_JSON_VALUE = msgspec.json.Decoder(msgspec.Raw)
_TRUNCATED = "Input data was truncated"


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
) -> SpanStream:
    """Read normalised spans from a trace file, a Jaeger query API, or in-memory spans.

    Args:
        source: a path (str, bytes or PathLike; OTLP JSON/JSONL or Jaeger JSON/JSONL,
            optionally gzipped), an
            ``http(s)://`` Jaeger query base URL, or an iterable of SDK spans / Spans.
        service: the service to query (Jaeger API only, and required there).
        lookback: how far back the Jaeger query searches, e.g. ``"1h"``, ``"30m"``, ``"2d"``.
        limit: the most traces the Jaeger query returns (default: Jaeger's own).
        timeout: seconds the whole Jaeger query may take, from connecting to the answer's
            last byte (default 60).
        max_response_mb: the largest Jaeger answer read, in MiB (default 256).

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
        if is_url(name):
            url = query_url(name, service, lookback, limit)
            seconds, max_bytes = limits(timeout, max_response_mb)
            spans = _api_spans(url, stats, seconds, max_bytes)
            return SpanStream(_guard(spans, url), name, stats)
        _reject_query_options(service, lookback, limit, timeout, max_response_mb)
        path = _readable(name)
        return SpanStream(_flat(_guard(_file_chunks(path, name, stats), name)), name, stats)
    if isinstance(source, bytearray | Mapping) or not isinstance(source, Iterable):
        raise ConfigurationError(
            f"cannot read spans from a {type(source).__name__}: give a path, a Jaeger URL "
            "or an iterable of spans"
        )
    _reject_query_options(service, lookback, limit, timeout, max_response_mb)
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
    chunks = _guard(_file_chunks(_readable(name), name, stats), name)
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
) -> None:
    options = (service, limit, timeout, max_response_mb)
    if any(option is not None for option in options) or lookback != _DEFAULT_LOOKBACK:
        raise ConfigurationError(
            "service, lookback, limit, timeout and max_response_mb apply only to a Jaeger "
            "query URL"
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


def _guard(spans: Iterator[Any], name: str) -> Generator[Any, None, None]:
    # The one place where stray exceptions become one-line TracekitErrors.
    try:
        yield from spans
    except TracekitError:
        raise
    except MemoryError as exc:
        # What held the memory is released by now (the readers' frames are gone).
        raise SourceError(_out_of_memory(name)) from exc
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceFormatError(f"{name}: corrupt gzip data ({one_line(str(exc), 120)})") from exc
    except OSError as exc:
        raise SourceNotFoundError(f"{name}: cannot read ({exc.strerror or exc})") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{name}: JSON nested too deeply") from exc
    except (*SPAN_ERRORS, UnicodeError) as exc:
        why = one_line(f"{type(exc).__name__}: {exc}", 160)
        raise TraceFormatError(f"{name}: unreadable trace data ({why})") from exc


def _out_of_memory(name: str) -> str:
    try:
        size = f" ({os.stat(name).st_size / 1e6:,.0f} MB)" if not is_url(name) else ""
    except OSError:
        size = ""
    return (
        f"out of memory reading {name}{size}: a single JSON document is held in memory "
        "whole; JSON Lines is read in bounded memory"
    )


def _api_spans(url: str, stats: ReadStats, timeout: float, max_bytes: int) -> Iterator[Span]:
    body = fetch(url, timeout, max_bytes)
    stats.format = "jaeger-api"
    _check_utf8(body, url)
    try:
        spans = jaeger_document(body, stats, url)
    except msgspec.DecodeError as exc:
        raise not_json(body, url, exc) from None
    yield from spans if spans is not None else jaeger_spans(_parse(body, url, whole=True), stats, url)


def _flat(chunks: Iterator[list[Span]]) -> Iterator[Span]:
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]


# --- reading a file -------------------------------------------------------------------------
def _file_chunks(path: Path, name: str, stats: ReadStats) -> Iterator[list[Span]]:
    """The spans of a trace file, in lists (a JSON Lines line's, or a run of a document's).

    A file whose first non-blank line is a complete JSON value followed by more content is
    JSON Lines (:func:`json_lines`). Anything else is one document (pretty-printed JSON, or a
    single line), held whole as bytes (:func:`_document`).
    """
    regular = stat.S_ISREG(path.stat().st_mode)  # a pipe cannot seek back
    with _open(path) as file:
        lineno, first = _first_content(file)
        if not first:
            raise TraceFormatError(f"{name}: empty file")
        if first.startswith(_BOM):
            del first[: len(_BOM)]
        second_no, second = _next_content(file, lineno)
        if not second:
            yield from _document(first, name, stats)
            return
        try:
            _JSON_VALUE.decode(first)  # checks the JSON, builds nothing
        except msgspec.DecodeError as exc:
            if str(exc) != _TRUNCATED:
                # The first line is wrong in itself, so is any document it starts: say so
                # now rather than read the rest (200 MB of garbage need not be held).
                raise not_json(first, f"{name}: line {lineno}", exc, line=True) from None
            # One document over several lines (pretty-printed), read whole. From a pipe, the
            # lines read so far are put back in front instead.
            if regular:
                file.seek(0)
                data = file.read().removeprefix(_BOM)
            else:
                gap = b"\n" * (second_no - lineno - 1)
                data = b"\n" * (lineno - 1) + first + gap + second + file.read()
            yield from _document(data, name, stats)
            return
        # The lines read so far go first, blank ones included, so that lines are numbered.
        lines: Iterator[bytes | bytearray] = itertools.chain(
            [b"\n"] * (lineno - 1), [first], [b"\n"] * (second_no - lineno - 1), [second], file
        )
        yield from json_lines(lines, stats, lambda index: f"{name}: line {index + 1}")


def json_lines(
    lines: Iterable[bytes | bytearray], stats: ReadStats, where: Callable[[int], str]
) -> Iterator[list[Span]]:
    """The spans of each line of a JSON Lines file of OTLP or Jaeger JSON, a list per line.

    The one loop over JSON Lines: the single pass runs it on a whole file, each worker of the
    parallel reader (:mod:`tracekit.analysis.readers.parallel`) on its byte range. A line goes
    through the OTLP decoder's fast path (:func:`~tracekit.analysis.readers.otlp.line_spans`),
    else is read span by span (:func:`_line`). A last line cut short (no newline, not JSON:
    a file still being written) ends the loop and is counted in ``stats.cut_tail_bytes``;
    a line that is not JSON anywhere else is an error.

    Args:
        lines: the lines, each with its newline, from the start of the file or of a range.
        stats: receives the format (if not set yet), skip and cut counts.
        where: the place of the line at an index of ``lines``, for messages (called only
            for a line that needs one).

    Raises:
        TraceFormatError: a line that is not JSON, or not a trace document.
    """
    for index, line in enumerate(lines):
        if line.isspace():
            continue
        spans = line_spans(line, stats)
        if spans is None:
            try:
                spans = _line(line, where(index), stats)
            except NotJson:
                if line.endswith(b"\n"):
                    raise
                stats.cut_tail_bytes = len(line)
                return
        elif not stats.format:
            stats.format = "otlp-jsonl"
        yield spans


def _line(line: bytes | bytearray, where: str, stats: ReadStats) -> list[Span]:
    # A line the fast path declined: OTLP read span by span, else Jaeger JSON, else an error.
    _check_utf8(line, where, " of the line")
    try:
        spans = otlp_spans(line, stats, where)
    except msgspec.DecodeError as exc:
        raise not_json(line, where, exc, line=True) from None
    family = "otlp"
    if spans is None:
        family = "jaeger"
        spans = jaeger_spans(_jaeger(_parse(line, where), where), stats, where)
    if not stats.format:
        stats.format = f"{family}-jsonl"
    return list(spans)


def _document(data: bytes | bytearray, where: str, stats: ReadStats) -> Iterator[list[Span]]:
    """The spans of a file that is one JSON document, in runs of ``_RUN`` spans.

    Read in about the document's size of memory: only its containers are decoded up front,
    each span (OTLP) or trace (Jaeger) when it is reached. Documents of other shapes, which
    are errors or tiny (a bare Jaeger trace, an API error), are parsed whole.
    """
    _check_utf8(data, where)
    try:
        family, spans = "otlp", otlp_spans(data, stats, where)
        if spans is None:
            family, spans = "jaeger", jaeger_document(data, stats, where)
    except msgspec.DecodeError as exc:  # not JSON (a wrong shape is not an error here)
        raise not_json(data, where, exc) from None
    if spans is None:
        spans = jaeger_spans(_jaeger(_parse(data, where, whole=True), where), stats, where)
    stats.format = f"{family}-json"
    yield []  # the format is known (detect_format stops here)
    while chunk := list(itertools.islice(spans, _RUN)):
        yield chunk


def _jaeger(doc: Any, where: str) -> Any:
    # A parsed document that is not OTLP (the OTLP decoder said so): Jaeger JSON, or an error
    # saying what it is.
    if is_jaeger(doc):
        return doc
    if type(doc) is dict and type(doc.get("error")) is dict:
        # Jaeger API v3 streams {"error": {"httpCode", "message"}} in place of a result.
        message = one_line(str(doc["error"].get("message", doc["error"])), 160)
        raise TraceFormatError(f"{where}: holds a Jaeger API error, not traces: {message}")
    raise TraceFormatError(f"{where}: neither OTLP JSON nor Jaeger JSON ({_describe(doc)})")


def _describe(doc: Any) -> str:
    if type(doc) is dict:
        keys = ", ".join(one_line(str(key), 30) for key in list(doc)[:5])
        return f"an object with keys {keys}" if keys else "an empty object"
    return f"a JSON {type(doc).__name__}"


def _check_utf8(data: bytes | bytearray, where: str, of: str = "") -> None:
    # msgspec does not check the UTF-8 of what it skips.
    at = utf8_error(data)
    if at is not None:
        raise NotJson(f"{where}: not valid JSON (invalid UTF-8 at byte {at + 1}{of})")


@contextlib.contextmanager
def _open(path: Path) -> Iterator[IO[bytes]]:
    with path.open("rb") as raw:
        # peek() does not consume, so a pipe can be sniffed as well as a file.
        if raw.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield cast(IO[bytes], unzipped)
        else:
            yield raw


def _first_content(file: IO[bytes]) -> tuple[int, bytearray]:
    # As _next_content, for the first line: the whole file when it is one document on one
    # line. Read in pieces into one growing buffer, it is held once (readline() holds a long
    # line twice while it joins the pieces).
    lineno = 0
    while True:
        line = bytearray()
        while piece := file.readline(_PIECE):
            line += piece
            if piece.endswith(b"\n"):
                break
        lineno += 1
        if not line or not line.isspace():
            return lineno, line


def _next_content(file: IO[bytes], lineno: int) -> tuple[int, bytes]:
    # The next non-blank line and its 1-based number; b"" at the end of the file.
    while True:
        line = file.readline()
        lineno += 1
        if not line or not line.isspace():
            return lineno, line


def _parse(data: bytes | bytearray | memoryview, where: str, *, whole: bool = False) -> Any:
    # Jaeger JSON, and documents of other shapes, as dicts (orjson).
    try:
        return loads(data)
    except orjson.JSONDecodeError as exc:
        raise _parse_error(data, where, exc, whole) from exc


def _parse_error(
    data: bytes | bytearray | memoryview, where: str, exc: orjson.JSONDecodeError, whole: bool
) -> NotJson:
    if exc.msg == "unexpected end of data":
        return NotJson(f"{where}: truncated JSON (ends after {len(data)} bytes)")
    if whole and exc.msg == "Input is a zero-length, empty document":
        return NotJson(f"{where}: empty file")
    at = utf8_error(data)
    if at is not None:  # orjson's words for it ("surrogates not allowed") say nothing useful
        of = "" if whole else " of the line"
        return NotJson(f"{where}: not valid JSON (invalid UTF-8 at byte {at + 1}{of})")
    if whole:
        return NotJson(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        )
    return NotJson(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
