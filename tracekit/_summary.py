"""Turns a finished request record into span attributes (pure: no OpenTelemetry here).

Runs off the request path (the span-building thread), except when tracekit enriches a
server span made by other instrumentation: then the request attributes are set on that span
as the request ends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tracekit import _accounting, _clock, semconv
from tracekit._accounting import MS, Ledger
from tracekit._request import Request

_ITL_KEYS = (semconv.ITL_P50_MS, semconv.ITL_P95_MS, semconv.ITL_MAX_MS)


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (q in [0, 1])."""
    index = max(0, min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[index]


def end_of(request: Request) -> int:
    """The request span's end: when the last body chunk left, else when the app returned."""
    return request.end or (request.root.end if request.root else 0)


def ledger_attributes(led: Ledger, c: dict[str, float]) -> dict[str, Any]:
    """The ``tracekit.*`` attributes of one stage span (``c``: its :func:`components`)."""
    attrs: dict[str, Any] = {
        semconv.STAGE: led.name,
        semconv.STAGE_KIND: led.kind,
        semconv.WALL_MS: c["wall"],
        semconv.CPU_MS: c["cpu"],
        semconv.WAIT_MS: c["wait"],
        semconv.LOOP_WAIT_MS: c["loop_wait"],
        semconv.MAX_BLOCK_MS: c["max_block"],
        semconv.ON_LOOP: led.cpu_on >= led.cpu_off and led.cpu_on > 0,
        semconv.STEPS: led.steps,
    }
    if led.function:
        attrs[semconv.CODE_FUNCTION] = led.function
        if led.namespace:
            attrs[semconv.CODE_NAMESPACE] = led.namespace
    if c["children"]:
        attrs[semconv.CHILDREN_MS] = c["children"]
    if led.consumer:
        attrs[semconv.CONSUMER_MS] = c["consumer"]
    if led.slices:
        attrs[semconv.LOOP_SLICES_US] = _offsets(led.slices, led.start)
    if led.waits:
        attrs[semconv.LOOP_WAITS_US] = _offsets(led.waits, led.start)
    if led.blocked:
        attrs[semconv.BLOCKED_AT] = led.blocked[0][2]
    if led.first_item and led.kind == semconv.KIND_MODEL:
        attrs[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = (led.first_item - led.start) / 1e9
    if not led.end:
        attrs["tracekit.unfinished"] = True
    if led.attributes:
        attrs.update(led.attributes)
    return attrs


def _offsets(notes: list[tuple[int, int]], origin: int) -> list[int]:
    flat: list[int] = []
    for start, duration in sorted(notes):
        flat.append(max(0, start - origin) // 1000)
        flat.append(duration // 1000)
    return flat


def all_components(request: Request) -> list[dict[str, float]]:
    """:func:`components` of every ledger of ``request``, in ``request.ledgers`` order."""
    end = end_of(request)
    return [_accounting.components(led, led.end or end) for led in request.ledgers]


def request_attributes(request: Request, comps: list[dict[str, float]] | None = None) -> dict[str, Any]:
    """The request-level ``tracekit.*`` attributes: components summed over all ledgers."""
    end = end_of(request)
    cpu = cpu_on = loop_wait = model_wait = io_wait = 0.0
    max_block = 0.0
    blocked_at = None
    for led, c in zip(request.ledgers, comps or all_components(request), strict=True):
        cpu += c["cpu"]
        cpu_on += c["cpu_on"]
        loop_wait += c["loop_wait"]
        if led.kind == semconv.KIND_MODEL:
            model_wait += c["wait"]
        else:
            io_wait += c["wait"]
        if c["max_block"] > max_block:
            max_block = c["max_block"]
            if led.blocked:
                blocked_at = led.blocked[0][2]
        elif blocked_at is None and led.blocked:
            blocked_at = led.blocked[0][2]
    wall = max(0, end - request.start) / MS
    attrs: dict[str, Any] = {
        semconv.WALL_MS: wall,
        semconv.CPU_MS: cpu,
        semconv.LOOP_WAIT_MS: loop_wait,
        semconv.MODEL_WAIT_MS: model_wait,
        semconv.IO_WAIT_MS: io_wait,
        semconv.OVERHEAD_MS: max(0.0, wall - model_wait),
        semconv.MAX_BLOCK_MS: max_block,
        semconv.ON_LOOP: cpu_on * 2 >= cpu and cpu > 0,
        semconv.INFLIGHT: request.inflight,
    }
    if blocked_at:
        attrs[semconv.BLOCKED_AT] = blocked_at
    root = request.root
    if root is not None:
        if root.slices:
            attrs[semconv.LOOP_SLICES_US] = _offsets(root.slices, request.start)
        if root.waits:
            attrs[semconv.LOOP_WAITS_US] = _offsets(root.waits, request.start)
    if request.ttfb:
        attrs[semconv.TTFB_MS] = (request.ttfb - request.start) / MS
    attrs.update(stream_attributes(request))
    return attrs


def stream_attributes(request: Request) -> dict[str, Any]:
    """TTFT, ITL percentiles, TPOT and chunk count (DESIGN §1 definitions)."""
    if not request.chunks:
        return {}
    attrs: dict[str, Any] = {
        semconv.CHUNKS: request.chunks,
        semconv.TTFT_MS: (request.chunk_first - request.start) / MS,
    }
    gaps = request.gaps
    if gaps:
        ordered = sorted(gaps)
        attrs[semconv.ITL_P50_MS] = percentile(ordered, 0.50) / MS
        attrs[semconv.ITL_P95_MS] = percentile(ordered, 0.95) / MS
        attrs[semconv.ITL_MAX_MS] = max(ordered[-1], request.gap_max) / MS
        attrs[semconv.TPOT_MS] = (request.chunk_last - request.chunk_first) / (request.chunks - 1) / MS
    return attrs


def http_attributes(request: Request) -> tuple[str, dict[str, Any]]:
    """Span name and OpenTelemetry HTTP server attributes (stable conventions) from the scope."""
    scope = request.scope or {}
    method = scope.get("method", "GET")
    route = route_template(scope, request)
    attrs: dict[str, Any] = {
        semconv.HTTP_REQUEST_METHOD: method,
        semconv.URL_PATH: scope.get("path", ""),
        semconv.URL_SCHEME: scope.get("scheme", "http"),
        semconv.NETWORK_PROTOCOL_VERSION: scope.get("http_version", "1.1"),
    }
    query = scope.get("query_string")
    if query:
        attrs[semconv.URL_QUERY] = query.decode("latin-1")
    if route:
        attrs[semconv.HTTP_ROUTE] = route
    if request.status:
        attrs[semconv.HTTP_RESPONSE_STATUS_CODE] = request.status
    server = scope.get("server")
    if server and server[0] is not None:
        attrs[semconv.SERVER_ADDRESS] = str(server[0])
        if len(server) > 1 and server[1] is not None:
            attrs[semconv.SERVER_PORT] = int(server[1])
    client = scope.get("client")
    if client:
        attrs[semconv.CLIENT_ADDRESS] = str(client[0])
        attrs[semconv.CLIENT_PORT] = int(client[1])
    for key, value in scope.get("headers", ()):
        if key == b"user-agent":
            attrs[semconv.USER_AGENT_ORIGINAL] = value.decode("latin-1")
        elif key == b"host" and semconv.SERVER_ADDRESS not in attrs:
            attrs[semconv.SERVER_ADDRESS] = value.decode("latin-1").rsplit(":", 1)[0]
    return (f"{method} {route}" if route else method), attrs


def route_template(scope: Mapping[str, Any], request: Request) -> str | None:
    """The matched route's path template (Starlette/FastAPI put the route in the scope)."""
    route = scope.get("route")
    path = getattr(route, "path", None) or getattr(route, "path_format", None)
    if not isinstance(path, str):
        return None
    mounted = scope.get("root_path", "")
    original = request.root_path
    prefix = mounted[len(original):] if mounted.startswith(original) else ""
    return prefix + path


def short_path(filename: str) -> str:
    """A file name relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def epoch(wall: int) -> int:
    """Span timestamp for a wall reading."""
    return _clock.epoch_ns(wall)
