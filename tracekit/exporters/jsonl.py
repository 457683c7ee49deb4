"""``jsonl:PATH``: OTLP JSON Lines, the OpenTelemetry file-exporter format.

Each ``export()`` call appends one line: a ``TracesData`` object
(``{"resourceSpans": [...]}``) with lowerCamelCase keys, hex ids, nanosecond times as decimal
strings and ``intValue`` as a string, as the OTLP/JSON encoding requires. ``tracekit analyze``,
the OpenTelemetry Collector's ``otlpjsonfile`` receiver and Jaeger's UI read it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def otlp_value(value: Any) -> dict[str, Any]:
    """An OTLP JSON ``AnyValue`` for an attribute value (ints as strings, per proto3 JSON)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"stringValue": value.decode("utf-8", "replace")}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [otlp_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": otlp_value(v)} for k, v in (attrs or {}).items()]


def encode_span(span: ReadableSpan) -> dict[str, Any]:
    """One span in OTLP/JSON form."""
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x"),
        "spanId": format(ctx.span_id, "016x"),
        "name": span.name,
        "kind": span.kind.value + 1,  # OTLP numbers kinds from 1 (INTERNAL); the API from 0
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _attributes(span.attributes),
        "flags": int(ctx.trace_flags) | (0x300 if span.parent is not None and span.parent.is_remote
                                         else 0x100),  # fmt: skip
    }
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    if span.events:
        out["events"] = [{"timeUnixNano": str(e.timestamp), "name": e.name,
                          "attributes": _attributes(e.attributes)} for e in span.events]  # fmt: skip
    status = span.status
    if status.status_code.value:
        out["status"] = {"code": status.status_code.value, **({"message": status.description}
                                                              if status.description else {})}  # fmt: skip
    return out


def encode(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """A ``TracesData`` object for ``spans``, grouped by resource and instrumentation scope."""
    by_resource: dict[int, tuple[Any, dict[Any, list[dict[str, Any]]]]] = {}
    for span in spans:
        resource = span.resource
        entry = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        entry[1].setdefault(key, []).append(encode_span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for (name, version), encoded in scopes.items():
            encoded_scope = {"name": name, **({"version": version} if version else {})}
            scope_spans.append({"scope": encoded_scope, "spans": encoded})
        resource_spans.append({
            "resource": {"attributes": _attributes(resource.attributes if resource else {})},
            "scopeSpans": scope_spans,
        })  # fmt: skip
    return {"resourceSpans": resource_spans}


class JsonLinesSpanExporter(SpanExporter):
    """Appends each batch of spans to ``path`` as one line of OTLP JSON, in one write.

    Args:
        path: the file to append to (created with its directory if missing).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        # Unbuffered, appending: each line is one write(2) at the end of the file, so several
        # processes (a gateway and its model server) can append to one file, line by line.
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open: one handle, many batches)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write one line for ``spans``."""
        if not spans:
            return SpanExportResult.SUCCESS
        line = orjson.dumps(encode(spans)) + b"\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the file."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()
