"""Helpers of :mod:`tracekit.analysis.replay.build`: recorded intervals cut into gaps and
clusters, and small rewrites of node lists (see :mod:`tracekit.analysis.replay.sim` for
the node types).

Every function returns new lists and never mutates the ones it is given: programs and their
parts are shared between replays (``_replay_build.ProgramMemo``).
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

from tracekit import semconv
from tracekit.analysis.model import StageRecord
from tracekit.analysis.replay.sim import DELAY, HOLD, LOOP, PAR, Node
from tracekit.analysis.stats.intervals import Interval, overlap

MS = 1e6
TINY_MS = 0.001  # pieces and delays shorter than a microsecond are noise
FOLLOW_NS = 50_000  # a recorded slice starting this soon after a loop wait is its resumption

_END = itemgetter(1)

#: (start, end, member stages) of a run of overlapping child stages.
Cluster = tuple[int, int, list[StageRecord]]


def consumer_ms(stage: StageRecord) -> float:
    """An async-generator stage's ``tracekit.consumer_ms`` (0 for other stages)."""
    value = stage.attributes.get(semconv.CONSUMER_MS)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def clusters(kids: list[StageRecord], start: int, end: int) -> list[Cluster]:
    """Runs of overlapping ``kids`` (clipped to [start, end]), by start."""
    out: list[Cluster] = []
    for kid in sorted(kids, key=lambda k: (k.start_ns, k.end_ns)):
        a, b = max(kid.start_ns, start), min(max(kid.end_ns, kid.start_ns), end)
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b), [*out[-1][2], kid])
        else:
            out.append((a, b, [kid]))
    return out


def gaps(spans: list[Interval], start: int, end: int) -> list[Interval]:
    """The gaps around the cluster spans: one before each cluster and one after the last
    (possibly empty), so that gaps and clusters alternate, starting and ending with a gap."""
    out: list[Interval] = []
    cursor = start
    for a, b in spans:
        out.append((cursor, max(cursor, a)))
        cursor = max(cursor, b)
    out.append((cursor, max(cursor, end)))
    return out


def resumptions(
    runs: list[Cluster], slices: list[Interval], waits: list[Interval]
) -> list[tuple[int, float]]:
    """Where the node's own code resumed inside an async-generator child (its consumer at
    work between items) in steps too short to be recorded: the ends of its loop waits there
    that no recorded slice follows. Returned as (time, cpu ms = 0 for now)."""
    out: list[tuple[int, float]] = []
    starts: list[int] | None = None
    for a, b, members in runs:
        if not any(consumer_ms(m) > 0 for m in members):
            continue
        if starts is None:
            starts = sorted(a for a, _ in slices)
        for _, resumed in waits:
            if a < resumed < b:
                i = bisect_left(starts, resumed)
                if i < len(starts) and starts[i] - resumed < FOLLOW_NS:
                    continue  # a recorded slice is that resumption
                out.append((resumed, 0.0))
    return out


def gap_resumptions(a: int, b: int, pieces: list[Interval], waits: list[Interval]) -> list[int]:
    """Where the node's code resumed in the gap [a, b) in a step too short to be recorded:
    the ends of its recorded loop waits there (a loop wait ends when a step of the waiting
    code begins) that no recorded slice follows. A wait ending as the gap ends is the next
    child's first step, not one of the node's.

    Args:
        a / b: the gap.
        pieces: the node's slices in the gap, sorted.
        waits: the node's loop waits, merged (sorted and disjoint: their ends are sorted).

    Cost: O(log waits + resumptions x log pieces).
    """
    i = bisect_left(waits, a, key=_END) if waits else 0
    out: list[int] = []
    starts: list[int] | None = None
    while i < len(waits) and waits[i][1] < b - FOLLOW_NS:
        resumed = waits[i][1]
        i += 1
        if starts is None:
            starts = [p[0] for p in pieces]
        j = bisect_left(starts, resumed)
        if j < len(starts) and starts[j] - resumed < FOLLOW_NS:
            continue  # a recorded slice is that resumption
        out.append(resumed)
    return out


def absorb(items: list[Node], ms: float) -> list[Node]:
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


