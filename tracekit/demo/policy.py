"""The demo gateway's input guardrail policy: pure-Python regex scanning, as many are.

Its own module, importing nothing of tracekit or the gateway, so that a process pool's
workers (the guardrail fix) import only this.
"""

from __future__ import annotations

import re

#: Patterns of a typical blocklist; none matches the demo's prompts, so every prompt passes.
BLOCKLIST = [re.compile(rf"\b{w}\w*\b", re.IGNORECASE) for w in
             ("password", "credit", "exploit", "malware", "ssn", "secret", "bomb", "hack")]  # fmt: skip
#: Characters of the prompt scanned: a policy bounds its work (the question, not the context).
SCANNED_CHARS = 2000


def check_input(text: str, rounds: int) -> bool:
    """Whether the prompt passes: ``rounds`` passes of every pattern over its first
    :data:`SCANNED_CHARS` characters (``rounds`` stands for a longer policy)."""
    head = text[:SCANNED_CHARS]
    hits = 0
    for _ in range(rounds):
        hits += sum(len(p.findall(head)) for p in BLOCKLIST)
    return hits == 0


def warm_up() -> bool:
    """A no-op a pool runs once per worker at start-up, so that the first requests do not pay
    for starting the workers."""
    return True
