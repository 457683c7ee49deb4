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
compiled (as installed) and as plain Python (``TRACEKIT_PURE_PYTHON=1``), and once more with
its finished requests dropped instead of turned into spans: the request path alone (the rest
of its overhead is building the spans, handing them to the SDK's processor, and collecting).

``--tree DIR`` counts another checkout's tracekit with that checkout's bench/overhead.py (e.g.
a ``git worktree`` of an older commit, to compare); it needs no install, the checkout is put
first on the path.

``--cold`` counts bare, otel and tracekit from their setup on, without the warm-up (what
bench/overhead_process.py measures in time), beside the same after it.

Run: .venv/bin/python bench/overhead_instructions.py [--requests 2000] [--json out.json] [--tree DIR] [--cold]
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
sys.path.insert(0, {tree!r})
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
import overhead
from tracekit._export import tracing
otel_trace.set_tracer_provider(TracerProvider())
tracing.MAX_QUEUE = 1_000_000  # count every span, as bench/overhead.py does
loop = asyncio.new_event_loop()
if {setup}:
    app, flush = overhead.variant({variant!r})  # -unbuilt: requests dropped, never built into spans
    if {warmup}:
        loop.run_until_complete(overhead.drive(app, {warmup}))
        flush()
if {requests}:
    loop.run_until_complete(overhead.drive(app, {requests}))
    flush()
"""


def instructions(variant: str, requests: int, pure: bool, tree: Path, warmup: int = WARMUP) -> int:
    """Instructions of one child process (all threads); with ``warmup`` 0, the variant is
    set up only when there are requests to count (its setup is counted with them)."""
    code = CHILD.format(bench=str(tree / "bench"), tree=str(tree), variant=variant,
                        warmup=warmup, requests=requests, setup=bool(requests or warmup))  # fmt: skip
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


def per_request(variant: str, requests: int, tree: Path, pure: bool = False,
                warmup: int = WARMUP) -> float:  # fmt: skip
    return (instructions(variant, requests, pure, tree, warmup)
            - instructions(variant, 0, pure, tree, warmup)) / requests  # fmt: skip


def cold(requests: int, tree: Path) -> dict[str, float]:
    """The compiled variants counted from their setup on (no warm-up: the first requests pay
    for what is made on first use), beside the same after the warm-up."""
    out: dict[str, float] = {}
    for warmup in (0, WARMUP):
        bare = per_request("bare", requests, tree, warmup=warmup)
        otel = per_request("otel", requests, tree, warmup=warmup) - bare
        ours = per_request("tracekit", requests, tree, warmup=warmup) - bare
        out[f"warmup{warmup}_otel_overhead"] = otel
        out[f"warmup{warmup}_tracekit_overhead"] = ours
        out[f"warmup{warmup}_ratio_to_otel"] = ours / otel
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="the checkout to count")
    parser.add_argument("--cold", action="store_true",
                        help="only the compiled bare, otel and tracekit, counted from their setup "
                             "on and after the warm-up (bench/overhead_process.py's question)")  # fmt: skip
    args = parser.parse_args()
    tree = args.tree.resolve()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.cold:
        print(json.dumps(cold(args.requests, tree), indent=2))
        return
    bare = per_request("bare", args.requests, tree)
    otel = per_request("otel", args.requests, tree) - bare
    results: dict[str, float] = {"bare": bare, "otel_overhead": otel}
    for name, pure in (("tracekit_compiled", False), ("tracekit_plain_python", True)):
        ours = per_request("tracekit", args.requests, tree, pure) - bare
        results[f"{name}_overhead"] = ours
        results[f"{name}_ratio_to_otel"] = ours / otel
    if "tracekit-unbuilt" in (tree / "bench" / "overhead.py").read_text():  # its bench has the variant
        path = per_request("tracekit-unbuilt", args.requests, tree) - bare
        results["tracekit_compiled_request_path"] = path
        results["tracekit_compiled_spans_and_rest"] = results["tracekit_compiled_overhead"] - path
    results["requests"] = args.requests
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
