"""Do the validation and the projections hold when the replay sees fewer requests?

The replay works on a window of the request sample (``ReplayConfig.max_requests``, the
earliest requests). This measures what the window size changes on a given trace: it reads
the trace as ``tracekit analyze`` does (the same sample), then for each size N replays
exactly the earliest N instrumented requests and runs the rules with their projections.
The table in ``docs/analyzer-rules.md`` ("Replay window") comes from it::

    python -m tracekit.analysis.replay.stability TRACE [--sizes 20000,5000,2000]

Prints, per size, the validation (worst route's p50 / p95 error) and each finding's
projected p50 and p95 (before -> after), or its note.

Cost: one validation and one replay per projecting finding, per size.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from typing import Any

from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import ReplayConfig, Replayer
from tracekit.analysis.rules.findings import RuleContext


def stability(sample: Sequence[RequestRecord], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Validation and findings of ``sample`` when the replay sees the earliest N requests.

    Args:
        sample: the request sample (as the aggregator keeps it).
        sizes: window sizes N.

    Returns:
        Per size: ``{"size", "validation" (``Validation.to_dict()``), "findings"}``, each
        finding as ``(rule, route, stage, projection or None, note or None)``.
    """
    from tracekit.analysis.rules import DEFAULT_RULES

    out: list[dict[str, Any]] = []
    for size in sizes:
        replayer = Replayer(ReplayConfig(max_requests=size, max_window=size))
        ctx = RuleContext(project=replayer.project)
        validation = replayer.validate(sample).to_dict()
        found = [f for rule in DEFAULT_RULES for f in rule(sample, ctx)]
        findings = [(f.rule, f.route, f.stage, f.projection, f.projection_note) for f in found]
        out.append({"size": size, "validation": validation, "findings": findings})
    return out


def _sample(path: str) -> list[RequestRecord]:
    from tracekit.analysis.assembly.grouping import assemble
    from tracekit.analysis.readers import read_spans
    from tracekit.analysis.stats.aggregate import Aggregator

    agg = Aggregator()
    stream = read_spans(path)
    try:
        for req in assemble(stream):
            agg.add(req)
    finally:
        stream.close()
    return agg.sample()


def _line(result: dict[str, Any]) -> str:
    v = result["validation"]
    head = f"N={result['size']:>6,}: validation ok={v['ok']}"
    if v["p50_error"] is not None:
        head += f" p50 {v['p50_error']:+.1%} p95 {v['p95_error']:+.1%}"
    parts = [head]
    for rule, route, stage, projection, note in result["findings"]:
        if projection is None:
            parts.append(f"  {rule} {route} {stage}: no projection ({note})")
        else:
            p50, p95 = projection["p50_ms"], projection["p95_ms"]
            parts.append(f"  {rule} {route} {stage}: p50 {p50[0]:.1f} -> {p50[1]:.1f} ms, "
                         f"p95 {p95[0]:.1f} -> {p95[1]:.1f} ms")  # fmt: skip
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a trace file tracekit analyze reads")
    parser.add_argument("--sizes", default="20000,5000,2000", help="window sizes, comma-separated")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    gc.disable()  # as the analyzer does: many long-lived objects, no cycles worth collecting
    for result in stability(_sample(args.trace), sizes):
        print(_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
