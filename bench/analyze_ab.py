"""Compare ``tracekit analyze`` of two versions of the code, alternating runs on one file.

On a machine shared with other jobs the wall time of the same command can change by 2x from
one minute to the next, so two versions timed apart cannot be compared. Here each round runs
both versions back to back (the order alternates from round to round, so a steady drift
favours neither), and what is reported is the ratio within each round.

The other version is a ``git worktree`` of ``--old`` (any revision) in a temporary folder,
with whatever it compiles (an older analyzer had C helpers and mypyc modules) built in place;
the current checkout is the new one. ``--plain-python`` builds nothing and runs both with
``TRACEKIT_PURE_PYTHON=1``: the code itself compared, as the analyzer runs now.
Both produce the report of the same file, and the two reports must be identical (except for
their ``source``): a speed-up that changes the result is not one.

Usage::

    python bench/analyze_ab.py --old HEAD~3 --file traces.jsonl [--rounds 3] [--workers N]
    python bench/analyze_ab.py --old HEAD~3 --spans 1000000   # generates the file first
    python bench/analyze_ab.py --old main --file traces.jsonl --plain-python

Prints each round's wall times and ratio (new / old) and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the git revision to compare with")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="an OTLP JSON Lines file to analyze")
    source.add_argument("--spans", type=int, help="generate a file of this many spans")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, help="TRACEKIT_ANALYZE_WORKERS for both")
    parser.add_argument("--plain-python", action="store_true",
                        help="build nothing; TRACEKIT_PURE_PYTHON=1 for both")  # fmt: skip
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.file is not None and not args.file.is_file():
        parser.error(f"{args.file}: no such file")
    with tempfile.TemporaryDirectory(prefix="tracekit-ab-") as folder:
        tmp = Path(folder)
        traces = args.file or generate(tmp / "traces.jsonl", args.spans)
        old = tmp / "old"
        git("worktree", "add", "--detach", str(old), args.old)
        try:
            if not args.plain_python:
                build(old)
            return compare(traces.resolve(), old, tmp, args.rounds, args.workers, args.plain_python)
        finally:
            git("worktree", "remove", "--force", str(old))


def generate(path: Path, spans: int) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_traces

    gen_traces.write_jsonl(path, spans)
    return path


def git(*args: str) -> None:
    subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True)


def build(tree: Path) -> None:
    """Build the old tree's compiled parts in place (without them it runs as plain Python)."""
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        print(f"note: the old tree's build failed; it runs as plain Python\n{result.stderr[-2000:]}",
              file=sys.stderr)  # fmt: skip


def run(tree: Path, traces: Path, out: Path, workers: int | None, plain: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("TRACEKIT_PURE_PYTHON", None)
    if plain:
        env["TRACEKIT_PURE_PYTHON"] = "1"
    if workers is not None:
        env["TRACEKIT_ANALYZE_WORKERS"] = str(workers)
    command = [sys.executable, "-m", "tracekit", "analyze", str(traces), "--format", "json",
               "-o", str(out)]  # fmt: skip
    start = time.perf_counter()
    # From a folder outside both trees, so that PYTHONPATH alone picks the version.
    subprocess.run(command, env=env, cwd=out.parent, check=True, capture_output=True)
    return time.perf_counter() - start


def compare(
    traces: Path, old: Path, tmp: Path, rounds: int, workers: int | None, plain: bool
) -> int:
    trees = {"old": old, "new": ROOT}
    ratios = []
    for i in range(rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        times = {name: run(trees[name], traces, tmp / f"{name}.json", workers, plain)
                 for name in order}  # fmt: skip
        ratios.append(times["new"] / times["old"])
        print(f"round {i + 1}: old {times['old']:.2f} s, new {times['new']:.2f} s, "
              f"new/old {ratios[-1]:.3f}")  # fmt: skip
    print(f"median new/old: {statistics.median(ratios):.3f} over {rounds} rounds")
    reports = [report(tmp / f"{name}.json") for name in trees]
    if reports[0] != reports[1]:
        print("the two versions' reports differ", file=sys.stderr)
        return 1
    print("the two reports are identical")
    return 0


def report(path: Path) -> Any:
    data = json.loads(path.read_text())
    data.pop("source", None)
    return data


if __name__ == "__main__":
    sys.exit(main())
