"""When each recorded request became ready to run, for the replay.

A request's recorded start is when the event loop began running its first step (the server
span starts inside it), so on a busy loop it had already waited, unrecorded, in the loop's
ready queue. Replaying it "ready at its recorded start" would put it behind work that it
actually preceded in the queue. Two estimates of the real ready time:

- **Closed-loop clients** (a load generator's client sends its next request when the
  previous response ends): a request is chained to the one whose end it followed when the
  loop was idle for at most ``gap_ms`` in between (the rest of the gap, the loop was busy
  running other requests' recorded slices, or other requests were recorded waiting for it:
  the new request was waiting for it too). In the
  replay the successor becomes ready that idle time after its predecessor *simulated* end,
  capped at the 10th percentile of all chains' idle times: a client's think time is about
  constant, and steps under 1 ms (not recorded) make the loop look idle when it was not.
  Predecessors are matched first-ended first (the ready queue is FIFO). Once the trace is
  judged closed-loop, every completion starts one request: requests left unmatched (their
  gap looked idler than it was) are paired first-ended to first-started, with the typical
  think time.
- **Open arrivals**: if the loop was busy right up to the recorded start (a busy run of
  recorded slices, joined across gaps under 1 ms, ending at the start), the request became
  ready at an unknown time within that run: assume the middle (the core's loop-wait
  estimator makes the same assumption, DESIGN §1).

Replayed latency is measured like the recorded one: from the request's first step on the
loop to its end.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.stats.intervals import Interval, merge

_MS = 1e6
# Recorded busy slices closer than this form one busy run: the loop dispatching the next
# callback, or polling with nothing ready, takes less than a millisecond.
GAP_NS = 1_000_000


class BusyIndex:
    """The recorded busy time of one event loop.

    Two readings: ``busy`` is the union of its requests' loop slices *and* loop waits (while
    a request waited for the loop, the loop was running someone else, if only in steps too
    short to be recorded); ``runs`` are the recorded slices joined across gaps under 1 ms, the
    core's loop-wait estimator's busy runs.

    Args:
        group: the requests served by that loop.
    """

    def __init__(self, group: list[RequestRecord]) -> None:
        slices: list[Interval] = []
        waits: list[Interval] = []
        for r in group:
            slices += r.loop_slices
            waits += r.loop_waits
            for st in r.stages:
                slices += st.loop_slices
                waits += st.loop_waits
        self.busy = merge([*slices, *waits])
        self._starts = [a for a, _ in self.busy]
        self._cum = [0]
        for a, b in self.busy:
            self._cum.append(self._cum[-1] + (b - a))
        self.runs = _join(merge(slices), GAP_NS)
        self._run_starts = [a for a, _ in self.runs]

    def covered(self, start: int, end: int) -> int:
        """Busy ns within [start, end]."""
        return max(0, self._busy_before(end) - self._busy_before(start))

    def _busy_before(self, t: int) -> int:
        i = bisect_right(self._starts, t)
        if i == 0:
            return 0
        a, b = self.busy[i - 1]
        return self._cum[i - 1] + (min(t, b) - a)

    def run_before(self, t: int) -> int:
        """Length of the busy run that reaches ``t`` (ends at most 1 ms before it), up to ``t``."""
        i = bisect_right(self._run_starts, t) - 1
        if i < 0:
            return 0
        a, b = self.runs[i]
        return t - a if b >= t - GAP_NS else 0


@dataclass(frozen=True)
class Arrivals:
    """Replay arrival times of one loop's requests (ms from the replay's origin).

    Attributes:
        ready: index -> ready time, for requests that are not chained.
        chains: predecessor index -> (successor index, idle ms before the successor is ready).
    """

    ready: dict[int, float]
    chains: dict[int, tuple[int, float]]


def arrivals(
    group: list[RequestRecord],
    t0_ns: int,
    mode: str,
    gap_ms: float,
    min_fraction: float,
) -> Arrivals:
    """Ready times and closed-loop chains of ``group`` (see the module docstring).

    Args:
        group: one loop's requests.
        t0_ns: the replay's time origin.
        mode: ``"open"``, ``"closed"`` or ``"auto"`` (closed when at least ``min_fraction``
            of the requests chain).
        gap_ms: the most idle loop time between a predecessor's end and its successor's start.
        min_fraction: see ``mode``.

    Returns:
        The arrivals.
    """
    busy = BusyIndex(group)
    chains: dict[int, tuple[int, float]] = {}
    if mode != "open" and len(group) > 1:
        chains = _chains(group, busy, int(gap_ms * _MS))
        if mode == "auto" and len(chains) < min_fraction * (len(group) - 1):
            chains = {}
        if chains:
            think = percentile([idle for _, idle in chains.values()], 0.1)
            chains = {p: (s, min(idle, think)) for p, (s, idle) in chains.items()}
            chains.update(_pair_leftovers(group, chains, think))
    chained = {succ for succ, _ in chains.values()}
    ready: dict[int, float] = {}
    for i, req in enumerate(group):
        if i not in chained:
            waited = busy.run_before(req.start_ns) // 2
            ready[i] = (req.start_ns - waited - t0_ns) / _MS
    return Arrivals(ready, chains)


def _chains(
    group: list[RequestRecord], busy: BusyIndex, gap_ns: int
) -> dict[int, tuple[int, float]]:
    ends = sorted(range(len(group)), key=lambda i: group[i].end_ns)
    out: dict[int, tuple[int, float]] = {}
    candidates: deque[int] = deque()
    pointer = 0
    for i in sorted(range(len(group)), key=lambda i: group[i].start_ns):
        start = group[i].start_ns
        while pointer < len(ends) and group[ends[pointer]].end_ns <= start:
            candidates.append(ends[pointer])
            pointer += 1
        # Too much idle loop time since it ended: it cannot have been waiting (and will be
        # idler still for every later start).
        while candidates and _idle(busy, group[candidates[0]].end_ns, start) > gap_ns:
            candidates.popleft()
        if candidates:
            pred = candidates.popleft()
            out[pred] = (i, _idle(busy, group[pred].end_ns, start) / _MS)
    return out


def _pair_leftovers(
    group: list[RequestRecord], chains: dict[int, tuple[int, float]], think: float
) -> dict[int, tuple[int, float]]:
    successors = {s for s, _ in chains.values()}
    first_end = min(r.end_ns for r in group)
    preds = sorted((i for i in range(len(group)) if i not in chains), key=lambda i: group[i].end_ns)
    succs = sorted(
        (i for i in range(len(group)) if i not in successors and group[i].start_ns >= first_end),
        key=lambda i: group[i].start_ns,
    )
    out: dict[int, tuple[int, float]] = {}
    p = 0
    for s in succs:
        if p < len(preds) and group[preds[p]].end_ns <= group[s].start_ns and preds[p] != s:
            out[preds[p]] = (s, think)
            p += 1
    return out


def _idle(busy: BusyIndex, start: int, end: int) -> int:
    return (end - start) - busy.covered(start, end)


def _join(intervals: list[Interval], gap: int) -> list[Interval]:
    out: list[Interval] = []
    for a, b in intervals:
        if out and a - out[-1][1] < gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
