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
from operator import attrgetter

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


def overlap(start: int, end: int, cover: Sequence[Interval]) -> int:
    """Length of ``[start, end]`` covered by ``cover`` (sorted and disjoint)."""
    if end <= start or not cover:
        return 0
    starts = [c[0] for c in cover]
    i = max(0, bisect_right(starts, start) - 1)
    total = 0
    while i < len(cover) and cover[i][0] < end:
        lo, hi = max(start, cover[i][0]), min(end, cover[i][1])
        if hi > lo:
            total += hi - lo
        i += 1
    return total


class StageTree:
    """Parent/child structure of one request's stages.

    Attributes:
        top: stages whose parent is the request span (or not among the stages), by start.
        children: span id -> its child stages, by start.
    """

    __slots__ = ("by_id", "children", "top")

    def __init__(self, req: RequestRecord) -> None:
        # Built for every request by several rules and the replay: kept to one pass and
        # C-level sort keys.
        self.by_id = by_id = {s.span_id: s for s in req.stages}
        self.children: dict[str, list[StageRecord]] = {}
        self.top: list[StageRecord] = []
        for stage in req.stages:
            parent = stage.parent_id
            if parent is None or parent == stage.span_id or parent not in by_id:
                self.top.append(stage)
            else:
                self.children.setdefault(parent, []).append(stage)
        if len(self.top) > 1:
            self.top.sort(key=_START_KEY)
        for kids in self.children.values():
            kids.sort(key=_START_KEY)

    def kids(self, stage: StageRecord | None) -> list[StageRecord]:
        """Direct children of ``stage`` (``None``: of the request)."""
        return self.top if stage is None else self.children.get(stage.span_id, [])

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


def function_of(stage: StageRecord | None) -> str | None:
    """``code.namespace + "." + code.function`` of a stage, or whichever of them is known."""
    if stage is None:
        return None
    if stage.code_namespace and stage.code_function:
        return f"{stage.code_namespace}.{stage.code_function}"
    return stage.code_function or stage.code_namespace


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile by linear interpolation between closest ranks (numpy's default).

    Args:
        values: at least one number (need not be sorted).
        q: between 0 and 1.

    Returns:
        The percentile.
    """
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
