"""The fast reader's line scanner: the C scanner against the msgspec struct path it declines to.

Generates tracekit-shaped traces (512 spans a line, as the core's exporter writes), then reads
every line with ``_otlp_typed.scan`` and with ``_otlp_typed.struct_spans``, which give the
same spans (the tests compare them field by field). Two ways to read the cost:

- time (default): CPU microseconds per span for each reader, in alternation (scan, structs,
  scan, structs ...), so that a change in the machine's load hits both;
- instructions, independent of the load: run one reader under callgrind and subtract the
  run without one::

      for reader in none scan struct; do
          valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
              python bench/line_scanner.py --reader $reader
      done

  (instructions per span = (I refs of the reader - I refs of none) / spans, printed by the
  time mode).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", choices=("time", "none", "scan", "struct"), default="time")
    parser.add_argument("--spans", type=int, default=102_400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_traces

    from tracekit.analysis import _otlp_typed

    if _otlp_typed.scan is None:
        parser.error("the C scanner is not built here (make build)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "traces.jsonl"
        gen_traces.write_jsonl(path, args.spans)
        lines = path.read_bytes().splitlines()
    readers = {"scan": _otlp_typed.scan, "struct": _otlp_typed.struct_spans}
    gc.disable()  # as analyze() does
    if args.reader != "time":
        read = readers.get(args.reader)
        if read is not None:
            for line in lines:
                read(line)
        return 0
    spans = sum(len(_otlp_typed.scan(line) or ()) for line in lines)
    print(f"{spans:,} spans in {len(lines)} lines; CPU microseconds per span:")
    for _ in range(args.rounds):
        for name, read in readers.items():
            start = time.process_time()
            out = [read(line) for line in lines]
            cpu = time.process_time() - start
            del out
            print(f"{name:7} {cpu / spans * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
