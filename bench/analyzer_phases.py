"""Instructions of the analyzer's phases in one process, for callgrind (independent of load).

Runs the pipeline of ``tracekit analyze`` in one process (reader, assembly, aggregation; then
the report) on a trace file, up to a phase;
each phase's instructions are its run's ``I refs`` less the previous phase's::

    head -n 200 traces.jsonl > part.jsonl     # 102,400 spans of bench/gen_traces.py output
    for upto in imports pipeline pipeline-unpacked report; do
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
            python bench/analyzer_phases.py part.jsonl --upto $upto
    done

- reading, assembling and aggregating = pipeline - imports (the sample packed, as in a
  parallel reader's worker);
- the report on the sample (rules, replay, projections, JSON) = report - pipeline-unpacked.

To compare two versions, run the same with ``PYTHONPATH`` set to a worktree of the other
(``git worktree add /tmp/old REV``) from a folder outside both checkouts, with
``TRACEKIT_PURE_PYTHON=1`` for the analyzer as it runs now (plain Python).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys

PHASES = ("imports", "pipeline", "pipeline-unpacked", "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="OTLP JSON Lines")
    parser.add_argument("--upto", choices=PHASES, required=True)
    args = parser.parse_args(argv)

    from tracekit.analysis.pipeline import BATCH_SPANS, Pipeline, Settings
    from tracekit.analysis.readers import read_spans
    from tracekit.analysis.report import build_report

    gc.disable()  # as analyze() does
    if args.upto == "imports":
        return 0
    pipeline = Pipeline(Settings(), pack_sample=args.upto == "pipeline")
    spans = iter(read_spans(args.file))
    while batch := list(itertools.islice(spans, BATCH_SPANS)):
        pipeline.add(batch)
    pipeline.finish()
    if args.upto == "report":
        build_report(pipeline.aggregator, source=args.file, spans=0, services=[]).to_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
