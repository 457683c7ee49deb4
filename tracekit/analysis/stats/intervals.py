"""Interval arithmetic and stage-tree helpers shared by the rules and the replay.

Intervals are ``(start, end)`` pairs of integer nanoseconds.

A recorded loop slice is an *outermost* step: the request's (or a stage's) step covers the
steps of every stage it calls or awaits inside it (a sync stage's call, an awaited async
stage's resumptions, which the awaiting coroutine's step drives). Steps under 1 ms are not
recorded, so subtracting the children's recorded slices is not enough. While a child stage
is open its parent's own code does not run (it awaits the child), except around an
async-generator child (``tracekit.consumer_ms`` > 0), whose consumer runs between items. So
a node's *own* time on the loop (:meth:`StageTree.own_slices`) is its slices minus its
children's intervals, minus only the recorded slices of async-generator children and of
all deeper descendants.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import pairwise
from operator import attrgetter, itemgetter

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, StageRecord

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals (empty ones dropped)."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def subtract(intervals: Iterable[Interval], cover: Sequence[Interval]) -> list[Interval]:
    """``intervals`` minus the union ``cover`` (sorted and disjoint, as :func:`merge` gives).

    Returns:
        The remaining pieces, sorted.
    """
    starts = [c[0] for c in cover]
    out: list[Interval] = []
    for start, end in sorted(intervals):
        cursor = start
        i = max(0, bisect_right(starts, start) - 1)
        while i < len(cover) and cover[i][0] < end:
            c_start, c_end = cover[i]
            if c_end > cursor:
                if c_start > cursor:
                    out.append((cursor, min(c_start, end)))
                cursor = max(cursor, c_end)
            i += 1
        if cursor < end:
            out.append((cursor, end))
    return [p for p in out if p[1] > p[0]]


#: An idle stretch (no request in flight) at least this long, and ``IDLE_FACTOR`` times the
#: typical gap between requests' starts, is no part of a run's throughput window: a warm-up
#: request seconds before the load, a pause between two loads.
IDLE_GAP_NS = 1_000_000_000
IDLE_FACTOR = 10


def idle_stretches(intervals: Sequence[Interval]) -> list[Interval]:
    """The stretches of ``intervals``' span with none of them in progress, at least
    :data:`IDLE_GAP_NS` long and :data:`IDLE_FACTOR` times the median gap between consecutive
    starts (a slow steady load keeps its gaps), in time order. Cost: O(n log n)."""
    if len(intervals) < 2:
        return []
    starts = sorted(a for a, _ in intervals)
    gaps = sorted(b - a for a, b in pairwise(starts))
    least = max(IDLE_GAP_NS, IDLE_FACTOR * gaps[len(gaps) // 2])
    busy = merge(intervals)
    return [(a[1], b[0]) for a, b in pairwise(busy) if b[0] - a[1] >= least]


def overlap(start: int, end: int, cover: Sequence[Interval]) -> int:
    """Length of ``[start, end]`` covered by ``cover`` (sorted and disjoint).

    Cost: O(log len(cover) + intervals within [start, end]).
    """
    if end <= start or not cover:
        return 0
    i = max(0, bisect_right(cover, start, key=_FIRST) - 1)
    total = 0
    while i < len(cover) and cover[i][0] < end:
        lo, hi = max(start, cover[i][0]), min(end, cover[i][1])
        if hi > lo:
            total += hi - lo
        i += 1
    return total


def has_components(stage: StageRecord) -> bool:
    """Whether a stage record carries tracekit's cpu/wait components (else: a plain span)."""
    return stage.cpu_ms is not None or stage.wait_ms is not None or bool(stage.loop_slices)


