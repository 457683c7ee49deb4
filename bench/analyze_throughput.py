"""Analyzer throughput: ``tracekit analyze`` on 1,000,000 tracekit-shaped spans, as plain Python.

Method (written into ``docs/performance-analyzer.md`` with the results):

1. ``bench/gen_traces.py`` writes N spans (default 1,000,000) of a simulated gateway under
   load as OTLP JSON Lines (512 spans per line, in end order, like the core's exporter).
2. Each measured command runs as its own child process (which may start worker processes),
   with ``TRACEKIT_PURE_PYTHON=1``: the analyzer is plain Python. Wall time is taken around
   the child; CPU time is the child's and its workers' (``wait4`` counts waited-for
   descendants); memory is the peak of the *sum* of the RSS of the child and all its
   descendants, sampled from ``/proc`` every 50 ms, next to the largest single process
   (``ru_maxrss``). The 1-minute load average is read before and after each command (the
   machine is shared: other jobs' load shows there). Each command runs ``--repeat`` times
   and the fastest run is reported (slower runs are disturbed ones), all runs alongside.
3. Four commands: ``parse`` (msgspec's decode of every line into the reader's structs: the
   floor under the reader); ``phases`` (one process that times, in CPU, ``read_spans``, then
   reader + assembly + aggregation, then the report: where the time goes, without
   differences between separate runs); ``analyze-1`` (the whole
   ``tracekit analyze FILE --format json -o OUT`` in one process) and ``analyze`` (the same
   command as users run it: one worker process per CPU).

Usage::

    python bench/analyze_throughput.py [--spans 1000000] [--repeat 2] [--keep DIR] [--no-doc]

Targets (issue 12): 1,000,000 spans in <= 20 s on 2 cores, peak RSS <= 300 MB.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance-analyzer.md"
TARGET_WALL_S = 20.0  # for 1,000,000 spans on 2 cores
TARGET_SPANS = 1_000_000
TARGET_RSS_MB = 300
SAMPLE_S = 0.05
PLAIN_PYTHON = {"TRACEKIT_PURE_PYTHON": "1"}
_HEADER = (
    "| command | best wall | spans/s | CPU, all processes | per span | peak RSS, sum "
    "| largest process | load before / after | all runs ("
)

PARSE = """
import sys
from tracekit.analysis.readers.otlp_schema import LINE
with open(sys.argv[1], "rb", buffering=4 * 2**20) as f:
    for line in f:
        if line.strip():
            LINE.decode(line)
"""
PHASES = """
import gc, itertools, json, sys, time
from tracekit.analysis.pipeline import BATCH_SPANS, Pipeline, Settings
from tracekit.analysis.report import build_report
from tracekit.analysis.readers import read_spans
gc.disable()  # as analyze() does
path = sys.argv[1]
clock = [time.process_time()]
for _ in read_spans(path):
    pass
clock.append(time.process_time())
pipeline = Pipeline(Settings())
spans = iter(read_spans(path))
while batch := list(itertools.islice(spans, BATCH_SPANS)):
    pipeline.add(batch)
