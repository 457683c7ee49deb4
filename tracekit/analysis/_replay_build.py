"""Turn one recorded request into a replay program (see :mod:`tracekit.analysis._replay_sim`).

The recorded timeline of a request (or a stage) is cut into *gaps* and *clusters*: a cluster
is a run of child stages whose intervals overlap (stages run by ``asyncio.gather``, or a
streaming model stage with the consumer's code inside it), a gap is the time between them,
where the node's own code ran. In a gap, the node's own loop slices (its recorded
``loop_slices`` minus its descendants' slices) become :data:`LOOP` nodes at their recorded
places and the rest becomes :data:`DELAY`, less the node's recorded loop waits: those are not
replayed, the replay produces its own. A cluster of one child is that child's program; a
cluster of several becomes a :data:`PAR` of chains (greedy interval partitioning), each chain
keeping its members' recorded offsets as delays.

A slice's CPU and its blocking part: when a node's slices add up to more than its CPU, each
slice holds the GIL for its share ``cpu / slices`` and holds the loop without CPU for the
rest (a blocking call, or a loop thread waiting for the GIL). CPU not covered by recorded
slices (slices under 1 ms are not recorded) is spread over the node's gaps in proportion to
their length. Stages that ran on a worker thread (``on_loop`` false) replay as a thread-pool
slot held for their recorded duration: their effect on the loop (GIL contention) is already
in the loop slices recorded beside them. Spans without tracekit attributes are containers
whose own time is a delay.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from tracekit import semconv
from tracekit.analysis._intervals import Interval, StageTree, merge, overlap, subtract
from tracekit.analysis._replay_sim import CPU, DELAY, HOLD, LOOP, PAR, Node
from tracekit.analysis.findings import Fix
from tracekit.analysis.model import RequestRecord, StageRecord

THREADS = "threads"
PROCESSES = "processes"
_MS = 1e6
_TINY_MS = 0.001  # pieces and delays shorter than a microsecond are noise
_FOLLOW_NS = 50_000  # a recorded slice starting this soon after a loop wait is its resumption


@dataclass(frozen=True)
class ModelCall:
    """A recorded model call's queueing, for replays with a one-at-a-time model server.

    Attributes:
        key: the HOLD resource standing for the server (or the lock).
        queue_out_ms: waiting before the stage started (a lock / blocking client).
        queue_in_ms: waiting inside the stage (the server's own queue).
        wrap_stage: hold the resource for the whole stage (a lock around the call) rather
            than for the model's answer only.
    """

    key: str
    queue_out_ms: float
    queue_in_ms: float
    wrap_stage: bool


def has_components(stage: StageRecord) -> bool:
    """Whether a stage record carries tracekit's cpu/wait components."""
    return stage.cpu_ms is not None or stage.wait_ms is not None or bool(stage.loop_slices)


class ProgramBuilder:
    """Builds the program of one request.

    Args:
        req: the recorded request.
        t0_ns: the replay's time origin.
        fix: the fix to apply, or ``None`` (as recorded). Applied only to ``fix.route``.
        model_calls: span id -> :class:`ModelCall`, for the model-server variant.
    """

    def __init__(
        self,
        req: RequestRecord,
        t0_ns: int,
        fix: Fix | None = None,
        model_calls: dict[str, ModelCall] | None = None,
    ) -> None:
        self.req = req
        self.tree = StageTree(req)
        self.t0 = t0_ns
        self.fix = fix if fix is not None and fix.route == req.route else None
        self.model_calls = model_calls or {}

    def program(self) -> list[Node]:
        """The request's program."""
        req = self.req
        stage_cpu = sum(s.cpu_ms or 0.0 for s in req.stages)
        own_cpu = max(0.0, (req.cpu_ms or 0.0) - stage_cpu)
        own = self.tree.own_slices(None, req)
        items = self._node(None, req.start_ns, req.end_ns, own_cpu, own, req.loop_waits, None)
        if not items or items[0][0] != LOOP:
            # The server span starts inside the request's first step: the program starts
            # with that step (its wait for the loop is not part of the recorded latency).
            items = [(LOOP, 0.0, 0.0), *items]
        return items

    # --- nodes ----------------------------------------------------------------------------
    def _node(
        self,
        stage: StageRecord | None,
        start: int,
        end: int,
        cpu_ms: float,
        slices: list[Interval],
        waits: list[Interval],
        max_block_ms: float | None,
        consumer_ms: float = 0.0,
    ) -> list[Node]:
        end = max(end, start)
        kids = [k for k in self.tree.kids(stage) if k.start_ns < end and k.end_ns > start]
        if not kids and not slices and not (max_block_ms and max_block_ms > cpu_ms):
            # A leaf with no recorded slices (the common case): its CPU, then its waits.
            return _absorb(self._leaf(stage, start, end, cpu_ms, waits), consumer_ms)
        clusters = _clusters(kids, start, end)
        spans = [(a, b) for a, b, _ in clusters]
        slices = [(max(a, start), min(b, end)) for a, b in slices if min(b, end) > max(a, start)]
        if not slices and max_block_ms and max_block_ms > cpu_ms and stage is not None:
            # No recorded slices (another producer): one blocking slice at the start.
            slices = [(start, min(end, start + int(max_block_ms * _MS)))]
        slice_ms = sum(b - a for a, b in slices) / _MS
        gil_share = min(1.0, cpu_ms / slice_ms) if slice_ms > 0 else 1.0
        leftover = max(0.0, cpu_ms - slice_ms)
        targeted = self._targets(stage)
        gaps = _gaps(spans, start, end)
        waits = merge(waits)
        # Unplaced CPU goes where the node's own code could have run: its gaps' free time
        # (a gap that was all waiting for the loop ran nothing).
        free = [max(0, (b - a) - overlap(a, b, waits)) for a, b in gaps]
        gap_total = sum(free)
        resumes = _resumptions(clusters, slices, waits)
        if resumes and leftover > 0:
            # Part of the unplaced CPU ran at those resumptions (per-chunk work): one
            # resumption's worth each, counting one per streamed chunk when known.
            used = sum(1 for f in free if f > 0)
            steps = max(len(resumes), (self.req.chunks or 0) if stage is None else 0)
            per = leftover / (steps + used)
            resumes = [(t, per) for t, _ in resumes]
            leftover -= per * len(resumes)
        blocks: list[tuple[StageRecord | None, list[Node]]] = []
        if gap_total <= 0 and leftover > 0:
            blocks.append((None, [self._loop(leftover, 0.0, targeted)]))
        gap_slices = subtract(slices, spans) if spans else slices
        # Gaps and clusters alternate: gap, cluster, gap, ..., cluster, gap.
        sequence: list[tuple[int, int, list[StageRecord] | None]] = [(*gaps[0], None)]
        for cluster, gap in zip(clusters, gaps[1:], strict=True):
            sequence += [cluster, (*gap, None)]
        gap_index = 0
        for a, b, members in sequence:
            if members is None:
                share = leftover * free[gap_index] / gap_total if gap_total > 0 else 0.0
                gap_index += 1
                pieces = [p for p in gap_slices if a <= p[0] < b]
                blocks.append((None, self._gap(a, b, pieces, waits, gil_share, share, targeted)))
            else:
                inside = [(max(p[0], a), min(p[1], b)) for p in slices if p[0] < b and p[1] > a]
                here = [r for r in resumes if a < r[0] < b]
                blocks.append(
                    self._cluster(a, b, members, inside, here, waits, gil_share, targeted)
                )
        blocks = self._restructure(stage, blocks)
        self._trim_before_outside_queues(blocks)
        return _absorb(_merge_loops([node for _, items in blocks for node in items]), consumer_ms)

    def _leaf(
        self, stage: StageRecord | None, start: int, end: int, cpu_ms: float, waits: list[Interval]
    ) -> list[Node]:
        waited = sum(min(b, end) - max(a, start) for a, b in waits if min(b, end) > max(a, start))
        free = max(0.0, (end - start - waited) / _MS)
        cpu_ms = min(cpu_ms, free)  # CPU cannot take longer than the time it had
        delay = free - cpu_ms
        items: list[Node] = []
        if cpu_ms > 0:
            items.append(self._loop(cpu_ms, 0.0, self._targets(stage)))
        if end > start:
            items.append((DELAY, delay))
        return items

    def _gap(
        self,
        a: int,
        b: int,
        pieces: list[Interval],
        waits: list[Interval],
        gil_share: float,
        extra_cpu: float,
        targeted: bool,
    ) -> list[Node]:
        items: list[Node] = []
        delays: list[int] = []  # indexes of DELAY items, to absorb the extra CPU
        cursor = a
        for p_start, p_end in sorted(pieces):
            if p_start > cursor:
                items.append((DELAY, _free(cursor, p_start, waits)))
                delays.append(len(items) - 1)
            held = (p_end - p_start) / _MS
            items.append(self._loop(held * gil_share, held * (1 - gil_share), targeted))
            cursor = max(cursor, p_end)
        if b > cursor:
            items.append((DELAY, _free(cursor, b, waits)))
            delays.append(len(items) - 1)
        if extra_cpu > _TINY_MS:
            # The unrecorded CPU happened in this gap: take its time out of the delays.
            room = sum(items[i][1] for i in delays)
            extra_cpu = min(extra_cpu, room)
            left = extra_cpu
            for i in sorted(delays, key=lambda i: -items[i][1]):
                take = min(left, items[i][1])
                items[i] = (DELAY, items[i][1] - take)
                left -= take
            items.insert(0, self._loop(extra_cpu, 0.0, targeted))
        return items

    def _cluster(
        self,
        a: int,
        b: int,
        members: list[StageRecord],
        pieces: list[Interval],
        resumes: list[tuple[int, float]],
        waits: list[Interval],
        gil_share: float,
        targeted: bool,
    ) -> tuple[StageRecord | None, list[Node]]:
        if len(members) == 1 and not pieces and not resumes:
            return members[0], self._child(members[0])
        entries: list[tuple[int, int, Any]] = [(m.start_ns, m.end_ns, m) for m in members]
        entries += [(p[0], p[1], None) for p in pieces]
        # A resumption of the parent's code: CPU (ms) at a point in time, after a loop wait.
        entries += [(t, t + round(cpu * _MS), cpu) for t, cpu in resumes]
        entries.sort(key=lambda e: (e[0], e[1]))
        chains: list[tuple[int, list[Node]]] = []  # (last end, items)
        for start, end, member in entries:
            fit = [i for i, (last, _) in enumerate(chains) if last <= start]
            if fit:
                i = max(fit, key=lambda i: chains[i][0])
                last, items = chains[i]
            else:
                last, items = a, []
                chains.append((a, items))
                i = len(chains) - 1
            if start > last:
                items.append((DELAY, _free(last, start, waits)))
            if member is None:
                held = (end - start) / _MS
                items.append(self._loop(held * gil_share, held * (1 - gil_share), targeted))
            elif isinstance(member, float):
                items.append(self._loop(member, 0.0, targeted))
            else:
                items.extend(self._child(member))
            chains[i] = (max(last, end), items)
        branches = [_merge_loops(items) for _, items in chains]
        if len(branches) == 1:
            return None, branches[0]
        return None, [(PAR, branches)]

    def _child(self, stage: StageRecord) -> list[Node]:
        call = self.model_calls.get(stage.span_id)
        if not has_components(stage):
            items = self._node(stage, stage.start_ns, stage.end_ns, 0.0, [], [], None)
        elif stage.on_loop is False:
            wall = max(0, stage.end_ns - stage.start_ns) / _MS
            items = [(HOLD, THREADS, [(DELAY, wall)])]
        else:
            own = self.tree.own_slices(stage, self.req)
            items = self._node(
                stage,
                stage.start_ns,
                stage.end_ns,
                stage.cpu_ms or 0.0,
                own,
                stage.loop_waits,
                stage.max_block_ms,
                consumer_ms(stage),
            )
        if call is None:
            return items
        if call.wrap_stage:
            return [(HOLD, call.key, _shrink_largest_delay(items, call.queue_in_ms))]
        return _hold_largest_delay(items, call.key, call.queue_in_ms)

    # --- fixes ----------------------------------------------------------------------------
    def _targets(self, stage: StageRecord | None) -> bool:
        fix = self.fix
        if fix is None or fix.action not in ("thread", "process", "shrink"):
            return False
        return fix.stage is None if stage is None else stage.name == fix.stage

    def _loop(self, gil: float, block: float, targeted: bool) -> Node:
        fix = self.fix
        if not targeted or fix is None:
            return (LOOP, gil, block)
        if fix.action == "shrink":
            return (LOOP, gil * fix.factor, block)
        inner: list[Node] = []
        if gil > 0:
            inner.append((CPU, gil, fix.action == "thread" and not fix.gil_free))
        if block > 0:
            inner.append((DELAY, block))
        return (HOLD, THREADS if fix.action == "thread" else PROCESSES, inner)

    def _restructure(
        self, parent: StageRecord | None, blocks: list[tuple[StageRecord | None, list[Node]]]
    ) -> list[tuple[StageRecord | None, list[Node]]]:
        fix = self.fix
        if fix is None or fix.action not in ("gather", "fanout"):
            return blocks
        names = [tag.name if tag is not None else None for tag, _ in blocks]
        if fix.action == "gather":
            if fix.stage not in names:
                return blocks
            i = names.index(fix.stage)
            later = [j for j in range(i + 1, len(blocks)) if names[j] == fix.other]
            if not later:
                return blocks
            j = later[0]
            rest = [node for _, items in blocks[i + 1 : j + 1] for node in items]
            par: Node = (PAR, [blocks[i][1], _merge_loops(rest)])
            return [*blocks[:i], (None, [par]), *blocks[j + 1 :]]
        calls = [i for i, name in enumerate(names) if name == fix.stage]
        if len(calls) < 2:
            return blocks
        par = (PAR, [blocks[i][1] for i in calls])
        out = [b for i, b in enumerate(blocks) if i not in calls[1:]]
        out[calls[0]] = (None, [par])
        return out

    def _trim_before_outside_queues(
        self, blocks: list[tuple[StageRecord | None, list[Node]]]
    ) -> None:
        # A lock (or blocking client) wait happened before the model stage started, in the
        # gap before it: the replay's HOLD produces that wait, so the recorded one goes.
        for index, (tag, _) in enumerate(blocks):
            call = self.model_calls.get(tag.span_id) if tag is not None else None
            if call is None or call.queue_out_ms <= 0 or index == 0:
                continue
            previous = blocks[index - 1][1]
            left = call.queue_out_ms
            for k in range(len(previous) - 1, -1, -1):
                if left <= 0:
                    break
                if previous[k][0] == DELAY:
                    take = min(left, previous[k][1])
                    previous[k] = (DELAY, previous[k][1] - take)
                    left -= take
                elif previous[k][0] == LOOP:
                    break


# --- helpers ------------------------------------------------------------------------------
def _clusters(
    kids: list[StageRecord], start: int, end: int
) -> list[tuple[int, int, list[StageRecord]]]:
    out: list[tuple[int, int, list[StageRecord]]] = []
    for kid in sorted(kids, key=lambda k: (k.start_ns, k.end_ns)):
        a, b = max(kid.start_ns, start), min(max(kid.end_ns, kid.start_ns), end)
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b), [*out[-1][2], kid])
        else:
            out.append((a, b, [kid]))
    return out


