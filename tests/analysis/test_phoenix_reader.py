"""The Phoenix REST API reader against a stand-in server (issue 15, item 4).

The real Phoenix is tested in tests/e2e/test_phoenix.py (``TRACEKIT_PHOENIX``; ``make test``
runs it); these run everywhere. The stand-in answers what Phoenix 20.26.1 answered there: pages
of ``{"data": [...], "next_cursor": ...}``, ISO times, no OTel span kind, the OpenInference kind
in ``span_kind``, and a plain-text 404 for an unknown project.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import tracekit
from tests.helpers import http_server
from tracekit import semconv as sc
from tracekit.analysis.readers import read_spans
from tracekit.cli import main
from tracekit.errors import ConfigurationError, SourceNotFoundError, TraceFormatError

TRACE = "0123456789abcdef0123456789abcdef"


def _span(name: str, sid: str, parent: str | None, kind: str, start_us: int, end_us: int,
          attributes: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    def iso(us: int) -> str:
        return f"2026-12-04T15:10:25.{us:06d}+00:00"

    return {"id": "U3Bhbjo" + sid[-2:], "name": name, "context": {"trace_id": TRACE, "span_id": sid},
            "span_kind": kind, "parent_id": parent, "start_time": iso(start_us),
            "end_time": iso(end_us), "status_code": "UNSET", "status_message": "",
            "attributes": attributes, "events": []}  # fmt: skip


SERVER = _span("POST /v1/chat", "00000000000000a1", None, "CHAIN", 100, 5100, {
    sc.HTTP_REQUEST_METHOD: "POST", sc.HTTP_ROUTE: "/v1/chat", sc.URL_PATH: "/v1/chat",
    sc.HTTP_RESPONSE_STATUS_CODE: 200, sc.WALL_MS: 5.0, sc.CPU_MS: 1.0, sc.OVERHEAD_MS: 1.0,
    sc.MODEL_WAIT_MS: 4.0, sc.IO_WAIT_MS: 0.0, sc.LOOP_WAIT_MS: 0.0, sc.ON_LOOP: True})  # fmt: skip
MODEL = _span("model", "00000000000000a2", "00000000000000a1", "LLM", 1000, 5000, {
    sc.STAGE: "model", sc.STAGE_KIND: "model", sc.WALL_MS: 4.0, sc.CPU_MS: 0.0, sc.WAIT_MS: 4.0,
    sc.LOOP_WAIT_MS: 0.0, sc.LOOP_SLICES_US: [0, 10, 3000, 5]})  # fmt: skip
CLIENT = _span("POST", "00000000000000a3", "00000000000000a2", "UNKNOWN", 1100, 4900,
               {"url.full": "http://model:8000/v1/chat/completions"})  # fmt: skip
PAGES = {None: ([SERVER, MODEL], "page2"), "page2": ([CLIENT], None)}
asked: list[dict[str, list[str]]] = []


class _Phoenix(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        asked.append(query)
        if parts.path == "/v1/projects/html/spans":  # a proxy's page, say
            self._answer(200, b"<html>", "text/html")
            return
        if parts.path != "/v1/projects/gateway/spans":
            self._answer(404, b"Project with name nope not found", "text/plain")
            return
        data, cursor = PAGES[query.get("cursor", [None])[0]]
        self._answer(200, json.dumps({"data": data, "next_cursor": cursor}).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def phoenix() -> Iterator[str]:
    asked.clear()
    with http_server(_Phoenix) as url:
        yield url


def test_pages_are_read_and_kinds_restored(phoenix: str) -> None:
    stream = read_spans(phoenix, project="gateway", lookback="30m")
    spans = {s.name: s for s in stream}
    assert stream.stats.format == "phoenix-api" and not stream.stats.skipped
    assert [q.get("cursor") for q in asked] == [None, ["page2"]]  # followed next_cursor
    assert asked[0]["sort"] == ["start_time"] and asked[0]["order"] == ["asc"]
    assert asked[0]["start_time"][0].endswith("+00:00")  # the lookback, as an ISO time
    server, model, client = spans["POST /v1/chat"], spans["model"], spans["POST"]
    # Phoenix drops the OTel span kind: HTTP server attributes make a SERVER, url.full a CLIENT.
    assert (server.kind, model.kind, client.kind) == ("server", "internal", "client")
    assert server.parent_id is None and model.parent_id == server.span_id
    assert server.attributes[sc.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert model.attributes[sc.OPENINFERENCE_SPAN_KIND] == "LLM"
    assert sc.OPENINFERENCE_SPAN_KIND not in client.attributes  # UNKNOWN is no kind
    assert model.attributes[sc.LOOP_SLICES_US] == [0, 10, 3000, 5]
    assert model.start_ns == 1796397025_001000000 and model.end_ns - model.start_ns == 4_000_000


def test_report_from_phoenix(phoenix: str) -> None:
    report = tracekit.analyze(phoenix, project="gateway").to_dict()
    assert report["requests"] == 1 and report["routes"][0]["route"] == "POST /v1/chat"
    assert [s["stage"] for s in report["routes"][0]["stages"]] == ["model", "POST"]  # + the client


def test_unknown_project_is_one_line(phoenix: str) -> None:
    with pytest.raises(SourceNotFoundError) as caught:
        list(read_spans(phoenix, project="nope"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith("Phoenix answered HTTP 404 Not Found: Project with name nope not found")


def test_not_a_page_is_a_format_error(phoenix: str) -> None:
    with pytest.raises(TraceFormatError, match="the answer is not JSON: '<html>'"):
        list(read_spans(phoenix, project="html"))


def test_options_that_do_not_apply(phoenix: str) -> None:
    with pytest.raises(ConfigurationError, match="not Phoenix"):
        read_spans(phoenix, project="gateway", service="gw")
    with pytest.raises(ConfigurationError, match="only to a Jaeger query URL or a Phoenix URL"):
        read_spans("traces.jsonl", project="gateway")


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["analyze", *args])  # in process: the exit code and what it printed
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_unreachable_phoenix_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused
        code, out, err = _cli(capsys, "--phoenix", f"http://127.0.0.1:{s.getsockname()[1]}")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tracekit: error: http://127.0.0.1:")
    assert "cannot reach Phoenix's REST API (connection refused)" in err


def test_cli_reads_phoenix(phoenix: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "--phoenix", phoenix, "--project", "gateway", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["requests"] == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--project", "x", "t.jsonl"], "--project applies to --phoenix"),
    (["--phoenix", "localhost:6006"], "is not an http(s) URL"),
    (["--phoenix", "http://h", "--service", "gw"], "--service and --limit apply to --jaeger"),
    (["--phoenix", "http://h", "--jaeger", "http://j"], "exactly one"),
])  # fmt: skip
def test_cli_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and message in err