class StageTree:
    """Parent/child structure of one request's stages, with plain containers made transparent.

    A *plain* span (no tracekit components: another instrumentation's) that covers
    instrumented stages of the same request is not a node here: frameworks record such spans
    beside tracekit's stages (FastAPI's ``fastapi.endpoint`` is a sibling of the stages it
    runs, covering them) or around them (a manual ``start_as_current_span`` whose children
    are stages). Its time belongs to the ledger it ran in (the request's or an enclosing
    stage's, whose slices and waits cover it), so its children move up to its parent and
    the stages it covers stay where they are. A plain span covers a stage when the stage is
    its descendant, or a sibling lying within its interval. A plain span that lies within a
    recorded loop slice of its ledger (FastAPI's ``fastapi.dependencies``, a sync HTTP call
    inside a sync stage) ran inside that step: it is not a node either, its time is the
    step's. Other plain spans (an awaited HTTP CLIENT call, a database query) stay nodes:
    recorded delays.

    Attributes:
        by_id: span id -> stage, every stage (transparent ones included).
        top: stages whose parent is the request span (or not among the stages), by start.
        children: span id -> its child stages, by start.
        transparent: span ids of the plain spans that are not nodes.

    Cost: one pass and C-level sort keys (built for every request by several rules and the
    replay); splicing, only for requests with both plain spans and instrumented stages, is
    O(stages x siblings).
    """

    __slots__ = ("_parent", "by_id", "children", "top", "transparent")

    def __init__(self, req: RequestRecord) -> None:
        self.by_id = by_id = {s.span_id: s for s in req.stages}
        self.children: dict[str, list[StageRecord]] = {}
        self.top: list[StageRecord] = []
        self.transparent: set[str] = set()
        self._parent: dict[str, StageRecord | None] | None = None
        plain: list[StageRecord] = []
        instrumented = under_plain = False
        for stage in req.stages:
            parent = stage.parent_id
            if has_components(stage):
                instrumented = True
                if parent is not None and parent in by_id and not under_plain:
                    under_plain = not has_components(by_id[parent])
            else:
                plain.append(stage)
            if parent is None or parent == stage.span_id or parent not in by_id:
                self.top.append(stage)
            else:
                self.children.setdefault(parent, []).append(stage)
        if len(self.top) > 1:
            self.top.sort(key=_START_KEY)
        for kids in self.children.values():
            kids.sort(key=_START_KEY)
        if plain and instrumented:
            self._splice(plain, under_plain, req.loop_slices)

    def _splice(
        self, plain: list[StageRecord], under_plain: bool, request_slices: list[Interval]
    ) -> None:
        """Find the transparent plain spans and lift their children to their parents."""
        by_id, transparent = self.by_id, self.transparent
        for p in plain:
            pid = p.parent_id
            kids = self.children.get(pid, ()) if pid is not None and pid in by_id else self.top
            for k in kids:  # beside instrumented siblings that it covers
                if k.start_ns > p.end_ns:
                    break
                if (k.start_ns >= p.start_ns and k.end_ns <= p.end_ns and k is not p
                        and has_components(k)):  # fmt: skip
                    transparent.add(p.span_id)
                    break
            if p.span_id not in transparent:  # inside a step of its ledger
                ledger = self._ledger(p)
                slices = request_slices if ledger is None else ledger.loop_slices
                if any(a <= p.start_ns and p.end_ns <= b for a, b in slices):
                    transparent.add(p.span_id)
        if under_plain:  # above an instrumented stage
            for stage in self.by_id.values():
                if not has_components(stage):
                    continue
                seen: set[str] = set()
                node = by_id.get(stage.parent_id or "")
                while node is not None and node.span_id not in seen:
                    seen.add(node.span_id)
                    if not has_components(node):
                        transparent.add(node.span_id)
                    node = by_id.get(node.parent_id or "")
        if not transparent:
            return
        parents: dict[str, StageRecord | None] = {}  # the lifted stages' new parents
        if any(k.span_id in transparent for k in self.top):
            self.top = self._lift(self.top, None, parents)
        for span_id, kids in list(self.children.items()):
            if span_id not in transparent and any(k.span_id in transparent for k in kids):
                self.children[span_id] = self._lift(kids, by_id[span_id], parents)
        for span_id in transparent:
            self.children.pop(span_id, None)
        self._parent = parents

    def _ledger(self, stage: StageRecord) -> StageRecord | None:
        """The nearest instrumented ancestor of ``stage`` (``None``: the request's)."""
        node = self.by_id.get(stage.parent_id or "")
        seen: set[str] = set()
        while node is not None and not has_components(node) and node.span_id not in seen:
            seen.add(node.span_id)
            node = self.by_id.get(node.parent_id or "")
        return node if node is not None and has_components(node) else None

    def _lift(
        self,
        kids: list[StageRecord],
        parent: StageRecord | None,
        parents: dict[str, StageRecord | None],
    ) -> list[StageRecord]:
        """``kids`` with each transparent span replaced by its own (lifted) children."""
        transparent, children = self.transparent, self.children
        if not any(k.span_id in children for k in kids if k.span_id in transparent):
            return [k for k in kids if k.span_id not in transparent]  # still sorted
        out: list[StageRecord] = []
        stack = list(reversed(kids))
        seen: set[str] = set()
        while stack:
            kid = stack.pop()
            if kid.span_id in seen:
                continue  # a cycle in hostile input
            seen.add(kid.span_id)
            if kid.span_id in transparent:
                stack.extend(reversed(children.get(kid.span_id, ())))
                continue
            out.append(kid)
            if kid.parent_id in transparent:
                parents[kid.span_id] = parent
        out.sort(key=_START_KEY)
        return out

    def kids(self, stage: StageRecord | None) -> list[StageRecord]:
        """Direct children of ``stage`` (``None``: of the request), by start."""
        return self.top if stage is None else self.children.get(stage.span_id, [])

    def parent(self, stage: StageRecord) -> StageRecord | None:
        """The parent of ``stage`` in this tree (``None``: the request)."""
        if self._parent is not None and stage.span_id in self._parent:
            return self._parent[stage.span_id]
        pid = stage.parent_id
        return self.by_id.get(pid) if pid is not None and pid != stage.span_id else None

    def descendants(self, stage: StageRecord | None) -> list[StageRecord]:
        """All stages below ``stage`` (``None``: every stage), cycle-safe."""
        out: list[StageRecord] = []
        seen: set[str] = set()
        stack = list(self.kids(stage))
        while stack:
            node = stack.pop()
            if node.span_id in seen:
                continue
            seen.add(node.span_id)
            out.append(node)
            stack.extend(self.children.get(node.span_id, ()))
        return out

    def own_slices(self, stage: StageRecord | None, req: RequestRecord) -> list[Interval]:
        """Loop slices of ``stage`` (``None``: the request's own code) minus its descendants'."""
        slices = req.loop_slices if stage is None else stage.loop_slices
        if not slices:
            return []
        if stage is not None and stage.span_id not in self.children:
            return merge(slices)  # a leaf: nothing nested to take out
        cover = [s for d in self.descendants(stage) for s in d.loop_slices]
        cover += [(k.start_ns, k.end_ns) for k in self.kids(stage) if not is_generator(k)]
        nested = merge(cover)
        return subtract(slices, nested) if nested else merge(slices)


def is_generator(stage: StageRecord) -> bool:
    """An async-generator stage: its consumer held items (``tracekit.consumer_ms`` > 0)."""
    consumer = stage.attributes.get(semconv.CONSUMER_MS)
    return isinstance(consumer, (int, float)) and not isinstance(consumer, bool) and consumer > 0


_START_KEY = attrgetter("start_ns", "span_id")
_FIRST = itemgetter(0)


def function_of(stage: StageRecord | None) -> str | None:
    """``code.namespace + "." + code.function`` of a stage, or whichever of them is known."""
    return None if stage is None else qualified_name(stage.code_function, stage.code_namespace)


def qualified_name(function: str | None, namespace: str | None) -> str | None:
    """``namespace.function``, or whichever of the two is known (``None``: neither)."""
    if function and namespace:
        return f"{namespace}.{function}"
    return function or namespace
