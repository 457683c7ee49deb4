"""The Report: analyze() end to end, the report schema, round trip, waterfall, timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.analysis.factories import request, stage
from tests.helpers import REAL, gen_traces, needs_real
from tracekit.analysis.api import analyze, analyze_spans
from tracekit.analysis.assembly.request_records import route_matches
from tracekit.analysis.report import SCHEMA, TIMELINE_REQUESTS, Report, build_report, waterfall
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import ConfigurationError

TOP_KEYS = {
    "schema", "source", "requests", "spans", "services", "instrumented", "slo", "validation",
    "routes", "findings", "slowest", "timeline", "loop",
}  # fmt: skip
ROUTE_KEYS = {
    "route", "requests", "errors", "throughput_rps", "latency_ms", "breakdown_ms", "streaming",
    "goodput", "stages",
}  # fmt: skip
STAGE_KEYS = {
    "stage", "kind", "count", "wall_ms", "cpu_ms", "wait_ms", "loop_wait_ms", "on_loop",
    "max_block_ms", "blocked_at", "function",
}  # fmt: skip
WATERFALL_KEYS = {
    "name", "kind", "depth", "start_ms", "wall_ms", "cpu_ms", "wait_ms", "loop_wait_ms", "on_loop",
}  # fmt: skip


@pytest.fixture(scope="module")
def gateway_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gen") / "gateway.jsonl"
    gen_traces().write_jsonl(path, 3_000, rate=40.0, seed=5)
    return path


@pytest.fixture(scope="module")
def gateway_report(gateway_file: Path) -> Report:
    return analyze(gateway_file, slo="ttft=300ms,e2e=1s")


def check_schema(d: dict[str, Any]) -> None:
    assert set(d) == TOP_KEYS and d["schema"] == SCHEMA
    for route in d["routes"]:
        assert set(route) == ROUTE_KEYS
        assert set(route["latency_ms"]) == {"p50", "p90", "p95", "p99", "max"}
        assert set(route["breakdown_ms"]) == {
            "cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait", "gc", "queue_wait",
        }  # fmt: skip
        for row in route["stages"]:
            assert set(row) == STAGE_KEYS
    if d["slowest"] is not None:
        assert set(d["slowest"]) == {"trace_id", "route", "wall_ms", "spans"}
        for row in d["slowest"]["spans"]:
            assert set(row) == WATERFALL_KEYS
    json.dumps(d, allow_nan=False)  # plain JSON, nothing non-finite


@needs_real
def test_hotrod_report_has_its_routes_and_no_loop_timeline() -> None:
    report = analyze(REAL / "otlp-hotrod-n-plus-one-serial.json")
    d = report.to_dict()
    check_schema(d)
    assert (d["requests"], d["spans"], d["instrumented"]) == (13, 40, False)
    assert d["services"] == ["customer", "driver", "frontend", "mysql", "redis-manual", "route"]
    routes = {r["route"]: r for r in d["routes"]}
    assert set(routes) == {
        "GET /route", "GET /dispatch", "GET /customer", "driver.DriverService/FindNearest",
    }  # fmt: skip
    assert routes["GET /route"]["requests"] == 10
    assert d["routes"][0]["route"] == "GET /route"  # busiest first
    dispatch = routes["GET /dispatch"]
    assert dispatch["latency_ms"]["p50"] == pytest.approx(1117.0, abs=1.0)
    assert set(dispatch["breakdown_ms"].values()) == {None}
    assert {s["stage"]: s["count"] for s in dispatch["stages"]}["HTTP GET"] == 11
    assert d["timeline"] is None
    slowest = d["slowest"]
    assert slowest["route"] == "GET /dispatch"
    assert slowest["spans"][0]["depth"] == 0
    assert {s["depth"] for s in slowest["spans"][1:]} == {1}
    assert len(slowest["spans"]) == 13


@needs_real
@pytest.mark.parametrize(
    "name", sorted(p.name for p in REAL.glob("*.json")) if REAL.is_dir() else []
)
def test_every_real_file_gives_a_valid_report(name: str) -> None:
    check_schema(analyze(REAL / name).to_dict())


def test_instrumented_report_has_breakdown_streaming_goodput_and_timeline(
    gateway_report: Report,
) -> None:
    d = gateway_report.to_dict()
    check_schema(d)
    assert d["instrumented"] and d["spans"] >= 3_000
    (route,) = d["routes"]
    assert route["route"] == "POST /v1/chat/completions"
    assert all(v is not None and v >= 0 for v in route["breakdown_ms"].values())
    assert route["breakdown_ms"]["model_wait"] > route["breakdown_ms"]["cpu_on_loop"] > 0
    assert route["streaming"]["ttft_ms"]["p50"] > 0
    assert 0 <= route["goodput"]["fraction"] <= 1
    assert [s["stage"] for s in route["stages"]] == ["tokenize", "guardrail", "model", "serialize"]
    assert d["slo"] == {"ttft_ms": 300.0, "itl_ms": None, "e2e_ms": 1000.0, "tpot_ms": None}
    timeline = d["timeline"]
    assert 0 < len(timeline["lanes"]) <= TIMELINE_REQUESTS
    lanes_with_slices = [lane for lane in timeline["lanes"] if lane["slices"]]
    assert lanes_with_slices
    for lane in timeline["lanes"]:
        assert 0 <= lane["start_ms"] <= lane["end_ms"] <= timeline["duration_ms"] + 1e-6
        for piece in lane["slices"]:
            assert piece["end_ms"] >= piece["start_ms"] and piece["stage"] and piece["kind"]
    assert d["validation"] is not None and set(d["validation"]) == {
        "ok", "p50_error", "p95_error", "reason", "model",
    }  # fmt: skip


def test_analyze_restores_the_garbage_collector(gateway_file: Path) -> None:
    import gc

    assert gc.isenabled()
    gc.collect()
    report = analyze(gateway_file, route="/v1/chat/completions")
    assert gc.isenabled()
    # What the report keeps went to the oldest generation: the next young collections do
    # not walk the sample's records again (0.44 s for a 20,000-request sample).
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert report.sample and not any(id(r) in young or id(r.stages) in young for r in report.sample)
    gc.disable()
    try:
        analyze(gateway_file)
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_round_trip_through_to_dict_and_from_dict(gateway_report: Report) -> None:
    d = gateway_report.to_dict()
    again = Report.from_dict(json.loads(json.dumps(d)))
    assert again.to_dict() == json.loads(json.dumps(d))
    assert again.requests == gateway_report.requests and again.sample == []


def test_from_dict_fills_defaults_and_rejects_other_schemas() -> None:
    report = Report.from_dict({"schema": SCHEMA, "requests": 3})
    assert (report.requests, report.routes, report.findings, report.timeline) == (3, [], [], None)
    with pytest.raises(ConfigurationError, match=r"not a tracekit\.report/1"):
        Report.from_dict({"schema": "tracekit.report/0"})
    with pytest.raises(ConfigurationError):
        Report.from_dict([])  # type: ignore[arg-type]


def test_route_filter_keeps_other_routes_for_the_replay_only() -> None:
    reqs = [request("GET /a", i, i + 5) for i in range(5)]
    reqs += [request("POST /b", i, i + 9) for i in range(3)]
    report = analyze_spans([], route=None)
    assert report.requests == 0 and report.slowest is None and report.timeline is None
    agg = Aggregator()
    for r in reqs:
        agg.add(r, counted=r.route == "POST /b")
    report = build_report(agg, source="memory", spans=0, services=[], routes=["POST /b"])
    assert report.requests == 3 and [r["route"] for r in report.routes] == ["POST /b"]
    assert len(report.sample) == 8
    assert all(f.route == "POST /b" for f in report.findings)


def test_analyze_route_filter_by_name_or_path(gateway_file: Path) -> None:
    by_path = analyze(gateway_file, route="/v1/chat/completions")
    assert by_path.requests == analyze(gateway_file, route="POST /v1/chat/completions").requests
    assert by_path.requests > 0
    with pytest.raises(ConfigurationError, match=r"no request has route '/nope'.*POST /v1/chat"):
        analyze(gateway_file, route="/nope")


def test_route_matches_the_full_name_or_the_path_alone() -> None:
    # The one rule both the single pass and the parallel reader's workers filter by.
    assert route_matches("POST /v1/chat", "POST /v1/chat") and route_matches("POST /v1/chat", "/v1/chat")
    assert not route_matches("POST /v1/chat", "GET /v1/chat") and not route_matches("POST /v1/chat", "/v1")
    assert route_matches("healthcheck", "healthcheck") and not route_matches("POST /v1/chat", "POST")


def test_waterfall_depths_follow_the_span_tree() -> None:
    outer = stage("model", 10, 90, cpu_ms=1.0, wait_ms=79.0, span_id="m")
    inner = stage("decode", 20, 80, cpu_ms=1.0, wait_ms=59.0, parent="m", span_id="d")
    loop_a = stage("a", 0, 1, parent="b", span_id="a")  # a <-> b: a cycle stays finite
    loop_b = stage("b", 0, 1, parent="a", span_id="b")
    req = request("r", 0, 100, [outer, inner, loop_a, loop_b], span_id="root")
    rows = {row["name"]: row for row in waterfall(req)["spans"]}
    assert (rows["r"]["depth"], rows["model"]["depth"], rows["decode"]["depth"]) == (0, 1, 2)
    assert rows["decode"]["start_ms"] == pytest.approx(20.0)
    assert rows["a"]["depth"] >= 1 and rows["b"]["depth"] >= 1


def test_timeline_window_is_centred_on_the_longest_loop_slice() -> None:
    agg = Aggregator()
    for i in range(500):
        long = 40.0 if i == 400 else 1.0
        tok = stage("tokenize", i * 10, i * 10 + long, cpu_ms=long, wait_ms=0.0,
                    slices=[(i * 10, i * 10 + long)])  # fmt: skip
        agg.add(request("r", i * 10, i * 10 + long + 1, [tok]))
    report = build_report(agg, source="memory", spans=1000, services=["gateway"])
    lanes = report.timeline["lanes"]  # type: ignore[index]
    assert len(lanes) == TIMELINE_REQUESTS
    longest = max(lanes, key=lambda lane: max(s["end_ms"] - s["start_ms"] for s in lane["slices"]))
    assert longest["slices"][0]["end_ms"] - longest["slices"][0]["start_ms"] == pytest.approx(40.0)
    assert 50 <= lanes.index(longest) <= 150


def test_to_html_and_to_text_render_the_report(gateway_report: Report) -> None:
    html = gateway_report.to_html()
    assert html.lstrip().lower().startswith("<!doctype html") and "loop-timeline" in html
    text = gateway_report.to_text(width=100, color=False)
    assert "POST /v1/chat/completions" in text and "tokenize" in text


# --- findings (the rules and the replay, through the report) --------------------------------
@needs_real
def test_the_real_n_plus_one_is_found_without_a_projection() -> None:
    report = analyze(REAL / "otlp-hotrod-n-plus-one-serial.json")
    found = {(f.rule, f.route, f.stage) for f in report.findings}
    assert ("sequential-independent", "GET /dispatch", "HTTP GET") in found
    dispatch = next(f for f in report.to_dict()["findings"] if f["route"] == "GET /dispatch")
    assert dispatch["severity"] == "high" and "10 'HTTP GET' calls to" in dispatch["evidence"]
    # Plain OpenTelemetry: the replay cannot model it, and says so instead of guessing.
    assert dispatch["projection"] is None and dispatch["projection_note"]
    assert report.worst_severity() == "high"


@needs_real
def test_route_filter_limits_findings_to_the_route() -> None:
    report = analyze(REAL / "otlp-hotrod-n-plus-one-serial.json", route="GET /dispatch")
    assert report.requests == 1 and report.findings
    assert {f.route for f in report.findings} == {"GET /dispatch"}


@needs_real
@pytest.mark.parametrize(
    "name",
    ["jaeger-petclinic-two-services.json", "otlp-spec-example-trace.json",
     "jaeger-api-traces-envelope.json"],
)  # fmt: skip
def test_healthy_traces_give_no_findings(name: str) -> None:
    report = analyze(REAL / name)
    assert report.findings == [] and report.worst_severity() is None


def test_the_simulated_gateway_gets_cpu_on_loop_with_a_validated_projection(
    gateway_report: Report,
) -> None:
    d = gateway_report.to_dict()
    finding = next(f for f in d["findings"] if f["rule"] == "cpu-on-loop")
    assert finding["stage"] == "tokenize" and finding["function"] == "gateway.app.tokenize"
    assert "to_thread" in finding["fix"]["code"]
    assert d["validation"]["ok"], d["validation"]
    p50_before, p50_after = finding["projection"]["p50_ms"]
    assert p50_after <= p50_before
    severities = [f["severity"] for f in d["findings"]]
    order = ["high", "medium", "low"]
    assert severities == sorted(severities, key=order.index)  # most severe first


def test_in_memory_spans_are_a_source() -> None:
    from tracekit.analysis.model import Span

    t0 = 1_767_225_600 * 10**9
    spans = [
        Span("a" * 32, "b" * 16, None, "GET /health", "server", t0, t0 + 2_000_000, "gw"),
        Span("a" * 32, "c" * 16, "b" * 16, "db", "client", t0, t0 + 1_000_000, "gw"),
    ]
    report = analyze(spans)
    assert (report.source, report.requests, report.spans, report.services) == (
        "memory", 1, 2, ["gw"],
    )  # fmt: skip
    assert report.routes[0]["latency_ms"]["p50"] == pytest.approx(2.0)


# --- a long idle stretch in the recording -------------------------------------------------------
def test_one_long_idle_stretch_is_said_once_and_steady_traffic_says_nothing() -> None:
    from tests.analysis.loop_factories import request_spans

    stages = [("tokenize", 2.0, 0.0)]
    # A warm-up request, then 3 s later 60 requests in 0.5 s (a new user's first recording):
    # idle 2.96 s of 3.512.
    burst = [span for i in range(60) for span in request_spans(3000.0 + i * 8.0, 40.0, stages)]
    report = analyze_spans([*request_spans(0.0, 40.0, stages), *burst])
    (line,) = [w for w in report.warnings if "no request was in flight" in w]
    assert line.startswith("for 3.0 s (84% of the recorded period) no request was in flight")
    # A pause of 1.5 s in 4 s of load (a new user's LiteLLM run had one 16% of its period, and
    # only compare, which leaves it out, said so): said too.
    paused = [span for i in range(120) for span in request_spans(i * 20.0 + (1500.0 if i >= 60 else 0.0),
                                                                 40.0, stages)]  # fmt: skip
    (line,) = [w for w in analyze_spans(paused).warnings if "no request was in flight" in w]
    assert line.startswith("for 1.5 s (") and "% of the recorded period) no request" in line, line
    # Requests every 0.5 s for 10 s: idle 90% of the time, in short gaps; nothing to say.
    steady = [span for i in range(20) for span in request_spans(i * 500.0, 50.0, stages)]
    assert not [w for w in analyze_spans(steady).warnings if "in flight" in w]
