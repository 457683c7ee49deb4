"""A stage's recorded loop waits, as the replay reads them.

Recordings made before 2026-12-06 book a run of checkpoints taken right before a wait for I/O
(after sending a request, anyio's streams check for cancellation before they wait for the
reply) as loop wait only from the data's arrival on: the rest overlapped the I/O. Those
recorders took that part out of the stage's ``tracekit.loop_wait_ms`` but not out of its
``tracekit.loop_waits_us`` intervals, where each checkpoint's wait of 1 ms or more was already
noted. The replay turns the time between a stage's steps into delays *less its recorded loop
waits*, so read as recorded those intervals took the overlapped I/O out of the delays: a
streamed model call on a busy loop (a chain of checkpoints, each ready at once and waiting
for the loop while the model worked) kept 19 ms of its 195 ms of I/O, and open arrivals at
20-30 requests/s replayed 16-24% short (``bench/validate.py``'s `cpu-on-loop` and
`blocking-call-on-loop` cases; on their recordings the intervals added up to 1.2-1.45 times
the stages' ``loop_wait_ms``). The recorder now counts only the last checkpoint before the
wait as part of it and drops its interval too (``tracekit/_core/ledger.py``, ``resume``;
``docs/attributes.md``, "The checkpoint before I/O"): its intervals add up to the sum.

The correction applies the recorder's own rule to the intervals: where they add up to more
than ``loop_wait_ms`` (by more than :data:`SLACK_NS`), the excess is cut from the earliest
intervals first (the checkpoints before the data arrived), whole intervals, then the start
of the next.
"""

from __future__ import annotations

from tracekit.analysis.model import StageRecord
from tracekit.analysis.stats.intervals import Interval

#: Intervals may add up to a little more than the sum (rounding to µs, waits under 1 ms in
#: the sum only): below this, they are read as recorded.
SLACK_NS = 1_000_000
_MS = 1_000_000


def recorded_loop_waits(stage: StageRecord) -> list[Interval]:
    """``stage``'s loop-wait intervals, trimmed to its ``loop_wait_ms`` (module docstring).

    Cost: O(waits log waits), only for a stage whose intervals exceed its sum.
    """
    waits = stage.loop_waits
    if not waits or stage.loop_wait_ms is None:
        return waits
    excess = sum(b - a for a, b in waits) - stage.loop_wait_ms * _MS
    if excess <= SLACK_NS:
        return waits
    out: list[Interval] = []
    for a, b in sorted(waits):
        if excess >= b - a:
            excess -= b - a
            continue
        out.append((a + int(excess), b))
        excess = 0
    return out
