"""Per-request overhead in CPU instructions (valgrind callgrind): the noise-free companion of
bench/overhead.py.

Wall and CPU time on a shared 2-core machine move by ±20 % from run to run; instruction counts
do not (the same run counts the same instructions whatever else the machine does), so they
compare variants and code changes reliably. They leave out what instructions do not show: the
kernel side of system calls (tracekit's thread-CPU reads, the span processor's ``getpid``),
cache misses, and time a thread waits for the GIL.

Each variant of bench/overhead.py (the same app, exporter and processor) runs in its own
process under ``valgrind --tool=callgrind``, twice: a warm-up only, and the warm-up plus N
requests and the flush of everything they queued; the difference divided by N is its
instructions per request, all threads and the garbage collector included. tracekit is counted
compiled (as installed) and as plain Python (``TRACEKIT_PURE_PYTHON=1``).

Run: .venv/bin/python bench/overhead_instructions.py [--requests 2000] [--json out.json]
Needs valgrind (Debian: ``apt-get install valgrind``); takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 300

CHILD = """
import asyncio, sys
sys.path.insert(0, {bench!r})
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
import overhead
from tracekit import _runtime
otel_trace.set_tracer_provider(TracerProvider())
_runtime.MAX_QUEUE = 1_000_000  # count every span, as bench/overhead.py does
app, flush = overhead.variant({variant!r})
loop = asyncio.new_event_loop()
loop.run_until_complete(overhead.drive(app, {warmup}))
flush()
if {requests}:
    loop.run_until_complete(overhead.drive(app, {requests}))
    flush()
"""


def instructions(variant: str, requests: int, pure: bool) -> int:
    """Instructions of one child process (all threads)."""
    code = CHILD.format(bench=str(HERE), variant=variant, warmup=WARMUP, requests=requests)
    env = dict(os.environ, PYTHONHASHSEED="0")
    if pure:
        env["TRACEKIT_PURE_PYTHON"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, "-c", code],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise SystemExit(f"callgrind printed no count for {variant}:\n{out.stderr[-2000:]}")
    return int(match.group(1))


def per_request(variant: str, requests: int, pure: bool = False) -> float:
    return (instructions(variant, requests, pure) - instructions(variant, 0, pure)) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    bare = per_request("bare", args.requests)
    otel = per_request("otel", args.requests) - bare
    results: dict[str, float] = {"bare": bare, "otel_overhead": otel}
    for name, pure in (("tracekit_compiled", False), ("tracekit_plain_python", True)):
        ours = per_request("tracekit", args.requests, pure) - bare
        results[f"{name}_overhead"] = ours
        results[f"{name}_ratio_to_otel"] = ours / otel
    results["requests"] = args.requests
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
