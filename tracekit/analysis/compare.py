"""``tracekit compare BEFORE AFTER``: the measured change per route, and BEFORE's projections
checked against it.

Both runs are read by the analyzer itself (:func:`tracekit.analysis.api.analyze`, so any
source it takes: trace files, a Jaeger query URL, in-memory spans), with an ``observe`` hook
that keeps, per route, what the intervals need of each request: its latency and end time, TTFT
and ITL when it streamed, the breakdown when it is instrumented
(:mod:`tracekit.analysis.stats.route_values`), and every request's start and end (the run's idle
stretches). Those are arrays, about 106 bytes a request: unlike ``analyze``, ``compare``'s
memory grows with the requests (a million requests a side, about 210 MB). The statistics
are in :mod:`tracekit.analysis.stats.confidence`; the projection verdicts in
:mod:`tracekit.analysis.projection_check`.

Which projection is "the change made": BEFORE's findings each project one fix applied alone.
``finding="RULE[:STAGE]"`` names the fix that was made; by default it is the first finding
of each route that carries a projection (the most severe, then the largest impact). Only the
change made is judged (:mod:`tracekit.analysis.projection_check`); BEFORE's other projected
findings of the route are listed with their figures as ``not the change made``. A named
finding without a projection (the replay declined) is the change made all the same: its
route and stage are measured, and its check says there was no projection and why.
"""

from __future__ import annotations

import os
import random
import re
import stat
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracekit.analysis.projection_check import ProjectionCheck, check_finding, unprojected
from tracekit.analysis.readers.jaeger_api import is_url
from tracekit.analysis.report import Report
from tracekit.analysis.rules.findings import Finding
from tracekit.analysis.stats.confidence import Change, mean_change, quantile_change, rate_change
from tracekit.analysis.stats.intervals import Interval
from tracekit.analysis.stats.route_stats import BREAKDOWN_KEYS
from tracekit.analysis.stats.route_values import RouteCollector, RouteValues
from tracekit.errors import ConfigurationError, TraceFormatError, TracekitError

__all__ = ["SCHEMA", "Comparison", "RouteComparison", "Side", "compare"]

SCHEMA = "tracekit.compare/1"
#: Percentiles compared: latency, and TTFT / ITL of streamed requests.
LATENCY_QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
STREAM_QUANTILES = (("p50", 0.50), ("p95", 0.95))
_FINDING = re.compile(r"[a-z0-9][a-z0-9-]*(:.+)?")


@dataclass
class Side:
    """One run as read: what the comparison says about it besides the statistics.

    Attributes:
        source: what was read. requests: requests analysed. routes: their routes, busiest
        first. warnings: what the reader skipped (the CLI prints them). idle_s: the idle
        stretches left out of its throughput (:func:`~tracekit.analysis.stats.intervals.idle_stretches`).
    """

    source: str
    requests: int
    routes: list[str]
    warnings: list[str] = field(default_factory=list)
    idle_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The ``before`` / ``after`` object of ``tracekit.compare/1``."""
        return {"source": self.source, "requests": self.requests, "routes": list(self.routes),
                "idle_s": self.idle_s}  # fmt: skip


@dataclass
class RouteComparison:
    """One route measured in both runs.

    Attributes:
        route: its name.
        requests / errors: (before, after).
        latency: ``p50``, ``p95``, ``p99`` changes (ms).
        throughput: requests/s over the active window.
        streaming: ``{"ttft_ms": {"p50", "p95"}, "itl_ms": {...}}``, or ``None`` when
            neither run streamed on this route.
        breakdown: mean ms per request of each ``BREAKDOWN_KEYS`` component, or ``None``
            when neither run is instrumented.
        projections: BEFORE's projected findings on this route, checked (only the change
            made is judged), and the change made when it has no projection.
    """

    route: str
    requests: tuple[int, int]
    errors: tuple[int, int]
    latency: dict[str, Change]
    throughput: Change
    streaming: dict[str, dict[str, Change]] | None
    breakdown: dict[str, Change] | None
    projections: list[ProjectionCheck] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``routes[]`` item of ``tracekit.compare/1``."""
        streaming = None
        if self.streaming is not None:
            streaming = {k: _changes(v) for k, v in self.streaming.items()}
        return {
            "route": self.route,
            "requests": list(self.requests),
            "errors": list(self.errors),
            "latency_ms": _changes(self.latency),
            "throughput_rps": self.throughput.to_dict(),
            "streaming": streaming,
            "breakdown_ms": None if self.breakdown is None else _changes(self.breakdown),
            "projections": [p.to_dict() for p in self.projections],
        }


