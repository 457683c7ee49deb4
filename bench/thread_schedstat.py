"""Each thread's CPU and wait for a CPU, from the kernel's scheduler statistics, of processes
found by their command line while they run.

Polls ``/proc`` every 0.2 s for ``--seconds`` and keeps, per thread of every process whose
command line holds ``--match`` (all of its words), the last ``/proc/<pid>/task/<tid>/schedstat``
read: CPU time, run-queue delay (ready to run, waiting for a CPU) and timeslices. Prints the
threads that ran more than ``--min-cpu-ms``, with the share of a CPU each got while ready to
run (``cpu / (cpu + delay)``). Linux only.

Used beside ``bench/validate.py`` to see which thread of the gateway got how much of a busy
host (docs/analyzer-rules.md, "A host short of CPU"):

    .venv/bin/python bench/thread_schedstat.py --match "--serve cpu-on-loop" --seconds 120 &
    .venv/bin/python bench/validate.py --cases cpu-on-loop --loads closed:2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def _matching(words: list[bytes]) -> list[Path]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if all(word in args for word in words):
            found.append(cmdline.parent)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--match", required=True, help="words of the command line, all of them")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--min-cpu-ms", type=float, default=50)
    args = parser.parse_args()
    words = [w.encode() for w in args.match.split()]
    last: dict[tuple[str, str], tuple[str, list[int]]] = {}
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for proc in _matching(words):
            for task in proc.glob("task/*"):
                try:
                    stats = [int(x) for x in (task / "schedstat").read_text().split()]
                    name = (task / "comm").read_text().strip()
                except (OSError, ValueError):
                    continue  # the thread or process ended
                last[(proc.name, task.name)] = (name, stats)
        time.sleep(0.2)
    print("pid     tid     thread           CPU ms  waited ms  slices  share of a CPU while ready")
    for (pid, tid), (name, (cpu, waited, slices)) in sorted(last.items()):
        if cpu / 1e6 >= args.min_cpu_ms:
            print(
                f"{pid:7s} {tid:7s} {name[:15]:15s} {cpu / 1e6:8.0f} {waited / 1e6:10.0f} {slices:7d}"
                f"  {cpu / (cpu + waited):.2f}"
            )


if __name__ == "__main__":
    main()
