"""The fast reader's attribute loop: the C helper against the Python reference.

Decodes one line of generated traces (512 spans) with the fast reader's msgspec decoder, then
runs a loop over every span's attribute list. Two ways to read the cost:

- time (default): microseconds per span for each loop, the fastest of 7 runs of 20 passes;
- instructions, independent of the machine's load: run one loop many times under callgrind
  and subtract the run without a loop::

      for loop in none c python; do
          valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
              python bench/attribute_loop.py --loop $loop --passes 100
      done

  (instructions per span = (I refs of the loop - I refs of none) / (512 * passes)).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("time", "none", "c", "python"), default="time")
    parser.add_argument("--passes", type=int, default=100)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_traces

    from tracekit.analysis import _otlp_typed

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "traces.jsonl"
        gen_traces.write_jsonl(path, 2_000)
        line = path.read_bytes().splitlines()[1]  # a full line, past the simulation's start
    doc = _otlp_typed._DECODER.decode(line)
    lists = [
        span.attributes
        for rs in doc.resourceSpans or ()
        for scope in rs.scopeSpans or ()
        for span in scope.spans or ()
        if span.attributes
    ]
    built = _otlp_typed.attributes is not _otlp_typed.python_attributes
    loops = {"c": _otlp_typed.attributes, "python": _otlp_typed.python_attributes}
    if args.loop != "time":
        if args.loop == "c" and not built:
            parser.error("the C loop is not built here (make build)")
        loop = loops.get(args.loop)
        if loop is not None:
            for _ in range(args.passes):
                for kvs in lists:
                    loop(kvs)
        return 0
    if not built:
        del loops["c"]
    print(f"{len(lists)} spans, microseconds per span (fastest of 7 runs of 20 passes):")
    for name, loop in loops.items():
        best = min(timeit.repeat(lambda f=loop: [f(kvs) for kvs in lists], number=20, repeat=7))
        print(f"{name:7} {best / 20 / len(lists) * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
