"""``tracekit.analyze``: read traces, assemble requests, aggregate, run the rules, report.

The whole pipeline streams (model.py): memory is bounded by the assembly window, the routes x
stages statistics and the request sample, not by the number of spans read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tracekit.analysis.aggregate import Aggregator
from tracekit.analysis.assemble import assemble
from tracekit.analysis.model import Span
from tracekit.analysis.report import Report, build_report
from tracekit.analysis.slo import SLO, parse_slo
from tracekit.errors import ConfigurationError

#: Distinct service names listed in a report (hostile input could have millions).
MAX_SERVICES = 1_000
#: Route names quoted when a ``route`` filter matches nothing.
_ROUTES_QUOTED = 10


def analyze(
    source: Any,
    *,
    route: str | None = None,
    slo: str | Mapping[str, Any] | SLO | None = None,
    service: str | None = None,
    lookback: str = "1h",
    limit: int | None = None,
) -> Report:
    """Analyse traces and report what is slow and what fixes it.

    Args:
        source: a trace file path (OTLP JSON / JSON Lines, Jaeger JSON), a Jaeger query URL
            (with ``service``), or in-memory spans (``tracekit.record()``'s, or
            :class:`~tracekit.analysis.model.Span` objects); whatever
            :func:`tracekit.analysis.sources.read_spans` accepts.
        route: analyse only this route: the full name (``"POST /v1/chat/completions"``) or
            its path (``"/v1/chat/completions"``).
        slo: latency targets for goodput, e.g. ``"ttft=500ms,itl=50ms,e2e=5s"`` or
            ``{"ttft": "500ms"}`` (see :mod:`tracekit.analysis.slo`).
        service: the service to query (Jaeger URL sources).
        lookback: how far back to query (Jaeger URL sources), e.g. ``"1h"``.
        limit: the most traces to fetch (Jaeger URL sources).

    Returns:
        The :class:`~tracekit.analysis.report.Report`.

    Raises:
        SourceNotFoundError: the file is missing or the Jaeger API is unreachable.
        TraceFormatError: the input is not a trace file tracekit can read.
        ConfigurationError: a bad ``slo``, or a ``route`` that no request has.

    Cost: linear in the spans read (about 10 µs per span); memory bounded by the assembly
    window (10,000 traces), routes x stages and a 20,000-request sample.
    """
    from tracekit.analysis.sources import read_spans

    targets = parse_slo(slo)
    counter = _SpanCounter()
    spans = counter.count(read_spans(source, service=service, lookback=lookback, limit=limit))
    return analyze_spans(spans, source=_describe(source), route=route, slo=targets, counter=counter)


def analyze_spans(
    spans: Iterable[Span],
    *,
    source: str = "memory",
    route: str | None = None,
    slo: SLO | None = None,
    counter: _SpanCounter | None = None,
) -> Report:
    """The pipeline behind :func:`analyze`, from spans already read.

    Args:
        spans: normalised spans.
        source: what was read, for the report.
        route: as in :func:`analyze`.
        slo: parsed targets.
        counter: the counter wrapping ``spans`` (one is made when ``None``).

    Returns:
        The report.

    Raises:
        ConfigurationError: ``route`` matched no request.
    """
    if counter is None:
        counter = _SpanCounter()
        spans = counter.count(spans)
    agg = Aggregator(slo=slo)
    seen: dict[str, None] = {}
    for req in assemble(spans):
        if route is not None and not _matches(req.route, route):
            if len(seen) < _ROUTES_QUOTED:
                seen[req.route] = None
            continue
        agg.add(req)
    if route is not None and agg.requests == 0 and seen:
        raise ConfigurationError(
            f"no request has route {route!r}; routes seen include: {', '.join(seen)}"
        )
    return build_report(agg, source=source, spans=counter.spans, services=sorted(counter.services))


class _SpanCounter:
    """Counts spans and collects service names as they stream past."""

    def __init__(self) -> None:
        self.spans = 0
        self.services: set[str] = set()

    def count(self, spans: Iterable[Span]) -> Iterator[Span]:
        services = self.services
        n = 0
        try:
            for span in spans:
                n += 1
                if span.service and span.service not in services and len(services) < MAX_SERVICES:
                    services.add(span.service)
                yield span
        finally:
            self.spans += n


def _matches(name: str, wanted: str) -> bool:
    return name == wanted or name.partition(" ")[2] == wanted


def _describe(source: Any) -> str:
    if isinstance(source, (str, bytes, os.PathLike)):
        return os.fsdecode(source)
    return "memory"
