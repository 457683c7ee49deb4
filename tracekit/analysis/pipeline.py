"""The pipeline of ``tracekit analyze``: spans to requests to statistics, in bounded memory.

One :class:`Pipeline` runs in the single pass (:func:`tracekit.analysis.api.analyze_spans`)
and in each worker of the parallel reader (:mod:`tracekit.analysis.readers.parallel`, one per byte
range of a file). It takes spans in batches, counts them and their services, assembles them
into requests (:class:`~tracekit.analysis.assembly.grouping.Window`) and adds each request to the
:class:`~tracekit.analysis.stats.aggregate.Aggregator`; when one route is asked for, the requests
of the other routes go to the sample only (the replay needs them all: every route shares the
event loop). A trace that makes no request goes to the aggregator's loop view
(:class:`~tracekit.analysis.stats.loop_windows.LoopWindows`), which keeps the ``tracekit.loop``
windows among it; it travels with the aggregator, so the parallel reader merges it too.

Batches rather than spans one by one: reading and assembling in runs of a few thousand spans
each is faster than alternating span by span (their working sets stop evicting each other
from the CPU caches).

A byte range after the first may start in the middle of traces of the previous range.
Assembly decides from positions only, and the state before a point matters for at most
``Window.reach`` spans after it; so the pipeline of such a range (``continues=True``) sets
aside the spans of every trace it first sees within that reach of its start (and all their
later spans), packed, and assembles them once the previous range's end state arrives
(:meth:`Pipeline.continue_from`), exactly as one pass would have. Its own end state goes to
the next range (:meth:`Pipeline.end_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tracekit.analysis.assembly.grouping import Group, LeftOut, Window
from tracekit.analysis.assembly.request_records import requests_of_trace, route_matches
from tracekit.analysis.model import RequestRecord, Span
from tracekit.analysis.readers.packing import pack, unpack
from tracekit.analysis.slo import SLO
from tracekit.analysis.stats.aggregate import Aggregator

__all__ = ["BATCH_SPANS", "Pipeline", "Settings", "State"]

#: Spans read before they are assembled (see the module docstring).
BATCH_SPANS = 4096
#: The assembly state one range hands on to the next: open traces, remembered flushes.
State = tuple[list[Group], dict[str, int]]


@dataclass(frozen=True)
class Settings:
    """What a pipeline needs besides its spans.

    Attributes:
        slo: targets for goodput, or ``None``.
        route: the route analysed (full name or path), or ``None`` for all.
        max_open_traces, flush_after: assembly's window
            (:func:`~tracekit.analysis.assembly.grouping.assemble`).
        sample_size: requests kept whole for the rules and the replay.
        max_services: distinct service names listed (hostile input could have millions).
        routes_quoted: route names quoted when ``route`` matches nothing.
    """

    slo: SLO | None = None
    route: str | None = None
    max_open_traces: int = 10_000
    flush_after: int = 10_000
    sample_size: int = 20_000
    max_services: int = 1_000
    routes_quoted: int = 10


class Pipeline:
    """Spans to aggregated requests: :meth:`add` batches, then :meth:`finish`.

    Args:
        settings: the analysis settings.
        pack_sample: keep the request sample packed (a worker sends it on).
        continues: this is a byte range after the first, whose start may cut traces of the
            previous range (see the module docstring).
        observe: called with each request counted (of the analysed route), before the
            aggregator sees it (``tracekit compare`` keeps per-request values this way).

    Attributes:
        aggregator: the statistics and the sample.
        spans: spans added so far.
        services: the distinct service names seen (at most ``settings.max_services``).
        matched: the routes of the requests counted, in order of appearance.
        others: some routes of the other requests (``route`` given), for the message when
            nothing matched.

    Cost: per span, a count and assembly's O(1); per request, building its record and the
    aggregation.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        pack_sample: bool = False,
        continues: bool = False,
        observe: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.settings = settings
        self.observe = observe
        self.aggregator = Aggregator(
            slo=settings.slo, sample_size=settings.sample_size, pack_sample=pack_sample
        )
        self.window = Window(settings.max_open_traces, settings.flush_after, self._build)
        self.spans = 0
        self.services: dict[str, None] = {}
        self.matched: dict[str, None] = {}
        self.others: dict[str, None] = {}
        # A range that continues another: the traces first seen within reach of its start,
        # their spans set aside (packed), and the window that assembles them later.
        self._reach = self.window.reach if continues else 0
        self._head: set[str] = set()
        self._set_aside: list[tuple[int, Span]] = []
        self._set_aside_packed: list[bytes] = []
        self._later = Window(settings.max_open_traces, settings.flush_after, self._build)

    def _build(self, spans: list[Span], *, late: bool = False) -> list[RequestRecord]:
        # Assembly's builder: a trace that makes no request may be event-loop windows,
        # which the aggregator's loop view counts (they travel with it to the parent).
        requests = requests_of_trace(spans, late=late)
        if not requests and not late:
            self.aggregator.loops.offer(spans)
        return requests

    def add(self, batch: list[Span]) -> None:
        """Count, assemble and aggregate a batch of spans (in input order)."""
        for req in self.window.run(self._positioned(batch)):
            self._add(req)
        if self._set_aside:
            # Set-aside spans wait packed (a third of the memory of the objects).
            self._set_aside_packed.append(pack(self._set_aside))
            self._set_aside = []

    def finish(self) -> None:
        """The input ends here: flush every open trace."""
        for window in (self.window, self._later):
            for req in window.finish():
                self._add(req)

    def continue_from(self, state: bytes) -> None:
        """Assemble the set-aside spans on the previous range's end state (packed
        :data:`State`; an empty one for the first range)."""
        self._later.adopt(*unpack(state, State))
        for packed in self._set_aside_packed:
            for req in self._later.run(unpack(packed, list[tuple[int, Span]])):
                self._add(req)
        self._set_aside_packed = []
        end = self.spans + 1
        for window in (self.window, self._later):
            for req in window.sweep(end):
                self._add(req)

    def end_state(self) -> State:
        """The open traces and remembered flushes, in the next range's positions."""
        groups, flushed = self.window.state(self.spans)
        more_groups, more_flushed = self._later.state(self.spans)
        for trace_id, at in more_flushed.items():
            flushed[trace_id] = max(at, flushed.get(trace_id, at))
        return groups + more_groups, flushed

    @property
    def left_out(self) -> LeftOut:
        """What the input held that is no request (:class:`LeftOut`)."""
        return self.window.left_out + self._later.left_out

    def _positioned(self, batch: list[Span]) -> Iterator[tuple[int, Span | None]]:
        n = self.spans
        services = self.services
        head = self._head
        reach = self._reach
        limit = self.settings.max_services
        last: str | None = None
        for span in batch:
            n += 1
            service = span.service
            if service is not last:  # the spans of a line share their service's string
                last = service
                if service and service not in services and len(services) < limit:
                    services[service] = None
            if reach:
                # A trace first seen within reach of the range's start may continue one of
                # the previous range: all its spans wait for that range's end state.
                trace_id = span.trace_id
                if n <= reach:
                    head.add(trace_id)
                if trace_id in head:
                    self._set_aside.append((n, span))
                    yield n, None
                    continue
            yield n, span
        self.spans = n

    def _add(self, req: RequestRecord) -> None:
        route = self.settings.route
        if route is None or route_matches(req.route, route):
            self.matched[req.route] = None
            if self.observe is not None:
                self.observe(req)  # before the aggregator compacts the records it keeps
            self.aggregator.add(req)
        else:
            if len(self.others) < self.settings.routes_quoted:
                self.others[req.route] = None
            self.aggregator.add(req, counted=False)
