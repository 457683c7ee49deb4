"""Analyzer throughput: ``tracekit analyze`` on 1,000,000 tracekit-shaped spans.

Method (written into ``docs/performance-analyzer.md`` with the results):

1. ``bench/gen_traces.py`` writes N spans (default 1,000,000) of a simulated gateway under
   load as OTLP JSON Lines (512 spans per line, in end order, like the core's exporter).
2. Each measured command runs as its own child process; its wall time is taken around the
   child and its peak RSS from the child's own ``rusage`` (``os.wait4``), so the parent's
   memory never counts. Each is run ``--repeat`` times and the best (least disturbed) run is
   reported, with the others alongside.
3. Four commands, to show where the time goes:
   ``parse``: ``orjson.loads`` of every line, nothing else: the floor any reader of this
   format pays; ``read``: tracekit's reader (``read_spans``), spans consumed and dropped;
   ``pipeline``: reader, assembly and aggregation, no rules and no output;
   ``analyze``: the whole ``tracekit analyze FILE --format json -o OUT`` (adds the rules,
   the replay's validation and projections on the sample, and the JSON output).

Usage::

    python bench/analyze_throughput.py [--spans 1000000] [--repeat 2] [--keep DIR] [--no-doc]

Targets (issue 3): >= 100,000 spans/s and peak RSS <= 300 MB.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance-analyzer.md"
TARGET_SPANS_PER_S = 100_000
TARGET_RSS_MB = 300

PARSE = """
import sys, orjson
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        if line.strip():
            orjson.loads(line)
"""
READ = """
import sys
from tracekit.analysis.sources import read_spans
n = 0
for _ in read_spans(sys.argv[1]):
    n += 1
print(n)
"""
PIPELINE = """
import gc, sys
from tracekit.analysis.aggregate import Aggregator
from tracekit.analysis.assemble import assemble
from tracekit.analysis.sources import read_spans
gc.disable()  # as analyze() does
agg = Aggregator()
for request in assemble(read_spans(sys.argv[1])):
    agg.add(request)
agg.routes()
"""


@dataclass
class Run:
    """One measured child process."""

    wall_s: float
    rss_mb: float


def measure(argv: list[str]) -> Run:
    """Run ``argv`` as a child; its wall time and its own peak RSS.

    Raises:
        RuntimeError: the child failed.
    """
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    stderr = child.stderr.read().decode() if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[:4]} failed: {stderr.strip()}")
    return Run(wall, usage.ru_maxrss / 1024)  # Linux reports KiB


def best(argv: list[str], repeat: int) -> tuple[Run, list[Run]]:
    runs = [measure(argv) for _ in range(repeat)]
    return min(runs, key=lambda r: r.wall_s), runs


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs ({model or platform.machine()}), "
        f"Python {platform.python_version()}, load average before the run {load}"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the generated file in this folder")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite the doc")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT / "bench"))
    import gen_traces

    folder = args.keep or Path(tempfile.mkdtemp(prefix="tracekit-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    traces = folder / f"traces-{args.spans}.jsonl"
    env_line = machine()
    if not traces.exists():
        t = time.perf_counter()
        gen_traces.write_jsonl(traces, args.spans)
        print(f"generated {traces} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    n_spans = sum(len(line) and line.count(b'"spanId"') for line in traces.open("rb"))
    size_mb = traces.stat().st_size / 1e6
    py = sys.executable
    out = folder / "report.json"
    commands = {
        "parse": [py, "-c", PARSE, str(traces)],
        "read": [py, "-c", READ, str(traces)],
        "pipeline": [py, "-c", PIPELINE, str(traces)],
        "analyze": [
            py,
            "-m",
            "tracekit",
            "analyze",
            str(traces),
            "--format",
            "json",
            "-o",
            str(out),
        ],
    }
    results = {}
    for name, command in commands.items():
        results[name] = best(command, args.repeat)
        run = results[name][0]
        print(
            f"{name:8} {run.wall_s:7.1f} s  {n_spans / run.wall_s:9,.0f} spans/s  "
            f"peak RSS {run.rss_mb:6.0f} MB",
            file=sys.stderr,
        )
    text = render(n_spans, size_mb, env_line, results, args.repeat)
    if not args.no_doc:
        DOC.write_text(text)
        print(f"wrote {DOC}", file=sys.stderr)
    if args.keep is None:
        traces.unlink()
        out.unlink(missing_ok=True)
        folder.rmdir()
    return 0


def render(
    n_spans: int,
    size_mb: float,
    env_line: str,
    results: dict[str, tuple[Run, list[Run]]],
    repeat: int,
) -> str:
    """The performance doc: results, then the method."""
    rows = []
    for name, (run, runs) in results.items():
        others = ", ".join(f"{r.wall_s:.1f} s" for r in runs)
        rows.append(
            f"| `{name}` | {run.wall_s:.1f} s | {n_spans / run.wall_s:,.0f} | "
            f"{run.rss_mb:.0f} MB | {others} |"
        )
    analyze_run = results["analyze"][0]
    rate = n_spans / analyze_run.wall_s
    verdict_rate = "meets" if rate >= TARGET_SPANS_PER_S else "misses"
    verdict_rss = "meets" if analyze_run.rss_mb <= TARGET_RSS_MB else "misses"
    wall = {name: run.wall_s for name, (run, _) in results.items()}
    parse_rate = n_spans / wall["parse"]
    us = {  # per span, from the differences between the commands
        "parsing JSON (orjson)": wall["parse"],
        "building spans (the reader's Python)": wall["read"] - wall["parse"],
        "assembly and aggregation": wall["pipeline"] - wall["read"],
        "rules, replay, projections, output (fixed: 20,000-request sample)": (
            wall["analyze"] - wall["pipeline"]
        ),
    }
    split = "\n".join(
        f"| {what} | {seconds:.1f} s | {1e6 * seconds / n_spans:.1f} µs |"
        for what, seconds in us.items()
    )
    python_us = 1e6 * (wall["pipeline"] - wall["parse"]) / n_spans
    gap = (
        "Per span, the Python work on top of parsing (building the `Span`, then assembly and "
        f"aggregation) costs {python_us:.0f} µs, "
        f"{(wall['pipeline'] - wall['parse']) / wall['parse']:.1f}x the parse itself, and the "
        "rules and replay add a fixed cost for the 20,000-request sample. Reaching the target "
        "needs that work out of the interpreter: decoding OTLP JSON straight into typed "
        "records in native code (a typed decoder such as msgspec Structs, or a compiled "
        "reader) instead of building dicts and then `Span` objects from them, and spreading "
        "traces over processes by trace id with mergeable aggregates (the percentile "
        "structures merge by adding buckets). Neither is done yet; memory already meets its "
        "target and does not grow with the input."
    )
    floor = f"Parsing alone reaches {parse_rate:,.0f} spans/s here, " + (
        "below the target: no reader of this format in one Python process can meet it on "
        "this machine; what remains is to shrink the Python work on top of parsing."
        if parse_rate < TARGET_SPANS_PER_S
        else "above the target: the gap is the Python work on top of parsing."
    )
    return f"""# Analyzer performance

