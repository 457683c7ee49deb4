"""How much a stage's calls overlap one another, and how long they take alone and overlapped.

For every span named ``--stage`` in a trace file (any format ``tracekit analyze`` reads):
the share of its wall time during which another call of the same stage ran, then the wall
time p50 of the calls that ran alone (under 5% overlapped) and of those overlapped for more
than half their time. A fix that moves CPU to a worker thread lets the calls overlap; on a
host short of CPU each overlapped call gets less of a core (docs/analyzer-rules.md, "A host
short of CPU").

Run: .venv/bin/python bench/stage_overlap.py TRACE [TRACE ...] [--stage tokenize]
"""

from __future__ import annotations

import argparse
import statistics

from tracekit.analysis.readers import read_spans


def overlap(path: str, stage: str) -> str:
    calls = sorted((s.start_ns, s.end_ns) for s in read_spans(path) if s.name == stage)
    if not calls:
        return f"{path}: no {stage!r} spans"
    shares = []
    for i, (start, end) in enumerate(calls):
        # Calls are sorted by start: only neighbours that start before this one ends overlap.
        shared = sum(max(0, min(end, e) - max(start, s)) for j, (s, e) in enumerate(calls)
                     if j != i and s < end and e > start)  # fmt: skip
        shares.append(shared / (end - start) if end > start else 0.0)
    walls = [(end - start) / 1e6 for start, end in calls]
    alone = [w for w, share in zip(walls, shares, strict=True) if share < 0.05]
    together = [w for w, share in zip(walls, shares, strict=True) if share > 0.5]

    def p50(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ms ({len(values)})" if values else "- (0)"

    return (f"{path}: {len(calls)} calls, {statistics.mean(shares):.0%} of their time overlapped; "
            f"wall p50 alone {p50(alone)}, overlapped over half {p50(together)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--stage", default="tokenize")
    args = parser.parse_args()
    for path in args.traces:
        print(overlap(path, args.stage))


if __name__ == "__main__":
    main()
