"""Turns a finished request record into span attributes (pure: no OpenTelemetry here).

Runs off the request path (the span-building thread), except when tracekit enriches a
server span made by other instrumentation: then the request attributes are set on that span
as the request ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import unquote

from tracekit import semconv
from tracekit._core.ledger import MS, REQUEST, SPAWNED, Ledger, cpu_of, split
from tracekit._core.request_record import Request
from tracekit._percentile import percentile
from tracekit.semconv import (
    BLOCKED_AT,
    CHILDREN_MS,
    CONSUMER_MS,
    CPU_MS,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    INFLIGHT,
    IO_WAIT_MS,
    KIND_MODEL,
    LOOP_SLICES_US,
    LOOP_WAIT_MS,
    LOOP_WAITS_US,
    MAX_BLOCK_MS,
    MODEL_WAIT_MS,
    ON_LOOP,
    OVERHEAD_MS,
    STEPS,
    TTFB_MS,
    WAIT_MS,
    WALL_MS,
)

# The keys every SERVER span has, in their order (http_attributes and request_attributes fill
# them in): copying a dict that has them is cheaper than growing one key by key.
_SERVER_TEMPLATE: dict[str, Any] = dict.fromkeys((
    semconv.HTTP_REQUEST_METHOD, semconv.URL_PATH, semconv.URL_SCHEME,
    semconv.NETWORK_PROTOCOL_VERSION, WALL_MS, CPU_MS, LOOP_WAIT_MS, MODEL_WAIT_MS, IO_WAIT_MS,
    OVERHEAD_MS, MAX_BLOCK_MS, ON_LOOP, INFLIGHT,
))  # fmt: skip
_SERVER_TEMPLATE[semconv.OPENINFERENCE_SPAN_KIND] = semconv.OPENINFERENCE_CHAIN
# A model stage's gen_ai.* attributes and the OpenInference names they are repeated under (a
# response model overrides the requested one), so that Phoenix shows model and token counts.
_OPENINFERENCE_LLM: Final[tuple[tuple[str, str], ...]] = (
    (semconv.GEN_AI_REQUEST_MODEL, semconv.LLM_MODEL_NAME),
    (semconv.GEN_AI_RESPONSE_MODEL, semconv.LLM_MODEL_NAME),
    (semconv.GEN_AI_PROVIDER_NAME, semconv.LLM_PROVIDER),
    (semconv.GEN_AI_PROVIDER_NAME, semconv.LLM_SYSTEM),
    (semconv.GEN_AI_USAGE_INPUT_TOKENS, semconv.LLM_TOKEN_COUNT_PROMPT),
    (semconv.GEN_AI_USAGE_OUTPUT_TOKENS, semconv.LLM_TOKEN_COUNT_COMPLETION),
)


# --- privacy (docs/attributes.md, "Privacy") ---------------------------------------------------
REDACTED: Final = "REDACTED"
# Query keys whose values are recorded as REDACTED: the OpenTelemetry HTTP conventions' list
# for url.query (its current version and the earlier one), matched case-sensitively as they
# say; the key itself stays (``q=x&sig=REDACTED``).
SENSITIVE_QUERY_KEYS: Final[tuple[str, ...]] = (
    "AWSAccessKeyId", "Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Amz-Signature",
    "X-Goog-Signature", "sig",
)  # fmt: skip
# Characters kept of an exception's message (status, exception event): enough for "connection
# refused to host:port" diagnostics, short of the prompt a message may quote.
DEFAULT_MESSAGE_LIMIT: Final = 256
# Characters kept of a string tracekit did not make: read from the request (path, query,
# headers) or set on a stage by an integration or the application.
MAX_VALUE: Final = 2048


class Privacy:
    """What tracekit's spans may carry of a request's data (``tracekit.configure()`` options).

    Args:
        record_query: record ``url.query`` at all.
        redact_query: query keys whose values are redacted besides ``SENSITIVE_QUERY_KEYS``;
            ``"*"`` redacts every value.
        exception_message_limit: characters kept of an exception's message (then ``…``); 0
            records none: the exception's type only.
    """

    def __init__(self, record_query: bool = True, redact_query: Iterable[str] = (),
                 exception_message_limit: int = DEFAULT_MESSAGE_LIMIT) -> None:  # fmt: skip
        extra = set(redact_query)
        self.record_query = record_query
        self.redact_every = "*" in extra
        self.redacted_keys: frozenset[str] = frozenset(SENSITIVE_QUERY_KEYS).union(extra)
        self.message_limit = exception_message_limit


DEFAULT_PRIVACY: Final = Privacy()


def redact_query(query: str, privacy: Privacy) -> str:
    """``query`` with the values of sensitive keys replaced by ``REDACTED``, the rest verbatim."""
    if "=" not in query:
        return query
    parts = query.split("&")
    changed = False
    for i in range(len(parts)):
        key, _, value = parts[i].partition("=")
        if value and (privacy.redact_every or _query_key(key) in privacy.redacted_keys):
            parts[i] = key + "=" + REDACTED
            changed = True
    return "&".join(parts) if changed else query


def _query_key(key: str) -> str:
    return unquote(key) if "%" in key else key  # "X%2DAmz%2DSignature" is that key too


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, then ``…`` where it was cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def end_of(request: Request) -> int:
    """The request span's end: when the last body chunk left, else when the app returned."""
    return request.end or (request.root.end if request.root else 0)


