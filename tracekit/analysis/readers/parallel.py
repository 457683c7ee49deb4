"""``tracekit analyze`` of a large OTLP JSON Lines file on every core: byte ranges, one process each.

The file is cut at line starts into one byte range per worker process (:func:`plan_file`).
Each worker (:mod:`tracekit.analysis.readers.range_worker`) reads its range with the
readers' line loop and runs the pipeline of the single pass on it
(:class:`tracekit.analysis.pipeline.Pipeline`); the parent merges the aggregates
(:meth:`Aggregator.merge`) and ``tracekit.analyze`` builds the report. The result is the one
a single pass gives (a test compares whole reports):

- Assembly decides from positions only (:mod:`tracekit.analysis.assembly.grouping`), and what happens
  to a trace before a boundary can matter for at most ``Window.reach`` spans after it. So
  worker k > 0 sets aside the spans of every trace it first sees within ``reach`` spans of
  its start (and all their later spans); after its range it receives the state worker k - 1
  ended with (open traces and remembered flushes, positions carried over), and assembles the
  set-aside spans on that state -- exactly as one pass would have. It then hands its own end
  state to worker k + 1. A trace that straddles a boundary is thus assembled whole.
- Aggregation is independent of the order requests come in, and merges exactly.
- The sample: each worker sends the sort keys of its kept requests; the parent asks it for
  those at or above the cut-off of the earliest ``sample_size`` among the keys it has so
  far (the ranges in file order): a superset of what the overall sample takes from it.

Errors stay those of a single pass: the first failing range in file order raises its
one-line error (line numbers are counted from the start of the file when a message needs one).

Workers are fresh interpreters (``python -c``), not multiprocessing children: those would
re-import the caller's main script, which a plain script calling ``tracekit.analyze`` does
not guard. A worker inherits three descriptors: its connection to the parent, the pipe from
the previous range's worker and the pipe to the next one's.

Cost: one process start per worker (~0.2 s), the set-aside spans (at most ``reach`` spans,
plus later spans of those traces) assembled after the range, the end state (the open
traces, ~``flush_after`` spans) packed between neighbours, the statistics and a share of the
packed sample sent to the parent, where the sample is unpacked once the workers have exited
(~20-50 µs a request as plain Python: 0.4-1 s for 20,000).
"""

from __future__ import annotations

import heapq
import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tracekit.analysis.pipeline import Settings
from tracekit.analysis.readers.common import ReadStats
from tracekit.analysis.readers.otlp import otlp_spans
from tracekit.analysis.readers.range_worker import BOM, Partial, Plan
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import TracekitError

__all__ = ["ENV_WORKERS", "Partial", "Plan", "Settings", "analyze_plan", "plan_file", "worker_count"]

#: Smallest file and byte range read in parallel (smaller ones are not worth a process).
MIN_RANGE_BYTES = 64 * 2**20
#: Most worker processes.
MAX_WORKERS = 16
ENV_WORKERS = "TRACEKIT_ANALYZE_WORKERS"


