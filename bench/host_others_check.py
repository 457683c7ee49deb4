"""Is the replay's reading of the host's other load right? Against the kernel's count.

The replay reads the host's other runnable threads (``host_others`` in the report's model)
from the loop thread's run-queue delay (docs/analyzer-rules.md, "The projection model"). The
kernel counts the runnable threads of the whole host at every instant (``procs_running`` in
``/proc/stat``). Sampled every 5 ms during a recording, their mean less the sampler itself and
the loop thread's share of the time ready to run (its CPU plus its run-queue delay, from the
loop windows) is the other threads' mean, measured independently.

Run, in two steps:
  python bench/host_others_check.py sample SECONDS OUT   # while the gateway is recorded
  python bench/host_others_check.py compare TRACE OUT    # the recording against the samples
e.g. beside ``bench/validate.py --cases cpu-on-loop --loads closed:2 --keep DIR`` with the
busy host's hogs running, TRACE = DIR/cpu-on-loop-closed2-before.jsonl.
"""

from __future__ import annotations

import argparse
import time


def sample(seconds: float, out: str) -> None:
    end = time.monotonic() + seconds
    with open(out, "w") as f:
        while time.monotonic() < end:
            with open("/proc/stat") as stat:
                running = next(line.split()[1] for line in stat if line.startswith("procs_running"))
            f.write(f"{time.time_ns()} {running}\n")
            time.sleep(0.005)


def compare(trace: str, samples: str) -> None:
    from tracekit.analysis.api import analyze

    report = analyze(trace)
    t0 = min(r.start_ns for r in report.sample)
    t1 = max(r.end_ns for r in report.sample)
    with open(samples) as f:
        counts = [int(n) for t, n in (line.split() for line in f) if t0 <= int(t) <= t1]
    if not counts:
        raise SystemExit("host_others_check: no sample inside the recording's time span")
    d = report.to_dict()
    loops = (d.get("loop") or {}).get("loops") or []
    if not loops or "cpu_wait" not in loops[0]:
        raise SystemExit("host_others_check: the trace has no loop windows with the run-queue delay")
    loop = loops[0]
    ready = (loop["cpu_ms"]["total"] + loop["cpu_wait"]["ms"]) / (loop["window_s"] * 1000)
    model = (d["validation"] or {}).get("model") or {}
    measured = sum(counts) / len(counts) - 1 - ready  # less the sampler and the loop thread
    print(f"{len(counts)} samples: other runnable threads {measured:.2f} by /proc/stat "
          f"(the loop thread ready {ready:.0%} of the time); the replay read "
          f"{model.get('host_others')} (loop_cpu_share {model.get('loop_cpu_share')})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    s = sub.add_parser("sample")
    s.add_argument("seconds", type=float)
    s.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("trace")
    c.add_argument("out")
    args = parser.parse_args()
    if args.step == "sample":
        sample(args.seconds, args.out)
    else:
        compare(args.trace, args.out)


if __name__ == "__main__":
    main()