def _changes(changes: Mapping[str, Change]) -> dict[str, Any]:
    return {key: change.to_dict() for key, change in changes.items()}


@dataclass
class Comparison:
    """Two runs compared; see ``docs/analyzer.md`` ("Comparing two runs") for every key.

    Attributes:
        before / after: the runs.
        routes: the routes both runs have, in BEFORE's order (busiest first).
        only_before / only_after: routes one run has and the other does not.
        confidence: the intervals' coverage. draws / seed: the bootstrap's.
        finding: the ``RULE[:STAGE]`` selection, or ``None`` (each route's top finding).
    """

    before: Side
    after: Side
    routes: list[RouteComparison]
    only_before: list[str]
    only_after: list[str]
    confidence: float
    draws: int
    seed: int
    finding: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The comparison as plain data, schema ``tracekit.compare/1``."""
        return {
            "schema": SCHEMA,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "method": {
                "confidence": self.confidence,
                "percentiles": "bootstrap",
                "means": "welch",
                "throughput": "welch over per-bin rates",
                "draws": self.draws,
                "seed": self.seed,
                "finding": self.finding,
            },
            "routes": [r.to_dict() for r in self.routes],
            "only_before": list(self.only_before),
            "only_after": list(self.only_after),
        }

    def to_json(self, *, indent: bool = True) -> str:
        """:meth:`to_dict` as JSON text (non-finite numbers become ``null``)."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 if indent else 0).decode()

    def to_text(self, width: int | None = None, color: bool | None = None) -> str:
        """The comparison for a terminal (:func:`tracekit.render.compare_text.render_comparison`).

        Args:
            width: columns; ``None`` asks the terminal (80 when unknown).
            color: ANSI colour; ``None``: only when stdout is a TTY and ``NO_COLOR`` is unset.
        """
        from tracekit.render.compare_text import render_comparison

        return render_comparison(self, width=width, color=color)


