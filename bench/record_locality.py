"""How much of assembly's cost is memory: building records from spans read just now vs long ago.

Assembly builds a trace's records when it flushes the trace, ~10,000 spans after its root was
read, so the spans it reads are no longer in the CPU caches. This measures the same work
(``stage_record`` on every stage span, ``request_record`` on every request span) three ways:

- ``hot``: one span, again and again (everything cached);
- ``recent``: the 500 spans read last, in turn (the working set of a few hundred kB);
- ``cold``: every span of the file once, in file order, after all were read (the spans of
  ~100 MB of objects, as a span flushed long after it was read).

Usage::

    python bench/record_locality.py [--spans 100000]

Prints microseconds per record for each; the ratio cold/hot is the cost of memory.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def per_record(build: Callable[[Any], Any], spans: list[Any]) -> tuple[float, float, float]:
    """Microseconds per record: hot, recent and cold."""
    one = spans[len(spans) // 2]
    hot = min(timeit.repeat(lambda: build(one), number=20_000, repeat=5)) / 20_000
    recent_set = spans[-500:]
    recent = min(
        timeit.repeat(lambda: [build(s) for s in recent_set], number=40, repeat=5)
    ) / (40 * len(recent_set))
    start = time.perf_counter()
    for span in spans:
        build(span)
    cold = (time.perf_counter() - start) / len(spans)
    return hot * 1e6, recent * 1e6, cold * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_traces

    from tracekit.analysis.assembly.request_records import request_record, stage_record
    from tracekit.analysis.readers import read_spans

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "traces.jsonl"
        gen_traces.write_jsonl(path, args.spans)
        gc.disable()  # as the analyzer runs
        spans = list(read_spans(path))
    stages = [s for s in spans if s.kind != "server"]
    heads = [s for s in spans if s.kind == "server"]
    print(f"{len(spans):,} spans; microseconds per record: hot, recent, cold (cold/hot)")
    for name, build, items in (
        ("stage_record", stage_record, stages),
        ("request_record", lambda span: request_record(span, []), heads),
    ):
        hot, recent, cold = per_record(build, items)
        print(f"{name:15} {hot:6.2f} {recent:6.2f} {cold:6.2f}  ({cold / hot:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