def open_end(request: Request, end: int) -> int:
    """Where a ledger still open when ``request`` was handed on ends (``end``: the request's):
    where the wait for it stopped (:meth:`tracekit._export.tracing.Runtime.linger`), else the
    request's end; never before the ledger began (see :func:`ledger_end`)."""
    return request.cutoff or end


def ledger_end(led: Ledger, open_at: int) -> int:
    """``led``'s end: its own, or ``open_at`` (:func:`open_end`) if it never closed."""
    return led.end or max(open_at, led.start)


def ledger_parts(request: Request, end: int = 0) -> list[tuple[int, int, int, int]]:
    """:func:`tracekit._core.ledger.split` of every ledger of ``request``, in ledger order
    (``end``: the request's end, default :func:`end_of`; for ledgers never closed)."""
    end = end or end_of(request)
    open_at = open_end(request, end)
    # The request's own ledger is split over the request span (to its last byte): it may
    # close later (a streamed body's task group ending), and the request's components add
    # up to the request's wall time.
    return [split(led, min(ledger_end(led, open_at), end) if led.site is REQUEST
                  else ledger_end(led, open_at)) for led in request.ledgers]  # fmt: skip


def stage_attributes(led: Ledger, wall: int, children: int, wait: int, loop_wait: int) -> dict[str, Any]:
    """The ``tracekit.*`` attributes of one stage span (the rest: its :func:`split`)."""
    cpu_on = led.cpu_on
    attrs = led.site.template.copy()
    attrs[WALL_MS] = wall / MS
    attrs[CPU_MS] = cpu_of(led) / MS
    attrs[WAIT_MS] = wait / MS
    attrs[LOOP_WAIT_MS] = loop_wait / MS
    attrs[MAX_BLOCK_MS] = led.max_block / MS
    attrs[ON_LOOP] = cpu_on >= led.cpu_off and cpu_on > 0
    if led.cpu_off > 0:
        attrs[semconv.CPU_OFF_LOOP_MS] = led.cpu_off / MS
    attrs[STEPS] = led.steps
    if children:
        attrs[CHILDREN_MS] = children / MS
    if led.consumer:
        attrs[CONSUMER_MS] = led.consumer / MS
    if led.gc:
        attrs[semconv.GC_MS] = led.gc / MS
    if led.queued:
        attrs[semconv.QUEUE_WAIT_MS] = led.queued / MS
    if led.slices:
        attrs[LOOP_SLICES_US] = _offsets(led.slices, led.start)
    if led.waits:
        attrs[LOOP_WAITS_US] = _offsets(led.waits, led.start)
    if led.blocked:
        attrs[BLOCKED_AT] = led.blocked[0][2]
    if led.first_item and led.site.kind == KIND_MODEL:
        attrs[GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = (led.first_item - led.start) / 1e9
    if not led.end:
        attrs["tracekit.unfinished"] = True
    if led.attributes:
        for key, value in led.attributes.items():
            attrs[key] = clip(value, MAX_VALUE) if isinstance(value, str) else value
        if led.site.kind == KIND_MODEL:
            openinference_llm(attrs)
    return attrs


def openinference_llm(attrs: dict[str, Any]) -> None:
    """Repeat a model span's ``gen_ai.*`` values under their OpenInference ``llm.*`` names."""
    for gen_ai, llm in _OPENINFERENCE_LLM:
        value = attrs.get(gen_ai)
        if value is not None:
            attrs[llm] = value
    prompt = attrs.get(semconv.LLM_TOKEN_COUNT_PROMPT)
    completion = attrs.get(semconv.LLM_TOKEN_COUNT_COMPLETION)
    if isinstance(prompt, int) and isinstance(completion, int):
        attrs[semconv.LLM_TOKEN_COUNT_TOTAL] = prompt + completion


def _offsets(notes: list[tuple[int, int]], origin: int) -> list[int]:
    flat: list[int] = []
    for start, duration in sorted(notes):
        flat.append(max(0, start - origin) // 1000)
        flat.append(duration // 1000)
    return flat


def request_attributes(request: Request, parts: list[tuple[int, int, int, int]] | None = None,
                       attrs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The request-level ``tracekit.*`` attributes: components summed over all ledgers
    (``parts``: :func:`ledger_parts`, computed when not given), added to ``attrs`` if given."""
    end = end_of(request)
    if parts is None:
        parts = ledger_parts(request, end)
    cpu = cpu_on = loop_wait = model_wait = io_wait = max_block = gc = queued = 0
    after, after_off = request.after_cpu, request.after_cpu_off
    blocked_at = None
    ledgers = request.ledgers
    for i in range(len(parts)):  # the ledgers split (enriching: another task may open one meanwhile)
        led = ledgers[i]
        if led.site is SPAWNED:  # folded into the ledger that spawned it
            continue
        if led.start >= end and request.end:  # a stage run after the response: after the span
            after += cpu_of(led)
            after_off += led.cpu_off
            continue
        _, _, wait, waited = parts[i]
        gc += led.gc
        queued += led.queued
        cpu_on += led.cpu_on
        cpu += cpu_of(led)
        loop_wait += waited
        if led.site.kind == KIND_MODEL:
            model_wait += wait
        else:
            io_wait += wait
        blocked = led.blocked
        if led.max_block > max_block:
            max_block = led.max_block
            if blocked:
                blocked_at = blocked[0][2]
        elif blocked_at is None and blocked:
            blocked_at = blocked[0][2]
    wall = max(0, end - request.start) / MS
    if attrs is None:
        attrs = {}
    attrs[WALL_MS] = wall
    attrs[CPU_MS] = cpu / MS
    attrs[LOOP_WAIT_MS] = loop_wait / MS
    attrs[MODEL_WAIT_MS] = model_wait / MS
    attrs[IO_WAIT_MS] = io_wait / MS
    if gc:
        attrs[semconv.GC_MS] = gc / MS
    if queued:
        attrs[semconv.QUEUE_WAIT_MS] = queued / MS
    if request.start_wait > 0:
        attrs[semconv.START_WAIT_MS] = request.start_wait / MS
    if after > 0:
        attrs[semconv.AFTER_RESPONSE_CPU_MS] = after / MS
        if after_off > 0:
            attrs[semconv.AFTER_RESPONSE_CPU_OFF_LOOP_MS] = after_off / MS
    attrs[OVERHEAD_MS] = max(0.0, wall - model_wait / MS)
    attrs[MAX_BLOCK_MS] = max_block / MS
    attrs[ON_LOOP] = cpu_on * 2 >= cpu and cpu > 0
    if cpu > cpu_on:
        attrs[semconv.CPU_OFF_LOOP_MS] = (cpu - cpu_on) / MS
    attrs[INFLIGHT] = request.inflight
    if blocked_at:
        attrs[BLOCKED_AT] = blocked_at
    root = request.root
    if root is not None:
        if root.slices:
            attrs[LOOP_SLICES_US] = _offsets(root.slices, request.start)
        if root.waits:
            attrs[LOOP_WAITS_US] = _offsets(root.waits, request.start)
    if request.ttfb:
        attrs[TTFB_MS] = (request.ttfb - request.start) / MS
    if request.chunks:
        stream_attributes(request, attrs)
    if request.cancelled:
        attrs[semconv.CANCELLED] = True
    return attrs


def stream_attributes(request: Request, attrs: dict[str, Any]) -> None:
    """Adds TTFT, ITL percentiles, TPOT and the chunk count (DESIGN §1 definitions)."""
    if not request.chunks:
        return
    attrs[semconv.CHUNKS] = request.chunks
    attrs[semconv.TTFT_MS] = (request.chunk_first - request.start) / MS
    gaps = request.gaps
    if gaps:
        ordered = sorted(gaps)
        attrs[semconv.ITL_P50_MS] = percentile(ordered, 0.50) / MS
        attrs[semconv.ITL_P95_MS] = percentile(ordered, 0.95) / MS
        attrs[semconv.ITL_MAX_MS] = max(ordered[-1], request.gap_max) / MS
        attrs[semconv.TPOT_MS] = (request.chunk_last - request.chunk_first) / (request.chunks - 1) / MS


def http_attributes(request: Request, privacy: Privacy = DEFAULT_PRIVACY) -> tuple[str, dict[str, Any]]:
    """Span name and OpenTelemetry HTTP server attributes (stable conventions) from the scope,
    as ``privacy`` allows; the dict has room for the request's own attributes
    (:func:`request_attributes`). Values read from the request are clipped to ``MAX_VALUE``
    characters; no other header than ``User-Agent`` and ``Host`` is read."""
    scope = request.scope or {}
    method = scope.get("method", "GET")
    route = route_template(scope, request)
    attrs = _SERVER_TEMPLATE.copy()
    attrs[semconv.HTTP_REQUEST_METHOD] = method
    attrs[semconv.URL_PATH] = clip(scope.get("path", ""), MAX_VALUE)
    attrs[semconv.URL_SCHEME] = scope.get("scheme", "http")
    attrs[semconv.NETWORK_PROTOCOL_VERSION] = scope.get("http_version", "1.1")
    query = scope.get("query_string")
    if query and privacy.record_query:  # redacted before it is clipped: no half-cut secret
        attrs[semconv.URL_QUERY] = clip(redact_query(query.decode("latin-1"), privacy), MAX_VALUE)
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
            attrs[semconv.USER_AGENT_ORIGINAL] = clip(value.decode("latin-1"), MAX_VALUE)
        elif key == b"host" and semconv.SERVER_ADDRESS not in attrs:
            host = value.decode("latin-1").rsplit(":", 1)[0]
            attrs[semconv.SERVER_ADDRESS] = clip(host, MAX_VALUE)
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
