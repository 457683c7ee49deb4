"""Assembly: spans -> requests (SERVER spans, stages, tracekit attributes, hostile input)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import REAL, needs_real
from tracekit import semconv
from tracekit.analysis.api import analyze_spans
from tracekit.analysis.assembly.grouping import Window, assemble, compact, decode_pairs, route_of
from tracekit.analysis.model import RequestRecord, Span
from tracekit.analysis.readers import read_spans
from tracekit.errors import ConfigurationError

T0 = 1_767_225_600 * 10**9
MS = 1_000_000


def span(
    span_id: str,
    parent: str | None = None,
    *,
    trace: str = "t1",
    kind: str = "internal",
    name: str | None = None,
    start_ms: float = 0.0,
    end_ms: float = 10.0,
    attrs: dict[str, Any] | None = None,
    service: str = "gateway",
) -> Span:
    return Span(
        trace_id=trace.rjust(32, "0"),
        span_id=span_id.rjust(16, "0"),
        parent_id=parent.rjust(16, "0") if parent else None,
        name=name or span_id,
        kind=kind,
        start_ns=T0 + int(start_ms * MS),
        end_ns=T0 + int(end_ms * MS),
        service=service,
        attributes=attrs or {},
    )


def stage_attrs(name: str, **values: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.STAGE: name, semconv.STAGE_KIND: values.pop("kind", name)}
    names = {
        "wall": semconv.WALL_MS,
        "cpu": semconv.CPU_MS,
        "wait": semconv.WAIT_MS,
        "loop_wait": semconv.LOOP_WAIT_MS,
        "max_block": semconv.MAX_BLOCK_MS,
        "on_loop": semconv.ON_LOOP,
        "slices": semconv.LOOP_SLICES_US,
        "waits": semconv.LOOP_WAITS_US,
        "function": semconv.CODE_FUNCTION,
        "namespace": semconv.CODE_NAMESPACE,
        "blocked_at": semconv.BLOCKED_AT,
    }
    attrs.update({names[k]: v for k, v in values.items()})
    return attrs


def one(spans: list[Span]) -> RequestRecord:
    requests = list(assemble(spans))
    assert len(requests) == 1
    return requests[0]


def test_a_tracekit_request_decodes_every_component() -> None:
    server = span(
        "a",
        kind="server",
        name="POST /v1/chat/completions",
        end_ms=100,
        attrs={
            semconv.HTTP_REQUEST_METHOD: "POST",
            semconv.HTTP_ROUTE: "/v1/chat/completions",
            semconv.HTTP_RESPONSE_STATUS_CODE: 200,
            semconv.CPU_MS: 12.5,
            semconv.LOOP_WAIT_MS: 3.0,
            semconv.MODEL_WAIT_MS: 60.0,
            semconv.IO_WAIT_MS: 20.0,
            semconv.TTFT_MS: 40.0,
            semconv.ITL_P95_MS: 9.0,
            semconv.CHUNKS: 7,
            semconv.INFLIGHT: 4,
            semconv.LOOP_SLICES_US: [0, 1500],
        },
    )
    tok = span(
        "b",
        "a",
        start_ms=1,
        end_ms=11,
        attrs=stage_attrs(
            "tokenize", wall=10.0, cpu=9.5, wait=0.0, loop_wait=0.5, max_block=9.5,
            on_loop=True, slices=[500, 9500, 20_000, 1_000], waits=[0, 500],
            function="encode", namespace="app.tok", blocked_at="app.py:3 in encode",
        ),
    )  # fmt: skip
    req = one([tok, server])
    assert (req.route, req.status_code, req.instrumented, req.error) == (
        "POST /v1/chat/completions",
        200,
        True,
        False,
    )
    assert (req.cpu_ms, req.loop_wait_ms, req.model_wait_ms, req.io_wait_ms) == (12.5, 3.0, 60, 20)
    assert (req.ttft_ms, req.itl_p95_ms, req.chunks, req.inflight) == (40.0, 9.0, 7, 4)
    assert req.loop_slices == [(T0, T0 + 1_500_000)]
    (stage,) = req.stages
    assert (stage.name, stage.kind, stage.span_kind) == ("tokenize", "tokenize", "internal")
    assert (stage.wall_ms, stage.cpu_ms, stage.wait_ms, stage.loop_wait_ms) == (10, 9.5, 0, 0.5)
    assert (stage.max_block_ms, stage.on_loop, stage.blocked_at) == (
        9.5,
        True,
        "app.py:3 in encode",
    )
    assert (stage.code_function, stage.code_namespace) == ("encode", "app.tok")
    start = T0 + MS
    assert stage.loop_slices == [
        (start + 500_000, start + 10_000_000),
        (start + 20_000_000, start + 21_000_000),
    ]
    assert stage.loop_waits == [(start, start + 500_000)]
    assert stage.parent_id == server.span_id


def test_stages_stop_at_the_next_server_span() -> None:
    # frontend SERVER -> CLIENT -> (downstream SERVER -> CLIENT), plus an INTERNAL child.
    spans = [
        span("f", kind="server", name="GET /dispatch", end_ms=100, service="frontend"),
        span("c1", "f", kind="client", name="HTTP GET", start_ms=1, end_ms=40),
        span("i1", "f", kind="internal", name="work", start_ms=41, end_ms=50),
        span("s2", "c1", kind="server", name="GET /customer", start_ms=2, end_ms=39),
        span("db", "s2", kind="client", name="SQL SELECT", start_ms=3, end_ms=38),
    ]
    requests = {r.route: r for r in assemble(spans)}
    assert set(requests) == {"GET /dispatch", "GET /customer"}
    front = requests["GET /dispatch"]
    assert [(s.name, s.kind, s.cpu_ms) for s in front.stages] == [
        ("HTTP GET", "client", None),
        ("work", "internal", None),
    ]
    assert [s.name for s in requests["GET /customer"].stages] == ["SQL SELECT"]
    assert not front.instrumented


def test_a_trace_without_server_span_uses_its_top_most_span() -> None:
    spans = [span("x", "missing", kind="internal", name="job"), span("y", "x", start_ms=1)]
    req = one(spans)
    assert (req.route, [s.name for s in req.stages]) == ("job", ["y"])


def test_stages_whose_request_span_is_missing_are_not_requests() -> None:
    # The server span went to another exporter: the stages' parent is not in the input.
    orphans = [
        span("a", "server1", name="tokenize", attrs=stage_attrs("tokenize", cpu=1.0)),
        span("b", "server1", name="model", start_ms=1, attrs=stage_attrs("model", wait=5.0)),
    ]
    standalone = [span("c", None, trace="t2", name="batch", attrs=stage_attrs("other", cpu=1.0))]
    window = Window(100, 100)
    requests = list(window.run(enumerate(orphans + standalone, start=1))) + list(window.finish())
    assert [r.route for r in requests] == ["batch"]  # a stage tree with no parent is one
    assert (window.orphan_traces, window.orphan_spans) == (1, 2)
    report = analyze_spans(iter(orphans + standalone))
    assert report.requests == 1
    assert report.warnings == [
        "2 stage spans in 1 traces have no request (SERVER) span in the input, so they are not "
        "counted as requests: was the server span exported elsewhere? (docs/composition.md)"
    ]
    # Once the server span is there, the same stages are one request, and no warning.
    server = span("server1", None, kind="server", name="POST /v1/chat", start_ms=-1, end_ms=11)
    whole = analyze_spans(iter([*orphans, server]))
    assert (whole.requests, whole.warnings) == (1, [])


@pytest.mark.parametrize(
    ("attrs", "name", "expected"),
    [
        ({semconv.HTTP_ROUTE: "/r", semconv.HTTP_REQUEST_METHOD: "GET"}, "x", "GET /r"),
        ({semconv.HTTP_ROUTE: "/r", semconv.HTTP_METHOD_OLD: "PUT"}, "x", "PUT /r"),
        ({semconv.HTTP_ROUTE: "/api"}, "POST /api", "POST /api"),
        ({semconv.HTTP_ROUTE: "/api"}, "handler", "/api"),
        ({semconv.HTTP_ROUTE: 42}, "handler", "handler"),
        ({}, "GET /dispatch", "GET /dispatch"),
    ],
)
def test_route_names(attrs: dict[str, Any], name: str, expected: str) -> None:
    assert route_of(span("a", kind="server", name=name, attrs=attrs)) == expected


def test_cycles_self_parents_and_duplicates_neither_hang_nor_crash() -> None:
    spans = [
        span("a", "b", name="a", start_ms=0),  # a <-> b: a cycle with no root at all
        span("b", "a", name="b", start_ms=1),
        span("b", "a", name="dup", start_ms=2),  # duplicate id: the first wins
        span("c", "c", name="self", trace="t2"),  # its own parent: a root
        span("s", "d", kind="server", trace="t3"),  # SERVER in a cycle with its child
        span("d", "s", trace="t3"),
    ]
    requests = {r.trace_id[-2:]: r for r in assemble(spans)}
    assert requests["t1"].route == "a"
    assert [s.name for s in requests["t1"].stages] == ["b"]
    assert requests["t2"].route == "self" and requests["t2"].stages == []
    assert [s.name for s in requests["t3"].stages] == ["d"]


def test_negative_durations_and_malformed_values_are_clamped_or_dropped() -> None:
    attrs = stage_attrs(
        "tokenize", wall="nan", cpu=math.nan, wait=-5.0, loop_wait=[1], max_block=math.inf,
        on_loop="yes", slices=[1, 2, 3], waits="[0, 1000]",
    )  # fmt: skip
    server = span("a", kind="server", start_ms=10, end_ms=5, attrs={semconv.CHUNKS: 2.5})
    req = one([server, span("b", "a", start_ms=20, end_ms=1, attrs=attrs)])
    assert req.wall_ms == 0 and req.chunks is None
    (stage,) = req.stages
    assert (stage.wall_ms, stage.cpu_ms, stage.wait_ms) == (0.0, None, 0.0)
    assert (stage.loop_wait_ms, stage.max_block_ms, stage.on_loop) == (None, None, None)
    assert stage.loop_slices == [(stage.start_ns + 1000, stage.start_ns + 3000)]
    assert stage.loop_waits == [(stage.start_ns, stage.start_ns + 1_000_000)]


def test_decode_pairs_is_bounded_and_skips_bad_pairs() -> None:
    assert decode_pairs(list(range(10_000)), 0)[:1] == [(0, 1000)]
    assert len(decode_pairs(list(range(10_000)), 0)) == 64
    assert decode_pairs([1, -2, True, 3, 4, 5], 10) == [(10 + 4000, 10 + 9000)]
    assert decode_pairs("[not json", 0) == [] and decode_pairs({"a": 1}, 0) == []


def test_unknown_stage_kind_falls_back_to_the_name_or_other() -> None:
    spans = [
        span("a", kind="server"),
        span("b", "a", attrs=stage_attrs("model", kind="weird", cpu=1.0)),
        span("c", "a", attrs=stage_attrs("lookup", kind=7, cpu=1.0)),
        span("d", "a", attrs=stage_attrs("serialize", kind=["unhashable"], cpu=1.0)),
    ]
    assert [(s.name, s.kind) for s in one(spans).stages] == [
        ("model", "model"),
        ("lookup", "other"),
        ("serialize", "serialize"),
    ]


def streamed(n_traces: int, consumed: list[int]) -> Iterator[Span]:
    for i in range(n_traces):
        consumed.append(i)
        yield span("c", "s", trace=f"t{i}", start_ms=i)
        yield span("s", kind="server", trace=f"t{i}", start_ms=i, end_ms=i + 10)


def test_assembly_streams_with_a_bounded_window() -> None:
    consumed: list[int] = []
    requests = assemble(streamed(1_000, consumed), max_open_traces=10, flush_after=10_000)
    first = next(requests)
    # The window holds 10 traces: the first request comes out long before the input ends.
    assert first.trace_id.endswith("t0") and len(consumed) <= 12
    rest = list(requests)
    assert len(rest) == 999 and all(len(r.stages) == 1 for r in rest)


def test_a_rooted_trace_is_flushed_soon_after_its_root() -> None:
    consumed: list[int] = []
    requests = assemble(streamed(100, consumed), max_open_traces=1_000, flush_after=4)
    next(requests)
    assert len(consumed) <= 4


def test_a_late_fragment_yields_only_its_server_spans() -> None:
    spans = [
        span("s", kind="server", trace="t1"),
        span("x", kind="server", trace="t2"),  # evicts t1 (window of 1)
        span("late", "s", trace="t1"),  # t1 again: a fragment without SERVER span
        span("y", kind="server", trace="t3"),
        span("s2", "s", kind="server", trace="t1", name="GET /downstream"),
    ]
    routes = Counter(r.route for r in assemble(spans, max_open_traces=1))
    assert routes == Counter({"s": 1, "x": 1, "y": 1, "GET /downstream": 1})


def routes(spans: list[Span], **window: int) -> list[str]:
    return sorted(r.route for r in assemble(spans, **window))


def test_fastapis_operation_spans_without_their_request_span_are_not_requests() -> None:
    # A file cut off before the server span (or the server span exported elsewhere): FastAPI's
    # own spans under it are stages of a request the input lacks, never routes of their own.
    orphans = [span("a", "server1", name="fastapi.dependencies"),
               span("b", "server1", name="fastapi.endpoint", start_ms=1),
               span("c", "server1", name="fastapi.serialization", start_ms=2)]  # fmt: skip
    window = Window(100, 100)
    assert list(window.run(enumerate(orphans, start=1))) + list(window.finish()) == []
    assert (window.orphan_traces, window.orphan_spans) == (1, 3)


def test_a_quiet_trace_is_flushed_max_open_traces_spans_after_its_last_span() -> None:
    # Positions count spans of any trace: t1's child comes 3 spans after t1 last had one.
    def stream(gap: int) -> list[Span]:
        fillers = [span(f"f{i}", kind="server", trace=f"x{i}", name=f"GET /x{i}") for i in range(gap)]
        return [span("s", kind="server", trace="t1", name="GET /t1"), *fillers,
                span("orphan", "nowhere", trace="t1", name="late child")]  # fmt: skip

    # Within reach: the child joins t1 (its parent is not in the trace: a top-most span,
    # but t1 has a SERVER span, so it makes no request of its own).
    assert "late child" not in routes(stream(2), max_open_traces=3)
    # Out of reach, soon after t1 was flushed: a late fragment, whose non-SERVER spans are
    # no request either.
    assert "late child" not in routes(stream(3), max_open_traces=3)
    # Long after: a fragment nobody remembers, whose top-most span is a request.
    assert "late child" in routes(stream(8), max_open_traces=3)


def test_a_rooted_trace_is_flushed_flush_after_spans_after_its_root() -> None:
    def stages_of_t1(gap: int) -> int:
        fillers = [span(f"f{i}", kind="server", trace=f"x{i}") for i in range(gap)]
        spans = [span("s", kind="server", trace="t1"), *fillers, span("c", "s", trace="t1")]
        requests = assemble(spans, max_open_traces=100, flush_after=3)
        return next(len(r.stages) for r in requests if r.trace_id.endswith("t1"))

    assert stages_of_t1(2) == 1  # the child is the 3rd span after the root: in time
    assert stages_of_t1(3) == 0  # the 4th: t1 was flushed, the child is a late fragment


def messy_stream(seed: int, n: int = 400) -> list[Span]:
    """Interleaved traces: roots, missing roots, late spans, cycles, duplicate ids."""
    rng = random.Random(seed)
    spans = []
    for t in range(n // 5):
        trace = f"t{t}"
        spans.append(span("s", kind="server", trace=trace, name=f"GET /r{t % 3}", end_ms=50))
        for c in range(rng.randint(0, 6)):
            parent = rng.choice(["s", "s", f"c{c - 1}", "missing", f"c{c}"])
            spans.append(span(f"c{c}", parent, trace=trace, start_ms=c, end_ms=c + 5,
                              kind=rng.choice(["internal", "client", "server"])))  # fmt: skip
        if rng.random() < 0.2:
            del spans[-1 - rng.randint(0, min(3, len(spans) - 1))]  # a lost span, maybe the root
    # Locally shuffled, so that traces interleave and some spans come much later.
    keyed = [(i + rng.expovariate(1 / 15), i, s) for i, s in enumerate(spans)]
    return [s for _, _, s in sorted(keyed)]


@pytest.mark.parametrize("seed", range(6))
def test_a_window_handed_on_at_any_point_gives_the_same_requests(seed: int) -> None:
    spans = messy_stream(seed)
    whole = Window(7, 5)
    expected = [*whole.run(enumerate(spans, 1)), *whole.finish()]
    cut = random.Random(seed).randint(1, len(spans) - 1)
    first = Window(7, 5)
    got = list(first.run(enumerate(spans[:cut], 1)))
    got += first.sweep(cut + 1)
    groups, flushed = first.state(cut)
    second = Window(7, 5)
    second.adopt(groups, flushed)
    got += [*second.run(enumerate(spans[cut:], 1)), *second.finish()]
    key = lambda r: (r.trace_id, r.span_id, len(r.stages))  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, expected))
    assert sorted(got, key=key) == sorted(expected, key=key)


def test_adopt_needs_an_empty_window() -> None:
    window = Window(3, 3)
    list(window.run([(1, span("a"))]))
    with pytest.raises(ValueError, match="empty window"):
        window.adopt([], {})


def test_bad_window_sizes_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="max_open_traces"):
        assemble([], max_open_traces=0)
    with pytest.raises(ConfigurationError, match="flush_after"):
        assemble([], flush_after=0)


def test_compact_drops_only_decoded_attributes() -> None:
    attrs = stage_attrs("tokenize", cpu=1.0) | {semconv.TOKENS: 12, "gen_ai.x": "y"}
    req = one([span("a", kind="server", attrs={semconv.CPU_MS: 2.0, "http.x": 1}),
               span("b", "a", attrs=attrs)])  # fmt: skip
    compact(req)
    assert req.attributes == {"http.x": 1}
    assert req.stages[0].attributes == {semconv.TOKENS: 12, "gen_ai.x": "y"}
    assert req.cpu_ms == 2.0 and req.stages[0].cpu_ms == 1.0


@needs_real
def test_hotrod_n_plus_one_gives_its_routes_and_the_eleven_sequential_calls() -> None:
    requests = list(assemble(read_spans(REAL / "otlp-hotrod-n-plus-one-serial.json")))
    assert Counter(r.route for r in requests) == Counter(
        {"GET /route": 10, "GET /dispatch": 1, "GET /customer": 1,
         "driver.DriverService/FindNearest": 1}
    )  # fmt: skip
    dispatch = next(r for r in requests if r.route == "GET /dispatch")
    calls = [s for s in dispatch.stages if s.name == "HTTP GET"]
    assert len(calls) == 11 and all(s.kind == "client" for s in calls)
    assert dispatch.service == "frontend" and not dispatch.instrumented
    assert abs(dispatch.wall_ms - 1117.0) < 1.0


@needs_real
def test_the_spec_example_with_a_missing_parent_is_one_request() -> None:
    (req,) = assemble(read_spans(REAL / "otlp-spec-example-trace.json"))
    assert (req.route, req.service, req.wall_ms) == ("I'm a server span", "my.service", 1000.0)


@needs_real
@pytest.mark.parametrize(
    ("name", "requests"),
    [
        ("jaeger-api-traces-envelope.json", 1),
        ("jaeger-petclinic-two-services.json", 2),
        ("jaeger-genai-agent-trace.json", 30),
        ("otlp-apiv3-hotrod-dispatch.json", 13),
    ],
)
def test_every_real_file_assembles(name: str, requests: int) -> None:
    assert len(list(assemble(read_spans(REAL / name)))) == requests
