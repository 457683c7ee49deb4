"""A stand-in for an OpenTelemetry Collector: an OTLP/HTTP receiver on 127.0.0.1 that keeps
what it receives and writes it out as OTLP JSON Lines (what the Collector's file exporter
writes), for ``tracekit analyze``."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.helpers import http_server

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


class Collector:
    """What the receiver got: one ``ExportTraceServiceRequest`` per export call."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def spans(self, since: int = 0) -> list[tuple[str, Any]]:
        """``(service.name, span)`` of every span received so far (from the ``since``-th
        export call on)."""
        out: list[tuple[str, Any]] = []
        with self.lock:
            requests = list(self.requests[since:])
        for message in requests:
            for rs in message.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                service = attrs.get("service.name", "")
                out.extend((service, span) for ss in rs.scope_spans for span in ss.spans)
        return out

    def wait_for(self, name: str, count: int, timeout: float = 20.0, since: int = 0) -> list[Any]:
        """The spans named ``name`` (in export calls from the ``since``-th on) once ``count``
        of them arrived (fewer at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [span for _, span in self.spans(since) if span.name == name]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def write_jsonl(self, path: Path, since: int = 0) -> Path:
        """What was received (from the ``since``-th export call on) as OTLP JSON Lines: hex
        ids, integer enums, as OTLP/JSON says."""
        with self.lock:
            requests = list(self.requests[since:])
        with path.open("w") as f:
            for message in requests:
                data = MessageToDict(message, use_integers_for_enums=True)
                for rs in data.get("resourceSpans", []):
                    for ss in rs.get("scopeSpans", []):
                        for span in ss.get("spans", []):
                            for key in _ID_KEYS:
                                if span.get(key):
                                    span[key] = base64.b64decode(span[key]).hex()
                f.write(json.dumps(data) + "\n")
        return path


@contextlib.contextmanager
def collector() -> Iterator[Collector]:
    """Run a receiver; its ``url`` takes OTLP/HTTP protobuf posts on any path."""
    got = Collector()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            message = trace_service_pb2.ExportTraceServiceRequest()
            message.ParseFromString(body)
            with got.lock:
                got.requests.append(message)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *args: Any) -> None:
            pass

    with http_server(Receiver) as url:
        got.url = url
        yield got
