"""The Jaeger query API: ``GET {base}/api/traces?service=NAME&lookback=1h&limit=N``.

The answer is the Jaeger JSON envelope ``{"data": [trace, ...], "errors": ...}``, read by
:mod:`._jaeger_json`. Every failure becomes one line naming the URL: unreachable, DNS, timeout
and HTTP errors are :class:`SourceNotFoundError`; a body that is not the envelope, or one
larger than the limit, is :class:`TraceFormatError`.

:func:`get` is the bounded GET itself, shared with Phoenix's reader (:mod:`.phoenix_api`).
Every fetch is bounded: an overall deadline for the whole exchange (connecting, the request,
every byte of the answer, redirects included: a server that trickles a byte at a time is cut
at the deadline, not merely between reads) and a limit on the answer's size, counted as it
is read. Both are arguments (``--timeout``, ``--max-response-mb`` on the command line). Name
resolution is left to the system resolver, which has its own timeouts.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import msgspec
import orjson

from tracekit.analysis.readers.common import one_line
from tracekit.errors import ConfigurationError, SourceNotFoundError, TraceFormatError

#: Seconds the whole fetch may take. Jaeger answers a search in seconds; a slow storage
#: backend (a long lookback on Elasticsearch or Cassandra) may need tens of them.
DEFAULT_TIMEOUT_S = 60.0
#: The largest answer read, in MiB: a quarter of a million spans or more (Jaeger JSON takes
#: 0.5 to 1 kB a span), more than a ``--limit`` of thousands of gateway traces returns. The
#: answer is held as bytes and parsed one trace at a time: this is about the memory it costs.
DEFAULT_MAX_RESPONSE_MB = 256.0
_MB = 2**20
_CHUNK = 2**20
# An error page is read for its message only.
_MAX_ERROR_BODY = 65_536
# Go duration syntax as Jaeger's UI writes lookbacks ("1h", "30m", "90s"), plus days ("2d").
_LOOKBACK = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def is_url(source: str) -> bool:
    """Whether a source string is an http(s) URL rather than a path."""
    return source[:8].lower().startswith(("http://", "https://"))


def query_url(base: str, service: str | None, lookback: str, limit: int | None) -> str:
    """Build the search URL; raise ConfigurationError for bad parameters.

    ``start``/``end`` (epoch µs) are sent beside ``lookback`` because Jaeger's API applies
    only them; ``lookback`` is what the UI sends, kept so the query reads the same in logs.

    Args:
        base: the query service's base URL, e.g. ``http://jaeger:16686``.
        service: the service to search (required by Jaeger).
        lookback: how far back to search, e.g. ``"1h"``, ``"30m"``, ``"2d"``.
        limit: the most traces to return, or None for Jaeger's default.

    Returns:
        The full URL.
    """
    if not service or not isinstance(service, str):
        raise ConfigurationError(f"{base}: a Jaeger query needs a service name (--service)")
    if isinstance(limit, bool) or (limit is not None and (not isinstance(limit, int) or limit < 1)):
        raise ConfigurationError(f"limit must be a positive integer, not {limit!r}")
    span_s = lookback_seconds(lookback)
    end_us = time.time_ns() // 1000
    params: dict[str, Any] = {
        "service": service,
        "lookback": lookback,
        "start": end_us - int(span_s * 1e6),
        "end": end_us,
    }
    if limit is not None:
        params["limit"] = limit
    root = base.rstrip("/").removesuffix("/api/traces")
    return f"{root}/api/traces?{urllib.parse.urlencode(params)}"


def lookback_seconds(lookback: str) -> float:
    """Parse a lookback such as ``"1h"`` or ``"1h30m"`` into seconds."""
    text = lookback.strip() if isinstance(lookback, str) else ""
    parts = _LOOKBACK.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ConfigurationError(f"lookback {lookback!r} is not a duration like 1h, 30m or 2d")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def limits(timeout: float | None, max_response_mb: float | None) -> tuple[float, int]:
    """Check the fetch limits and apply the defaults (``None``).

    Returns:
        ``(timeout in seconds, max_bytes)``.

    Raises:
        ConfigurationError: a limit that is not a positive number.
    """
    timeout = DEFAULT_TIMEOUT_S if timeout is None else _positive("timeout", timeout)
    mb = DEFAULT_MAX_RESPONSE_MB if max_response_mb is None else max_response_mb
    return timeout, int(_positive("max_response_mb", mb) * _MB)


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e12:
        raise ConfigurationError(f"{name} must be a positive number, not {value!r}")
    return float(value)


def fetch(
    url: str, timeout: float = DEFAULT_TIMEOUT_S, max_bytes: int = int(DEFAULT_MAX_RESPONSE_MB * _MB)
) -> bytearray:
    """GET the URL and return its body once it is checked to be a Jaeger envelope.

    Args:
        url: a URL from :func:`query_url`.
        timeout: seconds the whole fetch may take, from connecting to the answer's last byte.
        max_bytes: the largest answer read; a larger one is refused as soon as it shows
            (its ``Content-Length``, else the byte past the limit).

    Returns:
        The body: a JSON object with ``data`` and no ``errors`` (its traces are parsed later,
        one at a time, by the reader).

    Raises:
        SourceNotFoundError: unreachable, past the deadline, unknown host, non-200, or
            ``errors``.
        TraceFormatError: the body is larger than ``max_bytes``, not JSON or not the envelope.
    """
    body = get(url, timeout, max_bytes)
    _check_envelope(url, body)
    return body


def get(
    url: str, timeout: float, max_bytes: int, backend: str = "Jaeger", deadline_s: float | None = None
) -> bytearray:
    """GET the URL with a deadline and a size limit; every failure is one line naming ``url``
    and ``backend`` (the Jaeger query API, Phoenix's REST API).

    Args:
        url: the URL.
        timeout: seconds this GET may take, from connecting to the answer's last byte.
        max_bytes: the largest answer read.
        backend: the server's name, for the messages.
        deadline_s: the limit the messages name (a read of several pages shares one
            ``--timeout``); default ``timeout``.

    Returns:
        The body of a 200 answer.

    Raises:
        SourceNotFoundError: unreachable, past the deadline, unknown host, non-200.
        TraceFormatError: the body is larger than ``max_bytes``.
    """
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with _Deadline(timeout, backend, deadline_s) as deadline:
        try:
            with deadline.opener().open(request, timeout=timeout) as response:
                body = _read_capped(response, url, max_bytes, backend)
        except urllib.error.HTTPError as exc:
            message = _http_error(url, exc, backend)
            deadline.check(url)
            raise SourceNotFoundError(message) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            deadline.check(url, exc)
            api = "the Jaeger query API" if backend == "Jaeger" else f"{backend}'s REST API"
            raise SourceNotFoundError(f"{url}: cannot reach {api} ({_why(exc)})") from exc
        # A read cut short by the deadline ends like a complete one: the clock decides.
        deadline.check(url)
    return body


class _Deadline:
    """The wall-clock limit of one fetch: when it passes, every socket the fetch opened is
    shut down, which ends a read blocked in any phase (a per-operation timeout would let a
    server that sends a byte now and then hold the fetch for ever)."""

    def __init__(self, seconds: float, backend: str, limit_s: float | None) -> None:
        self.seconds = seconds
        self.backend = backend
        self.limit_s = seconds if limit_s is None else limit_s
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def check(self, url: str, exc: BaseException | None = None) -> None:
        """Raise SourceNotFoundError if the deadline passed (whatever the read then saw), or
        if ``exc`` is a socket timeout (connecting, before a socket could be watched, is
        bounded by the socket timeout, which is the whole deadline)."""
        self._timer.cancel()
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if self.passed or isinstance(reason, TimeoutError):
            raise SourceNotFoundError(
                f"{url}: {self.backend} did not answer within {self.limit_s:g} s (see --timeout)"
            )

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            passed = self.passed
        if passed:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener (proxies, redirects), with every connection's socket watched."""
        handlers = (_HTTPHandler(), _HTTPSHandler())
        for handler in handlers:
            handler.deadline = self
        return urllib.request.build_opener(*handlers)


class _Watching(urllib.request.AbstractHTTPHandler):
    """urllib's HTTP(S) handler, but each connection it opens hands its socket to the deadline."""

    deadline: _Deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> http.client.HTTPResponse:
        deadline = self.deadline

        class Connection(http_class):  # type: ignore[misc]
            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)

        return super().do_open(Connection, req, **kwargs)


