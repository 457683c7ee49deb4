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
- **Slow closed-loop clients**: when too few requests chain but the requests in flight say a
  closed loop (below), every start is chained first-ended first, however idle the loop was
  in between, each with its own think time: the gap less the successor's estimated wait for
  the loop (half the busy run before its start, as for open arrivals), at least the loop's
  idle time in the gap. Slow clients' think times vary, and the variation is what makes two
  clients' requests collide on the loop: capped at the 10th percentile as above, a 2-client
  loop replayed 16-20% faster than measured.
- **Clients with a fixed think time** (a load generator that waits, say, 0.8 s after each
  response): too idle in between to chain by idle time, and chaining every start to the
  earliest end pairs a client's end with another client's first request or next one, which
  halves the clients and their think times (the demo's 8 clients read as 4, the fixed
  gateway's p95 projected 5-10% above the measured). Such clients leave a peak in the gaps from
  each end to the later starts: the think time, within a few ms (:func:`_paced`). Where the
  peak holds at least half the requests and stands well above the gaps around it, each end
  is chained to the start whose gap is nearest the peak.
- **Open arrivals** (:func:`_open_ready`): a request that started while the loop was idle
  was ready at its start. One that started while the loop was busy (its recorded slices and
  waits, joined across gaps under 1 ms, covering the millisecond before the start) waited in
  the socket since some time after the previous request arrived and after that busy period
  began, and before its start: for Poisson arrivals at the recorded rate, the expected gap to
  it, an exponential time conditioned on ending before the start. During a burst the loop
  starts requests at its own pace, long after they arrived. Against the load generator's own
  send times (``bench/replay_arrivals.py``; the blocking-call validation gateway at 20/s), the
  earlier estimate, the middle of the busy run of recorded slices before the start, was
  11-13 ms late on average with a p95 error of 50-54 ms, this one 1-2 and 30-31 ms; replayed
  as recorded with each, the p95 came out −39% to −45% and −12% to −14% (−17% to −18% with
  the send times themselves; figures in docs/analyzer-rules.md). Where the recorder measured
  part of the wait (``tracekit.start_wait_ms``: from the server making the request's task to
  its first step), the request was ready that long before its start at the latest, and the
  expected gap is taken within that. On 28 kept validation runs' open-arrival recordings
  (``bench/replay_errors.py``) the as-recorded replay declined 6 of 106 with it, 11 without.
  The loop's busy periods include the recorded waits: recorded slices alone leave gaps where
  short steps ran, and read a saturated loop as idle. A closed loop's first requests (not
  chained) keep the earlier estimate.