pipeline.finish()
clock.append(time.process_time())
build_report(pipeline.aggregator, source=path, spans=0, services=[]).to_json()
clock.append(time.process_time())
print(json.dumps([b - a for a, b in zip(clock, clock[1:])]))
"""


@dataclass
class Run:
    """One measured child process (and its workers)."""

    wall_s: float
    cpu_s: float
    rss_mb: float  # peak of the sum over the process tree, sampled
    largest_mb: float  # the largest single process (ru_maxrss)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    output: str = ""  # what the child printed


class TreeRss:
    """Samples the summed RSS of a process and its descendants until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling; the peak in MB."""
        self._stop.set()
        self._thread.join()
        return self.peak_kb / 1024

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, sum(_rss_kb(pid) for pid in self._tree()))
            self._stop.wait(SAMPLE_S)

    def _tree(self) -> list[int]:
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                    todo.extend(int(child) for child in text.split())
            except OSError:
                pass  # exited meanwhile
        return tree


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(argv: list[str], env: dict[str, str] | None = None) -> Run:
    """Run ``argv`` as a child; wall time, CPU time and peak RSS of it and its workers.

    Raises:
        RuntimeError: the child failed.
    """
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            argv, cwd=ROOT, stdout=out, stderr=err, env={**os.environ, **PLAIN_PYTHON, **(env or {})}
        )
        sampler = TreeRss(child.pid)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        rss_mb = sampler.stop()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[:4]} failed: {stderr.strip()}")
    largest = usage.ru_maxrss / 1024  # Linux reports KiB: the child or its largest worker
    load = (load_before, os.getloadavg()[0])
    return Run(wall, usage.ru_utime + usage.ru_stime, max(rss_mb, largest), largest, load, stdout)


def best(argv: list[str], repeat: int, env: dict[str, str] | None = None) -> tuple[Run, list[Run]]:
    runs = [measure(argv, env) for _ in range(repeat)]
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
    if not traces.exists():
        t = time.perf_counter()
        gen_traces.write_jsonl(traces, args.spans)
        print(f"generated {traces} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    n_spans = sum(len(line) and line.count(b'"spanId"') for line in traces.open("rb"))
    size_mb = traces.stat().st_size / 1e6
    env_line = machine()
    py = sys.executable
    out = folder / "report.json"
    analyze = [py, "-m", "tracekit", "analyze", str(traces), "--format", "json", "-o", str(out)]
    commands: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "parse": ([py, "-c", PARSE, str(traces)], None),
        "phases": ([py, "-c", PHASES, str(traces)], None),
        "analyze-1": (analyze, {"TRACEKIT_ANALYZE_WORKERS": "1"}),
        "analyze": (analyze, None),
    }
    results = {}
    for name, (command, env) in commands.items():
        results[name] = best(command, args.repeat, env)
        run = results[name][0]
        print(
            f"{name:10} {run.wall_s:7.1f} s  {n_spans / run.wall_s:9,.0f} spans/s  "
            f"cpu {run.cpu_s:6.1f} s  peak RSS {run.rss_mb:6.0f} MB (largest process "
            f"{run.largest_mb:.0f} MB)  load {run.load[0]:.2f} -> {run.load[1]:.2f}",
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


def phase_times(output: str) -> tuple[float, float, float]:
    """The ``phases`` child's three CPU times: read, then pipeline (read included), report."""
    import json

    read, pipeline, report = json.loads(output.strip().splitlines()[-1])
    return read, pipeline, report


