"""The analyzer's result: :class:`Report`, its JSON form (``tracekit.report/1``) and renderers.

:func:`build_report` turns an :class:`~tracekit.analysis.stats.aggregate.Aggregator` into a
:class:`Report`: the route statistics, the findings of the rules run on the request sample,
the replay model's self-check (``validation``), the slowest request as a waterfall
(``slowest``), an event-loop ``timeline`` of at most :data:`TIMELINE_REQUESTS` requests
around the longest loop slice of the sample, and the ``loop`` view: per event loop, what it
ran per window (:mod:`tracekit.analysis.stats.loop_windows`), and each route's share of it.
``Report.to_dict()`` is the stable JSON schema (``docs/analyzer.md``); ``Report.from_dict``
reads it back, filling keys that older files lack with defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import ReplayConfig, Replayer
from tracekit.analysis.rules import run_rules
from tracekit.analysis.rules.findings import Finding, RuleContext, worst_severity
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import ConfigurationError

SCHEMA = "tracekit.report/1"
#: Requests shown in the event-loop timeline (a window around the longest loop slice).
TIMELINE_REQUESTS = 200
#: Spans shown in the slowest request's waterfall (the earliest-starting ones).
WATERFALL_SPANS = 500


@dataclass
class Report:
    """What the analyzer found; see ``docs/analyzer.md`` for every key of :meth:`to_dict`.

    Attributes:
        source: what was read (a path, a Jaeger URL, or "memory").
        requests: requests analysed.
        spans: spans read.
        services: service names seen, sorted.
        instrumented: any request carried tracekit attributes.
        slo: the SLO targets (ms) or ``None``.
        validation: the replay model's self-check, or ``None`` when it was not run.
        routes: one dict per route (busiest first), as in ``to_dict()["routes"]``.
        findings: the rules' findings, most severe first.
        slowest: the slowest request as a waterfall, or ``None`` when there are no requests.
        timeline: the event-loop timeline, or ``None`` for uninstrumented traces.
        loop: the loop view (``tracekit.loop`` windows), or ``None`` when the traces have none.
        sample: the requests the rules and the replay saw (not serialised).
        warnings: what the reader skipped or cut, one line each (not serialised; the CLI
            prints them on stderr).
    """

    source: str
    requests: int
    spans: int
    services: list[str]
    instrumented: bool
    slo: dict[str, float | None] | None
    validation: dict[str, Any] | None
    routes: list[dict[str, Any]]
    findings: list[Finding]
    slowest: dict[str, Any] | None
    timeline: dict[str, Any] | None
    loop: dict[str, Any] | None = None
    sample: list[RequestRecord] = field(default_factory=list, repr=False)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, schema ``tracekit.report/1`` (stable key set)."""
        return {
            "schema": SCHEMA,
            "source": self.source,
            "requests": self.requests,
            "spans": self.spans,
            "services": list(self.services),
            "instrumented": self.instrumented,
            "slo": self.slo,
            "validation": self.validation,
            "routes": self.routes,
            "findings": [f.to_dict() for f in self.findings],
            "slowest": self.slowest,
            "timeline": self.timeline,
            "loop": self.loop,
        }

    def to_json(self, *, indent: bool = True) -> str:
        """:meth:`to_dict` as JSON text (non-finite numbers become ``null``)."""
        option = orjson.OPT_INDENT_2 if indent else 0
        return orjson.dumps(self.to_dict(), option=option).decode()

    def to_text(self, width: int | None = None, color: bool | None = None) -> str:
        """The report for a terminal (see :func:`tracekit.render.text.render_text`).

        Args:
            width: columns; ``None`` asks the terminal (80 when unknown).
            color: ANSI colour; ``None`` means on only when stdout is a TTY and ``NO_COLOR``
                is unset.
        """
        from tracekit.render.text import render_text

        return render_text(self, width=width, color=color)

    def to_html(self) -> str:
        """The report as one self-contained HTML page."""
        from tracekit.render.html import render_html

        return render_html(self)

    def worst_severity(self) -> str | None:
        """The most severe finding's severity, or ``None`` without findings."""
        return worst_severity(f.severity for f in self.findings)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Rebuild a report from :meth:`to_dict` output (older files: missing keys default).

        Args:
            data: a ``tracekit.report/1`` dict.

        Returns:
            The report (with an empty ``sample``).

        Raises:
            ConfigurationError: ``data`` is not a tracekit report of a known schema version.
        """
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise ConfigurationError(f"not a {SCHEMA} report (schema: {got!r})")
        return cls(
            source=str(data.get("source", "")),
            requests=int(data.get("requests", 0)),
            spans=int(data.get("spans", 0)),
            services=list(data.get("services", [])),
            instrumented=bool(data.get("instrumented", False)),
            slo=data.get("slo"),
            validation=data.get("validation"),
            routes=list(data.get("routes", [])),
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            slowest=data.get("slowest"),
            timeline=data.get("timeline"),
            loop=data.get("loop") if isinstance(data.get("loop"), Mapping) else None,
        )


def build_report(
    agg: Aggregator,
    *,
    source: str,
    spans: int,
    services: Sequence[str],
    run_rules: bool = True,
    routes: Sequence[str] | None = None,
    cores: int | None = None,
) -> Report:
    """Finish an analysis: route statistics, findings, validation, waterfall and timeline.

    Args:
        agg: the aggregator that saw every request.
        source: what was read, for the report header.
        spans: how many spans were read.
        services: service names seen.
        run_rules: run the rules and the replay on the sample (off for raw statistics).
        routes: report findings on these routes only (the ``route`` filter of ``analyze``;
            ``agg`` counted only them, its sample holds every route); ``None``: all.
        cores: the gateway host's cores for the replay (``None``: the trace's, else this
            machine's; ``ReplayConfig.cores``).

    Returns:
        The report.
    """
    sample = agg.sample()
    route_dicts = agg.routes()
    findings: list[Finding] = []
    validation: dict[str, Any] | None = None
    if run_rules and sample and agg.requests:
        findings, validation = _rules_and_validation(sample, route_dicts, agg, routes, cores)
    return Report(
        source=source,
        requests=agg.requests,
        spans=spans,
        services=sorted(services),
        instrumented=agg.instrumented,
        slo=agg.slo.to_dict() if agg.slo is not None else None,
        validation=validation,
        routes=route_dicts,
        findings=findings,
        slowest=waterfall(agg.slowest) if agg.slowest is not None else None,
        timeline=timeline(sample) if agg.instrumented else None,
        loop=agg.loops.to_dict(_route_loop_cpu(agg, route_dicts, sample)),
        sample=sample,
    )


def _rules_and_validation(
    sample: list[RequestRecord],
    route_dicts: list[dict[str, Any]],
    agg: Aggregator,
    only: Sequence[str] | None,
    cores: int | None,
) -> tuple[list[Finding], dict[str, Any] | None]:
    single = only[0] if only is not None and len(only) == 1 else None
    # One replayer for the self-check and every projection: it caches the as-recorded replay.
    replayer = Replayer(ReplayConfig(cores=cores), agg.loops.loop_cpu())
    ctx = RuleContext(
        route=single, routes=route_dicts, slo=agg.slo, project=replayer.project, loops=agg.loops,
        statement=replayer.statement,
    )
    validation: dict[str, Any] = replayer.validate(sample).to_dict()
    found = run_rules(sample, ctx, routes=only)
    return found, validation


def _route_loop_cpu(
    agg: Aggregator, route_dicts: list[dict[str, Any]], sample: list[RequestRecord]
) -> list[tuple[str, str, float]]:
    # (route, service, total on-loop request CPU in ms) of each instrumented route: the mean
    # breakdown, with what its requests ran after their responses, times the instrumented
    # requests; the service is the one most of the route's sampled requests ran in (routes
    # are not kept per service).
    if not agg.loops.loops:
        return []
    services: dict[str, dict[str, int]] = {}
    for req in sample:
        count = services.setdefault(req.route, {})
        count[req.service] = count.get(req.service, 0) + 1
    out = []
    for stats, route in zip(agg.route_stats, route_dicts, strict=True):
        cpu = (route.get("breakdown_ms") or {}).get("cpu_on_loop")
        seen = services.get(stats.route)
        if cpu is None or not seen or not stats.instrumented:
            continue
        service = max(sorted(seen), key=lambda s: seen[s])
        cpu += (route.get("after_response_cpu_ms") or {}).get("cpu_on_loop", 0.0)
        out.append((stats.route, service, cpu * stats.instrumented))
    return out


def waterfall(req: RequestRecord) -> dict[str, Any]:
    """The report's ``slowest`` object for one request.

    Args:
        req: the request.

    Returns:
        ``{"trace_id", "route", "wall_ms", "spans"}``; ``spans`` starts with the request span
        (depth 0) followed by at most :data:`WATERFALL_SPANS` - 1 stages in start order, each
        with its depth in the span tree and its offset from the request's start.
    """
    depth = _depths(req)
    spans = [
        {
            "name": req.route,
            "kind": "server",
            "depth": 0,
            "start_ms": 0.0,
            "wall_ms": req.wall_ms,
            "cpu_ms": req.cpu_ms,
            "wait_ms": _request_wait(req),
            "loop_wait_ms": req.loop_wait_ms,
            "on_loop": None,
        }
    ]
    for stage in req.stages[: WATERFALL_SPANS - 1]:
        spans.append(
            {
                "name": stage.name,
                "kind": stage.kind,
                "depth": depth.get(stage.span_id, 1),
                "start_ms": (stage.start_ns - req.start_ns) / 1e6,
                "wall_ms": stage.wall_ms,
                "cpu_ms": stage.cpu_ms,
                "wait_ms": stage.wait_ms,
                "loop_wait_ms": stage.loop_wait_ms,
                "on_loop": stage.on_loop,
            }
        )
    return {"trace_id": req.trace_id, "route": req.route, "wall_ms": req.wall_ms, "spans": spans}


def _request_wait(req: RequestRecord) -> float | None:
    if req.model_wait_ms is None and req.io_wait_ms is None:
        return None
    return (req.model_wait_ms or 0.0) + (req.io_wait_ms or 0.0)


def _depths(req: RequestRecord) -> dict[str, int]:
    parent_of = {s.span_id: s.parent_id for s in req.stages}
    depth: dict[str, int] = {req.span_id: 0}
    for stage in req.stages:
        chain: list[str] = []
        node: str | None = stage.span_id
        # Walk up to a known depth; a cycle or a missing parent ends the walk (depth 1).
        while node is not None and node not in depth and node not in chain:
            chain.append(node)
            node = parent_of.get(node)
        base = depth.get(node, 0) if node is not None else 0
        for offset, span_id in enumerate(reversed(chain), start=1):
            depth[span_id] = base + offset
    return depth


def timeline(sample: list[RequestRecord]) -> dict[str, Any] | None:
    """The report's ``timeline``: who held the event loop, when, and who waited for it.

    Args:
        sample: requests sorted by start time.

    Returns:
        A window of at most :data:`TIMELINE_REQUESTS` consecutive requests centred on the one
        with the longest loop slice (the first requests when none has a slice); ``None``
        when no request in the sample is instrumented.
    """
    if not any(r.instrumented for r in sample):
        return None
    centre = max(range(len(sample)), key=lambda i: _longest_slice(sample[i]))
    first = max(0, min(centre - TIMELINE_REQUESTS // 2, len(sample) - TIMELINE_REQUESTS))
    window = sample[first : first + TIMELINE_REQUESTS]
    start_ns = min(r.start_ns for r in window)
    end_ns = max(r.end_ns for r in window)
    return {
        "start_ns": start_ns,
        "duration_ms": (end_ns - start_ns) / 1e6,
        "lanes": [_lane(r, start_ns) for r in window],
    }


def _longest_slice(req: RequestRecord) -> int:
    slices = [*req.loop_slices, *(s for stage in req.stages for s in stage.loop_slices)]
    return max((end - start for start, end in slices), default=-1)


def _lane(req: RequestRecord, base_ns: int) -> dict[str, Any]:
    def ms(ns: int) -> float:
        return (ns - base_ns) / 1e6

    slices: list[tuple[float, float, str, str]] = [
        (ms(a), ms(b), "request", "other") for a, b in req.loop_slices
    ]
    waits: list[tuple[float, float, str]] = [(ms(a), ms(b), "request") for a, b in req.loop_waits]
    for stage in req.stages:
        slices.extend((ms(a), ms(b), stage.name, stage.kind) for a, b in stage.loop_slices)
        waits.extend((ms(a), ms(b), stage.name) for a, b in stage.loop_waits)
    slices.sort()
    waits.sort()
    return {
        "trace_id": req.trace_id,
        "route": req.route,
        "start_ms": ms(req.start_ns),
        "end_ms": ms(req.end_ns),
        "slices": [
            {"stage": stage, "kind": kind, "start_ms": a, "end_ms": b}
            for a, b, stage, kind in slices
        ],
        "loop_waits": [{"stage": stage, "start_ms": a, "end_ms": b} for a, b, stage in waits],
    }
