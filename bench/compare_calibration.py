"""How often ``tracekit compare``'s intervals call a change where there is none (A/A).

Each trace given is cut in two at its middle request (in time order) and the first half is
compared with the second: the same gateway, load and host, so a 95% interval should exclude
no change about 5% of the time. Per statistic (latency p50 and p95, the mean of each
breakdown component) this prints the share of traces whose interval excluded zero, with the
intervals as ``compare`` computes them (neighbours' dependence read from the values in time
order: ``tracekit.analysis.stats.confidence``) and with the values taken as independent (the
same halves, each shuffled, which leaves no dependence to read).

The halves are not exact repeats: a run warms up and drifts, so some of what is called is
real. The point is the difference between the two columns on the same halves.

Run: .venv/bin/python bench/compare_calibration.py DIR... (folders of ``bench/validate.py
--keep``: every ``*.jsonl`` in them)
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tracekit.analysis.api import analyze
from tracekit.analysis.stats.confidence import mean_change, quantile_change
from tracekit.analysis.stats.route_stats import BREAKDOWN_KEYS
from tracekit.analysis.stats.route_values import RouteCollector


def halves(values: list[float]) -> tuple[list[float], list[float]]:
    middle = len(values) // 2
    return values[:middle], values[middle:]


def called(first: list[float], second: list[float], stat: str) -> bool:
    """Whether the 95% interval of ``stat``'s change excludes zero."""
    if stat in ("p50", "p95"):
        change = quantile_change(first, second, 0.5 if stat == "p50" else 0.95, confidence=0.95,
                                 draws=2000, rng=random.Random(0))  # fmt: skip
    else:
        change = mean_change(first, second, confidence=0.95)
    return change.significant is True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", type=Path, nargs="+")
    traces = [t for folder in parser.parse_args().folders for t in sorted(folder.glob("*.jsonl"))]
    if not traces:
        raise SystemExit("compare_calibration: no *.jsonl in the folders given")
    stats = ["p50", "p95", *BREAKDOWN_KEYS]
    counts = {s: [0, 0, 0] for s in stats}  # traces, called in time order, called shuffled
    shuffle = random.Random(1).shuffle
    for trace in traces:
        collector = RouteCollector()
        analyze(str(trace), observe=collector.add)
        values = max(collector.routes.values(), key=lambda v: len(v.wall))
        series = {"p50": values.in_time(values.wall), "p95": values.in_time(values.wall)}
        series.update({k: values.in_time(p) for k, p in zip(BREAKDOWN_KEYS, values.parts, strict=True)})
        for stat, ordered in series.items():
            if len(ordered) < 200 or len(set(ordered)) < 2:
                continue
            first, second = halves(ordered)
            counts[stat][0] += 1
            counts[stat][1] += called(first, second, stat)
            # The same halves, each shuffled: no order left to read a dependence from.
            shuffle(first)
            shuffle(second)
            counts[stat][2] += called(first, second, stat)
    print(f"{len(traces)} traces; first half against second half; share of 95% intervals excluding 0")
    print(f"{'statistic':<14}{'traces':>7}{'in time order':>15}{'shuffled':>10}")
    for stat, (n, ordered, shuffled) in counts.items():
        if n:
            print(f"{stat:<14}{n:>7}{100 * ordered / n:>14.0f}%{100 * shuffled / n:>9.0f}%")


if __name__ == "__main__":
    main()
