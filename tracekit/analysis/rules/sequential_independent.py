"""``sequential-independent``: awaited work runs one piece after another where it could overlap.

Two shapes:

- **Input guardrail before the model** (tracekit traces): a ``guardrail`` stage that ends
  before a sibling ``model`` stage (same parent) starts. The model call does not depend on
  the verdict, only its *use* does: start the model call speculatively, cancel it if the
  guardrail rejects. Fires when this happens in at least ``min_fraction`` of the route's
  requests and would save p50 >= ``min_gain_ms`` (the shorter of the two stages).
- **Repeated sequential calls** (any trace, plain OpenTelemetry and HotROD included): at
  least ``min_calls`` CLIENT children of one span with the same name and the same target
  (an HTTP call's host and path: instrumentations name every call ``HTTP GET``), no two of
  which overlap in time (an N+1). Running them concurrently would save their summed time
  minus the longest. A call that failed and was made again with the same attributes (a
  retry: HotROD's ``GetDriver`` after a redis timeout) is one unit of work with its retry,
  which had to wait for it: the saving is the units' summed time minus the longest unit's.
  Fires when this happens in at least ``min_fraction`` of the route's
  requests and saves p50 >= ``min_gain_ms``. A fan-out that already overlaps does not fire.
  The fix is Python code for a Python service, words for a service whose resource names
  another language (``telemetry.sdk.language``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlsplit

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.rules import fixes
from tracekit.analysis.rules.common import by_route, finding, ms, named, p50_latency
from tracekit.analysis.rules.findings import Finding, RuleContext
from tracekit.analysis.stats.intervals import StageTree, function_of

_TOUCH_NS = 10_000  # intervals overlapping by less than 10 us count as back to back


@dataclass
class _Serial:
    """One request's group of sequential same-name calls to one target under one parent."""

    parent: str
    calls: list[StageRecord]
    target: str = ""

    @cached_property  # read several times per group; the calls never change
    def units(self) -> list[list[StageRecord]]:
        """The calls as units of independent work: a call, and the same call made again
        (same attributes) after it failed, each retry waiting for the failure before it."""
        units: list[list[StageRecord]] = []
        last: dict[tuple[tuple[str, str], ...], list[StageRecord]] = {}
        for call in self.calls:  # sorted by start
            key = _identity(call)
            unit = last.get(key)
            if key and unit is not None and unit[-1].error:
                unit.append(call)
            else:
                unit = [call]
                units.append(unit)
            last[key] = unit
        return units

    @property
    def summed_ms(self) -> float:
        return sum(c.wall_ms for c in self.calls)

    @property
    def longest_ms(self) -> float:
        return max(sum(c.wall_ms for c in unit) for unit in self.units)

    @property
    def span_ms(self) -> float:
        return (max(c.end_ns for c in self.calls) - min(c.start_ns for c in self.calls)) / 1e6


def serial_groups(req: RequestRecord, min_calls: int) -> dict[str, _Serial]:
    """Per CLIENT span name, the request's largest group of >= ``min_calls`` same-name
    children of one parent, to one target, that never overlap each other."""
    groups: dict[tuple[str | None, str, str], list[StageRecord]] = {}
    for stage in req.stages:
        if stage.span_kind == "client":
            groups.setdefault((stage.parent_id, stage.name, call_target(stage)), []).append(stage)
    out: dict[str, _Serial] = {}
    for (parent, name, target), calls in groups.items():
        if len(calls) < min_calls or not _sequential(calls):
            continue
        if name not in out or len(calls) > len(out[name].calls):
            out[name] = _Serial(parent or req.span_id, sorted(calls, key=lambda c: c.start_ns), target)
    return out


def _identity(call: StageRecord) -> tuple[tuple[str, str], ...]:
    # What a call was asked, to tell a retry (the same again) from another call: its
    # attributes, less tracekit's own (timings) and the resend count a retry changes.
    return tuple(
        sorted(
            (k, repr(v))
            for k, v in call.attributes.items()
            if not k.startswith("tracekit.") and k != "http.request.resend_count"
        )
    )


