"""Aggregation: per-route and per-stage statistics of a stream of requests, in bounded memory.

:class:`Aggregator` takes requests one at a time (``add``) and keeps, per route and per
(route, stage name), counters and :class:`~tracekit.analysis.stats.quantiles.Quantiles` (exact up to
2,048 values, then a 1%-relative-error log histogram). Memory is bounded by routes x stages:
at most ``max_routes`` routes (later new routes are pooled as ``(other routes)``) and
``max_stages`` stage names per route (later ones pooled as ``(other stages)``), so a
high-cardinality span name cannot grow it without bound.

Besides the statistics it keeps a **sample** of whole requests for the rules and the replay:
the ``sample_size`` earliest requests by start time (a contiguous window of real concurrency,
which the replay needs; a random sample would thin out the overlap), plus the slowest
request for the report's waterfall. Kept requests are :func:`~tracekit.analysis.assembly.grouping.compact`-ed
in place: attributes already decoded into record fields are dropped from their maps.

Breakdown of a request (DESIGN §4), in ms, for instrumented requests only:

- ``cpu_on_loop``: CPU of stages that ran on the event-loop thread (``on_loop`` true or
  unknown), plus the request's own code: request CPU minus all stages' CPU (the request span's
  ``tracekit.cpu_ms`` is request-wide), which runs on the loop.
- ``cpu_off_loop``: CPU of stages with ``on_loop`` false (worker threads).
- ``model_wait``: ``tracekit.model_wait_ms`` of the request, else the wait of its model stages.
- ``io_wait``: ``tracekit.io_wait_ms``, else the wait of its other stages.
- ``loop_wait``: ``tracekit.loop_wait_ms``, else the sum of its stages' loop waits.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from tracekit.analysis.assembly.request_records import compact, reshare
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.readers.packing import pack, unpack
from tracekit.analysis.slo import SLO
from tracekit.analysis.stats.loop_windows import LoopWindows
from tracekit.analysis.stats.route_stats import (
    BREAKDOWN_KEYS,
    OTHER_ROUTES,
    OTHER_STAGES,
    RouteStats,
    StageStats,
    breakdown,
)

__all__ = [
    "BREAKDOWN_KEYS",
    "OTHER_ROUTES",
    "OTHER_STAGES",
    "Aggregator",
    "RouteStats",
    "StageStats",
    "breakdown",
    "sample_key",
]


class Aggregator:
    """Streaming aggregation of requests into route and stage statistics plus a sample.

    Args:
        slo: targets for goodput, or ``None``.
        sample_size: how many of the earliest requests to keep whole for rules and replay.
        max_routes: distinct routes tracked before new ones are pooled as ``(other routes)``.
        max_stages: distinct stage names per route before new ones are pooled.
        pack_sample: keep the sample as packed bytes (a quarter of the memory; for the
            parallel reader's workers, which send it on), unpacked by :meth:`sample`.

    The result does not depend on the order requests are added in (ties are broken by ids),
    and aggregators fed apart :meth:`merge` into what one fed everything holds -- except which
    names get pooled once ``max_routes`` or ``max_stages`` is reached, which follows the order.

    Cost: O(stages) per request plus O(log sample_size) for the sample.
    """

    def __init__(
        self,
        *,
        slo: SLO | None = None,
        sample_size: int = 20_000,
        max_routes: int = 500,
        max_stages: int = 64,
        pack_sample: bool = False,
    ) -> None:
        self.slo = slo
        self.pack_sample = pack_sample
        self.sample_size = sample_size
        self.max_routes = max_routes
        self.max_stages = max_stages
        self.requests = 0
        self.instrumented = False
        self.slowest: RequestRecord | None = None
        self._slowest_ns = -1  # its wall time in ns, clamped to >= 0 like wall_ms
        self._routes: dict[str, RouteStats] = {}
        # A heap whose top is the latest kept request (see _entry), so that the earliest
        # requests are kept whatever the order they come in.
        self._sample: list[_Entry] = []
        #: The event loops' windows (``tracekit.loop`` spans), fed by the pipeline.
        self.loops = LoopWindows()

    def add(self, req: RequestRecord, *, counted: bool = True) -> None:
        """Record one request.

        Args:
            req: the request (kept ones are compacted in place).
            counted: ``False`` puts the request in the sample only, not in the statistics:
                for requests of other routes when analysing one route, which the replay
                still needs because every route shares the event loop.
        """
        if counted:
            self.requests += 1
            if req.instrumented:
                self.instrumented = True
            (self._routes.get(req.route) or self._route(req.route)).add(req, self.slo)
            wall = req.end_ns - req.start_ns  # wall_ms in ns, as an integer: compared only
            if wall >= self._slowest_ns:
                self._slower(req, wall)
        sample = self._sample
        if len(sample) < self.sample_size:
            heapq.heappush(sample, self._entry(req))
        elif sample and req.start_ns <= -sample[0][0]:
            key = sample_key(req)
            if key > sample[0][:3]:  # earlier than the latest kept one
                heapq.heapreplace(sample, self._entry(req))

    def _entry(self, req: RequestRecord, *, compacted: bool = False) -> _Entry:
        payload: RequestRecord | bytes = req if compacted else compact(req)
        if self.pack_sample:
            payload = pack(payload)
        return (*sample_key(req), id(payload), payload)

    def _slower(self, req: RequestRecord, wall: int) -> None:
        wall = max(wall, 0)
        slowest = self.slowest
        if (
            slowest is None
            or wall > self._slowest_ns
            or _order(req) < _order(slowest)  # a tie: the earliest (then smallest ids)
        ):
            self.slowest = compact(req)  # kept whole, like the sample (decoded attributes dropped)
            self._slowest_ns = wall

    def _route(self, route: str) -> RouteStats:
        stats = self._routes.get(route)
        if stats is None:
            name = route if len(self._routes) < self.max_routes else OTHER_ROUTES
            stats = self._routes.get(name)
            if stats is None:
                stats = self._routes[name] = RouteStats(name, self.max_stages)
        return stats

    def merge(self, other: Aggregator, *, sample: bool = True) -> None:
        """Add everything ``other`` recorded (an aggregator with the same settings).

        Args:
            other: left unchanged but for its buffered values being folded.
            sample: also merge its sample (else only its statistics and slowest request).
        """
        self.requests += other.requests
        self.instrumented = self.instrumented or other.instrumented
        theirs = other.slowest
        if theirs is not None and other._slowest_ns >= self._slowest_ns:
            self._slower(theirs, other._slowest_ns)
        for name, stats in other._routes.items():
            if name not in self._routes and len(self._routes) >= self.max_routes:
                name = OTHER_ROUTES
            mine = self._routes.get(name)
            if mine is None:
                mine = self._routes[name] = RouteStats(name, self.max_stages)
            mine.merge(stats)
        self.loops.merge(other.loops)
        if sample:
            self.adopt_sample([entry[4] for entry in other._sample])

    def adopt_sample(self, requests: Sequence[RequestRecord | bytes]) -> None:
        """Offer already compacted (or packed) requests to the sample, not to the statistics."""
        for req in requests:
            if type(req) is bytes:
                req = reshare(unpack(req, RequestRecord))  # compacted, as it was packed
            entry = self._entry(req, compacted=True)  # type: ignore[arg-type]
            if len(self._sample) < self.sample_size:
                heapq.heappush(self._sample, entry)
            elif self._sample and entry[:3] > self._sample[0][:3]:
                heapq.heapreplace(self._sample, entry)

    def take_sample(self) -> list[tuple[SampleKey, RequestRecord | bytes]]:
        """Remove and return the kept requests (packed ones as bytes) with their keys.

        A request whose key is below the smallest key of a full sample can never enter it.
        """
        taken = [(e[:3], e[4]) for e in self._sample]
        self._sample = []
        return taken

    @property
    def route_stats(self) -> list[RouteStats]:
        """Routes, busiest first (then by name)."""
        return sorted(self._routes.values(), key=lambda r: (-r.requests, r.route))

    def routes(self) -> list[dict[str, Any]]:
        """The report's ``routes`` list."""
        return [r.to_dict(self.slo) for r in self.route_stats]

    def sample(self) -> list[RequestRecord]:
        """The kept requests, sorted by start time (then trace id, then span id)."""
        entries = sorted(self._sample, key=_key, reverse=True)
        return [_record(e[4]) for e in entries]


#: (-start_ns, trace id, span id) with the ids' bytes complemented: larger means earlier.
SampleKey = tuple[int, bytes, bytes]
# A sample entry: the key, then id() of the payload (separates exact duplicates, so that
# records are never compared), then the record or its packed bytes.
_Entry = tuple[int, bytes, bytes, int, "RequestRecord | bytes"]
# Complementing every byte (and ending with 0xff) reverses the order of UTF-8 texts.
_REVERSE = bytes(range(255, -1, -1))


def _key(entry: _Entry) -> SampleKey:
    return entry[:3]


def _record(payload: RequestRecord | bytes) -> RequestRecord:
    if type(payload) is bytes:
        return reshare(unpack(payload, RequestRecord))
    return payload  # type: ignore[return-value]


def sample_key(req: RequestRecord) -> SampleKey:
    """The key the sample orders requests by: the larger, the earlier (start, then ids)."""
    return (
        -req.start_ns,
        req.trace_id.encode().translate(_REVERSE) + b"\xff",
        req.span_id.encode().translate(_REVERSE) + b"\xff",
    )


def _order(req: RequestRecord) -> tuple[int, str, str]:
    return (req.start_ns, req.trace_id, req.span_id)
