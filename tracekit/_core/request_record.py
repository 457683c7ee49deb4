"""The compact per-request record kept on the hot path instead of live SDK spans.

A request is recorded as plain integers and ledgers while it runs; its spans are built
later, off the request path, by :mod:`tracekit._export.readable_spans`, instead of paying an SDK span
lifecycle per stage while the request runs (costs measured in docs/performance.md).
"""

from __future__ import annotations

import random
from typing import Any, Final

from opentelemetry import trace as otel_trace

from tracekit._core import current
from tracekit._core.ledger import Ledger

# Span ids need uniqueness, not secrecy: the OpenTelemetry SDK's default generator uses this too.
_bits: Final = random.getrandbits
#: ``Request.pending`` once the record is handed on for span building: far below zero, so the
#: closes of ledgers still open then never bring it back to zero.
HANDED_ON: Final = -(1 << 40)


def new_trace_id() -> int:
    """A random non-zero 128-bit trace id."""
    while True:
        value = _bits(128)
        if value:
            return value


def new_span_id() -> int:
    """A random non-zero 64-bit span id."""
    while True:
        value = _bits(64)
        if value:
            return value


class Request:
    """Everything tracekit keeps about one request (or one stage tree outside any request).

    Rarely used fields (streaming, errors, enrichment) default to class attributes; fields
    written for every request are slots (an instance ``__dict__`` is one more object for the
    garbage collector to track, per request).
    """

    __slots__ = (
        "__dict__", "end", "inflight", "ledgers", "parent_span_id", "pending", "remote_parent",
        "root", "root_path", "runtime", "scope", "server", "span_id", "start", "status",
        "trace_id", "trace_state", "ttfb",
    )  # fmt: skip

    chunk_first = 0
    chunk_last = 0
    chunks = 0
    gaps: list[int] | None = None  # inter-chunk gaps (a bounded sample: middleware.MAX_GAPS)
    gap_max = 0
    error: BaseException | None = None
    cancelled = False
    cutoff = 0  # handed on with ledgers still open (Runtime.linger): when; they end there
    # CPU (ns) its own code and the tasks it spawned ran after its response was complete
    # (``end``): background tasks, spend logging, clean-up. Not in the span's figures: the
    # span ended (tracekit._core.ledger.answered).
    after_cpu = 0
    after_cpu_off = 0  # the part of it off the loop thread (a sync background task's, in a pool)
    start_wait = 0  # ns from the server making its task to its first step (spawned.CREATED)
    enrich: Any = None  # an already-active server span we add attributes to
    view: Any = None  # the loop view counting it in flight (tracekit._core.loop_view)

    def __init__(self, runtime: Any, trace_id: int, parent_span_id: int | None,
                 remote_parent: bool, trace_state: Any, server: bool) -> None:  # fmt: skip
        self.runtime = runtime
        self.trace_id = trace_id
        self.span_id = new_span_id()
        self.parent_span_id = parent_span_id
        self.remote_parent = remote_parent
        self.trace_state = trace_state
        self.server = server  # emit a SERVER span (False: standalone stages, or enriching)
        self.root: Ledger | None = None
        self.ledgers: list[Ledger] = []
        self.scope: dict[str, Any] | None = None  # the ASGI scope (a dict, as servers make it)
        self.root_path = ""  # the scope's root_path when the request arrived (before mounts)
        self.start = self.end = self.status = self.ttfb = self.inflight = 0
        # Ledgers open (its root included): the record is handed on when the last one closes,
        # so work the request spawned that outlives it is in its trace (issue 11); HANDED_ON after.
        self.pending = 0

    def release(self) -> None:
        """Drop what the finished record references once its spans are built (or it is
        dropped). Its ledgers point back at it: without this, every request would be a
        reference cycle left to the cyclic garbage collector."""
        self.ledgers.clear()
        self.root = None
        self.scope = None
        if self.error is not None:
            self.error = None  # its traceback's frames reference the request too


def late_request(request: Request, parent_span_id: int) -> Request:
    """A record for a stage opened under ``request`` after it was handed on (work the request
    spawned, starting late): a tree of its own in the same trace, under ``parent_span_id``."""
    return Request(request.runtime, request.trace_id, parent_span_id, False, request.trace_state,
                   server=False)  # fmt: skip


def standalone_request() -> Request | None:
    """A request record for a stage opened outside any request, or None if not recording.

    Its parent is the application's current OpenTelemetry span, if any.
    """
    runtime = current.active_runtime
    if runtime is None or not runtime.enabled:
        return None
    current_context = otel_trace.get_current_span().get_span_context()
    parent = current_context if current_context.is_valid else None
    trace_id = parent.trace_id if parent else new_trace_id()
    if not runtime.sample(trace_id, parent, "stage"):
        return None
    request = Request(runtime, trace_id, parent.span_id if parent else None,
                      bool(parent and parent.is_remote), parent.trace_state if parent else None,
                      server=False)  # fmt: skip
    return request