def worker_count(requested: int | None = None) -> int:
    """How many workers to use: ``requested``, else ``TRACEKIT_ANALYZE_WORKERS``, else the CPUs.

    A bad value in the environment is ignored (with a warning) as the other settings are.
    """
    if requested is not None:
        return max(1, requested)
    text = os.environ.get(ENV_WORKERS)
    if text:
        try:
            value = int(text)
            if value >= 1:
                return value
        except ValueError:
            pass
        import warnings

        warnings.warn(f"{ENV_WORKERS}={text!r} is not a positive integer; ignored", stacklevel=2)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def plan_file(
    path: str, name: str, *, workers: int, min_range_bytes: int | None = None
) -> Plan | None:
    """Byte ranges for ``workers`` processes, or ``None`` when one pass should read the file.

    Only a regular, uncompressed file of OTLP JSON Lines (its first line a ``TracesData``,
    followed by more) large enough for two ranges is split; anything else, including every
    error, is left to the single pass, which reports it as it always does.
    """
    if workers < 2 or os.name != "posix":  # workers inherit descriptors: POSIX only
        return None
    if min_range_bytes is None:
        min_range_bytes = MIN_RANGE_BYTES
    try:
        size = os.stat(path).st_size
        count = min(workers, MAX_WORKERS, size // max(1, min_range_bytes))
        if count < 2:
            return None
        with open(path, "rb") as file:
            if file.read(2) == b"\x1f\x8b":
                return None  # gzip
            file.seek(0)
            # A single document (one line, or a first line that does not parse) is not split,
            # nor is a file whose first line is longer than a range; the planner reads no
            # more than a range of either (the single pass reads a document in one piece).
            first = _first_line(file, size // count)
            if first is None or not _more_content(file, size // count):
                return None
            if otlp_spans(first.removeprefix(BOM), ReadStats(), name) is None:
                return None
            bounds = [0]
            for k in range(1, count):
                file.seek(max(size * k // count - 1, bounds[-1]))
                file.readline()  # to the next line start
                at = file.tell()
                if bounds[-1] < at < size:
                    bounds.append(at)
            bounds.append(size)
    except (OSError, ValueError, MemoryError, RecursionError, TracekitError):
        return None  # the single pass reports it, as it always does
    return Plan(path, name, tuple(bounds)) if len(bounds) > 2 else None


def _first_line(file: Any, limit: int) -> bytes | None:
    # The first non-blank line, if it is a whole line shorter than ``limit``.
    while line := file.readline(limit):
        if not line.endswith(b"\n"):
            return None
        if not line.isspace():
            return bytes(line)
    return None


def _more_content(file: Any, limit: int) -> bool:
    while line := file.readline(limit):
        if not line.isspace():
            return True
    return False


def analyze_plan(plan: Plan, settings: Settings) -> tuple[Aggregator, Partial]:
    """Run the workers of ``plan`` and merge what they found.

    Returns:
        The merged aggregator (with the sample) and the merged :class:`Partial` (counts,
        read statistics, services, route names).

    Raises:
        TracekitError: the error of the first range (in file order) that failed.
        OSError: a worker could not be started.
    """
    ranges = len(plan.bounds) - 1
    links = [os.pipe() for _ in range(ranges - 1)]  # worker k - 1 -> worker k
    pairs = [socket.socketpair() for _ in range(ranges)]  # parent <-> worker k
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for k in range(ranges):
            ends = [
                pairs[k][1].fileno(),
                links[k - 1][0] if k > 0 else -1,
                links[k][1] if k < ranges - 1 else -1,
            ]
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", _BOOT, *map(str, ends)],
                    pass_fds=[fd for fd in ends if fd >= 0],
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
            )
    except BaseException:
        for process in processes:
            process.kill()
        raise
    finally:
        for read_end, write_end in links:  # the workers hold their own copies now
            os.close(read_end)
            os.close(write_end)
        for _, child in pairs:
            child.close()
    connections = [Connection(parent.detach()) for parent, _ in pairs]
    done = False
    try:
        for k, connection in enumerate(connections):
            connection.send((plan, k, settings))
        merged, total, samples = _collect(settings, connections)
        done = True
    finally:
        for connection in connections:
            connection.close()
        for process in processes:
            if not done:  # an error or an interrupt: the workers' results are not wanted
                process.kill()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a worker stuck on exit
                process.kill()
                process.wait()
    # The samples are unpacked (4x their packed size) only once every worker has exited:
    # unpacked while the last range was still being read, they set the peak of the summed
    # RSS (docs/performance-analyzer.md).
    while samples:
        merged.adopt_sample(samples.pop(0))
    return merged, total


_BOOT = (
    "import sys; from tracekit.analysis.readers.range_worker import worker_main; "
    "worker_main(sys.argv[1:])"
)


def _collect(
    settings: Settings, connections: list[Connection]
) -> tuple[Aggregator, Partial, list[list[bytes]]]:
    # Range by range, in file order (so that the first failing range's error is raised):
    # its statistics, then its packed sample. A range's sample is asked for as soon as the
    # range is done, with the cut-off of the keys known so far: later ranges can only raise
    # it, so the range sends a superset of what the final sample takes from it.
    merged = Aggregator(slo=settings.slo, sample_size=settings.sample_size)
    total = Partial(merged, ReadStats(format="otlp-jsonl"), 0, [], [], [])
    keys: list[Any] = []
    services: dict[str, None] = {}
    matched: dict[str, None] = {}
    others: dict[str, None] = {}
    samples: list[list[bytes]] = []
    for k, connection in enumerate(connections):
        kind, partial = _receive(connection, k)
        if kind != "ok":
            for each in connections:
                each.close()
            _raise(kind, partial)
        keys.extend(partial.sample_keys)
        cutoff = None
        if len(keys) > settings.sample_size:
            cutoff = heapq.nlargest(settings.sample_size, keys)[-1]
        connection.send(cutoff)
        merged.merge(partial.aggregator, sample=False)
        sample: list[bytes] = []
        while True:
            kind, chunk = _receive(connection, k)
            if kind != "sample":
                _raise(kind, chunk)
            if chunk is None:  # the end of the range's sample
                break
            sample += chunk
        samples.append(sample)
        total.spans += partial.spans
        total.left_out += partial.left_out
        total.stats.skipped += partial.stats.skipped
        total.stats.truncated += partial.stats.truncated
        total.stats.cut_tail_bytes += partial.stats.cut_tail_bytes
        total.stats.reasons.extend(partial.stats.reasons)
        services.update(dict.fromkeys(partial.services))
        matched.update(dict.fromkeys(partial.matched))
        others.update(dict.fromkeys(partial.others))
    del total.stats.reasons[10:]
    total.services = list(services)[: settings.max_services]
    total.matched = list(matched)
    total.others = [r for r in others if r not in matched][: settings.routes_quoted]
    return merged, total, samples


def _receive(connection: Connection, k: int) -> tuple[str, Any]:
    try:
        message: tuple[str, Any] = connection.recv()
    except EOFError:
        return "crash", f"worker {k} exited without a result"
    return message


def _raise(kind: str, payload: Any) -> None:
    if kind == "error" and isinstance(payload, TracekitError):
        raise payload
    raise RuntimeError(f"tracekit analyze: a worker failed:\n{payload}")


def file_path(source: Any) -> str | None:
    """``source`` as a local path the parallel reader may take, else ``None``."""
    if isinstance(source, str | bytes | os.PathLike):
        name = os.fsdecode(source)
        if "://" not in name and Path(name).is_file():
            return name
    return None


