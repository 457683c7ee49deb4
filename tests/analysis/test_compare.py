"""``tracekit.compare``: two runs read by the analyzer's pipeline, compared per route."""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path
from typing import Any

import pytest

import tracekit
from tests.analysis import factories
from tests.helpers import HOTROD, gen_traces, needs_real
from tracekit import semconv
from tracekit.analysis.compare import Comparison, compare
from tracekit.analysis.model import Span
from tracekit.analysis.stats import route_values
from tracekit.analysis.stats.aggregate import OTHER_ROUTES
from tracekit.analysis.stats.intervals import idle_stretches
from tracekit.errors import ConfigurationError, SourceNotFoundError

_ids = itertools.count(1)
T0 = 1_767_225_600 * 10**9


def server_spans(route: str, n: int, seed: int, *, shift_ms: float = 0.0) -> list[Span]:
    """Plain OpenTelemetry request spans: Poisson arrivals at 50/s, log-normal latency."""
    rng = random.Random(seed)
    method, path = route.split(" ", 1)
    spans, t = [], float(T0)
    for _ in range(n):
        t += rng.expovariate(50) * 1e9
        latency_ms = 100 * rng.lognormvariate(0, 0.4) + shift_ms
        i = next(_ids)
        spans.append(Span(
            f"{i:032x}", f"{i:016x}", None, route, "server", int(t), int(t + latency_ms * 1e6),
            "gateway", {semconv.HTTP_ROUTE: path, semconv.HTTP_REQUEST_METHOD: method},
        ))  # fmt: skip
    return spans


def test_a_known_latency_shift_is_measured_per_route() -> None:
    before = server_spans("POST /v1/chat", 800, seed=1) + server_spans("GET /health", 30, seed=2)
    after = server_spans("POST /v1/chat", 800, seed=3, shift_ms=25.0)
    result = compare(before, after)
    assert isinstance(result, Comparison)
    assert [r.route for r in result.routes] == ["POST /v1/chat"]
    assert (result.only_before, result.only_after) == (["GET /health"], [])
    route = result.routes[0]
    assert route.requests == (800, 800)
    for key in ("p50", "p95", "p99"):
        change = route.latency[key]
        assert change.low is not None and change.high is not None
        assert change.low < 25.0 < change.high, key  # the shift, in the interval
    assert route.latency["p50"].significant is True and route.latency["p95"].significant is True
    assert route.throughput.significant is False  # same arrivals rate
    assert route.breakdown is None and route.streaming is None  # plain OpenTelemetry
    assert route.projections == []
    d = result.to_dict()
    assert d["schema"] == "tracekit.compare/1"
    assert d["before"]["requests"] == 830 and d["after"]["routes"] == ["POST /v1/chat"]
    assert d["routes"][0]["latency_ms"]["p50"]["significant"] is True
    assert compare(before, after).to_dict() == d  # seeded: the same intervals every time
    assert compare(before, after, seed=1).to_dict() != d


def test_no_change_is_said_so() -> None:
    result = compare(server_spans("GET /a", 400, seed=4), server_spans("GET /a", 400, seed=5))
    latency = result.routes[0].latency
    assert latency["p50"].significant is False and latency["p95"].significant is False
    assert "no significant change" in result.to_text(width=100, color=False)


def test_the_public_function_and_route_filter() -> None:
    before = server_spans("GET /a", 50, seed=6) + server_spans("GET /b", 50, seed=7)
    after = server_spans("GET /a", 50, seed=8) + server_spans("GET /b", 50, seed=9)
    result = tracekit.compare(before, after, route="/b")
    assert [r.route for r in result.routes] == ["GET /b"]
    assert result.only_before == [] and result.only_after == []


