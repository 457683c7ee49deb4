"""Who held the event loop when, and each stage's use of it: one pass over the sample.

:class:`LoopIndex` answers "while this stage held the event loop, how long did *other*
requests wait for it?": every recorded loop wait (``tracekit.loop_waits_us`` of requests and
stages) is intersected with every recorded loop slice of another request (own slices: a
stage's slices minus its descendants'), per service. That is the measured blame of a
stage; rules report it per request and per second of trace. The same pass keeps each
request's :class:`Usage` of the loop per stage, which the CPU and blocking rules judge: the
stage tree and the own slices of a request are computed once for both.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, StageRecord, own_cpu_split, stage_cpu_split
from tracekit.analysis.rules.findings import RuleContext
from tracekit.analysis.stats.intervals import Interval, StageTree

_MS = 1e6
#: Stage key for the request's own code (outside any stage).
OWN = None


@dataclass(slots=True)
class Usage:
    """One stage's use of the event loop in one request (summed over its spans of that name).

    Attributes:
        cpu_ms: on-loop CPU.
        held_ms: time it held the loop (its own recorded slices; at least its CPU).
        max_block_ms: its longest uninterrupted slice.
        max_slice_ms: its longest own recorded slice.
        blocked_at: where the watchdog caught it blocking, if it did.
        stage: its first span (for the function name).
        gc_ms: garbage-collection pauses inside its steps (``tracekit.gc_ms``): they hold
            the loop but are neither its CPU nor a blocking call of its own.
    """

    cpu_ms: float = 0.0
    held_ms: float = 0.0
    max_block_ms: float = 0.0
    max_slice_ms: float = 0.0
    blocked_at: str | None = None
    stage: StageRecord | None = None
    gc_ms: float = 0.0

    @property
    def off_cpu_ms(self) -> float:
        """Time it held the loop without running on the CPU, GC pauses left out (the
        collector's, not the stage's: ``gc-pauses`` reports them)."""
        return max(0.0, self.held_ms - self.cpu_ms - self.gc_ms)

    @property
    def slice_ms(self) -> float:
        """Its longest slice without the GC pauses inside its steps (a lower bound when
        they fell in other steps): the slice the stage's own code held the loop."""
        return max(0.0, (self.max_block_ms or self.cpu_ms) - self.gc_ms)


def loop_usage(req: RequestRecord, tree: StageTree | None = None) -> dict[str | None, Usage]:
    """Per stage name (``None``: the request's own code), its use of the loop in ``req``.

    Only stages on the loop (``on_loop`` true or unknown) with known CPU count.
    """
    tree = tree or StageTree(req)
    own = tree.own_slices(None, req) if req.cpu_ms is not None else []
    pieces = [
        tree.own_slices(s, req) if s.cpu_ms is not None and s.on_loop is not False else []
        for s in req.stages
    ]
    return _usage(req, own, pieces)


def _usage(
    req: RequestRecord, own: list[Interval], pieces: list[list[Interval]]
) -> dict[str | None, Usage]:
    """:func:`loop_usage` from the request's own slices and each stage's (``pieces``)."""
    out: dict[str | None, Usage] = {}
    stage_cpu = stage_off = stage_gc = 0.0
    for stage, stage_pieces in zip(req.stages, pieces, strict=True):
        cpu = stage.cpu_ms
        if cpu is None:
            continue
        stage_cpu += cpu
        on, off = stage_cpu_split(stage)
        stage_off += off
        gc = gc_ms(stage.attributes)
        stage_gc += gc
        if stage.on_loop is False:
            continue
        usage = out.get(stage.name)
        if usage is None:
            usage = out[stage.name] = Usage(stage=stage)
        _add(usage, on, stage_pieces, stage.max_block_ms, stage.blocked_at)
        usage.gc_ms += gc
    if req.cpu_ms is not None:
        usage = out.get(OWN)
        if usage is None:
            usage = out[OWN] = Usage()
        # With what it ran after its response: that held the loop all the same.
        _add(usage, own_cpu_split(req, stage_cpu, stage_off, after=True)[0], own, None, req.blocked_at)
        usage.gc_ms += max(0.0, gc_ms(req.attributes) - stage_gc)
    return out


def gc_ms(attributes: dict[str, Any]) -> float:
    """``tracekit.gc_ms`` of a span's (kept) attributes: 0 when absent or malformed."""
    value = attributes.get(semconv.GC_MS)
    if (type(value) is float or type(value) is int) and 0 <= value < float("inf"):
        return float(value)
    return 0.0


def _add(
    usage: Usage,
    cpu_ms: float,
    pieces: list[Interval],
    max_block_ms: float | None,
    blocked_at: str | None,
) -> None:
    held_ns = longest_ns = 0
    for a, b in pieces:
        held_ns += b - a
        if b - a > longest_ns:
            longest_ns = b - a
    held = held_ns / _MS
    longest = longest_ns / _MS
    usage.cpu_ms += cpu_ms
    usage.held_ms += max(held, cpu_ms)
    usage.max_slice_ms = max(usage.max_slice_ms, longest)
    usage.max_block_ms = max(usage.max_block_ms, max_block_ms or 0.0, longest)
    usage.blocked_at = usage.blocked_at or blocked_at


@dataclass(slots=True)
class _Slice:
    start: int
    end: int
    index: int  # request index in the sample
    route: str
    stage: str | None