def free_ms(a: int, b: int, waits: list[Interval]) -> float:
    """Milliseconds of [a, b] that were not recorded loop waits."""
    return max(0.0, (b - a - overlap(a, b, waits)) / MS)


def merge_loops(items: list[Node]) -> list[Node]:
    """Adjacent loop steps as one step; sub-microsecond delays after a delay dropped."""
    out: list[Node] = []
    for node in items:
        if node[0] == DELAY and node[1] < TINY_MS and out and out[-1][0] == DELAY:
            continue
        if node[0] == LOOP and out and out[-1][0] == LOOP:
            out[-1] = (LOOP, out[-1][1] + node[1], out[-1][2] + node[2])
        else:
            out.append(node)
    return out


def trim_delays_before(items: list[Node], ms: float) -> list[Node]:
    """``items`` with ``ms`` taken out of the delays at their end, back to the last loop step."""
    out = list(items)
    left = ms
    for k in range(len(out) - 1, -1, -1):
        if left <= 0:
            break
        if out[k][0] == DELAY:
            take = min(left, out[k][1])
            out[k] = (DELAY, out[k][1] - take)
            left -= take
        elif out[k][0] == LOOP:
            break
    return out


def _largest_delay(items: list[Node]) -> int | None:
    best: int | None = None
    for i, node in enumerate(items):
        if node[0] == DELAY and (best is None or node[1] > items[best][1]):
            best = i
    return best


def shrink_largest_delay(items: list[Node], by_ms: float) -> list[Node]:
    """``items`` with their largest delay shortened by ``by_ms`` (not below 0)."""
    i = _largest_delay(items)
    if i is None or by_ms <= 0:
        return items
    out = list(items)
    out[i] = (DELAY, max(0.0, items[i][1] - by_ms))
    return out


def hold_after_queue(
    items: list[Node], key: str, queue_ms: float, service_ms: float | None = None
) -> list[Node]:
    """``items`` holding resource ``key`` (a one-at-a-time model server) from where their
    first ``queue_ms`` of delays ends through their last delay; all of them when there is
    no delay. The queueing comes off those first delays: the replay makes its own, waiting
    for ``key``.

    Through the last delay: a streamed call's server decodes for it until its last chunk,
    between the stage's steps that pass each chunk on. From where the queue ends, not from
    the largest delay: a stream's steps are merged into a few delays, and its largest was
    often the last (the decode), which left the server free for the rest of each stream.
    Either way the replayed serial server's queue fell short of the recorded one (the demo's
    serial server, a quarter of its calls streamed: simulated p95 21-27% short, no
    projection).

    For at least ``service_ms`` (the server's own prefill and decode, when its span said): a
    server decodes at its own pace while the gateway passes the chunks on, and the stage's
    delays are what is left of its wall time once its consumer's work and its waits for the
    loop (replayed elsewhere: the consumer beside the stage, the waits anew) are taken out.
    Held through those delays alone, a streamed call freed the demo's one-at-a-time server
    before the server's own span ended, and its replayed queue fell short (docs/analyzer-rules.md,
    "The projection model"). The server is given back after ``service_ms`` (a HOLD with a set
    time); the stage's steps run beside that time and it lasts at least as long."""
    delays = [k for k, node in enumerate(items) if node[0] == DELAY]
    if not delays:
        return [(HOLD, key, items)]
    out = list(items)
    left = queue_ms
    start = delays[-1]
    for k in delays:
        take = min(left, out[k][1])
        out[k] = (DELAY, out[k][1] - take)
        left -= take
        if left <= 0:
            start = k
            break
    last = delays[-1]
    held = out[start : last + 1]
    if service_ms is None:
        return [*out[:start], (HOLD, key, held), *out[last + 1 :]]
    # The server is free once its own time is up; the stage goes on for at least that long.
    *steps, tail = held  # the last delay: the last token's way back
    rest = service_ms - tail[1]
    if not steps:
        held = [(DELAY, max(tail[1], service_ms))]
    elif rest > 0:
        held = [(PAR, [[(DELAY, rest)], steps]), tail]
    return [*out[:start], (HOLD, key, held, service_ms), *out[last + 1 :]]