def test_bad_inputs_are_one_clear_error(tmp_path: Path) -> None:
    a = server_spans("GET /a", 20, seed=10)
    cases = [
        ((a, server_spans("GET /b", 20, seed=11)), {}, ConfigurationError,
         "no route is in both runs: before has 'GET /a'; after has 'GET /b'"),
        (([], a), {}, ConfigurationError, "before: memory has no requests to compare"),
        ((a, str(tmp_path / "missing.jsonl")), {}, SourceNotFoundError, "after: "),
        ((a, a), {"finding": "Not A Rule"}, ConfigurationError, "finding must be RULE or RULE:STAGE"),
        ((a, a), {"finding": "cpu-on-loop"}, ConfigurationError,
         "no finding of before matches 'cpu-on-loop' on a route both runs have; its findings: none"),
        ((a, a), {"confidence": 1.5}, ConfigurationError, "confidence must be between"),
        ((a, a), {"draws": 10}, ConfigurationError, "draws must be an integer >= 200"),
    ]  # fmt: skip
    for sources, options, error, message in cases:
        with pytest.raises(error) as info:
            compare(*sources, **options)
        assert message in str(info.value), (message, str(info.value))


def test_route_values_keep_each_request_and_pool_routes_past_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(route_values, "MAX_ROUTES", 2)
    collector = route_values.RouteCollector()
    streamed = factories.request("GET /a", 0, 120, chunks=5, ttft_ms=40.0, itl_p95_ms=9.0)
    for req in (streamed, factories.request("GET /b", 10, 50, instrumented=False),
                factories.request("GET /c", 20, 30), factories.request("GET /a", 30, 60)):
        collector.add(req)  # fmt: skip
    assert list(collector.routes) == ["GET /a", "GET /b", OTHER_ROUTES]
    a = collector.routes["GET /a"]
    assert list(a.wall) == [120.0, 30.0] and list(a.ttft) == [40.0] and list(a.itl) == [9.0]
    assert len(a.parts[0]) == 2 and len(collector.routes["GET /b"].parts[0]) == 0
    assert (a.first_ns, a.last_ns) == (factories.ns(0), factories.ns(120))
    assert sum(a.rates()) / len(a.rates()) == pytest.approx(2 / 0.12)


