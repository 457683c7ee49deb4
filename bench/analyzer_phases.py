"""Instructions of the analyzer's phases in one process, for callgrind (independent of load).

Runs the reader, assembly and aggregation (and the report) on a trace file, up to a phase;
each phase's instructions are its run's ``I refs`` less the previous phase's::

    head -n 200 traces.jsonl > part.jsonl     # 102,400 spans of bench/gen_traces.py output
    for upto in imports pipeline pipeline-unpacked report; do
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
            python bench/analyzer_phases.py part.jsonl --upto $upto
    done

- reading, assembling and aggregating = pipeline - imports (the sample packed, as in a
  parallel reader's worker);
- the report on the sample (rules, replay, projections, JSON) = report - pipeline-unpacked.

To compare two versions, run the same with ``PYTHONPATH`` set to a built worktree of the
other (``git worktree add /tmp/old REV && cd /tmp/old && python setup.py build_ext
--inplace``) from a folder outside both checkouts.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterator

PHASES = ("imports", "pipeline", "pipeline-unpacked", "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="OTLP JSON Lines")
    parser.add_argument("--upto", choices=PHASES, required=True)
    args = parser.parse_args(argv)

    from tracekit.analysis._otlp_typed import typed_spans
    from tracekit.analysis.assembly.grouping import assemble
    from tracekit.analysis.model import Span
    from tracekit.analysis.report import build_report
    from tracekit.analysis.stats.aggregate import Aggregator

    gc.disable()  # as analyze() does

    def spans() -> Iterator[Span]:
        with open(args.file, "rb", buffering=4 * 2**20) as f:
            for line in f:
                yield from typed_spans(line) or ()

    if args.upto == "imports":
        return 0
    agg = Aggregator(pack_sample=args.upto == "pipeline")
    for request in assemble(spans()):
        agg.add(request)
    if args.upto == "report":
        build_report(agg, source=args.file, spans=0, services=[]).to_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
