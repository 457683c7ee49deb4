"""The simulated model server as vLLM (issue 15, item 3): continuous batching
(``--max-num-seqs``, a decode step slowing with the batch) and its ``llm_request`` spans,
received over OTLP/HTTP by a collector stand-in, joined to the caller's trace through
``traceparent``, and read back by the analyzer beside a real gateway's trace."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import propagate
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tests.loop.proxy import ModelServer
from tracekit import semconv as sc
from tracekit._core import current
from tracekit.demo.model_server import DEFAULT_MAX_NUM_SEQS, Engine, Tracing, main, make_app, parse_args

from .otlp_collector import Collector, collector

SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER


@pytest.fixture
def otlp() -> Iterator[Collector]:
    with collector() as got:
        yield got


@pytest.fixture
def model_server(otlp: Collector, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModelServer]]:
    """``model_server(*args)``: the server in its own process, exporting to ``otlp``."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms, not 5 s
    started: list[ModelServer] = []

    def start(*args: str) -> ModelServer:
        server = ModelServer(*args, "--otlp-traces-endpoint", f"{otlp.url}/v1/traces")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


def test_serial_is_max_num_seqs_1_and_the_default_is_vllms() -> None:
    assert parse_args(["--serial"]).max_num_seqs == 1
    assert parse_args([]).max_num_seqs == DEFAULT_MAX_NUM_SEQS == 256
    assert parse_args(["--max-num-seqs", "8", "--batch-cost", "0.5"]).batch_cost == 0.5
    with pytest.raises(SystemExit):
        parse_args(["--max-num-seqs", "0"])


def test_a_bad_otlp_protocol_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "json")
    with pytest.raises(SystemExit, match=r"^model_server: error: .*'json': use http/protobuf or grpc$"):
        main(["--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces"])


def _burst(url: str, n: int, max_tokens: int) -> list[tuple[str, str, float]]:
    """``n`` requests at once, each from a span of its own trace (traceparent injected by hand);
    returns each request's ``(trace id, span id, x-model-ms)``."""
    tracer = TracerProvider().get_tracer("test")

    async def one(client: httpx.AsyncClient) -> tuple[str, str, float]:
        with tracer.start_as_current_span("caller") as span:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            body = {"messages": [{"role": "user", "content": "say something"}], "max_tokens": max_tokens}
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            ctx = span.get_span_context()
            return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", float(response.headers["x-model-ms"])

    async def run() -> list[tuple[str, str, float]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return list(await asyncio.gather(*(one(client) for _ in range(n))))

    return asyncio.run(run())


@pytest.mark.slow
def test_one_sequence_at_a_time_queues_and_a_batch_decodes_slower(
    otlp: Collector, model_server: Callable[..., ModelServer]
) -> None:
    runs: dict[int, list[dict[str, Any]]] = {}
    for seqs in (1, 8):
        server = model_server("--max-num-seqs", str(seqs), "--prefill-ms", "5", "--decode-ms", "5",
                              "--batch-cost", "1")  # fmt: skip
        callers = _burst(server.url, 8, max_tokens=6)
        spans = otlp.wait_for(sc.VLLM_REQUEST_SPAN, 8 * len(runs) + 8)
        server.stop()
        mine = {(s.trace_id.hex(), s.parent_span_id.hex()): s for s in spans}
        # Each span is in its caller's trace, under the caller's span.
        joined = [mine[(trace_id, span_id)] for trace_id, span_id, _ in callers]
        assert all(s.kind == SERVER for s in joined)
        attrs = [_attrs(s) for s in joined]
        for a, (_, _, model_ms) in zip(attrs, callers, strict=True):
            assert a[sc.VLLM_USAGE_COMPLETION_TOKENS] == 6 and a[sc.VLLM_USAGE_PROMPT_TOKENS] == 2
            # Seconds, as vLLM writes them; the server's e2e is within its own x-model-ms.
            assert 0.5 * model_ms <= a[sc.VLLM_LATENCY_E2E] * 1000 <= model_ms + 0.5
            parts = a[sc.VLLM_LATENCY_TIME_IN_QUEUE] + a[sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE]
            assert parts == pytest.approx(a[sc.VLLM_LATENCY_E2E], abs=0.002)
        runs[seqs] = attrs

    serial, batched = runs[1], runs[8]
    inference = statistics.median(a[sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE] for a in serial)
    queues = sorted(a[sc.VLLM_LATENCY_TIME_IN_QUEUE] for a in serial)
    # One at a time: the k-th request waits for the k before it (7x the inference at most).
    assert queues[0] < 0.5 * inference and queues[-1] > 5 * inference
    assert all(b > a for a, b in itertools.pairwise(queues))  # FIFO: each waits longer
    # Eight at once: nobody queues, and each decode step costs 1 + 7 x batch-cost (8x).
    assert max(a[sc.VLLM_LATENCY_TIME_IN_QUEUE] for a in batched) < 0.001
    decode_1 = statistics.median(a[sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE] for a in serial)
    decode_8 = statistics.median(a[sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE] for a in batched)
    assert decode_8 > 3 * decode_1


async def _chat(request: Request) -> JSONResponse:
    reply = await complete(request.app.state.client)
    return JSONResponse({"text": reply.choices[0].message.content})


@tracekit.stage("model")
async def complete(client: openai.AsyncOpenAI) -> Any:
    headers: dict[str, str] = {}
    propagate.inject(headers)  # what the httpx integration will do: the stage's traceparent
    return await client.chat.completions.create(
        model="sim-1", messages=[{"role": "user", "content": "hello there"}], max_tokens=4,
        extra_headers=headers,
    )  # fmt: skip


def _drive(url: str, n: int, concurrency: int) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            todo = iter(range(n))

            async def worker() -> None:
                for _ in todo:
                    (await client.post("/v1/chat", json={})).raise_for_status()

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())