def test_jaeger_options_go_to_the_url_side() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SourceNotFoundError) as info:
        compare(server_spans("GET /a", 20, seed=12), f"http://127.0.0.1:{port}", service="gw",
                lookback="5m", timeout=2)  # fmt: skip
    assert str(info.value).startswith(f"after: http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    # The simulated gateway (bench/gen_traces.py) with 6 ms of tokenize CPU on the loop, then
    # with 1 ms: the change a cpu-on-loop fix makes to the loop.
    folder = tmp_path_factory.mktemp("compare")
    gen = gen_traces()
    gen.write_jsonl(folder / "before.jsonl", 1_500, rate=40.0, seed=11, tokenize_ms=6.0)
    gen.write_jsonl(folder / "after.jsonl", 1_500, rate=40.0, seed=12, tokenize_ms=1.0)
    return folder / "before.jsonl", folder / "after.jsonl"


def test_instrumented_runs_compare_breakdown_streams_and_projections(runs: tuple[Path, Path]) -> None:
    result = compare(str(runs[0]), str(runs[1]), finding="cpu-on-loop:tokenize")
    route = result.routes[0]
    assert route.breakdown is not None and route.streaming is not None
    # Tokenize CPU per request is tokenize_ms * prompt tokens / 800, prompts log-normal(6.5,
    # 0.6): its mean falls by 5 * e^(6.5 + 0.18) / 800 = 4.97 ms; the rest of the CPU is alike.
    cpu = route.breakdown["cpu_on_loop"]
    assert cpu.low is not None and cpu.high is not None and cpu.low < -4.97 < cpu.high < 0
    assert route.breakdown["cpu_off_loop"].significant is False  # nothing runs off the loop
    assert set(route.streaming) == {"ttft_ms", "itl_ms"}
    checks = {c.label: c for c in route.projections}
    assert "cpu-on-loop:tokenize" in checks
    assert [c.label for c in route.projections if c.selected] == ["cpu-on-loop:tokenize"]
    check = checks["cpu-on-loop:tokenize"]
    assert [m.metric for m in check.metrics] == ["p50_ms", "p95_ms", "throughput_rps"]
    assert check.metrics[0].measured is route.latency["p50"]
    assert check.verdict in ("held", "missed", "wrong direction")
    text = result.to_text(width=100, color=False)
    assert "cpu-on-loop · tokenize · selected" in text or "cpu-on-loop - tokenize - selected" in text
    # Another finding's projection is listed, not judged against a change it did not make:
    # the mechanism says so, so the JSON and the text agree.
    assert [c.label for c in route.projections if not c.selected] == ["sequential-independent:guardrail"]
    other_check = next(c for c in route.projections if not c.selected)
    assert other_check.verdict == "not the change made"
    data = result.to_dict()["routes"][0]["projections"]
    [other_json] = [p for p in data if not p["selected"]]
    assert other_json["verdict"] == "not the change made"
    assert {m["verdict"] for m in other_json["metrics"]} == {"not the change made"}
    # The change made's stage, measured: 6 ms of tokenize CPU per 800 tokens, then 1 ms.
    stage = check.stage_ms
    assert stage is not None and stage.before is not None and stage.after is not None
    assert stage.high is not None and stage.high < 0 and stage.after < stage.before
    other = next(line for line in text.splitlines() if "sequential-independent" in line)
    assert "not the change made" in other and not any(v in other for v in ("held", "missed", "wrong"))
    judged = [line for line in text.splitlines()
              if line.rstrip().endswith((": held", ": inconclusive", "(short)", "(beyond)"))]
    assert len(judged) == 3  # p50, p95 and rps of the change made only


@needs_real
def test_a_finding_without_a_projection_is_measured_only() -> None:
    # Real HotROD traces (plain OpenTelemetry spans): the sequential-independent finding has no
    # projection (uninstrumented), and naming it gives the measured change of its route and
    # stage, with the reason, instead of an error (a run compared with itself: no change).
    result = compare(str(HOTROD), str(HOTROD), finding="sequential-independent:GetDriver")
    [route] = [r for r in result.routes if any(c.selected for c in r.projections)]
    assert route.route == "driver.DriverService/FindNearest"
    [check] = [c for c in route.projections if c.selected]
    assert (check.verdict, check.metrics, check.model) == ("no projection", [], None)
    assert check.note is not None and check.note.startswith("uninstrumented")
    stage = check.stage_ms
    assert stage is not None and stage.before == stage.after and stage.before is not None
    assert stage.before > 0
    assert route.latency["p50"].before == route.latency["p50"].after
    text = result.to_text(width=80, color=False)
    assert "sequential-independent · GetDriver · selected · no projection" in text
    assert "no projection: uninstrumented" in text
    # A finding before does not have at all is still an error naming those it has.
    with pytest.raises(ConfigurationError, match=r"its findings: .*sequential-independent:GetDriver"):
        compare(str(HOTROD), str(HOTROD), finding="cpu-on-loop")


def test_values_are_read_in_the_order_their_requests_ended() -> None:
    # The intervals read the dependence of neighbours: each array in end order, whatever
    # order the requests were assembled in; arrays of some requests only, as they came.
    values = route_values.RouteValues()
    for start, end in ((0.0, 30.0), (5.0, 10.0), (1.0, 20.0)):
        values.add(factories.request("POST /x", start, end))
    assert values.in_time(values.wall) == [5.0, 19.0, 30.0]
    values.add(factories.request("POST /x", 2.0, 4.0))  # a later request: ordered again
    assert values.in_time(values.wall) == [2.0, 5.0, 19.0, 30.0]
    assert values.in_time(values.ttft) == list(values.ttft)


def test_a_projection_for_another_route_is_checked_against_that_routes_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A new user's gateway: the plain route's tokenizer held the loop the stream route's
    # requests waited on, so cpu-on-loop on the plain route was projected for the stream
    # route. The stream route got 30% faster, the plain one did not change: the projection
    # is checked against the stream route's change, and says so.
    from types import SimpleNamespace

    from tracekit.analysis import compare as comparing
    from tracekit.analysis.rules.findings import Finding

    plain, stream = "POST /v1/chat", "POST /v1/chat/stream"
    projection = {"route": stream, "p50_ms": [100.0, 70.0], "p95_ms": [150.0, 105.0],
                  "range": {"p50_ms": [65.0, 75.0], "p95_ms": [95.0, 115.0]}}  # fmt: skip
    finding = Finding("cpu-on-loop", plain, "tokenize", None, "high", 30.0, "", "", "", projection)

    def side(scale: float, seed: int) -> tuple[Any, dict[str, route_values.RouteValues], list[Any]]:
        rng = random.Random(seed)
        collector = route_values.RouteCollector()
        for i in range(400):
            route, base = (stream, 100.0 * scale) if i % 2 else (plain, 50.0)
            wall = base * (0.9 + 0.2 * rng.random())
            collector.add(factories.request(route, i * 10.0, i * 10.0 + wall))
        report = SimpleNamespace(findings=[finding] if scale == 1.0 else [], source=f"{seed}.jsonl",
                                 requests=400, warnings=[], sample=[], services=["gateway"])  # fmt: skip
        return report, collector.routes, collector.idle()

    sides = iter([side(1.0, 1), side(0.7, 2)])
    monkeypatch.setattr(comparing, "_measure", lambda *args: next(sides))
    result = compare("before.jsonl", "after.jsonl")
    checks = {r.route: r.projections for r in result.routes}
    [check] = checks[plain]
    assert check.route == stream and check.selected
    assert check.verdict == "held"  # p50 -30% projected and measured on the stream route
    assert check.metrics[0].measured is next(r for r in result.routes if r.route == stream).latency["p50"]
    words = " ".join(result.to_text(width=80, color=False).split())
    assert f"projected for {stream}, whose requests waited for this stage" in words
    # No --finding: the selection is a guess, and the text says how to name the change made
    # (a new user made a change no finding proposed and read gc-pauses as "selected").
    assert "assumed to be each route's top projected finding (if you made another change" in words
    assert result.to_dict()["routes"][0]["projections"][0]["projected_route"] == stream


def test_an_idle_stretch_is_left_out_of_the_throughput_and_said() -> None:
    # A new user's AFTER run: a few warm-up requests, 3 s idle, then the load. Divided by the
    # whole period, its throughput read 37.4 -> 31.8 req/s while the client saw +10%.
    before = server_spans("POST /v1/chat", 600, seed=6)
    load = server_spans("POST /v1/chat", 600, seed=7)
    warm_up = [Span(s.trace_id, s.span_id, None, s.name, s.kind, s.start_ns - 3 * 10**9 - 10**9,
                    s.end_ns - 3 * 10**9 - 10**9, s.service, s.attributes)
               for s in server_spans("POST /v1/chat", 5, seed=8)]  # fmt: skip
    result = compare(before, warm_up + load)
    route = result.routes[0]
    assert route.throughput.significant is False  # the same arrival rate once the pause is out
    assert route.throughput.after == pytest.approx(route.throughput.before, rel=0.15)
    d = result.to_dict()
    assert d["before"]["idle_s"] == 0.0 and d["after"]["idle_s"] > 3.0
    assert any("no request in flight" in w for w in result.after.warnings)
    assert not any("no request in flight" in w for w in result.before.warnings)


def test_a_slow_steady_load_keeps_its_gaps() -> None:
    # One request every 2 s for a minute: its gaps are the load, not a pause.
    spans = [Span(f"{i:032x}", f"{i:016x}", None, "GET /a", "server", T0 + i * 2 * 10**9,
                  T0 + i * 2 * 10**9 + 50 * 10**6, "gateway",
                  {semconv.HTTP_ROUTE: "/a", semconv.HTTP_REQUEST_METHOD: "GET"})
             for i in range(1, 31)]  # fmt: skip
    assert idle_stretches([(s.start_ns, s.end_ns) for s in spans]) == []
    result = compare(spans, spans)
    assert result.routes[0].throughput.before == pytest.approx(0.5, rel=0.05)


def test_two_runs_of_no_common_service_are_compared_with_a_warning() -> None:
    # A new user compared their gateway with the demo's traces: the routes shared a name.
    before = server_spans("POST /v1/chat", 200, seed=21)
    after = [Span(s.trace_id, s.span_id, None, s.name, s.kind, s.start_ns, s.end_ns, "demo-gateway",
                  s.attributes) for s in server_spans("POST /v1/chat", 200, seed=22)]  # fmt: skip
    result = compare(before, after)
    (warning,) = [w for w in result.after.warnings if "no service in common" in w]
    assert warning.startswith("no service in common with before ('gateway' before, 'demo-gateway' after)")
    assert not any("no service in common" in w for w in compare(before, before).after.warnings)
