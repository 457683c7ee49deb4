"""The Jaeger query API: ``GET {base}/api/traces?service=NAME&lookback=1h&limit=N``.

The answer is the Jaeger JSON envelope ``{"data": [trace, ...], "errors": ...}``, read by
:mod:`._jaeger_json`. Every failure becomes one line naming the URL: unreachable, DNS, timeout
and HTTP errors are :class:`SourceNotFoundError`; a body that is not the envelope is
:class:`TraceFormatError`.
"""

from __future__ import annotations

import http.client
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

from tracekit.analysis._source_common import one_line
from tracekit.errors import ConfigurationError, SourceNotFoundError, TraceFormatError

#: Seconds to wait for the connection and for each read of the answer.
DEFAULT_TIMEOUT_S = 10.0
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


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """GET the URL and return the parsed Jaeger envelope.

    Args:
        url: a URL from :func:`query_url`.
        timeout: seconds for connecting and for each read.

    Returns:
        The parsed JSON body (a dict with ``data``).

    Raises:
        SourceNotFoundError: unreachable, timed out, unknown host, non-200, or ``errors``.
        TraceFormatError: the body is not JSON or not the envelope.
    """
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise SourceNotFoundError(_http_error(url, exc)) from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        raise SourceNotFoundError(
            f"{url}: cannot reach the Jaeger query API ({_why(exc, timeout)})"
        ) from exc
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(
            f"{url}: the answer is not JSON ({exc.msg}): "
            f"{one_line(body[:80].decode('utf-8', 'replace'), 80)!r}"
        ) from exc
    if type(doc) is not dict or "data" not in doc:
        raise TraceFormatError(f"{url}: the answer is not a Jaeger /api/traces envelope")
    if doc.get("errors"):
        raise SourceNotFoundError(f"{url}: Jaeger answered with errors: {_messages(doc)}")
    return doc


def _why(exc: BaseException, timeout: float) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.timeout | TimeoutError):
        return f"timed out after {timeout:g} s"
    if isinstance(reason, socket.gaierror):
        return f"unknown host: {reason.strerror or reason}"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    return one_line(f"{type(reason).__name__}: {reason}", 160)


def _http_error(url: str, exc: urllib.error.HTTPError) -> str:
    try:
        detail = _messages(orjson.loads(exc.read()))
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError):
        detail = ""
    finally:
        exc.close()
    suffix = f": {detail}" if detail else ""
    return f"{url}: Jaeger answered HTTP {exc.code} {one_line(str(exc.reason), 60)}{suffix}"


def _messages(doc: Any) -> str:
    errors = doc.get("errors") if type(doc) is dict else None
    if not errors:
        return ""
    if not isinstance(errors, list):
        return one_line(str(errors), 200)
    texts = [str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in errors]
    return one_line("; ".join(texts), 200)