@pytest.mark.slow
def test_the_analyzer_splits_a_gateways_model_wait_with_the_servers_spans(
    otlp: Collector, model_server: Callable[..., ModelServer], serve: Callable[..., Any],
    otel_globals: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    """A gateway calling the model server with the OpenAI SDK, both exporting to the same
    collector; ``tracekit analyze`` of what it received: one route (the server's spans are
    not requests), the model wait split into network, queue, prefill and decode, and the
    one-at-a-time server found from its own queue time."""
    server = model_server("--serial", "--prefill-ms", "10", "--decode-ms", "5")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
    tracekit.configure(service_name="gateway", exporter="otlp")
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The client's connections closed with the gateway: left to the collector, they warn
        # in a later test (8 sockets, found with a gc.collect() after every test).
        app.state.client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none",
                                              max_retries=0)  # fmt: skip
        yield
        await app.state.client.close()

    app = Starlette(routes=[Route("/v1/chat", _chat, methods=["POST"])], lifespan=lifespan)
    gateway = serve(tracekit.TracekitMiddleware(app))
    _drive(gateway.url, 24, 8)
    assert current.active_runtime is not None
    current.active_runtime.flush()
    assert len(otlp.wait_for(sc.VLLM_REQUEST_SPAN, 24)) == 24
    server.stop()

    spans = {s.span_id: (service, s) for service, s in otlp.spans()}
    for service, span in spans.values():
        if span.name == sc.VLLM_REQUEST_SPAN:  # under the gateway's model stage, same trace
            parent_service, parent = spans[span.parent_span_id]
            assert (service, parent_service, parent.name) == ("model-server", "gateway", "model")
            assert parent.trace_id == span.trace_id

    report = tracekit.analyze(str(otlp.write_jsonl(tmp_path / "collected.jsonl"))).to_dict()
    (route,) = report["routes"]  # the old analyzer also made a route of llm_request
    assert route["route"] == "POST /v1/chat" and route["requests"] == 24
    split = route["model_wait_split_ms"]
    assert split["requests"] == 24
    # 8 clients, one call at a time: a call waits for others (~30 ms each) in the server's
    # queue (measured: a mean of 2-4 calls' time; asserted: more than one).
    assert split["queue"] > split["prefill"] + split["decode"]
    # Prefill: 10 ms and the first token's step (5 ms); decode: the 3 steps after it (asyncio
    # may wake a sleep up to its clock resolution early, hence 0.8x).
    assert split["prefill"] >= 0.8 * 15 and split["decode"] >= 0.8 * 3 * 5
    parts = sum(split[k] for k in ("network", "queue", "prefill", "decode"))
    assert parts == pytest.approx(route["breakdown_ms"]["model_wait"], rel=0.01)
    (finding,) = [f for f in report["findings"] if f["rule"] == "serialized-model-calls"]
    assert "gen_ai.latency.time_in_queue" in finding["evidence"]
    assert "one sequence at a time" in finding["evidence"]