def _gaps(spans: list[Interval], start: int, end: int) -> list[Interval]:
    """The gaps around the cluster spans: one before each cluster and one after the last
    (possibly empty), so that gaps and clusters alternate, starting and ending with a gap."""
    gaps: list[Interval] = []
    cursor = start
    for a, b in spans:
        gaps.append((cursor, max(cursor, a)))
        cursor = max(cursor, b)
    gaps.append((cursor, max(cursor, end)))
    return gaps


def consumer_ms(stage: StageRecord) -> float:
    """An async-generator stage's ``tracekit.consumer_ms`` (0 for other stages)."""
    value = stage.attributes.get(semconv.CONSUMER_MS)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def _resumptions(
    clusters: list[tuple[int, int, list[StageRecord]]],
    slices: list[Interval],
    waits: list[Interval],
) -> list[tuple[int, float]]:
    """Where the node's own code resumed inside an async-generator child (its consumer at
    work between items) in steps too short to be recorded: the ends of its loop waits there
    that no recorded slice follows. Returned as (time, cpu ms = 0 for now)."""
    out: list[tuple[int, float]] = []
    starts = sorted(a for a, _ in slices)
    for a, b, members in clusters:
        if not any(consumer_ms(m) > 0 for m in members):
            continue
        for _, resumed in waits:
            if a < resumed < b:
                i = bisect_left(starts, resumed)
                if i < len(starts) and starts[i] - resumed < _FOLLOW_NS:
                    continue  # a recorded slice is that resumption
                out.append((resumed, 0.0))
    return out


