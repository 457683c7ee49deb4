"""Does ``tracekit demo``'s story hold, and does its fix land in the projected range?

Reads the output folders of ``tracekit demo`` runs (``--run N`` makes them first, one after
another, with the installed command) and prints a line per run:

- the findings in report order, ``rule:stage(impact ms)``, ``+rule`` for a symptom folded in;
  ``story`` is ``ok`` when the report flags each of the demo's five seeded problems with the
  right rule and stage and nothing else (as ``tests/demo/test_demo_command.py`` checks);
- the p95 CPU on the loop of the seeded stages (``cpu-on-loop`` needs 10 ms or more);
- for the top finding, the replay's before against the measured one (p50 and p95): the
  replay it projects from (for ``serialized-model-calls``, the recording replayed with the
  model server taking one call at a time), or ``declined`` with the note's figures;
- the measured p95 before and after the fix (``compare.json``) and the projected after with
  its range: ``inside``, ``above`` or ``below``;
- how regular the requests' arrivals were before and after the fix: the coefficient of
  variation of the gaps between request starts (the slow run's clients are paced by the
  one-at-a-time server; the replay keeps those arrival times for the projected after);
- the model calls' p95 before and after the fix, as the replay takes them from the slow run:
  the server's own time (prefill and decode, its span) and the call's time outside the server
  and the gateway's loop (sending, the server's API layer, the answer's way back), and the
  gateway's loop waits per request.

The findings and the projection are those of the code on ``PYTHONPATH`` (``before.jsonl`` is
analyzed again), so two versions of the replay can be compared on the same recordings; the
measured after is the run's own.

Run: ``python bench/demo_projection.py --run 6 --requests 80 --out /tmp/demo-runs``, or
``python bench/demo_projection.py /tmp/demo-runs/run-*`` to read folders again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The demo's seeded problems, as (rule, stage) the report must name (tests/demo).
SEEDED = {
    ("cpu-on-loop", "tokenize"),
    ("cpu-on-loop", "guardrail"),
    ("sequential-independent", "guardrail"),
    ("cpu-on-loop", "serialize"),
    ("serialized-model-calls", "model"),
}


def read(folder: Path) -> dict[str, Any]:
    """One run: its findings (analyzed again), the top one's replay error, the fix measured."""
    from tracekit.analysis.api import analyze

    report = analyze(str(folder / "before.jsonl"))
    [route] = report.routes
    measured = route["latency_ms"]
    flagged: list[tuple[str, str | None]] = [(f.rule, f.stage) for f in report.findings]
    flagged += [(rule, f.stage) for f in report.findings for rule in f.explains]
    top = report.findings[0]
    missing, extra = sorted(SEEDED - set(flagged)), sorted(set(flagged) - SEEDED)
    row: dict[str, Any] = {
        "run": folder.name,
        "findings": [f"{f.rule}:{f.stage}({f.impact_ms:.0f}{''.join('+' + r for r in f.explains)})"
                     for f in report.findings],  # fmt: skip
        "story": "ok" if not missing and not extra and len(flagged) == len(SEEDED) else
                 f"missing {missing} extra {extra} (or one twice)",  # fmt: skip
        "top": f"{top.rule}:{top.stage}",
        # cpu-on-loop needs a stage's p95 CPU on the loop at 10 ms or more: the seeds' margin.
        "cpu_p95": {s["stage"]: s["cpu_ms"]["p95"] for s in route["stages"]
                    if s["stage"] in ("tokenize", "guardrail", "serialize")},  # fmt: skip
        "measured_before": {q: measured[q] for q in ("p50", "p95")},
    }
    if top.projection:
        replayed = {q: top.projection[f"{q}_ms"][0] for q in ("p50", "p95")}
        row["replay_error"] = {q: replayed[q] / measured[q] - 1 for q in ("p50", "p95")}
        row["projected_p95"] = [top.projection["p95_ms"][1], *top.projection["range"]["p95_ms"]]
    else:
        found = re.findall(r"([+-]\d+)%", top.projection_note or "")
        row["declined"] = found[:2]
    compared = folder / "compare.json"
    if compared.exists():
        p95 = json.loads(compared.read_text())["routes"][0]["latency_ms"]["p95"]
        row["measured_p95"] = [p95["before"], p95["after"]]
        after = analyze(str(folder / "after.jsonl"))
        row["arrival_cv"] = [arrival_cv(report.sample), arrival_cv(after.sample)]
        row["calls_p95"] = [model_calls_p95(report.sample), model_calls_p95(after.sample)]
    return row