def call_target(stage: StageRecord) -> str:
    """What a client call went to: an HTTP call's host and path (no query), else ``""``."""
    attributes = stage.attributes
    url = attributes.get(semconv.URL_FULL) or attributes.get(semconv.HTTP_URL_OLD)
    if isinstance(url, str) and url:
        try:
            parts = urlsplit(url)
        except ValueError:  # hostile input: not a URL
            return ""
        return parts.netloc + parts.path
    host = attributes.get(semconv.SERVER_ADDRESS)
    path = attributes.get(semconv.URL_PATH)
    if host is None or path is None:
        return ""
    port = attributes.get(semconv.SERVER_PORT)
    return f"{host}{'' if port is None else f':{port}'}{path}"


def _sequential(calls: list[StageRecord]) -> bool:
    reach = None
    for call in sorted(calls, key=lambda c: (c.start_ns, c.end_ns)):
        if reach is not None and call.start_ns < reach - _TOUCH_NS:
            return False
        reach = call.end_ns if reach is None else max(reach, call.end_ns)
    return True


class SequentialIndependent:
    """Rule ``sequential-independent``.

    Args:
        min_gain_ms: fire only when overlapping would save p50 >= this per request (5 ms).
        min_fraction: ... in at least this share of the route's requests (0.5).
        min_calls: repeated calls: at least this many same-name siblings (3).
    """

    id = "sequential-independent"

    def __init__(
        self, min_gain_ms: float = 5.0, min_fraction: float = 0.5, min_calls: int = 3
    ) -> None:
        self.min_gain_ms = min_gain_ms
        self.min_fraction = min_fraction
        self.min_calls = min_calls

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """Findings for guardrails before the model and for sequential repeated calls."""
        out: list[Finding] = []
        for route, reqs in by_route(requests, ctx, instrumented=False).items():
            out.extend(self._guardrails(route, reqs, requests, ctx))
            out.extend(self._repeated(route, reqs, requests, ctx))
        return out

    # --- input guardrail before the model ---------------------------------------------------
    def _guardrails(
        self,
        route: str,
        reqs: list[RequestRecord],
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> list[Finding]:
        pairs: dict[tuple[str, str], list[tuple[StageRecord, StageRecord]]] = {}
        for req in reqs:
            if not req.instrumented:
                continue
            tree = StageTree(req)
            for model in req.stages:
                if model.kind != semconv.KIND_MODEL:
                    continue
                guard = _guardrail_before(model, tree)
                if guard is not None:
                    pairs.setdefault((guard.name, model.name), []).append((guard, model))
        out: list[Finding] = []
        instrumented = sum(1 for r in reqs if r.instrumented)
        for (guard_name, model_name), found in pairs.items():
            gains = [min(g.wall_ms, m.wall_ms) for g, m in found]
            if len(found) < self.min_fraction * instrumented:
                continue
            gain = percentile(gains, 0.5)
            if gain < self.min_gain_ms:
                continue
            guard, model = found[0]
            g_fn, m_fn = function_of(guard), function_of(model)
            guard_words = named("input guardrail", guard_name)
            model_words = named("model call", model_name)
            evidence = (
                f"{guard_words} "
                f"({ms(percentile([g.wall_ms for g, _ in found], 0.5))} per request) finished "
                f"before {model_words} "
                f"({ms(percentile([m.wall_ms for _, m in found], 0.5))}) started in "
                f"{len(found)} of {instrumented} requests; started together they would "
                f"overlap by {ms(gain)} per request (p50)"
            )
            caused_by: tuple[tuple[str, str, str | None], ...] = ()
            folded = None
            if _cpu_bound_on_loop([g for g, _ in found]):
                # A sync CPU-bound guardrail holds the loop: a model call started "beside" it
                # cannot even send its request until it returns. Its cpu-on-loop finding is
                # the cause; this overlap is the next step once that is fixed.
                evidence += (
                    f"; but {guard_name} is CPU-bound on the event loop, so a model call started "
                    f"beside it only overlaps once {guard_name} runs off the loop (see cpu-on-loop)"
                )
                caused_by = (("cpu-on-loop", route, guard_name),)
                folded = (
                    f"it also runs before {model_words}, which does not need its verdict to "
                    f"start: once it runs off the loop, start the model call beside it and "
                    f"cancel it if the input is rejected, for up to {ms(gain)} per request "
                    f"more (sequential-independent)"
                )
            out.append(
                finding(
                    rule=self.id,
                    route=route,
                    stage=guard_name,
                    function=g_fn,
                    impact_ms=gain,
                    route_p50_ms=p50_latency(reqs),
                    evidence=evidence,
                    fix=fixes.speculative_start(guard_name, g_fn, model_name, m_fn),
                    requests=requests,
                    ctx=ctx,
                    model=Fix("gather", route, guard_name, other=model_name),
                    caused_by=caused_by,
                    folded=folded,
                )
            )
        return out

    # --- repeated sequential calls ----------------------------------------------------------
    def _repeated(
        self,
        route: str,
        reqs: list[RequestRecord],
        requests: Sequence[RequestRecord],
        ctx: RuleContext,
    ) -> list[Finding]:
        found: dict[str, list[_Serial]] = {}
        for req in reqs:
            for name, group in serial_groups(req, self.min_calls).items():
                found.setdefault(name, []).append(group)
        out: list[Finding] = []
        for name, groups in found.items():
            gains = [g.summed_ms - g.longest_ms for g in groups]
            gain = percentile(gains, 0.5)
            if len(groups) < self.min_fraction * len(reqs) or gain < self.min_gain_ms:
                continue
            worst = max(groups, key=lambda g: g.summed_ms - g.longest_ms)
            n, units = len(worst.calls), len(worst.units)
            where = f" in {len(groups)} of {len(reqs)} requests" if len(reqs) > 1 else ""
            to = f" to {worst.target}" if worst.target else ""
            retries = (
                f", {n - units} of them retries of a failed call (each waited for the failure, "
                f"so {units} could run together)"
                if units < n
                else ""
            )
            evidence = (
                f"{n} {name!r} calls{to} under span {worst.parent} ran one after another "
                f"(0 of {n * (n - 1) // 2} pairs overlap; {ms(worst.summed_ms)} summed, "
                f"longest {ms(worst.longest_ms)}{' with its retries' if units < n else ''}, "
                f"{ms(worst.span_ms)} from first start to last end{retries}){where}; run "
                f"concurrently they would save about {ms(gain)} per request"
            )
            instrumented = any(r.instrumented for r in reqs)
            out.append(
                finding(
                    rule=self.id,
                    route=route,
                    stage=name,
                    function=function_of(worst.calls[0]),
                    impact_ms=gain,
                    route_p50_ms=p50_latency(reqs),
                    evidence=evidence,
                    fix=fixes.fan_out(name, units, function_of(worst.calls[0]), _language(reqs)),
                    requests=requests,
                    ctx=ctx,
                    model=Fix("fanout", route, name) if instrumented else None,
                    no_model_note=(
                        "uninstrumented: plain OpenTelemetry spans carry no CPU, wait and loop "
                        "components, so the replay cannot model this route; the saving above "
                        "is the ideal one (all calls independent)"
                    ),
                )
            )
        return out


def _language(reqs: Sequence[RequestRecord]) -> str | None:
    """The language the route's service names in its resource (``None``: not said)."""
    for req in reqs:
        language = req.attributes.get(semconv.TELEMETRY_SDK_LANGUAGE)
        if isinstance(language, str) and language:
            return language
    return None


def _cpu_bound_on_loop(guards: list[StageRecord]) -> bool:
    """Most of these guardrail runs spent most of their wall time on-CPU on the loop."""
    bound = sum(1 for g in guards if g.on_loop and (g.cpu_ms or 0.0) >= 0.5 * g.wall_ms > 0)
    return bound * 2 > len(guards)


def _guardrail_before(model: StageRecord, tree: StageTree) -> StageRecord | None:
    """The latest guardrail sibling of ``model`` that ended before it started."""
    parent = tree.parent(model)
    best: StageRecord | None = None
    for sibling in tree.kids(parent):
        if sibling.kind != semconv.KIND_GUARDRAIL or sibling.end_ns > model.start_ns:
            continue
        if best is None or sibling.end_ns > best.end_ns:
            best = sibling
    return best