@dataclass
class LoopIndex:
    """Loop slices and loop waits of a sample, per service, and loop usage per route.

    Attributes:
        blame_ns: (service, route, stage) -> ns that other requests waited for the loop
            while that stage held it.
        victims_ns: (service, route, stage) -> {route of the waiting requests: ns}.
        window_s: service -> seconds from its first request's start to its last one's end.
        requests: service -> requests in the sample.
        usages: route -> stage (``None``: own code) -> one :class:`Usage` per instrumented
            request of the route that has it, in sample order.

    Cost: one pass over the sample (a stage tree per request), then O(waits x log slices
    + overlapping pieces) for the blame. Memory: the sample's own slices and usages.
    """

    blame_ns: dict[tuple[str, str, str | None], int] = field(default_factory=dict)
    victims_ns: dict[tuple[str, str, str | None], dict[str, int]] = field(default_factory=dict)
    window_s: dict[str, float] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    usages: dict[str, dict[str | None, list[Usage]]] = field(default_factory=dict)
    _slices: dict[str, list[_Slice]] = field(default_factory=dict)
    _ends: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, requests: Sequence[RequestRecord], ctx: RuleContext) -> LoopIndex:
        """The index of ``requests``, built once per sample and kept in ``ctx.cache``."""
        cached = ctx.cache.get("loop_index")
        if cached is not None and cached[0] is requests:
            index: LoopIndex = cached[1]
            return index
        index = cls._build(requests)
        ctx.cache["loop_index"] = (requests, index)
        return index

    @classmethod
    def _build(cls, requests: Sequence[RequestRecord]) -> LoopIndex:
        index = cls()
        waits: dict[str, list[tuple[int, int, int]]] = {}
        bounds: dict[str, tuple[int, int]] = {}
        for i, req in enumerate(requests):
            if req.instrumented:
                index._read(i, req, waits, bounds)
        for service, slices in index._slices.items():
            slices.sort(key=lambda s: s.start)
            index._ends[service] = _running_max([s.end for s in slices])
            lo, hi = bounds[service]
            index.window_s[service] = max(1e-9, (hi - lo) / 1e9)
            for a, b, who in waits.get(service, ()):
                victim = requests[who].route
                for piece, ns in index.overlapping(service, a, b, exclude=who):
                    key = (service, piece.route, piece.stage)
                    index.blame_ns[key] = index.blame_ns.get(key, 0) + ns
                    victims = index.victims_ns.setdefault(key, {})
                    victims[victim] = victims.get(victim, 0) + ns
        return index

    def _read(
        self,
        i: int,
        req: RequestRecord,
        waits: dict[str, list[tuple[int, int, int]]],
        bounds: dict[str, tuple[int, int]],
    ) -> None:
        """Add request ``i``'s own slices, waits and loop usage."""
        service, route = req.service, req.route
        self.requests[service] = self.requests.get(service, 0) + 1
        lo, hi = bounds.get(service, (req.start_ns, req.end_ns))
        bounds[service] = (min(lo, req.start_ns), max(hi, req.end_ns))
        tree = StageTree(req)
        slices = self._slices.setdefault(service, [])
        service_waits = waits.setdefault(service, [])
        own = tree.own_slices(None, req)
        for a, b in own:
            slices.append(_Slice(a, b, i, route, OWN))
        for a, b in req.loop_waits:
            service_waits.append((a, b, i))
        pieces = []
        for stage in req.stages:
            stage_pieces = tree.own_slices(stage, req)
            pieces.append(stage_pieces)
            for a, b in stage_pieces:
                slices.append(_Slice(a, b, i, route, stage.name))
            for a, b in stage.loop_waits:
                service_waits.append((a, b, i))
        per_stage = self.usages.setdefault(route, {})
        for name, usage in _usage(req, own, pieces).items():
            per_stage.setdefault(name, []).append(usage)

    def overlapping(
        self, service: str, start: int, end: int, exclude: int | None = None
    ) -> list[tuple[_Slice, int]]:
        """Slices of ``service`` overlapping [start, end] (not of request ``exclude``),
        each with the overlap in ns."""
        slices = self._slices.get(service, [])
        ends = self._ends.get(service, [])
        out: list[tuple[_Slice, int]] = []
        # First slice whose running-max end passes ``start``; slices are sorted by start.
        i = bisect_right(ends, start)
        while i < len(slices) and slices[i].start < end:
            piece = slices[i]
            ns = min(end, piece.end) - max(start, piece.start)
            if ns > 0 and piece.index != exclude:
                out.append((piece, ns))
            i += 1
        return out

    def blame_ms_per_request(self, service: str, route: str, stage: str | None) -> float:
        """Mean ms each request of ``service`` waited for the loop because of this stage."""
        total = self.blame_ns.get((service, route, stage), 0) / _MS
        return total / max(1, self.requests.get(service, 1))

    def main_victim(self, service: str, route: str, stage: str | None) -> str:
        """The route whose requests waited longest for the loop while this stage held it
        (``route`` itself when nobody waited)."""
        victims = self.victims_ns.get((service, route, stage))
        return max(victims, key=lambda r: victims[r]) if victims else route

    def blame_ms_per_second(self, service: str, route: str, stage: str | None) -> float:
        """Ms of loop waiting this stage caused per second of trace."""
        total = self.blame_ns.get((service, route, stage), 0) / _MS
        return total / self.window_s.get(service, 1.0)


def _running_max(values: list[int]) -> list[int]:
    out: list[int] = []
    best = -(2**63)
    for value in values:
        best = max(best, value)
        out.append(best)
    return out
