"""One module per rule id (DESIGN §4); :data:`DEFAULT_RULES` is what ``analyze`` runs.

A rule is a class with an ``id``, its thresholds as ``__init__`` arguments (documented
defaults, see ``docs/analyzer-rules.md``), and ``__call__(requests, ctx) -> list[Finding]``:
``requests`` is the bounded request sample (sorted by start, possibly of several routes and
services), ``ctx`` a :class:`~tracekit.analysis.rules.findings.RuleContext`. Rules never raise on
odd data: what they cannot judge, they skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Replayer
from tracekit.analysis.rules.background_on_loop import BackgroundOnLoop
from tracekit.analysis.rules.blocking_call_on_loop import BlockingCallOnLoop
from tracekit.analysis.rules.cpu_on_loop import CpuOnLoop
from tracekit.analysis.rules.findings import Finding, RuleContext, finding_order
from tracekit.analysis.rules.folding import fold_symptoms
from tracekit.analysis.rules.fp32_weights import Fp32Weights
from tracekit.analysis.rules.gc_pauses import GcPauses
from tracekit.analysis.rules.loop_saturated import LoopSaturated
from tracekit.analysis.rules.sequential_independent import SequentialIndependent
from tracekit.analysis.rules.serialized_model_calls import SerializedModelCalls
from tracekit.analysis.rules.stream_stall import StreamStall


class Rule(Protocol):
    """What a rule looks like."""

    id: str

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """The rule's findings on ``requests``."""
        ...


#: The rules ``tracekit analyze`` runs, one instance per rule id, default thresholds.
DEFAULT_RULES: list[Rule] = [
    CpuOnLoop(),
    BlockingCallOnLoop(),
    SequentialIndependent(),
    SerializedModelCalls(),
    StreamStall(),
    LoopSaturated(),
    GcPauses(),
    BackgroundOnLoop(),
    Fp32Weights(),
]


def run_rules(
    requests: Sequence[RequestRecord],
    ctx: RuleContext | None = None,
    rules: Sequence[Rule] | None = None,
    routes: Sequence[str] | None = None,
) -> list[Finding]:
    """Run ``rules`` (default :data:`DEFAULT_RULES`) on ``requests``.

    Args:
        requests: the request sample.
        ctx: the context (default: a :class:`RuleContext` projecting with a default
            :class:`~tracekit.analysis.replay.Replayer`).
        rules: the rules to run.
        routes: keep only the findings on these routes (``None``: all). They are kept
            before symptoms are folded, so that a symptom whose cause is on a route left
            out stays a finding.

    Returns:
        One finding per root cause (symptoms folded into their cause's finding:
        :func:`~tracekit.analysis.rules.folding.fold_symptoms`), most severe first, then
        by impact.
    """
    ctx = ctx or RuleContext(project=Replayer().project)
    found = [f for rule in (rules or DEFAULT_RULES) for f in rule(requests, ctx)]
    if routes is not None:
        found = [f for f in found if f.route in routes]
    found = fold_symptoms(found)
    found.sort(key=finding_order)
    return found


__all__ = [
    "DEFAULT_RULES",
    "BackgroundOnLoop",
    "BlockingCallOnLoop",
    "CpuOnLoop",
    "Fp32Weights",
    "GcPauses",
    "LoopSaturated",
    "Rule",
    "RuleContext",
    "SequentialIndependent",
    "SerializedModelCalls",
    "StreamStall",
    "run_rules",
]
