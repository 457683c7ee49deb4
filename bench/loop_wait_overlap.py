"""Did a block on the loop really delay the calls it overlapped? Read from a recording.

For every ``--stage`` span (default ``model``), the other requests' ``--block`` stages
(default ``lookup``: bench/validate.py's ``blocking-call-on-loop`` gateway, whose lookup
holds the loop with a sync client) that overlapped it. Printed: how many calls a block
overlapped, their wall time (p50) against the calls none overlapped, how long after the
block's end they ended, and the loop wait tracekit booked on them. A block that delayed a
call makes it longer than the others by about the wait booked; a call as long as the others
that ends well after the block was not delayed, whatever was booked (docs/analyzer-rules.md,
runs O-S).

Run: .venv/bin/python bench/loop_wait_overlap.py TRACE [--stage model] [--block lookup]
     (the traces ``bench/validate.py --keep DIR`` keeps, e.g.
     DIR/blocking-call-on-loop-closed2-before.jsonl)
"""

from __future__ import annotations

import argparse
import statistics

from tracekit.analysis.api import analyze


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--stage", default="model")
    parser.add_argument("--block", default="lookup")
    args = parser.parse_args()
    reqs = analyze(args.trace).sample
    blocks = [(s.start_ns, s.end_ns, r.trace_id) for r in reqs for s in r.stages if s.name == args.block]
    overlapped, alone = [], []
    for req in reqs:
        for s in req.stages:
            if s.name != args.stage:
                continue
            ends = [b for a, b, trace in blocks if trace != req.trace_id and a < s.end_ns and b > s.start_ns]
            wall = (s.end_ns - s.start_ns) / 1e6
            if ends:
                overlapped.append((wall, (s.end_ns - max(ends)) / 1e6, s.loop_wait_ms or 0.0))
            else:
                alone.append(wall)
    total = len(overlapped) + len(alone)
    print(f"{args.stage} calls a {args.block} block of another request overlapped: "
          f"{len(overlapped)} of {total}")
    if overlapped:
        walls, after, waits = zip(*overlapped, strict=True)
        print(f"  their wall p50 {statistics.median(walls):.1f} ms, ended {statistics.median(after):.1f} ms "
              f"after the block (p50), loop wait booked p50 {statistics.median(waits):.1f} ms")
    if alone:
        print(f"  the others' wall p50 {statistics.median(alone):.1f} ms")


if __name__ == "__main__":
    main()