def render(
    n_spans: int,
    size_mb: float,
    env_line: str,
    results: dict[str, tuple[Run, list[Run]]],
    repeat: int,
) -> str:
    """The performance doc: results, then the method and what the analyzer does."""
    rows = []
    for name, (run, runs) in results.items():
        others = ", ".join(f"{r.wall_s:.1f} s" for r in runs)
        rows.append(
            f"| `{name}` | {run.wall_s:.1f} s | {n_spans / run.wall_s:,.0f} | "
            f"{run.cpu_s:.1f} s | {1e6 * run.cpu_s / n_spans:.1f} µs | {run.rss_mb:.0f} MB | "
            f"{run.largest_mb:.0f} MB | {run.load[0]:.2f} / {run.load[1]:.2f} | {others} |"
        )
    top = results["analyze"][0]
    rate = n_spans / top.wall_s
    target_s = TARGET_WALL_S * n_spans / TARGET_SPANS
    verdict_wall = (
        "meets the target" if top.wall_s <= target_s
        else f"misses the target by {top.wall_s - target_s:.1f} s ({top.wall_s / target_s - 1:.0%})"
    )
    verdict_rss = "meets" if top.rss_mb <= TARGET_RSS_MB else "misses"
    read_s, pipeline_s, report_s = phase_times(results["phases"][0].output)
    parse_s = results["parse"][0].cpu_s
    parts = {  # CPU of one process, phase by phase (one run)
        "reading: lines to spans (msgspec's decode, then the conversion)": read_s,
        "assembly and aggregation": pipeline_s - read_s,
        "rules, replay, projections, JSON output (20,000-request sample)": report_s,
    }
    split = "\n".join(
        f"| {what} | {seconds:.1f} s | {1e6 * seconds / n_spans:.1f} µs |"
        for what, seconds in parts.items()
    )
    one = results["analyze-1"][0]
    speedup = one.wall_s / top.wall_s
    cpus = os.cpu_count() or 1
    per_span_us = 1e6 * pipeline_s / n_spans
    workers_s = pipeline_s / cpus
    tail_s = top.wall_s - workers_s
    left = (
        f"Per span, one process spends {1e6 * read_s / n_spans:.1f} µs of CPU reading (of which "
        f"{1e6 * parse_s / n_spans:.1f} µs are msgspec's decode, the `parse` row) and "
        f"{1e6 * (pipeline_s - read_s) / n_spans:.1f} µs assembling and aggregating: "
        f"{per_span_us:.1f} µs, so {cpus} CPUs fully used take about {workers_s:.1f} s for the "
        f"{n_spans:,} spans. The other {tail_s:.1f} s of `analyze` are serial or overhead: the "
        f"report on the sample ({report_s:.1f} s of CPU in one process, after the workers, "
        "while the other CPUs idle), the workers' start, the last range's tail (it assembles "
        "the spans it set aside and the open traces handed on by its neighbour only once that "
        "neighbour is done) and unpacking the sample in the parent. Runs of one command differ by "
        "up to 15% on this shared machine (the `all runs` column)."
    )
    levers = (
        "What would close the gap, largest first: the report's CPU (its replays and their "
        "validation run one after another in one process: in parallel, or on the workers' "
        "idle CPU, they would take a fraction of their time); the Python per request in "
        "assembly and aggregation (record building, statistics); the conversion of decoded "
        "structs to spans (the reader's Python: per attribute, a few field reads, a shared "
        "key and a dict insert)."
        if top.wall_s > target_s
        else "The target is met; the report's replays, run one after another in one "
        "process, are the largest serial part left."
    )
    return f"""# Analyzer performance

Generated by `python bench/analyze_throughput.py` (this file is rewritten by each run; its
text is in the script).

## Result

`tracekit analyze` on {n_spans:,} tracekit-shaped spans ({size_mb:,.0f} MB of OTLP JSON Lines),
as plain Python (`TRACEKIT_PURE_PYTHON=1`: the analyzer is not compiled): **{top.wall_s:.1f} s**
wall, {rate:,.0f} spans/s ({verdict_wall} of {TARGET_WALL_S:.0f} s for {TARGET_SPANS:,} spans on
2 cores), {top.cpu_s:.1f} s of CPU over all processes, and a peak RSS of **{top.rss_mb:.0f} MB**
summed over the command and its worker processes ({verdict_rss} the target of {TARGET_RSS_MB}
MB; the largest single process peaked at {top.largest_mb:.0f} MB).

Machine: {env_line}.
The machine is shared with other jobs: wall times depend on what else runs (the load
average before and after each command is in the table); CPU times less so.

{_HEADER}{repeat}) |
|---|---:|---:|---:|---:|---:|---:|---:|---|
{chr(10).join(rows)}

`analyze` runs one worker process per CPU ({speedup:.2f}x the wall speed of `analyze-1`, the
same command in one process, for the same report). Where the CPU time goes, in one process
(the `phases` run: each phase timed with the process's CPU clock):

| part | CPU | per span |
|---|---:|---:|
{split}

- `parse`: msgspec's decode of every line into the reader's structs, nothing more: the floor
  under the reader.
- `phases`: one process running, one after the other, `tracekit.analysis.readers.read_spans`
  (every line to its `Span`s: ids, times, typed attribute map), the reader with assembly and
  aggregation (the pipeline of `tracekit/analysis/pipeline.py`), and the report (rules,
  replay, projections, JSON); its wall time and memory are those of all three.
- `analyze-1` and `analyze`: the whole `tracekit analyze FILE --format json -o OUT`, with
  `TRACEKIT_ANALYZE_WORKERS=1` and as users run it.

## Method

1. `bench/gen_traces.py` simulates a gateway under load: Poisson arrivals at 40 requests/s
   into one event loop (a FIFO single server); each request runs its handler and four
   stages (`tokenize` on the loop, `guardrail` I/O, `model` waiting then streaming 8-24
   chunks, `serialize` on the loop), so that one request's tokenize delays the others.
   Spans carry every attribute the core writes (DESIGN §2, `tracekit.semconv`), including
   loop slices and loop waits, and are written in end order, 512 per line, as the core's
   `jsonl` exporter does. Seeded: the same arguments give the same file.
2. Every command runs as its own child process, with `TRACEKIT_PURE_PYTHON=1`. Wall time is
   measured around the child. CPU time is the child's plus its worker processes' (`os.wait4`
   counts descendants it waited for). Memory: the RSS of the child and all its descendants is
   read from `/proc` every {int(SAMPLE_S * 1000)} ms and summed; the peak of that sum is
   reported (a peak shorter than the interval can be missed; the largest single process's
   own peak, `ru_maxrss`, is exact and listed beside it). The 1-minute load average is read
   before and after each command. Each command runs {repeat} times; the fastest run is
   reported and all runs are listed.
3. To compare two versions of the code, time them in alternation, not apart:
   `python bench/analyze_ab.py --old REV --file FILE` runs `tracekit analyze` of a worktree
   of `REV` and of the checkout back to back, round after round, reports the ratio within
   each round and checks that both give the same report. On a machine this busy, counting
   instructions is steadier than timing: `bench/analyzer_phases.py` runs each phase alone,
   for `valgrind --tool=cachegrind`.

## What the analyzer does

1. **One decoder of OTLP JSON: msgspec's typed decoding** (`tracekit/analysis/readers/otlp.py`).
   msgspec decodes a line straight into structs holding only the fields the analyzer reads,
   checking every type in C and skipping unknown fields; a Python loop then converts them to
   `Span`s (ids and times normalised, value limits applied, repeated strings shared). A line
   is decoded whole; a line with a malformed span, and every file that is one document, is
   decoded container by container and span by span instead, so that a bad span is skipped
   and counted (naming its field) and a document's spans are never all held as objects at
   once. msgspec's lax mode reads proto3 JSON's integers and doubles given as strings in C.
   Jaeger JSON is parsed by orjson into dicts, a trace at a time. On 20,480 generated spans,
   cachegrind counts 89k instructions a span to iterate `read_spans`, against 96k for the
   msgspec struct path it replaces (its C scanner off), both as plain Python.
2. **One pipeline, one worker process per CPU.** The pipeline
   (`tracekit/analysis/pipeline.py`: count spans and services, assemble requests, aggregate)
   runs in the single pass and in each worker of the parallel reader, on spans read by one
   line loop (`json_lines` in `tracekit/analysis/readers/files.py`). A large (>= 64 MB per worker)
   uncompressed OTLP JSON Lines file is cut at line starts into one byte range per worker
   (`tracekit/analysis/readers/parallel.py`); each worker runs the pipeline on its range and the
   parent merges. The report is the one a single pass gives
   (`tests/analysis/test_sources_parallel.py` compares whole reports on files whose traces
   straddle the boundaries, arrive late, lack roots or repeat ids):
   - assembly decides from positions only: a trace is flushed `flush_after` spans after its
     root, or once no span of it came for `max_open_traces` spans, and spans arriving soon
     after their trace was flushed form a late fragment. So the state before a boundary can
     matter for a bounded number of spans after it: each worker sets aside the traces it
     first sees that close to its start, receives its neighbour's end state (open traces and
     remembered flushes), assembles the set-aside spans on it, and hands its own end state
     on;
   - aggregation does not depend on the order of requests (percentiles from exact values or
     order-free histograms, breakdown sums in exact fixed point, ties broken by ids), and
     merges exactly;
   - the sample: each worker keeps its earliest 20,000 requests packed (msgpack) and sends
     their keys; the parent, range by range in file order, asks for those at or above the
     cut-off of the keys it has so far (later ranges can only raise it), received in
     chunks of 1,000, and unpacks them once every worker has exited. The unpacked sample
     (~5 kB a request, `tracemalloc`: ~100 MB for 20,000) is what the parent's report is
     built on; unpacked while the last range was still being read, it met the workers'
     own peaks and set the summed RSS to 291-357 MB in runs of the same file (issue 12's
     note); sent as one message, the pickled sample was one more copy in the worker and
     in the parent (+28 MB at the peak). Unpacked after the workers: 252-276 MB in 8
     runs on this machine; with the chunks too: 258-261 MB in 4.
   Smaller files, gzip, Jaeger JSON, a Jaeger query and in-memory spans are read in one
   process; `TRACEKIT_ANALYZE_WORKERS` sets the number of workers (1: one process).
3. **Less work per span.** Model records are msgspec Structs (constructed in C); the
   aggregation buffers rows and folds them into the percentile structures in batches of C
   calls; reading and assembling alternate in runs of 4,096 spans rather than span by span;
   a worker reads its range through a 4 MB buffer (whole ~500 kB lines per read); the cyclic
   garbage collector is paused during the pipeline (it would rescan the ~10^5 objects the
   window and the sample keep, again and again), and what the report keeps goes to the
   oldest generation when it is re-enabled.
4. **Less memory per span waiting for assembly.** A decoder makes a new string for every
   attribute key and text; the reader shares keys, texts up to 200 characters and span names
   as it reads them. A span waiting in the assembly window holds about 1.1 kB instead of
   2.2 kB (`tracemalloc`, asserted by `tests/analysis/test_sources_typed.py`), and later
   lookups by key compare identities. This matters more than its instruction count
   suggests: assembly touches each span again ~10,000 spans after reading it, out of the CPU
   caches (`bench/record_locality.py` times record building on spans in cache and on spans
   read long before).
5. **Memory stays bounded** (DESIGN §7): per process, at most the open traces (a window of
   10,000 spans after their roots), per route and stage counters and percentile structures
   (exact up to 2,048 values, then a 1% log histogram), and a sample of the 20,000 earliest
   requests, whose decoded attributes are dropped and whose repeated strings are shared.
   None of this grows with the number of spans.

## What dominates

{textwrap.fill(left, 92)}

{textwrap.fill(levers, 92)}

## Before: the C scanner

Until issue 12 the OTLP reader had three more decoders that had to agree with this one: a
line scanner in C (`_otlp_scan.c`, 1,116 lines of hand-written parsing of untrusted input),
the attribute loop in C (`_otlp_attributes.c`, reading msgspec's structs at raw member
offsets) and the generic orjson reader, and the analyzer's hot modules were compiled with
mypyc. With all of that, the same benchmark read 1,000,115 spans in 9.0 s (111,196 spans/s,
14.4 s of CPU, peak RSS 261 MB) on the machine of that day (2 CPUs, AMD EPYC; not this one,
so the figures compare only roughly). They were removed for one decoder on a well-kept
library and an analyzer in plain Python: 276 of the analyzer's test cases existed only to
prove the decoders agreed.
"""


if __name__ == "__main__":
    sys.exit(main())
