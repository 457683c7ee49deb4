"""tracekit: what exactly is slow on an LLM gateway's request path, and what fixes it.

The public API (DESIGN §3)::

    app = tracekit.TracekitMiddleware(app, service_name="gateway")
    @tracekit.stage("tokenize") ...;  with tracekit.stage("guardrail"): ...
    tracekit.configure(service_name="gateway", exporter="otlp")
    with tracekit.record() as rec: ...;  rec.report()
    tracekit.analyze("traces.jsonl")
    tracekit.compare("before.jsonl", "after.jsonl")

Importing tracekit loads the OpenTelemetry API only (no SDK, no web framework).
"""

from __future__ import annotations

from typing import Any

from tracekit import _native

_native.load()  # compiled modules or their sources: decided before any is imported

from tracekit.config import configure  # noqa: E402
from tracekit.middleware import TracekitMiddleware  # noqa: E402
from tracekit.recording import record  # noqa: E402
from tracekit.stage import stage  # noqa: E402

__all__ = ["TracekitMiddleware", "analyze", "compare", "configure", "record", "stage"]


def analyze(source: Any, **options: Any) -> Any:
    """Analyze traces and return a report (``tracekit.analysis.api.analyze``).

    Args:
        source: a trace file path (OTLP JSON/JSONL or Jaeger JSON), a Jaeger query URL, or
            in-memory spans (``rec.spans``).
        **options: ``route=``, ``slo=``, ``service=``, ``lookback=``, ``limit=``, ``cores=``.

    Returns:
        A ``Report`` (``.findings``, ``.routes``, ``.to_dict()``, ``.to_text()``, ``.to_html()``).
    """
    from tracekit.analysis.api import analyze as _analyze

    return _analyze(source, **options)


def compare(before: Any, after: Any, **options: Any) -> Any:
    """Compare two runs per route (``tracekit.analysis.compare.compare``).

    Args:
        before: the traces before the change, as :func:`analyze` takes them.
        after: the traces after it.
        **options: ``route=``, ``finding="RULE[:STAGE]"``, ``confidence=``, ``draws=``,
            ``seed=``, and the Jaeger options of :func:`analyze`.

    Returns:
        A ``Comparison``: the measured change per route with confidence intervals, and
        BEFORE's projections checked against it (``.routes``, ``.to_dict()``, ``.to_text()``).
    """
    from tracekit.analysis.compare import compare as _compare

    return _compare(before, after, **options)
