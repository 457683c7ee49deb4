"""Slow, endless and lying Jaeger backends: every read has a deadline and a size limit.

Each backend is a real socket server on 127.0.0.1 whose handler misbehaves on purpose: it
trickles the answer a byte at a time, sends a body without end, or announces one of 10 GB.
The handlers are bounded themselves (a few seconds, a few MB), so that a reader without the
limits fails these tests instead of hanging them.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tracekit.analysis.readers import jaeger_api, read_spans
from tracekit.cli import main
from tracekit.errors import ConfigurationError, SourceNotFoundError, TraceFormatError

# How long a misbehaving handler keeps at it, at most: far past every deadline used here.
HANDLER_SECONDS = 12.0
# The deadline the tests give the reader, and the slack a busy 2-core machine may add to it.
DEADLINE_S = 1.0
SLACK_S = 3.0

Handler = Callable[[socket.socket, threading.Event], None]


class Backend:
    """A TCP server on 127.0.0.1 that runs ``handler(connection, stop)`` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(HANDLER_SECONDS)
            try:
                _read_request(connection)
                self.handler(connection, self.stop)
            except OSError:
                pass  # the reader hung up: what a limit does

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.acceptor.join(5)
        for thread in self.threads:
            thread.join(HANDLER_SECONDS + 5)


