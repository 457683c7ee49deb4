"""The model server's own spans (vLLM's ``llm_request``, joined through ``traceparent``):
assembly folds them into the model call they answered, the report splits the model wait into
network, queue, prefill and decode, and ``serialized-model-calls`` takes the server's queue
time as its evidence (issue 15, item 3)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import tracekit
from tracekit import semconv as sc
from tracekit.analysis.api import analyze_spans
from tracekit.analysis.assembly.grouping import assemble, requests_of_trace
from tracekit.analysis.model import ServerTiming, Span, StageRecord, model_wait_split
from tracekit.render.html import render_html
from tracekit.render.text import render_text

MS = 1_000_000
T0 = 1_767_225_600_000_000_000
ROUTE = "POST /v1/chat/completions"
_ids = itertools.count(1)


def _id() -> str:
    return f"{next(_ids):016x}"


def gateway_trace(
    start_ms: float,
    wall_ms: float,
    model_ms: tuple[float, float],
    server: dict[str, float] | None,
    *,
    via_client: bool = True,
    trace: str | None = None,
) -> list[Span]:
    """One gateway request: SERVER span, a tracekit ``model`` stage from ``model_ms[0]`` to
    ``model_ms[1]`` (ms into the request) waiting all of it, an httpx CLIENT span inside it,
    and the model server's ``llm_request`` span (seconds, as vLLM writes them) under the client
    span (or under the stage itself), its queue/prefill/decode from ``server`` (ms)."""
    trace = trace or f"{next(_ids):032x}"
    root, model, client = _id(), _id(), _id()
    t = T0 + int(start_ms * MS)
    m0, m1 = t + int(model_ms[0] * MS), t + int(model_ms[1] * MS)
    wait = model_ms[1] - model_ms[0]
    spans = [
        Span(trace, root, None, ROUTE, "server", t, t + int(wall_ms * MS), "gateway", {
            sc.HTTP_ROUTE: "/v1/chat/completions", sc.HTTP_REQUEST_METHOD: "POST",
            sc.CPU_MS: 1.0, sc.MODEL_WAIT_MS: wait, sc.IO_WAIT_MS: 0.0, sc.LOOP_WAIT_MS: 0.0}),
        Span(trace, model, root, "model", "internal", m0, m1, "gateway", {
            sc.STAGE: "model", sc.STAGE_KIND: "model", sc.WALL_MS: wait, sc.CPU_MS: 0.0,
            sc.WAIT_MS: wait, sc.LOOP_WAIT_MS: 0.0, sc.ON_LOOP: True}),
    ]  # fmt: skip
    parent = model
    if via_client:
        spans.append(Span(trace, client, model, "POST", "client", m0, m1, "gateway", {}))
        parent = client
    if server is not None:
        q, p, d = server["queue"], server["prefill"], server["decode"]
        net = server.get("network", 2.0)
        s0 = m0 + int(net / 2 * MS)
        s1 = s0 + int((q + p + d) * MS)
        spans.append(Span(trace, _id(), parent, sc.VLLM_REQUEST_SPAN, "server", s0, s1, "vllm", {
            sc.VLLM_REQUEST_ID: f"cmpl-{next(_ids)}",
            sc.VLLM_LATENCY_TIME_IN_QUEUE: q / 1000, sc.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: p / 1000,
            sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE: d / 1000, sc.VLLM_LATENCY_E2E: (q + p + d) / 1000,
            sc.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: (q + p) / 1000,
            sc.VLLM_USAGE_PROMPT_TOKENS: 12, sc.VLLM_USAGE_COMPLETION_TOKENS: 16}))  # fmt: skip
    return spans


def test_the_server_span_is_part_of_the_model_call_not_a_request() -> None:
    spans = gateway_trace(0, 130, (10, 120), {"queue": 40, "prefill": 20, "decode": 40})
    requests = requests_of_trace(spans)
    assert [r.route for r in requests] == [ROUTE]  # the old code made "llm_request" a second one
    model = next(s for s in requests[0].stages if s.name == "model")
    assert model.server is not None
    timing = (model.server.queue_ms, model.server.prefill_ms, model.server.decode_ms)
    assert timing == pytest.approx((40, 20, 40))
    assert sc.VLLM_REQUEST_SPAN not in {s.name for s in requests[0].stages}


def test_the_server_span_right_under_the_model_stage_joins_it() -> None:
    # tracekit propagates the innermost stage: without a client span the stage is the parent.
    spans = gateway_trace(0, 130, (10, 120), {"queue": 5, "prefill": 20, "decode": 70}, via_client=False)
    (request,) = requests_of_trace(spans)
    (model,) = [s for s in request.stages if s.name == "model"]
    assert model.server is not None and model.server.decode_ms == pytest.approx(70)


def test_a_plain_client_span_answered_by_a_model_server_becomes_a_model_call() -> None:
    spans = gateway_trace(0, 130, (10, 120), {"queue": 5, "prefill": 20, "decode": 70})
    # An uninstrumented gateway: its own OpenTelemetry spans only, no tracekit stage.
    root = spans[0]
    plain = [Span(s.trace_id, s.span_id, root.span_id if s.kind == "client" else s.parent_id, s.name,
                  s.kind, s.start_ns, s.end_ns, s.service, {} if s is root else s.attributes)
             for s in spans if s.name != "model"]  # fmt: skip
    (request,) = requests_of_trace(plain)
    (client,) = [s for s in request.stages if s.span_kind == "client"]
    assert client.kind == sc.KIND_MODEL and client.server is not None


def test_a_late_server_span_is_not_a_request() -> None:
    spans = gateway_trace(0, 130, (10, 120), {"queue": 5, "prefill": 20, "decode": 70})
    server_span = spans.pop()
    # The server exported its span after the gateway's trace had been flushed (10 spans
    # after its root), within the late window (10 spans more).
    filler = [s for i in range(3) for s in gateway_trace(200 + i * 10, 5, (1, 4), None)]
    records = list(assemble([*spans, *filler, server_span], max_open_traces=10, flush_after=10))
    assert [r.route for r in records] == [ROUTE] * 4


def test_a_model_server_span_is_never_a_request() -> None:
    # A client probing the model server directly (or a gateway whose spans went elsewhere):
    # the server's span has no model call to join. It was a request on route "llm_request".
    lone = gateway_trace(0, 130, (10, 120), {"queue": 5, "prefill": 20, "decode": 70})[-1]
    assert requests_of_trace([lone]) == []
    orphaned = Span(lone.trace_id, _id(), _id(), lone.name, lone.kind, lone.start_ns,
                    lone.end_ns, lone.service, lone.attributes)  # its caller not in the input
    assert requests_of_trace([orphaned]) == []
    spans = [*burst(1), lone, orphaned]
    analyzed = analyze_spans(spans)
    report = analyzed.to_dict()
    assert [r["route"] for r in report["routes"]] == [ROUTE] and report["requests"] == 8
    (warning,) = [w for w in analyzed.warnings if sc.VLLM_REQUEST_SPAN in w]
    assert warning.startswith("2 model server spans (llm_request) had no model call")


def _stage(wait: float, server: ServerTiming | None) -> StageRecord:
    return StageRecord("model", "model", "a", None, 0, int(wait * MS), wall_ms=wait, cpu_ms=0.0,
                       wait_ms=wait, server=server)  # fmt: skip


def test_the_split_adds_up_to_the_model_wait() -> None:
    split = model_wait_split(_stage(110, ServerTiming(40, 20, 40, 100, 0, 0)))
    assert split == pytest.approx((10, 40, 20, 40))
    # The server's parts exceed the wait (the answer waited for a busy loop): scaled to fit.
    split = model_wait_split(_stage(50, ServerTiming(40, 20, 40, 100, 0, 0)))
    assert split == pytest.approx((0, 20, 10, 20)) and sum(split or ()) == pytest.approx(50)
    assert model_wait_split(_stage(50, None)) is None


def burst(capacity: int, n: int = 8, inference_ms: float = 100.0) -> list[Span]:
    """``n`` requests arriving together at a model server that runs ``capacity`` at once."""
    spans: list[Span] = []
    for i in range(n):
        queue = (i // capacity) * inference_ms
        model_end = 10 + 2 + queue + inference_ms
        spans += gateway_trace(i * 0.01, model_end + 3, (10, model_end),
                               {"queue": queue, "prefill": 20, "decode": inference_ms - 20})  # fmt: skip
    return spans


def test_the_report_splits_model_wait_into_network_queue_prefill_decode() -> None:
    report = analyze_spans(burst(1)).to_dict()
    (route,) = report["routes"]
    split = route["model_wait_split_ms"]
    assert split["requests"] == 8
    # queue: 0, 100, ..., 700 ms: mean 350; prefill 20; decode 80; network 2 ms each.
    assert split["queue"] == pytest.approx(350) and split["prefill"] == pytest.approx(20)
    assert split["decode"] == pytest.approx(80) and split["network"] == pytest.approx(2, abs=0.01)
    parts = sum(split[k] for k in ("network", "queue", "prefill", "decode"))
    assert parts == pytest.approx(route["breakdown_ms"]["model_wait"])
    text = render_text(report, width=120, color=False, unicode=False)
    assert "model wait    network 2.00" in text and "queue 350" in text
    html = render_html(report)
    assert "<h3>Model wait, from the model server's spans</h3>" in html
    assert "<td>8</td><td>2.00</td><td>350</td><td>20.0</td><td>80.0</td>" in html


def test_a_report_without_server_spans_keeps_its_keys() -> None:
    spans = [s for s in burst(1) if s.name != sc.VLLM_REQUEST_SPAN]
    (route,) = analyze_spans(spans).to_dict()["routes"]
    assert "model_wait_split_ms" not in route


def _serialized(spans: list[Span]) -> list[dict[str, object]]:
    report = analyze_spans(spans).to_dict()
    return [f for f in report["findings"] if f["rule"] == "serialized-model-calls"]


def test_serialized_model_calls_quotes_the_servers_queue() -> None:
    (finding,) = _serialized(burst(1))
    evidence = str(finding["evidence"])
    assert "gen_ai.latency.time_in_queue" in evidence and "one sequence at a time" in evidence
    assert "7 of 8 model calls" in evidence
    assert finding["stage"] == "model" and "max-num-seqs" in str(finding["fix"])


def test_a_server_running_a_few_at_once_is_caught_by_its_queue() -> None:
    # Pairs of calls overlap and finish together: the FIFO reading sees service times of 0
    # and stays silent (the old code gave no finding); the server's queue says 100-300 ms.
    spans = burst(2)
    (finding,) = _serialized(spans)
    assert "at most 2 sequences at once" in str(finding["evidence"])
    assert "ran at most 2 sequences at once and queued the rest" in str(finding["fix"])
    assert _serialized([s for s in spans if s.name != sc.VLLM_REQUEST_SPAN]) == []


def test_a_batching_server_that_never_queued_gives_no_finding() -> None:
    assert _serialized(burst(8)) == []


def test_the_queue_growing_with_calls_in_flight_is_in_the_evidence() -> None:
    # A one-at-a-time server under rising load: 1, then 2, then 4 calls at once.
    spans: list[Span] = []
    t = 0.0
    for width in (1, 1, 2, 2, 4, 4):
        for i in range(width):
            spans += gateway_trace(t + i * 0.01, 12 + 100 * (i + 1) + 3, (10, 12 + 100 * (i + 1)),
                                   {"queue": 100 * i, "prefill": 20, "decode": 80})  # fmt: skip
        t += 100 * width + 50
    (finding,) = _serialized(spans)
    assert "its queue grew with the calls in flight: 0.00 ms with 0-1 others in flight, 250 ms with 2-3" \
        in str(finding["evidence"])


def test_a_lock_in_the_gateway_is_still_found_when_the_server_never_queued() -> None:
    # The gateway lets one call out at a time (the stages never overlap; each request was
    # ready at its start): the server's spans say it never queued, so the wait was before
    # the stage, in the gateway: the FIFO reading's finding, with its fix, still stands.
    spans: list[Span] = []
    for i in range(8):
        start, end = 10 + 100 * i, 10 + 100 * (i + 1)
        spans += gateway_trace(i * 0.01, end + 3, (start, end), {"queue": 0.0, "prefill": 20, "decode": 78})
    (finding,) = _serialized(spans)
    assert "before each stage started" in str(finding["evidence"])
    assert "AsyncOpenAI" in str(finding["fix"])


def _jaeger(spans: list[Span]) -> dict[str, object]:
    """The spans as Jaeger's query API returns them: one trace per trace id, a process per
    service, tags typed, microseconds, ids without leading zeros."""
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)

    def tag(key: str, value: object) -> dict[str, object]:
        kind = {bool: "bool", int: "int64", float: "float64"}.get(type(value), "string")
        return {"key": key, "type": kind, "value": value}

    data = []
    for trace_id, members in traces.items():
        processes = {f"p{i}": {"serviceName": s, "tags": []}
                     for i, s in enumerate(sorted({m.service for m in members}))}  # fmt: skip
        by_service = {p["serviceName"]: key for key, p in processes.items()}
        data.append({"traceID": trace_id.lstrip("0"), "processes": processes, "spans": [{
            "traceID": trace_id.lstrip("0"), "spanID": s.span_id.lstrip("0"),
            "operationName": s.name, "startTime": s.start_ns // 1000,
            "duration": (s.end_ns - s.start_ns) // 1000, "processID": by_service[s.service],
            "references": [] if s.parent_id is None else [
                {"refType": "CHILD_OF", "traceID": trace_id.lstrip("0"), "spanID": s.parent_id.lstrip("0")}],
            "tags": [tag("span.kind", s.kind), *(tag(k, v) for k, v in s.attributes.items())],
        } for s in members]})  # fmt: skip
    return {"data": data}


def test_from_jaeger_the_servers_spans_join_as_well(tmp_path: Path) -> None:
    # Jaeger is where both processes' spans meet at scale (docs/integrations.md, "vLLM").
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(_jaeger(burst(1))))
    report = tracekit.analyze(str(path)).to_dict()
    (route,) = report["routes"]
    assert route["model_wait_split_ms"]["queue"] == pytest.approx(350, abs=0.01)
    assert [f["rule"] for f in report["findings"]] == ["serialized-model-calls"]
