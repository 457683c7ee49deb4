"""What the trace readers share: id and time normalisation, value limits, skip accounting.

Readers turn each malformed span into :class:`BadSpan` (or let a ``KeyError``/``TypeError``/
``ValueError`` escape from the per-span conversion), skip it and count it in
:class:`ReadStats`; only a document of the wrong shape as a whole stops the read.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from tracekit import semconv
from tracekit.analysis.model import SPAN_KINDS, Span
from tracekit.errors import TraceFormatError

#: String attribute values longer than this are cut (a prompt can be megabytes; the analyzer
#: needs none of it, and assembly holds a window of spans in memory).
MAX_VALUE_CHARS = 65_536
#: Longest array attribute kept, and deepest nesting of array/kvlist values accepted.
MAX_ARRAY_ITEMS = 4_096
MAX_VALUE_DEPTH = 32
#: At most this many attributes per span are kept (the OTel SDK's default limit is 128).
MAX_ATTRIBUTES = 1_024
#: Times beyond this (ns) are not real timestamps and would overflow float arithmetic.
MAX_NS = 2**64 - 1
#: How many skip reasons ReadStats keeps as examples.
MAX_REASONS = 10

#: Exceptions a per-span conversion may raise on hostile input; the span is then skipped.
SPAN_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)

KIND_BY_NAME = {name: name for name in SPAN_KINDS}
_ZEROS = {16: "0" * 16, 32: "0" * 32}
# raw id -> normalised id. Trace ids repeat on every span of a trace and parent ids repeat
# on every sibling, so most lookups hit; cleared when full to bound memory.
TRACE_IDS: dict[object, str] = {}
SPAN_IDS: dict[object, str] = {}
_CACHE_MAX = 4096
# UTF-8 is checked a MiB at a time, so that a large document is not copied into a str.
_PIECE = 2**20


class BadSpan(Exception):
    """One span is malformed: the reader skips it and counts it."""


@dataclass
class ReadStats:
    """What a read skipped or changed, filled in while the spans are iterated.

    Attributes:
        format: the detected input format ("otlp-json", "otlp-jsonl", "jaeger-json",
            "jaeger-jsonl", "jaeger-api", "memory"), or "" before the first document is read.
        skipped: malformed spans that were skipped (bad or missing ids, times, types).
        truncated: attribute values or attribute lists that were cut to the limits above.
        reasons: the first few skip reasons, each naming where the span was.
        cut_tail_bytes: the size of a last JSON Lines line that was skipped because it is
            cut short (no newline, not JSON: the file is still being written), else 0.
    """

    format: str = ""
    skipped: int = 0
    truncated: int = 0
    reasons: list[str] = field(default_factory=list)
    cut_tail_bytes: int = 0

    def skip(self, where: str, exc: BaseException) -> None:
        """Count one skipped span.

        Args:
            where: the span's location, e.g. ``"line 3, span 2"``.
            exc: why it was skipped.
        """
        self.skipped += 1
        if len(self.reasons) < MAX_REASONS:
            if isinstance(exc, BadSpan):
                why = str(exc)
            elif isinstance(exc, KeyError):  # a field the format requires
                why = f"no {exc.args[0]!r}" if exc.args else "a required field is missing"
            else:
                why = f"{type(exc).__name__}: {exc}"
            # The place is never cut (a long path must not push the reason out): the reason is.
            self.reasons.append(f"{where}: {one_line(why, 200)}")


def loads(data: bytes | bytearray | memoryview) -> Any:
    """``orjson.loads``, except that running out of memory raises :class:`MemoryError`.

    orjson reports a failed allocation as a ``JSONDecodeError``, which every reader would
    take for bad input ("not valid JSON").
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("Not enough memory"):
            raise MemoryError(exc.msg) from exc
        raise


