"""The replay's self-check on every BEFORE trace a validation run kept.

``bench/validate.py --keep DIR`` keeps each case's traces; this prints, for each
``*-before.jsonl`` in DIR, the as-recorded replay's p50 and p95 errors (simulated / measured
− 1) and whether they are within the tolerance: the figures that decide whether ``tracekit
analyze`` projects. Run it at two commits on the same DIR to see what a replay change does
to the same recordings.

Run: .venv/bin/python bench/replay_errors.py DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tracekit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of bench/validate.py --keep")
    folder = parser.parse_args().folder
    traces = sorted(folder.glob("*-before.jsonl"))
    if not traces:
        raise SystemExit(f"replay_errors: no *-before.jsonl in {folder}")
    for trace in traces:
        check = tracekit.analyze(str(trace)).to_dict()["validation"]
        name = trace.name.removesuffix("-before.jsonl")
        if check["p50_error"] is None:
            print(f"{name:40s} not replayed: {check['reason']}")
            continue
        verdict = "ok" if check["ok"] else "declines"
        print(f"{name:40s} p50 {check['p50_error']:+.0%}  p95 {check['p95_error']:+.0%}  {verdict}")


if __name__ == "__main__":
    main()