def _absorb(items: list[Node], ms: float) -> list[Node]:
    """Take ``ms`` out of the largest top-level delays (time that belonged to someone else)."""
    if ms <= 0:
        return items
    out = list(items)
    for i in sorted((i for i, n in enumerate(out) if n[0] == DELAY), key=lambda i: -out[i][1]):
        take = min(ms, out[i][1])
        out[i] = (DELAY, out[i][1] - take)
        ms -= take
        if ms <= 0:
            break
    return out


def _free(a: int, b: int, waits: list[Interval]) -> float:
    """Milliseconds of [a, b] that were not recorded loop waits."""
    return max(0.0, (b - a - overlap(a, b, waits)) / _MS)


def _merge_loops(items: list[Node]) -> list[Node]:
    out: list[Node] = []
    for node in items:
        if node[0] == DELAY and node[1] < _TINY_MS and out and out[-1][0] == DELAY:
            continue
        if node[0] == LOOP and out and out[-1][0] == LOOP:
            out[-1] = (LOOP, out[-1][1] + node[1], out[-1][2] + node[2])
        else:
            out.append(node)
    return out


def _largest_delay(items: list[Node]) -> int | None:
    best: int | None = None
    for i, node in enumerate(items):
        if node[0] == DELAY and (best is None or node[1] > items[best][1]):
            best = i
    return best


def _shrink_largest_delay(items: list[Node], by_ms: float) -> list[Node]:
    i = _largest_delay(items)
    if i is None or by_ms <= 0:
        return items
    out = list(items)
    out[i] = (DELAY, max(0.0, items[i][1] - by_ms))
    return out


def _hold_largest_delay(items: list[Node], key: str, queue_ms: float) -> list[Node]:
    i = _largest_delay(items)
    if i is None:
        return [(HOLD, key, items)]
    out = list(items)
    out[i] = (HOLD, key, [(DELAY, max(0.0, items[i][1] - queue_ms))])
    return out


def is_model_stage(stage: StageRecord) -> bool:
    """A model call: a ``model`` stage, or a plain span with GenAI attributes."""
    if stage.kind == semconv.KIND_MODEL:
        return True
    return not has_components(stage) and semconv.GEN_AI_OPERATION_NAME in stage.attributes
