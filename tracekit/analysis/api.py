"""``tracekit.analyze``: read traces, assemble requests, aggregate, run the rules, report.

The whole pipeline streams (:mod:`tracekit.analysis.pipeline`): memory is bounded by the
assembly window, the routes x stages statistics and the request sample, not by the number of
spans read. A large OTLP JSON Lines file runs the same pipeline in one worker process per
byte range (:mod:`tracekit.analysis.readers.parallel`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from tracekit import semconv
from tracekit.analysis.assembly.grouping import LeftOut
from tracekit.analysis.model import RequestRecord, Span
from tracekit.analysis.pipeline import BATCH_SPANS, Pipeline, Settings
from tracekit.analysis.readers.common import ReadStats
from tracekit.analysis.report import Report, build_report
from tracekit.analysis.slo import SLO, parse_slo
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.analysis.stats.intervals import idle_stretches
from tracekit.errors import ConfigurationError, TraceFormatError

#: Distinct service names listed in a report (hostile input could have millions).
MAX_SERVICES = Settings.max_services


def analyze(
    source: Any,
    *,
    route: str | None = None,
    slo: str | Mapping[str, Any] | SLO | None = None,
    service: str | None = None,
    lookback: str = "1h",
    limit: int | None = None,
    timeout: float | None = None,
    max_response_mb: float | None = None,
    project: str | None = None,
    observe: Callable[[RequestRecord], None] | None = None,
    cores: int | None = None,
) -> Report:
    """Analyse traces and report what is slow and what fixes it.

    Args:
        source: a trace file path (OTLP JSON / JSON Lines, Jaeger JSON), a Jaeger query URL
            (with ``service``), or in-memory spans (``tracekit.record()``'s, or
            :class:`~tracekit.analysis.model.Span` objects); whatever
            :func:`tracekit.analysis.readers.read_spans` accepts.
        route: analyse only this route: the full name (``"POST /v1/chat/completions"``) or
            its path (``"/v1/chat/completions"``).
        slo: latency targets for goodput, e.g. ``"ttft=500ms,itl=50ms,e2e=5s"`` or
            ``{"ttft": "500ms"}`` (see :mod:`tracekit.analysis.slo`).
        service: the service to query (Jaeger URL sources).
        lookback: how far back to query (Jaeger URL sources), e.g. ``"1h"``.
        limit: the most traces to fetch (Jaeger URL sources).
        timeout: seconds the whole Jaeger query may take (default 60).
        max_response_mb: the largest Jaeger answer read, in MiB (default 256); for
            Phoenix, over all its pages.
        project: read a URL source as Arize Phoenix's REST API, this project's spans
            (Phoenix's default project is ``"default"``).
        observe: called with every request analysed, as it is assembled (``tracekit
            compare`` keeps per-request values this way); the file is then read in one
            process, since a callable does not reach the parallel reader's workers.
        cores: CPU cores of the gateway host, for the projections' replay; ``None``: the
            trace's (``tracekit.process.cpus``), else this machine's. The report's model
            statement says which.

    Returns:
        The :class:`~tracekit.analysis.report.Report`.

    Raises:
        SourceNotFoundError: the file is missing, or the Jaeger API is unreachable or did
            not answer within ``timeout``.
        TraceFormatError: the input is not a trace file tracekit can read, or the Jaeger
            answer is larger than ``max_response_mb``.
        SourceError: out of memory while reading.
        ConfigurationError: a bad ``slo`` or ``cores``, or a ``route`` that no request has.

    Cost: linear in the spans read; memory bounded by the assembly window (10,000 spans of
    open traces), routes x stages and a 20,000-request sample. A large OTLP JSON Lines file
    is read by one process per CPU (``TRACEKIT_ANALYZE_WORKERS`` sets how many), with the
    same result (:mod:`tracekit.analysis.readers.parallel`; figures in
    ``docs/performance-analyzer.md``).
    """
    from tracekit.analysis.readers import read_spans

    targets = parse_slo(slo)
    _check_cores(cores)
    options = (service, limit, timeout, max_response_mb, project)
    if lookback == "1h" and observe is None and all(option is None for option in options):
        report = _analyze_in_parallel(source, route, targets, cores)
        if report is not None:
            return report
    stream = read_spans(
        source,
        service=service,
        lookback=lookback,
        limit=limit,
        timeout=timeout,
        max_response_mb=max_response_mb,
        project=project,
    )
    try:
        report = analyze_spans(
            stream, source=stream.source, route=route, slo=targets, observe=observe, cores=cores
        )
    finally:
        stream.close()
    _warn(report, stream.stats)
    return report


def _warn(report: Report, stats: ReadStats) -> None:
    # What the reader skipped comes first: it often explains the lines after it (a cut last
    # line leaves stages without their request span).
    lines = []
    if stats.skipped:
        first = f" (first: {stats.reasons[0]})" if stats.reasons else ""
        if not report.spans:  # nothing was readable: no report to give, not an empty one
            raise TraceFormatError(
                f"{report.source}: no span could be read ({stats.skipped:,} skipped"
                f"{'; the first: ' + stats.reasons[0] if stats.reasons else ''})"
            )
        lines.append(f"skipped {stats.skipped:,} malformed span{'s' if stats.skipped != 1 else ''}{first}")
    if stats.truncated:
        lines.append(f"cut {stats.truncated:,} oversized attribute values or lists")
    if stats.cut_tail_bytes:
        lines.append(
            f"skipped an incomplete last line ({stats.cut_tail_bytes:,} bytes): is the file "
            "still being written?"
        )
    report.warnings[:0] = lines


def _warn_left_out(report: Report, left_out: LeftOut) -> None:
    # Stage spans without their request span are not requests (assembly leaves them out):
    # one line says so, and why it usually happens (docs/composition.md). Spans read twice
    # are counted once: one line says so, since a provider exporting twice is a set-up bug.
    if left_out.duplicate_spans:
        report.warnings.append(
            f"{left_out.duplicate_spans:,} spans repeated a span id already read in their "
            "trace, and were counted once: was each span exported twice (two exporters or "
            "processors writing to the same place)?"
        )
    if left_out.model_server_spans:
        report.warnings.append(
            f"{left_out.model_server_spans:,} model server spans ({semconv.VLLM_REQUEST_SPAN}) "
            "had no model call in the input to join, so they are not requests: calls straight "
            "to the model server, or a gateway whose spans went elsewhere"
        )
    if left_out.orphan_spans:
        report.warnings.append(
            f"{left_out.orphan_spans:,} stage spans in {left_out.orphan_traces:,} traces have no "
            "request (SERVER) span in the input, so they are not counted as requests: was the "
            "server span exported elsewhere? (docs/composition.md)"
        )


def _check_cores(cores: int | None) -> None:
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ConfigurationError(f"cores must be a whole number >= 1, not {cores!r}")


def _analyze_in_parallel(
    source: Any, route: str | None, slo: SLO | None, cores: int | None
) -> Report | None:
    # A large OTLP JSON Lines file on more than one CPU; None: read it in one pass instead.
    from tracekit.analysis.readers import parallel

    path = parallel.file_path(source)
    if path is None:
        return None
    plan = parallel.plan_file(path, path, workers=parallel.worker_count())
    if plan is None:
        return None
    with _gc_paused():
        try:
            agg, found = parallel.analyze_plan(plan, Settings(slo=slo, route=route))
        except OSError:  # no worker process could be started here: one pass it is
            return None
        report = _report(agg, path, route, found.spans, found.services, found.matched, found.others,
                         cores)  # fmt: skip
    _warn(report, found.stats)
    _warn_left_out(report, found.left_out)
    return report


def _report(
    agg: Aggregator,
    source: str,
    route: str | None,
    spans: int,
    services: Iterable[str],
    matched: Iterable[str],
    others: Iterable[str],
    cores: int | None = None,
) -> Report:
    matched, others = list(matched), list(others)
    if route is not None and not matched and others:
        raise ConfigurationError(
            f"no request has route {route!r}; routes seen include: {', '.join(others)}"
        )
    report = build_report(
        agg,
        source=source,
        spans=spans,
        services=sorted(services),
        routes=matched if route is not None else None,
        cores=cores,
    )
    _warn_idle(report)
    return report


def _warn_idle(report: Report) -> None:
    # The throughput figures divide by the whole recorded period: its idle stretches (a new
    # user's warm-up request 3 s before a burst read 26 req/s for 119) are said, found as
    # tracekit compare finds the ones it leaves out (steady traffic at a low rate keeps its
    # gaps: its throughput is what it says).
    sample = report.sample
    if not sample or report.requests > len(sample):
        return  # the sample is the earliest requests only: the gaps after it are not known
    idle = idle_stretches([(r.start_ns, r.end_ns) for r in sample])
    if not idle:
        return
    period = max(r.end_ns for r in sample) - min(r.start_ns for r in sample)
    total = sum(b - a for a, b in idle)
    report.warnings.append(
        f"for {total / 1e9:.1f} s ({total / period:.0%} of the recorded period) no request was in "
        f"flight, and every throughput figure here counts that time (tracekit compare leaves it "
        f"out): was a request sent long before the load (a warm-up), or did the load pause?"
    )


def analyze_spans(
    spans: Iterable[Span],
    *,
    source: str = "memory",
    route: str | None = None,
    slo: SLO | None = None,
    observe: Callable[[RequestRecord], None] | None = None,
    cores: int | None = None,
) -> Report:
    """The pipeline behind :func:`analyze`, from spans already read.

    Args:
        spans: normalised spans.
        source: what was read, for the report.
        route: as in :func:`analyze`.
        slo: parsed targets.
        observe: as in :func:`analyze`.
        cores: as in :func:`analyze`.

    Returns:
        The report.

    Raises:
        ConfigurationError: ``route`` matched no request.
    """
    pipeline = Pipeline(Settings(slo=slo, route=route), observe=observe)
    with _gc_paused():
        iterator = iter(spans)
        while batch := list(itertools.islice(iterator, BATCH_SPANS)):
            pipeline.add(batch)
        pipeline.finish()
        report = _report(
            pipeline.aggregator, source, route, pipeline.spans, pipeline.services,
            pipeline.matched, pipeline.others, cores,
        )  # fmt: skip
    _warn_left_out(report, pipeline.left_out)
    return report


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # The pipeline allocates millions of small acyclic objects (reference counting frees
    # them) while keeping ~10^5 alive (window, sample); the cyclic collector would rescan
    # those again and again (docs/performance-analyzer.md).
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            # What the analysis keeps (the report's sample: ~600,000 small containers for
            # 20,000 requests) is young and acyclic: the first collection after re-enabling
            # would walk all of it for nothing. Moved to the oldest generation (freeze, then
            # unfreeze) it waits for the next full collection.
            gc.freeze()
            gc.unfreeze()
            gc.enable()
