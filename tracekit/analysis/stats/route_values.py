"""Per-request values of each route, kept for ``tracekit compare``'s intervals.

Unlike the aggregator's statistics these grow with the requests: arrays of floats, about 90
bytes a request (latency, end time, TTFT and ITL when streamed, the seven breakdown components
when instrumented), and 8 more per distinct stage name of the route (at most
:data:`MAX_STAGES`); the collector 16 more (every request's start and end: the run's idle
stretches).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

from tracekit.analysis.model import RequestRecord
from tracekit.analysis.slo import request_itl_ms
from tracekit.analysis.stats.confidence import bin_rates
from tracekit.analysis.stats.intervals import Interval, idle_stretches
from tracekit.analysis.stats.route_stats import BREAKDOWN_KEYS, OTHER_ROUTES, breakdown

__all__ = ["MAX_ROUTES", "RouteCollector", "RouteValues"]

#: Distinct routes kept; later ones are pooled, as the analyzer pools them.
MAX_ROUTES = 500
#: Distinct stage names kept per route (for the change made's stage); later ones are not.
MAX_STAGES = 64


class RouteValues:
    """What the intervals need of each request of one route (per-request arrays).

    Attributes:
        wall: latency, ms. ends: end times, epoch ns (as floats: bins of a second or
            so do not need the last nanoseconds). first_ns / last_ns: the earliest start and
            latest end. ttft / itl: TTFT and ITL (each request's p95 gap, the report's
            ``streaming.itl_ms``) of streamed requests. parts: the breakdown of instrumented
            requests, one array per ``BREAKDOWN_KEYS`` item. errors: requests in error.
            stages: stage name -> each request's wall ms in stages of that name (0 for a
            request without one), for the change made's stage (``stage_ms``).
    """

    __slots__ = ("_order", "ends", "errors", "first_ns", "itl", "last_ns", "parts", "stages", "ttft",
                 "wall")  # fmt: skip

    def __init__(self) -> None:
        self.wall = array("d")
        self.ends = array("d")
        self.ttft = array("d")
        self.itl = array("d")
        self.parts = [array("d") for _ in BREAKDOWN_KEYS]
        self.stages: dict[str, array[float]] = {}
        self.errors = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self._order: list[int] = []  # indexes by end time (in_time), for the requests added

    def add(self, req: RequestRecord) -> None:
        """Keep one request's values. Cost: O(stages) for its breakdown and stage times."""
        self._add_stages(req)
        self.wall.append(req.wall_ms)
        self.ends.append(float(req.end_ns))
        if self.first_ns is None or req.start_ns < self.first_ns:
            self.first_ns = req.start_ns
        if self.last_ns is None or req.end_ns > self.last_ns:
            self.last_ns = req.end_ns
        self.errors += req.error
        if req.chunks is not None and req.chunks > 1:  # streamed, as the report counts them
            if req.ttft_ms is not None:
                self.ttft.append(req.ttft_ms)
            itl = request_itl_ms(req)
            if itl is not None:
                self.itl.append(itl)
        parts = breakdown(req)
        if parts is not None:
            for values, value in zip(self.parts, parts, strict=True):
                values.append(value)

    def _add_stages(self, req: RequestRecord) -> None:
        own: dict[str, float] = {}
        for st in req.stages:
            own[st.name] = own.get(st.name, 0.0) + st.wall_ms
        for name in own:
            if name not in self.stages and len(self.stages) < MAX_STAGES:
                self.stages[name] = array("d", bytes(8 * len(self.wall)))  # 0 for earlier requests
        for name, values in self.stages.items():
            values.append(own.get(name, 0.0))

    def in_time(self, values: array[float]) -> list[float]:
        """``values`` (one per request: ``wall``, a breakdown component, a stage's) in the
        order the requests ended, for the intervals' dependence; arrays of some requests only
        (TTFT, ITL; a breakdown of partly instrumented requests) as they came, the order the
        requests were assembled in (their traces' spans as read)."""
        ends = self.ends
        if len(values) != len(ends):
            return list(values)
        if len(self._order) != len(ends):  # sorted once for all the arrays of these requests
            self._order = sorted(range(len(ends)), key=ends.__getitem__)
        return [values[i] for i in self._order]

    def rates(self, idle: Sequence[Interval] = ()) -> list[float]:
        """Completions per second in bins of the active window (:func:`bin_rates`), the
        ``idle`` stretches (no request in flight, :func:`idle_stretches`) left out of it."""
        if self.first_ns is None or self.last_ns is None:
            return []
        inside = [(a, b) for a, b in idle if self.first_ns <= a and b <= self.last_ns]
        if not inside:
            return bin_rates([int(e) for e in self.ends], self.first_ns, self.last_ns)
        # The window without them: each time moved back by the idle time before it.
        cut = [0]
        for a, b in inside:
            cut.append(cut[-1] + (b - a))
        starts = [a for a, _ in inside]

        def active(t: int) -> int:
            return t - cut[bisect_right(starts, t)]

        return bin_rates([active(int(e)) for e in self.ends], self.first_ns, active(self.last_ns))


class RouteCollector:
    """The analyzer's ``observe`` hook: each request's values, by route (at most
    :data:`MAX_ROUTES` routes; later ones pooled as ``(other routes)``)."""

    def __init__(self) -> None:
        self.routes: dict[str, RouteValues] = {}
        # Every request's start and end (16 bytes a request): the run's idle stretches.
        self.starts = array("q")
        self.ends = array("q")

    def idle(self) -> list[Interval]:
        """The run's idle stretches (:func:`idle_stretches`), no request of any route in flight."""
        return idle_stretches(list(zip(self.starts, self.ends, strict=True)))

    def add(self, req: RequestRecord) -> None:
        """Keep one request's values under its route."""
        self.starts.append(req.start_ns)
        self.ends.append(req.end_ns)
        values = self.routes.get(req.route)
        if values is None:
            name = req.route if len(self.routes) < MAX_ROUTES else OTHER_ROUTES
            values = self.routes.setdefault(name, RouteValues())
        values.add(req)