def compare(
    before: Any,
    after: Any,
    *,
    route: str | None = None,
    finding: str | None = None,
    confidence: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
    service: str | None = None,
    lookback: str = "1h",
    limit: int | None = None,
    timeout: float | None = None,
    max_response_mb: float | None = None,
    cores: int | None = None,
) -> Comparison:
    """Measure what changed per route between two runs, and check BEFORE's projections.

    Args:
        before / after: trace sources, as :func:`tracekit.analyze` takes them (a trace file,
            a Jaeger query URL, in-memory spans).
        route: compare this route only (full name or path).
        finding: ``"RULE"`` or ``"RULE:STAGE"``: the fix that was made, among BEFORE's
            findings (one without a projection too: then it is measured only); ``None``:
            each route's top finding with a projection.
        confidence: the intervals' coverage, between 0.5 and 0.995.
        draws: bootstrap draws per side and percentile (at least 200).
        seed: the bootstrap's seed: the same inputs and seed give the same intervals.
        service, lookback, limit, timeout, max_response_mb: Jaeger query options, applied
            to whichever side is a Jaeger URL.
        cores: the gateway host's CPU cores for BEFORE's projections, as in
            :func:`tracekit.analyze` (default: the trace's, else this machine's).

    Returns:
        The :class:`Comparison`.

    Raises:
        SourceNotFoundError / TraceFormatError / SourceError: a side could not be read (the
            message starts with ``before:`` or ``after:``).
        ConfigurationError: a bad option, a side without requests, no route in both runs,
            or a ``finding`` no finding of BEFORE on a route both runs have matches.

    Cost: two analyses (rules and replay included) plus, per route, O(n log n) to sort
    and O(draws) per percentile; memory as the module docstring says.
    """
    if not 0.5 <= confidence <= 0.995:
        raise ConfigurationError(f"confidence must be between 0.5 and 0.995, not {confidence!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 200:
        raise ConfigurationError(f"draws must be an integer >= 200, not {draws!r}")
    wanted = _parse_finding(finding)
    jaeger = {"service": service, "lookback": lookback, "limit": limit, "timeout": timeout,
              "max_response_mb": max_response_mb}  # fmt: skip
    given = lookback != "1h" or any(v is not None for k, v in jaeger.items() if k != "lookback")
    if given and not any(isinstance(s, str) and is_url(s) for s in (before, after)):
        raise ConfigurationError(
            "service, lookback, limit, timeout and max_response_mb (on the command line "
            "--service, --lookback, --limit, --timeout, --max-response-mb) apply only to a "
            "Jaeger query URL, and neither run is one"
        )
    b_report, b_values, b_idle = _measure(before, "before", route, jaeger, cores)
    a_report, a_values, a_idle = _measure(after, "after", route, jaeger, cores)
    common = [name for name in b_values if name in a_values]
    if not common:
        raise ConfigurationError(
            f"no route is in both runs: before has {_names(b_values)}; after has "
            f"{_names(a_values)}"
        )
    found_after = {(f.rule, f.route, f.stage) for f in a_report.findings}
    routes = [_route(name, b_values[name], a_values[name], seed, confidence, draws, (b_idle, a_idle))
              for name in common]  # fmt: skip
    measured: dict[str, dict[str, Change]] = {}
    for compared in routes:
        changes = measured[compared.route] = {"throughput_rps": compared.throughput}
        changes.update({f"{key}_ms": change for key, change in compared.latency.items()})
    for compared in routes:
        name = compared.route
        on_route = [f for f in b_report.findings if f.route == name]
        made = _made(on_route, wanted)
        checks = []
        for f in on_route:
            found = (f.rule, f.route, f.stage) in found_after
            if isinstance(f.projection, Mapping):
                # A fix to this route's stage may be projected for the route whose requests
                # waited for it: its figures are checked against that route's change.
                target = f.projection.get("route")
                target = target if isinstance(target, str) and target else name
                check = check_finding(f.to_dict(), measured.get(target, {}), still_found=found,
                                      selected=f is made)  # fmt: skip
                check.route = None if target == name else target
                checks.append(check)
            elif f is made:
                checks.append(unprojected(f.to_dict(), still_found=found))
            else:
                continue
            if f is made and f.stage is not None:
                checks[-1].stage_ms = _stage_change(f.stage, b_values[name], a_values[name], confidence)
        compared.projections = checks
    if wanted is not None and not any(c.selected for r in routes for c in r.projections):
        labels = sorted({f.rule if f.stage is None else f"{f.rule}:{f.stage}" for f in b_report.findings
                         if f.route in b_values and f.route in a_values})  # fmt: skip
        raise ConfigurationError(
            f"no finding of before matches {finding!r} on a route both runs have; its findings: "
            f"{', '.join(labels) or 'none'}"
        )
    after_side = _side(a_report, a_values, a_idle)
    if b_report.services and a_report.services and not set(b_report.services) & set(a_report.services):
        # Routes of the same name (POST /v1/chat/completions) in two different applications.
        after_side.warnings.append(
            f"no service in common with before ({_names(dict.fromkeys(b_report.services))} "
            f"before, {_names(dict.fromkeys(a_report.services))} after): are they the same "
            "application? (a renamed service: OTEL_SERVICE_NAME or configure(service_name=))"
        )
    return Comparison(
        before=_side(b_report, b_values, b_idle),
        after=after_side,
        routes=routes,
        only_before=[n for n in b_values if n not in a_values],
        only_after=[n for n in a_values if n not in b_values],
        confidence=confidence,
        draws=draws,
        seed=seed,
        finding=finding,
    )


def _parse_finding(finding: str | None) -> tuple[str, str | None] | None:
    if finding is None:
        return None
    if not isinstance(finding, str) or not _FINDING.fullmatch(finding):
        raise ConfigurationError(
            f"finding must be RULE or RULE:STAGE (e.g. cpu-on-loop:tokenize), not {finding!r}"
        )
    rule, _, stage = finding.partition(":")
    return rule, stage or None


def _made(findings: list[Finding], wanted: tuple[str, str | None] | None) -> Finding | None:
    # The change made on a route: the first finding matching `wanted` (projected or not),
    # else, with no `wanted`, the route's first projected finding.
    for f in findings:
        if wanted is None:
            if isinstance(f.projection, Mapping):
                return f
        elif f.rule == wanted[0] and wanted[1] in (None, f.stage):
            return f
    return None


def _stage_change(stage: str, b: RouteValues, a: RouteValues, confidence: float) -> Change | None:
    # The stage's mean wall ms per request, each side (0 for a request without the stage:
    # a fix that removes the stage shows as its time going to 0); None when neither has it.
    before, after = b.stages.get(stage), a.stages.get(stage)
    if before is None and after is None:
        return None
    return mean_change(b.in_time(before) if before is not None else [],
                       a.in_time(after) if after is not None else [], confidence=confidence)  # fmt: skip


def _measure(
    source: Any, side: str, route: str | None, jaeger: dict[str, Any], cores: int | None
) -> tuple[Report, dict[str, RouteValues], list[Interval]]:
    from tracekit.analysis.api import analyze

    collector = RouteCollector()
    options = jaeger if isinstance(source, str) and is_url(source) else {}
    try:
        report = analyze(source, route=route, observe=collector.add, cores=cores, **options)
    except TraceFormatError as exc:
        if _is_report(source):
            raise TraceFormatError(
                f"{side}: {source} is a tracekit report, not traces: compare needs the traces "
                "(each request's latency, for the confidence intervals)"
            ) from exc
        raise type(exc)(f"{side}: {exc}") from exc
    except TracekitError as exc:
        raise type(exc)(f"{side}: {exc}") from exc
    if not collector.routes:
        raise ConfigurationError(f"{side}: {report.source} has no requests to compare")
    report.sample = []  # the replay's sample is not needed any more
    return report, collector.routes, collector.idle()


def _is_report(source: Any) -> bool:
    # Only on the error path: does the file start like a tracekit JSON report?
    # A regular file only: a pipe (<(zcat ...)) was consumed by the reader already.
    if not isinstance(source, str):
        return False
    try:
        if not stat.S_ISREG(os.stat(source).st_mode):
            return False
        with open(source, "rb") as f:
            head = f.read(4096)
    except (OSError, ValueError):
        return False
    return re.search(rb'"schema"\s*:\s*"tracekit\.report/', head) is not None


def _names(values: Mapping[str, Any]) -> str:
    names = list(values)
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _side(report: Report, values: Mapping[str, RouteValues], idle: list[Interval]) -> Side:
    warnings = list(report.warnings)
    idle_s = sum(b - a for a, b in idle) / 1e9
    if idle:
        # The report's throughput divides by them (it warns only when they are half the run):
        # a warm-up seconds before the load read a throughput gain as a loss.
        warnings.append(
            f"{idle_s:.1f} s with no request in flight ({len(idle)} "
            f"stretch{'es' if len(idle) > 1 else ''} of a second or more, ten times the typical "
            "gap between requests: a warm-up, a pause) left out of its throughput"
        )
    return Side(report.source, report.requests, list(values), warnings, round(idle_s, 3))


def _rng(seed: int, route: str, metric: str) -> random.Random:
    # One stream per (route, metric): results do not depend on the order they are computed
    # in. A str seed is hashed with SHA-512, the same in every process.
    return random.Random(f"{seed}\x00{route}\x00{metric}")


def _throughput(
    before: RouteValues, after: RouteValues, confidence: float, idle: tuple[list[Interval], list[Interval]]
) -> Change:
    return rate_change(before.rates(idle[0]), after.rates(idle[1]), (len(before.wall), len(after.wall)),
                       confidence=confidence)  # fmt: skip


def _route(
    name: str,
    b: RouteValues,
    a: RouteValues,
    seed: int,
    confidence: float,
    draws: int,
    idle: tuple[list[Interval], list[Interval]],
) -> RouteComparison:
    def quantiles(
        key: str, before: array[float], after: array[float], which: tuple[tuple[str, float], ...]
    ) -> dict[str, Change]:
        ordered = b.in_time(before), a.in_time(after)
        return {
            label: quantile_change(
                *ordered, q, confidence=confidence, draws=draws,
                rng=_rng(seed, name, f"{key} {label}"),
            )  # fmt: skip
            for label, q in which
        }

    streaming = None
    if b.ttft or a.ttft or b.itl or a.itl:
        streaming = {
            "ttft_ms": quantiles("ttft", b.ttft, a.ttft, STREAM_QUANTILES),
            "itl_ms": quantiles("itl", b.itl, a.itl, STREAM_QUANTILES),
        }
    parts = None
    if b.parts[0] or a.parts[0]:
        parts = {
            key: mean_change(b.in_time(before), a.in_time(after), confidence=confidence)
            for key, before, after in zip(BREAKDOWN_KEYS, b.parts, a.parts, strict=True)
        }
    return RouteComparison(
        route=name,
        requests=(len(b.wall), len(a.wall)),
        errors=(b.errors, a.errors),
        latency=quantiles("latency", b.wall, a.wall, LATENCY_QUANTILES),
        throughput=_throughput(b, a, confidence, idle),
        streaming=streaming,
        breakdown=parts,
    )