class _HTTPHandler(_Watching, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_Watching, urllib.request.HTTPSHandler):
    pass


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


def _read_capped(
    response: http.client.HTTPResponse, url: str, max_bytes: int, backend: str
) -> bytearray:
    # Counted as it arrives, so an endless body stops one chunk past the limit.
    if response.length is not None and response.length > max_bytes:
        raise _too_large(url, max_bytes, backend)
    body = bytearray()
    while chunk := response.read(min(_CHUNK, max_bytes + 1 - len(body))):
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(url, max_bytes, backend)
    return body


def _too_large(url: str, max_bytes: int, backend: str) -> TraceFormatError:
    fewer = "--limit, --lookback" if backend == "Jaeger" else "--lookback"
    return TraceFormatError(
        f"{url}: the {backend} answer is larger than {max_bytes / _MB:g} MB (see "
        f"--max-response-mb; or ask for fewer traces: {fewer})"
    )


def _check_envelope(url: str, body: bytearray) -> None:
    # The envelope's members, each left as raw JSON: checked without parsing the traces.
    try:
        envelope = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        envelope = None
    except msgspec.DecodeError as exc:
        text = one_line(bytes(body[:80]).decode("utf-8", "replace"), 80)
        raise TraceFormatError(
            f"{url}: the answer is not JSON ({one_line(str(exc), 80)}): {text!r}"
        ) from exc
    if envelope is None or "data" not in envelope:
        raise TraceFormatError(f"{url}: the answer is not a Jaeger /api/traces envelope")
    if "errors" in envelope:
        errors = orjson.loads(memoryview(envelope["errors"]))
        if errors:
            raise SourceNotFoundError(
                f"{url}: Jaeger answered with errors: {_messages({'errors': errors})}"
            )


def _why(exc: BaseException) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return f"unknown host: {reason.strerror or reason}"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    return one_line(f"{type(reason).__name__}: {reason}", 160)


def _http_error(url: str, exc: urllib.error.HTTPError, backend: str) -> str:
    try:
        page = exc.read(_MAX_ERROR_BODY)
        plain = (exc.headers.get_content_type() if exc.headers else "") == "text/plain"
        # Jaeger answers errors as JSON; Phoenix as a line of plain text.
        detail = one_line(page.decode("utf-8", "replace"), 200) if plain else _messages(orjson.loads(page))
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError):
        detail = ""
    finally:
        exc.close()
    suffix = f": {detail}" if detail else ""
    return f"{url}: {backend} answered HTTP {exc.code} {one_line(str(exc.reason), 60)}{suffix}"


def _messages(doc: Any) -> str:
    errors = doc.get("errors") if type(doc) is dict else None
    if not errors:
        return ""
    if not isinstance(errors, list):
        return one_line(str(errors), 200)
    texts = [str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in errors]
    return one_line("; ".join(texts), 200)