Which: **the chains first, then a think-time peak, then the requests in flight**. A closed
loop of ``N`` independent clients holds about ``N`` requests in flight throughout (each
client has one, or is about to send it): a binomial count, whose dispersion (variance /
mean, time-weighted over the loop's active window) is ``1 - p`` for clients in flight a
share ``p`` of the time; open Poisson arrivals give a dispersion of 1, more when requests
queue. When fewer than ``min_fraction`` of the requests chain, a dispersion at or under
:data:`CLOSED_DISPERSION` still reads the trace as a closed loop (its ``N`` the most in
flight): clients slow to send again (a load generator sharing the host: 2 ms and more
between a response and the next request) chain poorly by idle time, and were read as open
arrivals before the count was used. The count does not overrule chains: clients that fall
into lock-step batches (all sending at once, then served one after another) swing it from
``N`` to 0 although they are a closed loop. Open arrivals at a fixed rate with a
near-constant latency (not Poisson) also hold a near-constant count: they would read as
closed.

Replayed latency is measured like the recorded one: from the request's first step on the
loop to its end.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.assembly.request_records import ms_value
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.stats.intervals import Interval, merge

_MS = 1e6
# Recorded busy slices closer than this form one busy run: the loop dispatching the next
# callback, or polling with nothing ready, takes less than a millisecond.
GAP_NS = 1_000_000
#: The think-time peak (:func:`_paced`): gaps are counted in bins this wide, from each end to
#: at most this many later starts (more than the clients that can start during one think).
THINK_BIN_MS = 5.0
THINK_WINDOW = 128
#: ... from this many ends at most, evenly spread (the peak is a share of them).
THINK_SAMPLE = 1_000
#: The peak (two adjacent bins) must hold this share of the requests, and this many times the
#: pairs an average two bins below twice its gap hold.
THINK_SHARE = 0.5
THINK_CONTRAST = 4.0
#: Shorter think times are left to the requests in flight: such clients are in flight most of
#: the time, so the count reads them, and a peak this close to 0 blurs with the loop's waits.
THINK_MIN_MS = 20.0
#: In-flight dispersion (variance / mean) at or under which the requests are a closed loop
#: (module docstring): clients in flight at least half the time.
CLOSED_DISPERSION = 0.5


@dataclass(frozen=True)
class InFlight:
    """The requests in flight over one loop's active window (first start to last end),
    weighted by time.

    Attributes:
        mean / variance: of the count. most: the largest count.
    """

    mean: float
    variance: float
    most: int

    @property
    def dispersion(self) -> float:
        """Variance over mean (0 for a constant count; 1 for Poisson arrivals)."""
        return self.variance / self.mean if self.mean > 0 else 0.0

    @property
    def closed(self) -> bool:
        """Whether the count says a closed loop (module docstring)."""
        return self.most >= 1 and self.dispersion <= CLOSED_DISPERSION

    def to_dict(self) -> dict[str, float]:
        """The model statement's ``in_flight`` object."""
        return {"mean": round(self.mean, 2), "max": self.most, "dispersion": round(self.dispersion, 2)}


def in_flight(group: list[RequestRecord]) -> InFlight:
    """The in-flight count of ``group`` (:class:`InFlight`). Cost: O(n log n)."""
    events = sorted([(r.start_ns, 1) for r in group] + [(r.end_ns, -1) for r in group])
    if not events or events[-1][0] <= events[0][0]:
        return InFlight(float(len(group)), 0.0, len(group))
    total = float(events[-1][0] - events[0][0])
    count, last, most = 0, events[0][0], 0
    first = second = 0.0  # time-weighted sums of the count and its square
    for t, step in events:
        first += count * (t - last)
        second += count * count * (t - last)
        count += step
        last = t
        most = max(most, count)
    mean = first / total
    return InFlight(mean, max(0.0, second / total - mean * mean), most)


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
        self.periods = _join(self.busy, GAP_NS)
        self._period_starts = [a for a, _ in self.periods]

    def covered(self, start: int, end: int) -> int:
        """Busy ns within [start, end]."""
        return max(0, self._busy_before(end) - self._busy_before(start))

    def _busy_before(self, t: int) -> int:
        i = bisect_right(self._starts, t)
        if i == 0:
            return 0
        a, b = self.busy[i - 1]
        return self._cum[i - 1] + (min(t, b) - a)

    def period_before(self, t: int) -> int | None:
        """The start of the busy period (``busy`` joined across gaps under 1 ms) that covers
        the millisecond before ``t``, or ``None`` if the loop was idle in it."""
        i = bisect_right(self._period_starts, t - GAP_NS) - 1
        if i < 0 or self.periods[i][1] < t - GAP_NS:
            return None
        return self.periods[i][0]

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
        in_flight: the recorded requests in flight (``None`` for a single request).
        read_by: what decided the arrivals: ``"in flight"`` (the count), ``"think time"``
            (the clients' think-time peak), ``"chains"`` (the share of requests that chain),
            or ``"option"`` (``arrivals`` was not ``auto``).
        think_ms: ``"think time"`` only: the peak's gap from a response to the next request.
    """

    ready: dict[int, float]
    chains: dict[int, tuple[int, float]]
    in_flight: InFlight | None = None
    read_by: str = "option"
    think_ms: float | None = None


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
    flight = in_flight(group) if len(group) > 1 else None
    read_by = "option" if mode != "auto" else "chains"
    think: float | None = None
    if mode != "open" and len(group) > 1:
        chains = _chains(group, busy, int(gap_ms * _MS))
        if mode == "auto" and len(chains) < min_fraction * (len(group) - 1):
            chains, think = _paced(group, busy, gap_ms)
            if chains:
                read_by = "think time"
            elif flight is not None and flight.closed:
                # A closed loop by the count, whose clients are too slow to chain by idle
                # time: every start follows an earlier end, each with its own think time.
                read_by = "in flight"
                slow = _chains(group, busy, None)
                chains = {p: (s, _think(group[p], group[s], busy, idle)) for p, (s, idle) in slow.items()}
        if chains and read_by == "chains":
            capped = percentile([idle for _, idle in chains.values()], 0.1)
            chains = {p: (s, min(idle, capped)) for p, (s, idle) in chains.items()}
            chains.update(_pair_leftovers(group, chains, capped))
    chained = {succ for succ, _ in chains.values()}
    first = [i for i in range(len(group)) if i not in chained]
    if not chains:
        return Arrivals(_open_ready(group, first, busy, t0_ns), chains, flight, read_by, think)
    ready: dict[int, float] = {}
    for i in first:  # each closed-loop client's first request: the middle of the busy run
        waited = busy.run_before(group[i].start_ns) // 2
        ready[i] = (group[i].start_ns - waited - t0_ns) / _MS
    return Arrivals(ready, chains, flight, read_by, think)


def _open_ready(
    group: list[RequestRecord], indexes: list[int], busy: BusyIndex, t0_ns: int
) -> dict[int, float]:
    """Ready times (ms from ``t0_ns``) of open arrivals (the module docstring)."""
    order = sorted(indexes, key=lambda i: group[i].start_ns)
    span = group[order[-1]].start_ns - group[order[0]].start_ns if order else 0
    rate = (len(order) - 1) / span if span > 0 else 0.0  # arrivals per ns
    ready: dict[int, float] = {}
    previous: float | None = None
    for i in order:
        start = group[i].start_ns
        began = busy.period_before(start)
        # Ready by the wait the recorder measured before its first step, at the latest.
        at = start - (ms_value(group[i].attributes.get(semconv.START_WAIT_MS)) or 0.0) * _MS
        if began is not None and previous is not None and rate > 0:
            low = max(previous, float(began))
            at = min(at, low + _expected_gap(rate, at - low)) if at > low else at
        if previous is not None:
            at = max(at, previous)  # arrivals keep their order (the ready queue is FIFO)
        ready[i] = (at - t0_ns) / _MS
        previous = at
    return ready


def _expected_gap(rate: float, within: float) -> float:
    """E[X | X <= within] for X exponential at ``rate``: when an arrival known to come
    within ``within`` of the last one is expected (``within / 2`` for a short window, the
    mean gap ``1 / rate`` for a long one)."""
    x = rate * within
    if x <= 0:
        return 0.0
    if x < 1e-6:
        return within / 2
    return 1 / rate - within * math.exp(-x) / -math.expm1(-x)


def _chains(
    group: list[RequestRecord], busy: BusyIndex, gap_ns: int | None
) -> dict[int, tuple[int, float]]:
    # gap_ns None: no limit on the idle time between an end and the start it is chained to.
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
        while (
            gap_ns is not None and candidates and _idle(busy, group[candidates[0]].end_ns, start) > gap_ns
        ):
            candidates.popleft()
        if candidates:
            pred = candidates.popleft()
            out[pred] = (i, _idle(busy, group[pred].end_ns, start) / _MS)
    return out


def _paced(
    group: list[RequestRecord], busy: BusyIndex, gap_ms: float
) -> tuple[dict[int, tuple[int, float]], float | None]:
    # Clients with a fixed think time (module docstring): the peak of the gaps from each end to
    # the later starts, if there is one from THINK_MIN_MS and ``gap_ms`` on, and each end
    # chained to the start nearest end + think, nearest pairs first.
    order = sorted(range(len(group)), key=lambda i: group[i].start_ns)
    starts = [group[i].start_ns for i in order]
    # The peak from THINK_SAMPLE ends at most: every end's THINK_WINDOW gaps, kept as pairs,
    # were 2.5 million tuples for a 20,000-request window, and open arrivals (no peak) come
    # here every time. The matching below looks near the peak only.
    looked = group[:: max(1, len(group) // THINK_SAMPLE)]
    bins: dict[int, int] = {}
    for req in looked:
        first = bisect_right(starts, req.end_ns)
        for k in range(first, min(first + THINK_WINDOW, len(starts))):
            b = int((starts[k] - req.end_ns) / _MS // THINK_BIN_MS)
            bins[b] = bins.get(b, 0) + 1
    if not bins:
        return {}, None
    peak = max(sorted(bins), key=lambda b: bins[b] + bins.get(b + 1, 0))
    held = bins[peak] + bins.get(peak + 1, 0)
    below = sum(n for b, n in bins.items() if b < 2 * peak + 2) / (peak + 1)  # per two bins
    short = peak * THINK_BIN_MS < max(gap_ms, THINK_MIN_MS)
    if short or held < THINK_SHARE * len(looked) or held < THINK_CONTRAST * below:
        return {}, None
    think = (peak + 1) * THINK_BIN_MS
    # A start is recorded when the loop first runs it: later than the client sent it when the
    # loop was busy (the demo's fixed gateway: up to 40 ms later), never earlier.
    lo, hi = think - 2 * THINK_BIN_MS, 1.5 * think
    near: list[tuple[float, int, int]] = []  # (distance from the peak, end's request, start's)
    for p, req in enumerate(group):
        first = bisect_left(starts, req.end_ns + int(lo * _MS))
        last = min(bisect_right(starts, req.end_ns + int(hi * _MS)), first + THINK_WINDOW)
        near += ((abs((starts[k] - req.end_ns) / _MS - think), p, order[k]) for k in range(first, last))
    near.sort()
    out: dict[int, tuple[int, float]] = {}
    taken: set[int] = set()
    for _, p, s in near:
        if p not in out and s not in taken:
            taken.add(s)
            idle = _idle(busy, group[p].end_ns, group[s].start_ns) / _MS
            out[p] = (s, _think(group[p], group[s], busy, idle))
    return out, think


def _think(pred: RequestRecord, succ: RequestRecord, busy: BusyIndex, idle_ms: float) -> float:
    # A slow client's own think time: the gap less the successor's estimated wait for the
    # loop (half the busy run before its start, as for a closed loop's first requests),
    # within [the loop's idle time in the gap (the successor was not ready while the loop
    # idled), the gap].
    gap = (succ.start_ns - pred.end_ns) / _MS
    waited = busy.run_before(succ.start_ns) / 2 / _MS
    return min(gap, max(idle_ms, gap - waited))


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