def model_calls_p95(requests: Any) -> tuple[float, float, float]:
    """p95 over the requests of (the server's prefill + decode, the model call's time outside
    the server and the gateway's loop, the request's loop waits), ms."""
    from tracekit._percentile import percentile

    inference, outside, waits = [], [], []
    for req in requests:
        for stage in req.stages:
            if stage.name == "model" and stage.server is not None:
                server = stage.server
                inference.append(server.prefill_ms + server.decode_ms)
                outside.append(stage.wall_ms - (stage.loop_wait_ms or 0.0) - server.queue_ms - inference[-1])
        waits.append(req.loop_wait_ms or 0.0)
    return percentile(inference, 0.95), percentile(outside, 0.95), percentile(waits, 0.95)


def arrival_cv(requests: Any) -> float:
    """The coefficient of variation of the gaps between request starts (1 for Poisson)."""
    starts = sorted(r.start_ns for r in requests)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return statistics.pstdev(gaps) / statistics.mean(gaps)


def line(row: dict[str, Any]) -> str:
    out = f"{row['run']}: {' '.join(row['findings'])} | story {row['story']} | cpu p95 "
    out += " ".join(f"{stage} {ms:.1f}" for stage, ms in row["cpu_p95"].items()) + " | "
    if "replay_error" in row:
        e = row["replay_error"]
        out += f"replayed before p50 {e['p50']:+.1%} p95 {e['p95']:+.1%}"
    else:
        out += f"declined (replayed before p50 {row['declined'][0]}%, p95 {row['declined'][1]}%)" \
            if len(row["declined"]) == 2 else "declined"  # fmt: skip
    if "measured_p95" in row:
        before, after = row["measured_p95"]
        out += f" | p95 measured {before:.0f} -> {after:.0f}"
        if "projected_p95" in row:
            point, low, high = row["projected_p95"]
            where = "inside" if low <= after <= high else ("above" if after > high else "below")
            out += f", projected {point:.0f} [{low:.0f}-{high:.0f}]: {where}"
        out += " | arrival gaps cv {:.2f} -> {:.2f}".format(*row["arrival_cv"])
        (i0, o0, w0), (i1, o1, w1) = row["calls_p95"]
        out += f" | p95 server {i0:.0f} -> {i1:.0f}, outside {o0:.0f} -> {o1:.0f}, "
        out += f"loop waits {w0:.0f} -> {w1:.0f}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="tracekit demo output folders")
    parser.add_argument("--run", type=int, default=0, metavar="N", help="run the demo N times first")
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--out", type=Path, default=Path("demo-runs"), help="where --run writes")
    args = parser.parse_args(argv)
    folders = list(args.folders)
    tracekit = Path(sys.executable).with_name("tracekit")
    for i in range(1, args.run + 1):
        folder = args.out / f"run-{i}"
        command = [str(tracekit), "demo", "--requests", str(args.requests), "--out", str(folder)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=600)
        folders.append(folder)
    rows = [read(folder) for folder in folders]
    for row in rows:
        print(line(row))
    declined = sum("declined" in row for row in rows)
    landed = [row for row in rows if "projected_p95" in row and "measured_p95" in row]
    inside = sum(r["projected_p95"][1] <= r["measured_p95"][1] <= r["projected_p95"][2] for r in landed)
    stories = sum(row["story"] == "ok" for row in rows)
    print(f"{len(rows)} runs: story ok in {stories}; top projection declined in {declined}; "
          f"measured p95 after inside the projected range in {inside} of {len(landed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
