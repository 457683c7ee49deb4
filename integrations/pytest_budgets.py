"""Performance budgets over recorded requests: what ``@pytest.mark.tracekit_budget`` checks.

The pytest plugin (:mod:`tracekit.integrations.pytest_plugin`) holds only hooks; this module
parses budgets (marker keywords, ini strings), measures the recorded requests and writes the
failure table. It imports no pytest: a bad budget raises
:class:`~tracekit.errors.ConfigurationError`, which the plugin turns into ``pytest.UsageError``.

Every measure comes from the analyzer: the requests are the analyzer's
:class:`~tracekit.analysis.model.RequestRecord` objects (``tracekit.analyze``'s ``observe``
hook sees each one), percentiles are :func:`tracekit._percentile.percentile`, the findings
are the report's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracekit.errors import ConfigurationError

if TYPE_CHECKING:
    from tracekit.analysis.model import RequestRecord
    from tracekit.analysis.rules.findings import Finding
    from tracekit.recording import Recording

#: Every budget key, with what it limits (the marker's keywords; ini ``tracekit_budget_<key>``).
KEYS: dict[str, str] = {
    "stage_p95_ms": "p95 wall time of each named stage, ms: {'tokenize': 5} (ini: tokenize=5 model=300)",
    "max_block_ms": "longest hold of the event loop by any request, ms",
    "overhead_ratio": "share of request time outside the model wait (0..1), over all requests",
    "loop_wait_p95_ms": "p95 of the requests' time ready to run but waiting for the loop, ms",
    "ttft_p95_ms": "p95 time to first token (first non-empty body chunk) of streamed requests, ms",
    "findings": "'none' (no analyzer finding at all), or the most severe finding allowed: "
    "'low' or 'medium' ('high' allows every finding)",
}  # fmt: skip

#: Requests named per failed budget in the table (the worst first).
SHOWN = 3


def valid_keys() -> str:
    """The budget keys, for error messages."""
    return ", ".join(KEYS)


def parse(budgets: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Validate budgets given as Python values (the marker's keywords).

    Args:
        budgets: key to value; a ``None`` value unsets the key (an ini default, say).
        origin: where they come from, for the error message.

    Returns:
        The budgets, ``None`` values kept (they unset ini defaults when merged).

    Raises:
        ConfigurationError: an unknown key or a bad value (the message names the valid ones).
    """
    out: dict[str, Any] = {}
    for key, value in budgets.items():
        if key not in KEYS:
            raise ConfigurationError(f"{origin}: unknown budget {key!r}; valid: {valid_keys()}")
        out[key] = None if value is None else _check(key, value, origin)
    return out


def parse_ini(key: str, text: str) -> Any:
    """Validate one ini value (``tracekit_budget_<key>``), given as text.

    Raises:
        ConfigurationError: a bad value.
    """
    origin = f"ini option tracekit_budget_{key}"
    text = text.strip()
    value: Any = text
    if key == "stage_p95_ms":
        value = {}
        for item in text.replace(",", " ").split():
            name, sep, number = item.partition("=")
            if not sep or not name:
                raise ConfigurationError(
                    f"{origin}: expected stage=ms pairs like 'tokenize=5 model=300', not {item!r}"
                )
            value[name] = _number(number, origin)
    elif key != "findings":
        value = _number(text, origin)
    return _check(key, value, origin)


