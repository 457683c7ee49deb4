"""Assembly: group a stream of spans into requests, in bounded memory.

Spans of one trace arrive close together but in no guaranteed order (exporters write spans
as they end, so children usually come before their parent). Assembly keeps the spans of each
*open* trace and flushes a trace -- builds and yields its requests -- when

- ``flush_after`` spans have been read since its first root span (no parent) arrived:
  exporters write a span when it ends and a root ends last, so the trace is complete then,
  with room left for spans that other processes export later; or
- ``max_open_traces`` spans have been read since its last span arrived (it went quiet), so
  at most that many traces are ever open; or
- the input ends.

Every rule counts positions in the input, never how many other traces are open, so what
becomes of a trace depends only on where its own spans are: this is what lets the parallel
reader (:mod:`tracekit.analysis.readers.parallel`) assemble byte ranges of a file apart and get the
very requests a single pass gets.

A request is each SERVER span, or, in a trace with no SERVER span, each top-most span (a
root, or a span whose parent is not in the input, like the OTLP specification's example).
Its stages are its descendants down to, not into, the next SERVER span (a downstream service's
SERVER span is a request of its own), except a model server's own span (vLLM's
``llm_request``), which joins the model call it answered. Spans of a trace that arrive within
``max_open_traces`` spans after it was flushed form a *late fragment*: only their SERVER spans
become requests, because a top-most span of a fragment is not a real request root. A model
server's span is never a request (a client probing the model server directly), not even a
top-most one.

Hostile input never hangs or crashes assembly: duplicate span ids keep the first span (and
are counted: spans exported twice are a set-up problem the report names), a
span that is its own parent is a root, cycles in parent links are cut by a visited set in
iterative walks, negative durations are clamped to zero, and malformed ``tracekit.*`` values
are ignored (the component becomes ``None``). Record building lives in
:mod:`tracekit.analysis.assembly.request_records`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from tracekit.analysis.assembly.request_records import (
    DECODED_KEYS,
    compact,
    decode_pairs,
    loop_trace,
    model_server_trace,
    request_record,
    requests_of_trace,
    route_of,
    stage_record,
)
from tracekit.analysis.model import RequestRecord, Span
from tracekit.errors import ConfigurationError

__all__ = [
    "DECODED_KEYS",
    "Group",
    "LeftOut",
    "Window",
    "assemble",
    "compact",
    "decode_pairs",
    "request_record",
    "requests_of_trace",
    "route_of",
    "stage_record",
]

Builder = Callable[..., list[RequestRecord]]


def assemble(
    spans: Iterable[Span], *, max_open_traces: int = 10_000, flush_after: int = 10_000
) -> Iterator[RequestRecord]:
    """Group spans into requests, yielding each request when its trace is flushed.

    Args:
        spans: spans in any order (a reader's output).
        max_open_traces: a trace that has had no span for this many spans is flushed, so at
            most this many traces are open at once; memory is bounded by this times the
            spans per trace. A trace whose spans are further apart is split (its late spans
            form a fragment).
        flush_after: a trace whose root span (no parent) has arrived is flushed once this
            many more spans have been read. Keeps the window small on long inputs.

    Returns:
        An iterator of :class:`RequestRecord`, in flush order (roughly the input's order),
        each with its stages sorted by start time.

    Raises:
        ConfigurationError: ``max_open_traces`` or ``flush_after`` is less than 1.

    Cost: O(1) per span plus building the requests (:mod:`tracekit.analysis.assembly.request_records`).
    """
    window = Window(max_open_traces, flush_after)
    return _stream(window, spans)


def _stream(window: Window, spans: Iterable[Span]) -> Iterator[RequestRecord]:
    yield from window.run(enumerate(spans, start=1))
    yield from window.finish()


class LeftOut(NamedTuple):
    """What assembly read and counted as no request, for the report's warnings."""

    #: Stage spans (and their traces) whose request span was not in the input.
    orphan_spans: int = 0
    orphan_traces: int = 0
    #: The model server's spans that had no model call in the input to join.
    model_server_spans: int = 0
    #: Spans whose trace already had a span of their id (the first was kept).
    duplicate_spans: int = 0

    def __add__(self, other: object) -> LeftOut:
        if not isinstance(other, LeftOut):
            return NotImplemented
        return LeftOut(*(a + b for a, b in zip(self, other, strict=True)))


@dataclass(eq=False, slots=True)
class Group:
    """The spans of one trace read since it was last flushed (or first seen)."""

    trace_id: str
    late: bool
    spans: list[Span] = field(default_factory=list)
    last: int = 0  # position of its latest span
    deadline: int | None = None  # flush position set by its first root span
    done: bool = False


class Window:
    """The state of assembly: open traces, pending root deadlines, recently flushed traces.

    Positions are 1-based span counts of the input; :meth:`run` takes ``(position, span)``
    pairs so that a caller can leave out spans handled elsewhere (``None`` in their place,
    or a gap), and a state can be handed on to a later byte range (:meth:`state`,
    :meth:`adopt`).

    Args:
        max_open_traces: see :func:`assemble`.
        flush_after: see :func:`assemble`.
        build: makes the requests of a flushed trace (``build(spans, late=...)``).
    """

    def __init__(
        self, max_open_traces: int, flush_after: int, build: Builder = requests_of_trace
    ) -> None:
        if max_open_traces < 1:
            raise ConfigurationError(f"max_open_traces must be >= 1, not {max_open_traces}")
        if flush_after < 1:
            raise ConfigurationError(f"flush_after must be >= 1, not {flush_after}")
        self.idle = max_open_traces
        self.flush_after = flush_after
        self.late_after = max_open_traces
        self.build = build
        self.open: dict[str, Group] = {}
        self.rooted: deque[tuple[int, Group]] = deque()
        self.flushed: dict[str, int] = {}  # trace id -> position it was flushed at
        self._expiry: deque[tuple[int, str]] = deque()
        # Traces that made no request (stages whose request span is missing) and their spans.
        self.orphan_traces = 0
        self.orphan_spans = 0
        # Model server spans in traces of nothing else (no model call to join: not requests).
        self.model_server_spans = 0
        # Spans that repeated a span id of their trace (a trace exported twice).
        self.duplicate_spans = 0
        self._sweep_every = max(1, max_open_traces // 4)
        self._sweep_at = self._sweep_every

    @property
    def left_out(self) -> LeftOut:
        """What the traces flushed so far held that is no request."""
        return LeftOut(self.orphan_spans, self.orphan_traces, self.model_server_spans,
                       self.duplicate_spans)  # fmt: skip

    @property
    def reach(self) -> int:
        """How many positions after a point the state before it can still matter."""
        return max(self.idle, self.flush_after) + self.late_after + 1

    def run(self, positioned: Iterable[tuple[int, Span | None]]) -> Iterator[RequestRecord]:
        """Add spans at increasing positions, yielding the requests of traces flushed meanwhile.

        Cost: O(1) per span (two dict lookups, an append), plus a sweep over the open
        traces every ``max_open_traces / 4`` positions.
        """
        open_get = self.open.get
        rooted = self.rooted
        idle = self.idle
        for n, span in positioned:
            if span is None:
                continue
            while rooted and rooted[0][0] < n:
                deadline, due = rooted.popleft()
                if not due.done:
                    yield from self._flush(due, deadline)
            trace_id = span.trace_id
            group = open_get(trace_id)
            if group is None or group.last + idle < n:
                if group is not None:  # went quiet before this span: flushed back then
                    yield from self._flush(group, group.last + idle)
                group = self._open(trace_id, n)
            group.spans.append(span)
            group.last = n
            if span.parent_id is None and group.deadline is None:
                group.deadline = n + self.flush_after
                rooted.append((group.deadline, group))
            if n >= self._sweep_at:
                self._sweep_at = n + self._sweep_every
                yield from self.sweep(n)

    def _open(self, trace_id: str, n: int) -> Group:
        flushed_at = self.flushed.get(trace_id)
        late = flushed_at is not None and n - flushed_at <= self.late_after
        group = self.open[trace_id] = Group(trace_id, late)
        return group

    def sweep(self, n: int) -> Iterator[RequestRecord]:
        """Flush every trace due before position ``n``; forget flushed traces out of reach."""
        while self.rooted and self.rooted[0][0] < n:
            deadline, due = self.rooted.popleft()
            if not due.done:
                yield from self._flush(due, deadline)
        idle = self.idle
        for group in [g for g in self.open.values() if g.last + idle < n]:
            yield from self._flush(group, group.last + idle)
        expiry = self._expiry
        while expiry and expiry[0][0] < n - self.late_after:
            at, trace_id = expiry.popleft()
            if self.flushed.get(trace_id) == at:
                del self.flushed[trace_id]

    def finish(self) -> Iterator[RequestRecord]:
        """The input ended: flush every open trace."""
        for group in list(self.open.values()):
            yield from self._flush(group, group.last)
        self.rooted.clear()

    def _flush(self, group: Group, at: int) -> Iterator[RequestRecord]:
        group.done = True
        trace_id = group.trace_id
        if self.open.get(trace_id) is group:
            del self.open[trace_id]
        self.flushed[trace_id] = at
        self._expiry.append((at, trace_id))
        self.duplicate_spans += len(group.spans) - len({span.span_id for span in group.spans})
        requests = self.build(group.spans, late=group.late)
        if not requests and not group.late and group.spans and not loop_trace(group.spans):
            if model_server_trace(group.spans):
                self.model_server_spans += len(group.spans)
            else:
                self.orphan_traces += 1
                self.orphan_spans += len(group.spans)
        return iter(requests)

    def state(self, shift: int) -> tuple[list[Group], dict[str, int]]:
        """The open traces and the remembered flushes, positions moved by ``-shift``.

        For handing the state on to the reader of the next byte range (``shift``: the spans
        of this range). Groups keep their spans; call :meth:`sweep` first to drop the due.
        """
        groups = list(self.open.values())
        for group in groups:
            group.last -= shift
            if group.deadline is not None:
                group.deadline -= shift
        return groups, {t: at - shift for t, at in self.flushed.items()}

    def adopt(self, groups: list[Group], flushed: dict[str, int]) -> None:
        """Take over a state from :meth:`state` (before any span of this window was added).

        Raises:
            ValueError: this window already holds traces.
        """
        if self.open or self.flushed:
            raise ValueError("adopt() needs an empty window")
        for trace_id, at in sorted(flushed.items(), key=lambda item: item[1]):
            self.flushed[trace_id] = at
            self._expiry.append((at, trace_id))
        deadlines = []
        for group in groups:
            self.open[group.trace_id] = group
            if group.deadline is not None:
                deadlines.append((group.deadline, group))
        deadlines.sort(key=lambda item: item[0])
        self.rooted.extend(deadlines)