Generated by `python bench/analyze_throughput.py` (this file is rewritten by each run).

## Result

`tracekit analyze` on {n_spans:,} tracekit-shaped spans ({size_mb:,.0f} MB of OTLP JSON Lines):
**{rate:,.0f} spans/s** ({verdict_rate} the target of {TARGET_SPANS_PER_S:,}) and a peak RSS of
**{analyze_run.rss_mb:.0f} MB** ({verdict_rss} the target of {TARGET_RSS_MB} MB).

Machine: {env_line}.

| command | best wall | spans/s | peak RSS | all runs ({repeat}) |
|---|---:|---:|---:|---|
{chr(10).join(rows)}

Where the time goes (differences between the commands' best runs; the runs are separate, so
on a shared machine a difference can come out slightly off or even negative):

| part | wall | per span |
|---|---:|---:|
{split}

{floor}

- `parse`: `orjson.loads` of every line and nothing else. This is the floor for any reader of
  this format in Python on this machine: {parse_rate:,.0f} spans/s. A span of the core's
  shape is about {1e6 * size_mb / n_spans:,.0f} bytes of JSON with some 15 attributes, each
  an object of its own in OTLP JSON, so parsing alone creates ~60 Python objects per span.
- `read`: tracekit's reader (`tracekit.analysis.sources.read_spans`): parsing plus turning
  each span into a `Span` (ids, times, typed attribute map).
- `pipeline`: the reader, assembly and aggregation (no rules, no output).
- `analyze`: the whole command: the above plus the rules, the replay's validation and the
  projections on the 20,000-request sample, and writing the JSON report.

## Method

1. `bench/gen_traces.py` simulates a gateway under load: Poisson arrivals at 40 requests/s
   into one event loop (a FIFO single server); each request runs its handler and four
   stages (`tokenize` on the loop, `guardrail` I/O, `model` waiting then streaming 8-24
   chunks, `serialize` on the loop), so that one request's tokenize delays the others.
   Spans carry every attribute the core writes (DESIGN §2, `tracekit.semconv`), including
   loop slices and loop waits, and are written in end order, 512 per line, as the core's
   `jsonl` exporter does. Seeded: the same arguments give the same file.
2. Every command runs as its own child process. Wall time is measured around the child;
   peak RSS is the child's own `ru_maxrss` from `os.wait4`, so the benchmark's own memory
   never counts. Each command is run {repeat} times; the fastest run is reported (the machine
   is shared, slower runs are disturbed ones) and all runs are listed.
3. Why memory stays bounded (DESIGN §6): assembly holds at most 10,000 open traces and
   flushes a trace 10,000 spans after its root span arrived; aggregation keeps per route and
   stage counters and percentile structures (exact up to 2,048 values, then a 1% log
   histogram); the rules and the replay see a sample of the 20,000 earliest requests, whose
   already-decoded attributes are dropped. None of this grows with the number of spans.
4. What was changed after profiling (cProfile and tracemalloc on 200,000 spans): the cyclic
   garbage collector is paused while the pipeline runs (it rescanned the ~10^5 objects the
   window and the sample keep alive again and again); the open-trace window and the set of
   flushed traces are `OrderedDict`s (popping the oldest entry of a plain dict over and over
   rescans its deleted slots: quadratic); kept requests drop the attributes already decoded
   into fields and share repeated strings (names, kinds, code locations); assembly reads the
   `tracekit.*` values through an inline fast path.

## What it would take

{gap}
"""


if __name__ == "__main__":
    sys.exit(main())
