"""Aggregation: percentiles, the DESIGN §4 breakdown, streaming metrics, bounds, the sample."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from tests.analysis.factories import request, stage
from tracekit import semconv
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.slo import parse_slo
from tracekit.analysis.stats.aggregate import OTHER_ROUTES, OTHER_STAGES, Aggregator, breakdown, sample_key
from tracekit.analysis.stats.quantiles import EXACT_LIMIT, RELATIVE_ERROR, Quantiles

ROUTE = "POST /v1/chat/completions"


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def test_small_samples_are_exact_with_linear_interpolation() -> None:
    q = Quantiles()
    for v in [5.0, 1.0, 3.0, 2.0, 4.0]:
        q.add(v)
    assert q.exact and q.count == 5
    assert q.summary(("p50", "p90", "max")) == {"p50": 3.0, "p90": 4.6, "max": 5.0}
    assert (q.min, q.mean, Quantiles().quantile(0.5)) == (1.0, 3.0, None)


def test_large_samples_stay_within_one_percent_in_bounded_memory() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(3, 1.2) for _ in range(50_000)] + [0.0] * 100
    q = Quantiles()
    for v in values:
        q.add(v)
    assert not q.exact and q.count == len(values)
    ordered = sorted(values)
    for p in (0.5, 0.9, 0.95, 0.99):
        rank = p * (len(ordered) - 1)
        low, high = ordered[math.floor(rank)], ordered[math.ceil(rank)]
        got = q.quantile(p)
        assert got is not None
        assert low * (1 - RELATIVE_ERROR) - 1e-9 <= got <= high * (1 + RELATIVE_ERROR) + 1e-9
    assert q.max == max(values) and q.quantile(0.0) == 0.0
    assert math.isclose(q.mean or 0, sum(values) / len(values))
    # One counter per occupied 2%-wide bucket: a few hundred, not 50,000 values.
    assert len(q._buckets) < 1_500


def test_the_switch_to_the_histogram_happens_past_the_exact_limit() -> None:
    q = Quantiles()
    for i in range(EXACT_LIMIT):
        q.add(float(i + 1))
    assert q.exact and q.quantile(0.5) == exact_quantile([i + 1.0 for i in range(EXACT_LIMIT)], 0.5)
    q.add(-3.0)  # clamped to zero
    assert not q.exact and q.min == 0.0


def test_breakdown_splits_cpu_by_thread_and_waits_by_kind() -> None:
    req = request(
        ROUTE,
        0,
        100,
        [
            stage("tokenize", 0, 10, cpu_ms=8.0, wait_ms=0.0, loop_wait_ms=2.0),
            stage("guardrail", 10, 30, cpu_ms=4.0, wait_ms=16.0, on_loop=False),
            stage("model", 30, 90, cpu_ms=1.0, wait_ms=58.0, loop_wait_ms=1.0),
        ],
        cpu_ms=15.0,  # 13 in stages, 2 of the request's own code
    )
    assert breakdown(req) == (11.0, 4.0, 58.0, 16.0, 3.0, 0.0, 0.0)
    req.model_wait_ms, req.io_wait_ms, req.loop_wait_ms = 50.0, 10.0, 5.0
    assert breakdown(req) == (11.0, 4.0, 50.0, 10.0, 5.0, 0.0, 0.0)
    # GC pauses and queue waits come from the request span (written only when not zero).
    req.attributes = {semconv.GC_MS: 7.5, semconv.QUEUE_WAIT_MS: 12}
    assert breakdown(req) == (11.0, 4.0, 50.0, 10.0, 5.0, 7.5, 12.0)
    req.attributes = {semconv.GC_MS: "bad", semconv.QUEUE_WAIT_MS: -3.0}
    assert breakdown(req)[5:] == (0.0, 0.0)
    assert breakdown(request(ROUTE, 0, 1, instrumented=False)) is None


def test_route_statistics_latency_errors_throughput_and_stages() -> None:
    agg = Aggregator()
    for i in range(10):
        tok = stage("tokenize", i * 100, i * 100 + 5, cpu_ms=5.0, wait_ms=0.0, max_block_ms=i)
        tok.blocked_at = f"app.py:{i}"
        req = request(ROUTE, i * 100, i * 100 + 10 * (i + 1), [tok], error=i == 0)
        agg.add(req)
    (route,) = agg.routes()
    assert (route["route"], route["requests"], route["errors"]) == (ROUTE, 10, 1)
    assert route["throughput_rps"] == pytest.approx(10 / 1.0)  # 0 .. 1000 ms
    assert route["latency_ms"]["p50"] == pytest.approx(55.0)
    assert route["latency_ms"]["max"] == pytest.approx(100.0)
    assert route["breakdown_ms"]["cpu_on_loop"] == pytest.approx(5.0)
    assert route["streaming"] is None and route["goodput"] is None
    (tok_row,) = route["stages"]
    assert (tok_row["stage"], tok_row["kind"], tok_row["count"]) == ("tokenize", "tokenize", 10)
    assert tok_row["cpu_ms"] == {"p50": 5.0, "p95": 5.0}
    assert (tok_row["on_loop"], tok_row["max_block_ms"], tok_row["blocked_at"]) == (
        True,
        9,
        "app.py:9",
    )
    assert tok_row["function"] == "app.tokenize"
    assert agg.slowest is not None and agg.slowest.wall_ms == pytest.approx(100.0)


def test_a_single_request_has_no_throughput() -> None:
    # Its window is its own duration: one over it (166.7 req/s for a 6 ms request) is no rate.
    agg = Aggregator(slo=parse_slo("e2e=100ms"))
    agg.add(request(ROUTE, 0, 6, []))
    (route,) = agg.routes()
    assert route["throughput_rps"] is None and route["goodput"]["rps"] is None
    assert route["goodput"]["fraction"] == 1.0
    agg.add(request(ROUTE, 100, 106, []))
    (route,) = agg.routes()
    assert route["throughput_rps"] == pytest.approx(2 / 0.106)


def test_a_stage_name_of_two_kinds_takes_the_kind_of_its_earliest_instance() -> None:
    # In any order, and merged from parts: the kind does not follow the order of arrival.
    early = request("GET /a", 0, 10, [stage("db", 1, 2, kind="client")])
    late = request("GET /a", 100, 110, [stage("db", 101, 102, kind="internal")])
    tie = [request("GET /a", 200, 210, [stage("q", 201, 202, kind=kind)]) for kind in ("z", "b")]
    results = []
    for order in ([early, late, *tie], [late, *tie[::-1], early]):
        agg = Aggregator()
        for req in order:
            agg.add(req)
        results.append(agg.routes())
    parts = [Aggregator(), Aggregator()]
    for part, req in zip([0, 1, 1, 0], [late, early, tie[0], tie[1]], strict=True):
        parts[part].add(req)
    parts[0].merge(parts[1])
    results.append(parts[0].routes())
    assert results[0] == results[1] == results[2]
    kinds = {row["stage"]: row["kind"] for row in results[0][0]["stages"]}
    assert kinds == {"db": "client", "q": "b"}


def test_uninstrumented_routes_have_a_null_breakdown() -> None:
    agg = Aggregator()
    agg.add(request("GET /dispatch", 0, 10, [stage("HTTP GET", 1, 2, span_kind="client")],
                    instrumented=False))  # fmt: skip
    (route,) = agg.routes()
    assert set(route["breakdown_ms"].values()) == {None}
    assert route["stages"][0]["cpu_ms"] == {"p50": None, "p95": None}
    assert route["stages"][0]["on_loop"] is None


def test_streaming_metrics_and_goodput_against_an_slo() -> None:
    agg = Aggregator(slo=parse_slo("ttft=100ms,itl=20ms"))
    for i in range(4):
        agg.add(request(ROUTE, i * 250, i * 250 + 200, chunks=11, ttft_ms=50.0 + 30 * i,
                        itl_p95_ms=10.0 + 5 * i))  # fmt: skip
    agg.add(request(ROUTE, 1000, 1100, chunks=1))  # not streamed: no gaps, counts as good
    (route,) = agg.routes()
    s = route["streaming"]
    assert s["ttft_ms"]["p50"] == pytest.approx(95.0)
    assert s["itl_ms"]["p99"] == pytest.approx(24.85)
    # TPOT from (wall - ttft) / (chunks - 1) when the attribute is absent.
    assert s["tpot_ms"]["p50"] == pytest.approx((200 - 95) / 10)
    # ttft 50, 80 meet; 110, 140 miss; itl 10, 15, 20 meet, 25 misses; the 1-chunk one meets.
    assert route["goodput"]["fraction"] == pytest.approx(3 / 5)
    assert route["goodput"]["rps"] == pytest.approx(3 / 1.1)


def test_routes_and_stages_are_capped() -> None:
    agg = Aggregator(max_routes=2, max_stages=2)
    for i in range(5):
        stages = [stage(f"s{j}", 0, 1, cpu_ms=0.5, wait_ms=0.0) for j in range(4)]
        agg.add(request(f"GET /r{i}", 0, 10, stages))
    rows = {r["route"]: r for r in agg.routes()}
    assert set(rows) == {"GET /r0", "GET /r1", OTHER_ROUTES}
    assert rows[OTHER_ROUTES]["requests"] == 3
    assert [s["stage"] for s in rows["GET /r0"]["stages"]] == ["s0", "s1", OTHER_STAGES]
    assert rows["GET /r0"]["stages"][2]["count"] == 2


def test_the_sample_keeps_the_earliest_requests_sorted() -> None:
    agg = Aggregator(sample_size=5)
    starts = list(range(20))
    random.Random(3).shuffle(starts)
    for s in starts:
        agg.add(request(ROUTE, s * 10.0, s * 10.0 + 5), counted=s % 2 == 0)
    sample = agg.sample()
    assert [r.start_ns for r in sample] == sorted(r.start_ns for r in sample)
    assert [(r.start_ns - sample[0].start_ns) // 10_000_000 for r in sample] == [0, 1, 2, 3, 4]
    assert agg.requests == 10  # the uncounted ones are in the sample only


def random_requests(seed: int, n: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.choice([0.0, 10.0, rng.uniform(0, 60_000)])  # ties on the start too
        stages = [
            stage(name, start + j, start + j + rng.lognormvariate(1, 1),
                  cpu_ms=rng.lognormvariate(0, 1), wait_ms=rng.choice([None, 0.0, 3.5]),
                  on_loop=rng.choice([True, False, None]),
                  max_block_ms=rng.choice([None, 1.0, rng.uniform(0, 50)]),
                  function=rng.choice(["encode", "tokenize", None]))  # fmt: skip
            for j, name in enumerate(rng.sample(["tokenize", "guardrail", "model", "x"], 3))
        ]
        for s in stages:
            s.blocked_at = rng.choice([None, "app.py:1", "app.py:2"]) if s.max_block_ms else None
        out.append(
            request(rng.choice([ROUTE, "GET /health", "POST /embed"]), start,
                    start + rng.lognormvariate(4, 1), stages, error=rng.random() < 0.1,
                    chunks=rng.choice([None, 1, 12]), ttft_ms=rng.choice([None, 30.0]),
                    itl_p95_ms=rng.choice([None, 7.5]))  # fmt: skip
        )
    return out


def aggregate(requests: list[RequestRecord], **settings: Any) -> Aggregator:
    settings.setdefault("sample_size", 300)
    agg = Aggregator(slo=parse_slo("ttft=50ms,e2e=100ms"), **settings)
    for req in requests:
        agg.add(req, counted=req.route != "POST /embed" or req.start_ns % 2 == 0)
    return agg


def summary(agg: Aggregator) -> tuple[Any, ...]:
    return (agg.requests, agg.instrumented, agg.routes(), agg.sample(), agg.slowest)


@pytest.mark.parametrize("seed", range(4))
def test_aggregation_does_not_depend_on_the_order_of_requests(seed: int) -> None:
    # 3,000 requests: past the exact limit, so the histograms are compared too.
    requests = random_requests(seed, 3_000)
    shuffled = requests[:]
    random.Random(seed + 1).shuffle(shuffled)
    assert summary(aggregate(requests)) == summary(aggregate(shuffled))


@pytest.mark.parametrize("seed", range(4))
def test_merged_aggregators_equal_one_fed_everything(seed: int) -> None:
    requests = random_requests(seed, 3_000)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(requests)), 3))
    parts = [requests[a:b] for a, b in zip([0, *cuts], [*cuts, len(requests)], strict=True)]
    merged = Aggregator(slo=parse_slo("ttft=50ms,e2e=100ms"), sample_size=300)
    for i, part in enumerate(parts):
        merged.merge(aggregate(part, pack_sample=i % 2 == 1))  # packed samples merge too
    assert summary(merged) == summary(aggregate(requests))


def test_the_sample_can_travel_apart_from_the_statistics() -> None:
    requests = random_requests(9, 1_000)
    halves = [aggregate(requests[:400]), aggregate(requests[400:])]
    keys = sorted((key for a in halves for key in map(sample_key, a.sample())), reverse=True)
    cutoff = keys[299]
    merged = Aggregator(slo=parse_slo("ttft=50ms,e2e=100ms"), sample_size=300)
    for half in halves:
        kept = [r for key, r in half.take_sample() if key >= cutoff]
        assert half.sample() == [] and all(sample_key(r) >= cutoff for r in kept)  # type: ignore[arg-type]
        merged.merge(half, sample=False)
        merged.adopt_sample(kept)
    assert summary(merged) == summary(aggregate(requests))


def test_the_route_breakdown_is_the_mean_of_the_requests_breakdowns() -> None:
    requests = [r for r in random_requests(5, 2_000) if r.route == ROUTE]
    for i, req in enumerate(requests):  # the request-level components too, now and then
        req.model_wait_ms = 7.0 if i % 3 == 0 else None
        req.io_wait_ms = 2.5 if i % 4 == 0 else None
        req.instrumented = i % 10 != 0
    agg = Aggregator()
    for req in requests:
        agg.add(req)
    parts = [p for p in map(breakdown, requests) if p is not None]
    (route,) = [r for r in agg.routes() if r["route"] == ROUTE]
    for i, key in enumerate(("cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait")):
        # Fixed point: within 2**-32 ms of the float mean.
        mean = sum(p[i] for p in parts) / len(parts)
        assert route["breakdown_ms"][key] == pytest.approx(mean, rel=0, abs=2**-31)


def test_work_after_the_response_is_out_of_the_breakdown_and_in_the_loops_usage() -> None:
    from tracekit.analysis.rules.loop_index import OWN, loop_usage

    log_spend = stage("log_spend", 20, 26, cpu_ms=6.0)  # began once the response was sent
    req = request("POST /chat", 0, 20, [stage("model", 2, 18, kind="model", cpu_ms=0.0, wait_ms=16.0),
                                        log_spend], cpu_ms=4.0, model_wait_ms=16.0, io_wait_ms=0.0,
                  attributes={semconv.AFTER_RESPONSE_CPU_MS: 9.0,
                              semconv.AFTER_RESPONSE_CPU_OFF_LOOP_MS: 1.0})  # fmt: skip
    on, off, model, *_ = breakdown(req)  # type: ignore[misc]
    assert (on, off, model) == (4.0, 0.0, 16.0)  # the request's 20 ms, nothing after it
    usage = loop_usage(req)
    # On the loop, its own code held it 4 ms in the span and 2 ms after (9 less 1 off the
    # loop, less the stage's 6, which are the stage's usage).
    assert usage[OWN].cpu_ms == pytest.approx(6.0)
    assert usage["log_spend"].cpu_ms == pytest.approx(6.0)