def _number(text: str, origin: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigurationError(f"{origin}: {text!r} is not a number") from None


def _check(key: str, value: Any, origin: str) -> Any:
    where = f"{origin}: {key}={value!r}"
    if key == "findings":
        from tracekit.analysis.rules.findings import SEVERITIES

        choices = ("none", *reversed(SEVERITIES))
        if value not in choices:
            raise ConfigurationError(f"{where}: expected one of {', '.join(map(repr, choices))}")
        return value
    if key == "stage_p95_ms":
        if not isinstance(value, Mapping) or not value:
            raise ConfigurationError(f"{where}: expected a dict of stage name to ms, e.g. {{'tokenize': 5}}")
        return {_stage_name(name, where): _positive(ms, where) for name, ms in value.items()}
    limit = _positive(value, where)
    if key == "overhead_ratio" and limit > 1:
        raise ConfigurationError(f"{where}: a ratio is at most 1")
    return limit


def _stage_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{where}: stage names are non-empty strings")
    return name


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigurationError(f"{where}: expected a number > 0")
    return float(value)


def describe(budgets: Mapping[str, Any]) -> str:
    """``key=value`` of each set budget, in :data:`KEYS` order (the report header)."""
    parts = []
    for key in KEYS:
        value = budgets.get(key)
        if isinstance(value, Mapping):
            value = ",".join(f"{name}:{_num(ms)}" for name, ms in value.items())
        elif isinstance(value, float):
            value = _num(value)
        if value is not None:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Breach:
    """One budget not met: the table's row."""

    budget: str
    measured: str
    requests: str


@dataclass(frozen=True)
class Outcome:
    """What :func:`check` found: ``requests`` measured, the budgets not met, and whether
    requests were still running when it gave up waiting (``settled`` false)."""

    requests: int
    breaches: list[Breach]
    settled: bool = True

    def table(self) -> str:
        """The failure message: one row per budget not met (budget, measured, which requests)."""
        rows = [("budget", "measured", "requests")]
        rows += [(b.budget, b.measured, b.requests) for b in self.breaches]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        late = "" if self.settled else "; requests still running after the wait are not in it"
        lines = [f"tracekit budget exceeded ({_count(self.requests)} recorded{late}):"]
        for row in rows:
            lines.append(f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip())
        return "\n".join(lines)


def check(recording: Recording, budgets: Mapping[str, Any], *, settle_s: float = 5.0) -> Outcome:
    """Measure the requests of ``recording`` against ``budgets``.

    Waits (at most ``settle_s``) for traced requests still finishing to be handed on
    (:meth:`~tracekit.recording.Recording.settle`), then analyses the spans once.

    Args:
        recording: an open :func:`tracekit.record` recording.
        budgets: parsed budgets (:func:`parse`); ``None`` values are ignored.

    Returns:
        The outcome; its ``breaches`` is empty when every budget is met.

    Cost: one analysis of the recorded spans (``tracekit.analyze``: rules and replay included).
    """
    settled = recording.settle(settle_s)
    requests: list[RequestRecord] = []
    findings: list[Finding] = []
    if recording.spans:
        findings = recording.report(observe=requests.append).findings
    measured = [r for r in requests if r.instrumented]
    return Outcome(len(measured), evaluate(budgets, measured, findings), settled)


def evaluate(budgets: Mapping[str, Any], requests: Sequence[RequestRecord],
             findings: Sequence[Finding]) -> list[Breach]:  # fmt: skip
    """The budgets ``requests`` (and ``findings``) do not meet, in :data:`KEYS` order.

    A budget that nothing measured (no request recorded, a stage that never ran, no
    streamed request for ``ttft_p95_ms``) is not met: it would otherwise pass unchecked.
    """
    breaches: list[Breach] = []
    for key in KEYS:
        limit = budgets.get(key)
        if limit is None:
            continue
        if key == "findings":
            breaches += _findings(limit, findings)
        elif key == "stage_p95_ms":
            ran = sorted({s.name for r in requests for s in r.stages if s.name})
            for name, ms in limit.items():
                values = [(r, s.wall_ms) for r in requests for s in r.stages if s.name == name]
                why = f"stage {name!r} never ran (stages that ran: {', '.join(ran) or 'none'})"
                breaches += _p95(f"stage_p95_ms[{name}]", ms, values, why)
        elif key == "max_block_ms":
            values = _known(requests, lambda r: r.max_block_ms)
            breaches += _limit(key, limit, values, "max", max, "ms")
        elif key == "overhead_ratio":
            breaches += _overhead(limit, requests)
        elif key == "loop_wait_p95_ms":
            breaches += _p95(key, limit, _known(requests, lambda r: r.loop_wait_ms), "")
        elif key == "ttft_p95_ms":
            values = _known(requests, lambda r: r.ttft_ms)
            breaches += _p95(key, limit, values, "no request streamed a body (no TTFT)")
    return breaches


def _known(requests: Iterable[RequestRecord],
           value: Callable[[RequestRecord], float | None]) -> list[tuple[RequestRecord, float]]:  # fmt: skip
    return [(r, v) for r in requests if (v := value(r)) is not None]


def _p95(budget: str, limit: float, values: list[tuple[RequestRecord, float]], absent: str) -> list[Breach]:
    from tracekit._percentile import percentile

    if not values:
        return [Breach(f"{budget} <= {_num(limit)} ms", "not measured", absent or "no request recorded")]
    return _limit(budget, limit, values, "p95", lambda vs: percentile(vs, 0.95), "ms")


def _limit(budget: str, limit: float, values: list[tuple[RequestRecord, float]], label: str,
           measure: Callable[[list[float]], float], unit: str) -> list[Breach]:  # fmt: skip
    text = f"{budget} <= {_num(limit)} {unit}".rstrip()
    if not values:
        return [Breach(text, "not measured", "no request recorded")]
    measured = measure([v for _, v in values])
    if measured <= limit:
        return []
    return [Breach(text, f"{label} {_num(measured)} {unit}".rstrip(), _over(values, limit, unit))]


def _overhead(limit: float, requests: Sequence[RequestRecord]) -> list[Breach]:
    # Over all requests: their time outside the model wait over their wall time (time-weighted,
    # so a few fast health checks do not dominate); the requests listed are those over it.
    pairs = [(r, r.overhead_ms, r.wall_ms) for r in requests if r.overhead_ms is not None and r.wall_ms > 0]
    text = f"overhead_ratio <= {_num(limit)}"
    if not pairs:
        return [Breach(text, "not measured", "no request recorded")]
    ratio = sum(o for _, o, _ in pairs) / sum(w for _, _, w in pairs)
    if ratio <= limit:
        return []
    per_request = [(r, o / w) for r, o, w in pairs]
    return [Breach(text, f"{_num(ratio)} of request time", _over(per_request, limit, ""))]


def _over(values: list[tuple[RequestRecord, float]], limit: float, unit: str) -> str:
    # The requests over the limit, per route (the worst routes first, at most SHOWN).
    worst: dict[str, list[float]] = {}
    for req, value in values:
        if value > limit:
            worst.setdefault(req.route, []).append(value)
    over = sum(map(len, worst.values()))
    routes = sorted(worst.items(), key=lambda item: -max(item[1]))
    suffix = f" {unit}" if unit else ""
    shown = ", ".join(f"{route} x{len(vs)} (worst {_num(max(vs))}{suffix})" for route, vs in routes[:SHOWN])
    more = f", +{len(routes) - SHOWN} more routes" if len(routes) > SHOWN else ""
    return f"{over} of {len(values)} over: {shown}{more}"


def _findings(allowed: str, findings: Sequence[Finding]) -> list[Breach]:
    from tracekit.analysis.rules.findings import SEVERITIES, severity_rank, worst_severity

    # "none": no finding at all; a severity: none more severe than it.
    ceiling = len(SEVERITIES) if allowed == "none" else severity_rank(allowed)
    bad = [f for f in findings if severity_rank(f.severity) < ceiling]
    if not bad:
        return []
    shown = ", ".join(f"{f.rule} ({f.severity}) on {f.route}{f' stage {f.stage}' if f.stage else ''}"
                      for f in bad[:SHOWN])  # fmt: skip
    more = f" (+{len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
    budget = "findings: none" if allowed == "none" else f"findings <= {allowed}"
    return [Breach(budget, f"worst {worst_severity(f.severity for f in bad)}", f"{shown}{more}")]


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}".removesuffix(".0")


def _count(requests: int) -> str:
    return f"{requests} request{'s' if requests != 1 else ''}"