def test_the_engine_admits_first_come_first_served_and_frees_a_cancelled_waiters_slot() -> None:
    async def run() -> None:
        engine = Engine(prefill_ms=1, decode_ms=4, max_num_seqs=2, batch_cost=0.5)
        order: list[int] = []

        async def request(i: int) -> None:
            await engine.admit()
            order.append(i)

        await engine.admit()
        await engine.admit()
        assert engine.step_s() == pytest.approx(0.004 * 1.5)  # two running: 1 + 0.5 x 1
        waiting = [asyncio.create_task(request(i)) for i in range(3)]
        await asyncio.sleep(0)
        waiting[0].cancel()  # a client that went away while queued
        await asyncio.sleep(0)
        engine.release()
        engine.release()
        await asyncio.gather(*waiting[1:])
        assert order == [1, 2] and engine.running == 2 and not engine.waiting

    asyncio.run(run())


@pytest.mark.parametrize("running", [1, 3])
def test_the_engines_steps_keep_their_length_on_uvloops_millisecond_timers(running: int) -> None:
    """One step for the whole batch, each due one step after the last was due: under uvloop
    (uvicorn's loop), whose timers are whole milliseconds, 2.5 ms steps took 2.2 ms alone and
    2.8 ms for 2.75 ms asked among three, so a batching fix measured slower decoding than
    the batch cost alone makes."""
    uvloop = pytest.importorskip("uvloop")

    async def sequence(engine: Engine, out: list[float]) -> None:
        await engine.admit()
        try:
            times = []
            for _ in range(41):
                await engine.step()
                times.append(time.perf_counter())
            out.append((times[-1] - times[0]) / 40)
        finally:
            engine.release()

    async def run() -> list[float]:
        engine = Engine(prefill_ms=1, decode_ms=2.5, max_num_seqs=4, batch_cost=0.05)
        out: list[float] = []
        await asyncio.gather(*(sequence(engine, out) for _ in range(running)))
        return out

    asked = 0.0025 * (1 + 0.05 * (running - 1))
    for step in uvloop.run(run()):
        # Never shorter (the millisecond timers made 2.5 ms steps 2.2 ms); a late loop on a busy
        # host makes them longer (seen: +8% under the parallel suite), so only a wide upper bound.
        assert asked * 0.95 <= step <= asked * 1.5


def test_a_streamed_reply_ends_with_its_span_and_no_traceparent_starts_a_trace(otlp: Collector) -> None:
    tracing = Tracing(f"{otlp.url}/v1/traces")
    app = make_app(prefill_ms=1, decode_ms=1, max_num_seqs=4, tracing=tracing)

    async def run() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            body = {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3, "stream": True}
            response = await client.post("/v1/chat/completions", json=body)
            return [line for line in response.text.splitlines() if line.startswith("data: ")]

    lines = asyncio.run(run())
    tracing.shutdown()
    assert len(lines) == 4 and lines[-1] == "data: [DONE]"
    (span,) = otlp.wait_for(sc.VLLM_REQUEST_SPAN, 1)
    attrs = _attrs(span)
    assert span.parent_span_id == b"" and span.kind == SERVER  # a root: nobody sent a traceparent
    assert attrs[sc.VLLM_USAGE_PROMPT_TOKENS] == 3 and attrs[sc.VLLM_USAGE_COMPLETION_TOKENS] == 3
    assert attrs[sc.VLLM_REQUEST_ID] == "cmpl-1" and attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] == 3


def test_a_stream_asked_for_usage_ends_with_a_usage_chunk() -> None:
    """``stream_options.include_usage``, as OpenAI and vLLM answer it: a last chunk with no
    choices and the usage, before ``[DONE]``; without it, no usage chunk."""
    app = make_app(prefill_ms=1, decode_ms=1, max_num_seqs=4, tracing=None)

    async def run(options: dict[str, Any]) -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            body = {"messages": [{"role": "user", "content": "a b c d"}], "max_tokens": 5,
                    "stream": True, **options}  # fmt: skip
            response = await client.post("/v1/chat/completions", json=body)
            return [line for line in response.text.splitlines() if line.startswith("data: ")]

    lines = asyncio.run(run({"stream_options": {"include_usage": True}}))
    assert len(lines) == 7 and lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 4, "completion_tokens": 5,
                                                       "total_tokens": 9}  # fmt: skip
    plain = asyncio.run(run({}))
    assert len(plain) == 6 and all("usage" not in line for line in plain)
