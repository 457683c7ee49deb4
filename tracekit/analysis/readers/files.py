"""Reading a trace file: JSON Lines line by line, or one JSON document, gzipped or not.

:func:`file_chunks` tells the two apart from the first lines and yields the spans in lists;
:func:`json_lines` is the one loop over JSON Lines (the parallel reader's workers run it on
their byte ranges too); :func:`guard` turns any stray exception of a reader into the
one-line error that names the file.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import stat
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
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
from tracekit.analysis.readers.jaeger_api import is_url
from tracekit.analysis.readers.otlp import line_spans, otlp_spans
from tracekit.errors import SourceError, SourceNotFoundError, TraceFormatError, TracekitError

__all__ = ["check_utf8", "file_chunks", "guard", "json_lines", "parse_json"]

_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
# A possibly long first line is read a MiB at a time.
_PIECE = 2**20
# A single document's spans are handed on in runs of this many.
_RUN = 4096
# Decodes any JSON value to a view of it: checks the JSON, builds nothing.
_JSON_VALUE = msgspec.json.Decoder(msgspec.Raw)
_TRUNCATED = "Input data was truncated"


def guard(spans: Iterator[Any], name: str) -> Generator[Any, None, None]:
    """``spans``, with any stray exception turned into a one-line :class:`TracekitError`
    naming ``name`` (the one place where that happens)."""
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


def file_chunks(path: Path, name: str, stats: ReadStats) -> Iterator[list[Span]]:
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
    check_utf8(line, where, " of the line")
    try:
        spans = otlp_spans(line, stats, where)
    except msgspec.DecodeError as exc:
        raise not_json(line, where, exc, line=True) from None
    family = "otlp"
    if spans is None:
        family = "jaeger"
        spans = jaeger_spans(_jaeger(parse_json(line, where), where), stats, where)
    if not stats.format:
        stats.format = f"{family}-jsonl"
    return list(spans)


def _document(data: bytes | bytearray, where: str, stats: ReadStats) -> Iterator[list[Span]]:
    """The spans of a file that is one JSON document, in runs of ``_RUN`` spans.

    Read in about the document's size of memory: only its containers are decoded up front,
    each span (OTLP) or trace (Jaeger) when it is reached. Documents of other shapes, which
    are errors or tiny (a bare Jaeger trace, an API error), are parsed whole.
    """
    check_utf8(data, where)
    try:
        family, spans = "otlp", otlp_spans(data, stats, where)
        if spans is None:
            family, spans = "jaeger", jaeger_document(data, stats, where)
    except msgspec.DecodeError as exc:  # not JSON (a wrong shape is not an error here)
        raise not_json(data, where, exc) from None
    if spans is None:
        spans = jaeger_spans(_jaeger(parse_json(data, where, whole=True), where), stats, where)
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
    names = {type(None): "JSON null", bool: "a JSON boolean", int: "a JSON number",
             float: "a JSON number", str: "a JSON string", list: "a JSON list"}  # fmt: skip
    return names.get(type(doc), f"a JSON {type(doc).__name__}")


def check_utf8(data: bytes | bytearray, where: str, of: str = "") -> None:
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


def parse_json(data: bytes | bytearray | memoryview, where: str, *, whole: bool = False) -> Any:
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
