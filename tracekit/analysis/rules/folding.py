"""One finding per root cause (DESIGN §4): a symptom is folded into the finding of its cause.

Some findings are symptoms of another defect: a stream stalls because another stage holds
the event loop; model calls look served one at a time because the loop did not get to send
them; an input guardrail cannot overlap the model call while it holds the loop. The rule
that finds such a symptom measures what explains it and says so on its finding:
``caused_by``, the findings that would be its cause, most likely first, as (rule, route,
stage); and ``folded``, the clause the cause's evidence gains ("which is also why ...").

:func:`fold_symptoms` runs after every rule: each symptom whose cause is among the findings
is folded into it (the cause's evidence gains the clause, its ``explains`` the symptom's
rule id) and is not reported apart. A symptom whose cause did not fire (below its own
gates, or on a route the analysis left out) stays a finding, with its own fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracekit.analysis.rules.findings import Finding

Key = tuple[str, str, str | None]


def fold_symptoms(findings: Sequence[Finding]) -> list[Finding]:
    """Fold each symptom into the finding of its cause.

    Args:
        findings: every rule's findings.

    Returns:
        The findings that remain, in the given order; causes carry their symptoms' clauses
        in their evidence and their rule ids in ``explains`` (a chain of symptoms ends in
        the first finding that is no one's symptom).
    """
    by_key: dict[Key, Finding] = {}
    for f in findings:
        by_key.setdefault((f.rule, f.route, f.stage), f)
    folded: set[int] = set()
    for f in findings:
        cause = _root_cause(f, by_key)
        if cause is None:
            continue
        folded.add(id(f))
        if f.folded:
            cause.evidence = f"{cause.evidence}; {f.folded}"
        for rule in (f.rule, *f.explains):
            if rule not in cause.explains:
                cause.explains.append(rule)
    return [f for f in findings if id(f) not in folded]


def _root_cause(symptom: Finding, by_key: dict[Key, Finding]) -> Finding | None:
    # Follow caused_by to a finding that is no one's symptom; a cycle folds nothing.
    seen = {id(symptom)}
    current = symptom
    while True:
        cause = next((by_key[k] for k in current.caused_by if k in by_key), None)
        if cause is None:
            return None if current is symptom else current
        if id(cause) in seen:
            return None
        seen.add(id(cause))
        current = cause