def _read_request(connection: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(4096)
        if not chunk:
            raise OSError("no request")
        data += chunk


@pytest.fixture
def backend() -> Iterator[Callable[[Handler], Backend]]:
    started: list[Backend] = []

    def start(handler: Handler) -> Backend:
        started.append(Backend(handler))
        return started[-1]

    yield start
    for server in started:
        server.close()


def trickle(data: bytes, head: bytes = b"", interval: float = 0.2) -> Handler:
    """A handler that sends ``head`` at once, then ``data`` a byte every ``interval`` seconds
    (for at most HANDLER_SECONDS): every read gets a byte long before any per-read timeout."""

    def handle(connection: socket.socket, stop: threading.Event) -> None:
        connection.sendall(head)
        ends = time.monotonic() + HANDLER_SECONDS
        for byte in data:
            if stop.is_set() or time.monotonic() > ends:
                return
            connection.sendall(bytes([byte]))
            time.sleep(interval)

    return handle


def endless(head: bytes, limit_bytes: int = 48 * 2**20) -> Handler:
    """A handler that sends ``head`` and then JSON traces without end (stopping by itself
    after ``limit_bytes`` or HANDLER_SECONDS)."""
    trace = b'{"traceID": "1", "spans": [], "processes": {}},' * 1000

    def handle(connection: socket.socket, stop: threading.Event) -> None:
        connection.sendall(head + b'{"data": [')
        sent = 0
        ends = time.monotonic() + HANDLER_SECONDS
        while sent < limit_bytes and not stop.is_set() and time.monotonic() < ends:
            connection.sendall(trace)
            sent += len(trace)

    return handle


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


def timed(fn: Callable[[], Any]) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        fn()
    return caught.value, time.monotonic() - started


# --- the deadline ---------------------------------------------------------------------------
def test_a_trickling_body_is_cut_at_the_deadline(backend: Any) -> None:
    server = backend(trickle(b" " * 1000 + b"]}", head=OK_HEAD + b'{"data": ['))
    url = f"{server.url}/api/traces?service=gw"
    exc, took = timed(lambda: jaeger_api.fetch(url, timeout=DEADLINE_S))
    assert isinstance(exc, SourceNotFoundError), exc
    assert str(exc) == f"{url}: Jaeger did not answer within 1 s (see --timeout)"
    assert DEADLINE_S * 0.9 < took < DEADLINE_S + SLACK_S


def test_trickling_headers_are_cut_at_the_deadline(backend: Any) -> None:
    # Before the body: the status line and headers, a byte at a time.
    server = backend(trickle(OK_HEAD.replace(b"\r\n\r\n", b"\r\nX-Pad: " + b"a" * 500 + b"\r\n\r\n")))
    exc, took = timed(lambda: list(read_spans(server.url, service="gw", timeout=DEADLINE_S)))
    assert isinstance(exc, SourceNotFoundError) and "did not answer within 1 s" in str(exc)
    assert took < DEADLINE_S + SLACK_S


def test_an_error_page_without_end_is_read_only_for_its_message(backend: Any) -> None:
    # An HTTP error whose body never ends (a MB at once, then a byte at a time): the message
    # needs its first bytes only.
    head = b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n"
    server = backend(trickle(b"x" * 1000, head=head + b"<html>" + b" " * 2**20))
    exc, took = timed(lambda: list(read_spans(server.url, service="gw")))
    assert isinstance(exc, SourceNotFoundError) and "Jaeger answered HTTP 500" in str(exc)
    assert took < SLACK_S


def test_the_cli_reports_the_deadline_in_one_line(backend: Any) -> None:
    server = backend(trickle(OK_HEAD + b'{"data": []}'))
    started = time.monotonic()
    code, out, err = run_main("analyze", "--jaeger", server.url, "--service", "gw", "--timeout", "1")
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert (code, out) == (2, "")
    assert err.startswith("tracekit: error: http://127.0.0.1:") and err.count("\n") == 1
    assert "Jaeger did not answer within 1 s" in err


# --- the size limit -------------------------------------------------------------------------
def test_an_endless_body_stops_at_the_size_limit(backend: Any) -> None:
    server = backend(endless(OK_HEAD))
    exc, took = timed(lambda: list(read_spans(server.url, service="gw", max_response_mb=1)))
    assert isinstance(exc, TraceFormatError), exc
    assert "the Jaeger answer is larger than 1 MB (see --max-response-mb" in str(exc)
    assert took < SLACK_S


def test_an_announced_size_over_the_limit_is_refused_before_reading(backend: Any) -> None:
    head = OK_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Length: 10000000000\r\n\r\n")
    server = backend(endless(head))
    exc, took = timed(lambda: list(read_spans(server.url, service="gw", max_response_mb=1)))
    assert isinstance(exc, TraceFormatError) and "larger than 1 MB" in str(exc)
    assert took < SLACK_S


def test_the_cli_reports_the_size_limit_in_one_line(backend: Any) -> None:
    server = backend(endless(OK_HEAD))
    code, out, err = run_main(
        "analyze", "--jaeger", server.url, "--service", "gw", "--max-response-mb", "0.5"
    )
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "the Jaeger answer is larger than 0.5 MB" in err


def test_an_answer_within_the_limits_is_read(backend: Any) -> None:
    body = (
        b'{"data": [{"traceID": "a1", "processes": {"p1": {"serviceName": "gw"}}, "spans": ['
        b'{"traceID": "a1", "spanID": "b1", "operationName": "GET /x", "startTime": 1700000000000000,'
        b' "duration": 5000, "processID": "p1", "references": [],'
        b' "tags": [{"key": "span.kind", "type": "string", "value": "server"}]}]}]}'
    )
    head = OK_HEAD.replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())

    def answer(connection: socket.socket, stop: threading.Event) -> None:
        connection.sendall(head + body)

    server = backend(answer)
    (span,) = read_spans(server.url, service="gw", timeout=5, max_response_mb=len(body) / 2**20)
    assert (span.name, span.service, span.kind) == ("GET /x", "gw", "server")


# --- the options ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options", [{"timeout": 0}, {"timeout": -1.0}, {"timeout": float("nan")}, {"timeout": "5"},
                {"max_response_mb": 0}, {"max_response_mb": True}],
)  # fmt: skip
def test_bad_limits_are_configuration_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="must be a positive number"):
        read_spans("http://127.0.0.1:9", service="gw", **options)


def test_limits_apply_to_a_jaeger_query_only(tmp_path: Any) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"resourceSpans": []}')
    for options in ({"timeout": 5}, {"max_response_mb": 5}):
        with pytest.raises(ConfigurationError, match="only to a Jaeger query URL"):
            read_spans(path, **options)


@pytest.mark.parametrize("option", ["--timeout", "--max-response-mb"])
@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_bad_limit_options_are_usage_errors(option: str, value: str) -> None:
    code, out, err = run_main("analyze", "--jaeger", "http://127.0.0.1:9", "--service", "gw",
                              option, value)  # fmt: skip
    assert (code, out) == (2, "") and err.count("\n") == 1 and option in err


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
