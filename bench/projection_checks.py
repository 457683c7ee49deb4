"""BEFORE's projections checked again on the traces validation runs kept.

``bench/validate.py --keep DIR`` keeps each case's BEFORE and AFTER traces. This runs
``tracekit compare BEFORE AFTER --finding RULE:STAGE`` on every pair in each DIR (the
analyzer of this checkout, nothing re-recorded) and prints each case's verdict with the
projected and measured p50/p95 changes, then, over all the folders: the verdicts, and how
often the measured change fell inside the projected range. Run it at two commits on the same
folders to see what an analyzer change does to the same recordings.

Run: .venv/bin/python bench/projection_checks.py DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import tracekit

# The finding each case's fix was made for (bench/validate.py's CASES).
SELECTED = {
    "cpu-on-loop": "cpu-on-loop:tokenize",
    "blocking-call-on-loop": "blocking-call-on-loop:lookup",
    "serialized-model-calls": "serialized-model-calls:model",
    "sequential-independent": "sequential-independent:guardrail",
    "gc-pauses": "gc-pauses",
    "loop-saturated": "loop-saturated",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders of bench/validate.py --keep")
    verdicts: collections.Counter[str] = collections.Counter()
    inside = checked = 0
    for folder in parser.parse_args().folders:
        pairs = sorted(folder.glob("*-before.jsonl"))
        if not pairs:
            raise SystemExit(f"projection_checks: no *-before.jsonl in {folder}")
        for before in pairs:
            name = before.name.removesuffix("-before.jsonl")
            rule = next((r for r in SELECTED if name.startswith(r)), None)
            after = before.with_name(f"{name}-after.jsonl")
            if rule is None or not after.exists():
                continue
            comparison = tracekit.compare(str(before), str(after), route="POST /chat",
                                          finding=SELECTED[rule]).to_dict()  # fmt: skip
            checks = [p for r in comparison["routes"] for p in r["projections"] if p["selected"]]
            if not checks or not checks[0]["metrics"]:
                verdicts["no projection"] += 1
                print(f"{folder.name:6s} {name:34s} no projection")
                continue
            check = checks[0]
            verdicts[check["verdict"]] += 1
            said = []
            for metric in check["metrics"][:2]:  # p50, p95
                low, high = metric["projected_change_pct"]
                measured = metric["measured_change_pct"]
                if measured is not None:
                    checked += 1
                    inside += low <= measured <= high
                said.append(f"{metric['metric'][:3]} {low:+.0f}..{high:+.0f}% vs {measured:+.0f}%")
            print(f"{folder.name:6s} {name:34s} {check['verdict']:16s} {' | '.join(said)}")
    print("verdicts:", ", ".join(f"{k} {n}" for k, n in verdicts.most_common()))
    if checked:
        print(f"measured p50/p95 change inside the projected range: {inside} of {checked} "
              f"({100 * inside / checked:.0f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