def one_line(text: str, limit: int = 300) -> str:
    """``text`` with line breaks replaced and cut to ``limit`` characters (for messages)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _normalise(raw: object, width: int) -> str:
    # Jaeger drops leading zeros (15/31 chars), OTLP may be uppercase: pad, then let
    # bytes.fromhex validate and .hex() lowercase in one C call.
    if type(raw) is not str or not 0 < len(raw) <= width:
        raise BadSpan(f"id {short(raw)} is not {width} hex digits")
    try:
        norm = bytes.fromhex(raw.rjust(width, "0")).hex()
    except ValueError:
        raise BadSpan(f"id {short(raw)} is not hex") from None
    if len(norm) != width or norm == _ZEROS[width]:
        raise BadSpan(f"id {short(raw)} is not a valid {width}-digit id")
    return norm


def trace_id(raw: object) -> str:
    """Normalise a trace id to 32 lowercase hex digits; raise BadSpan if it is not one."""
    return TRACE_IDS.get(raw) or _remember(TRACE_IDS, raw, 32)


def span_id(raw: object) -> str:
    """Normalise a span id to 16 lowercase hex digits; raise BadSpan if it is not one."""
    return SPAN_IDS.get(raw) or _remember(SPAN_IDS, raw, 16)


def _remember(cache: dict[object, str], raw: object, width: int) -> str:
    # A bounded cache: ids repeat (parents, Jaeger references), and a hit skips the hex work.
    norm = _normalise(raw, width)
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[raw] = norm
    return norm


def parent_id(raw: object) -> str | None:
    """Normalise a parent span id; ``None``, ``""`` and all zeros mean no parent."""
    if not raw:
        return None
    hit = SPAN_IDS.get(raw)
    if hit is not None:
        return hit
    if type(raw) is str and not raw.strip("0"):
        return None
    return span_id(raw)


def check_times(start: int, end: int) -> None:
    """Raise BadSpan unless ``0 < start <= end <= MAX_NS``."""
    if not 0 < start <= end <= MAX_NS:
        if end < start:
            raise BadSpan(f"negative duration ({end - start} ns)")
        raise BadSpan(f"time out of range ({start}..{end} ns)")


def clip(value: str, stats: ReadStats) -> str:
    """Cut an over-long string value to MAX_VALUE_CHARS, saying so in the value."""
    stats.truncated += 1
    cut = len(value) - MAX_VALUE_CHARS
    return f"{value[:MAX_VALUE_CHARS]}…[{cut} more characters cut by tracekit]"


def short(raw: object) -> str:
    """A short printable form of a raw value, for skip reasons."""
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def utf8_error(data: bytes | bytearray | memoryview) -> int | None:
    """The offset of the first byte of ``data`` that is not UTF-8, or ``None``.

    msgspec does not check the UTF-8 of what it skips (unknown fields), so the readers check
    it first. Cost: nothing for ASCII; else a decode, a MiB at a time (a document is never
    copied into a str).
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


class NotJson(TraceFormatError):
    """The data is not JSON at all (as opposed to JSON of the wrong shape)."""


# msgspec's words for malformed JSON: "JSON is malformed: <reason> (byte <offset>)".
_MALFORMED = re.compile(r"JSON is malformed: (.+) \(byte (\d+)\)")


def not_json(
    data: bytes | bytearray, where: str, exc: msgspec.DecodeError, *, line: bool = False
) -> NotJson:
    """msgspec's refusal of ``data`` as a one-line message: ``truncated JSON (ends after N
    bytes)``, ``not valid JSON (invalid UTF-8 at byte N)``, ``not valid JSON (<reason> at
    line L column C)``; for a JSON Lines ``line``, bytes and columns are the line's."""
    of = " of the line" if line else ""
    at = utf8_error(data)
    if at is not None:
        return NotJson(f"{where}: not valid JSON (invalid UTF-8 at byte {at + 1}{of})")
    text = str(exc)
    if text == "Input data was truncated":
        return NotJson(f"{where}: truncated JSON (ends after {len(data)} bytes)")
    found = _MALFORMED.fullmatch(text)
    if found is None:
        return NotJson(f"{where}: not valid JSON ({one_line(text, 120)})")
    at = int(found[2])
    if line:
        return NotJson(f"{where}: not valid JSON ({found[1]} at column {at + 1})")
    lineno = data.count(b"\n", 0, at) + 1
    column = at - data.rfind(b"\n", 0, at)
    return NotJson(f"{where}: not valid JSON ({found[1]} at line {lineno} column {column})")


#: Resource attributes the analyzer reads (the replay's cores); the analyzer's spans carry no
#: resource, so the readers copy these onto the spans that can be requests (SERVER spans and
#: roots), where the replay finds them.
RESOURCE_KEYS = (semconv.HOST_CPUS, semconv.PROCESS_CPUS, semconv.TELEMETRY_SDK_LANGUAGE)


def resource_extra(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :data:`RESOURCE_KEYS` of a resource's attributes (``None`` when it has none)."""
    extra = {key: attributes[key] for key in RESOURCE_KEYS if key in attributes}
    return extra or None


def with_resource(span: Span, extra: dict[str, Any] | None) -> Span:
    """``span`` with ``extra`` (:func:`resource_extra`) among its attributes when it can be a
    request span; its own attributes of the same names win. Returns ``span``."""
    if extra is not None and (span.kind == "server" or span.parent_id is None):
        attributes = span.attributes
        for key, value in extra.items():
            attributes.setdefault(key, value)
    return span
