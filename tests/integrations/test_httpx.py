"""tracekit.integrations.httpx with the real OpenAI SDK, real servers on 127.0.0.1.

Two upstreams: the example model server (``tracekit.demo.model_server`` in a process of its
own: known prefill and per-token delays) and a small OpenAI/Anthropic-shaped app below whose
replies are deterministic (byte-for-byte comparisons), that streams usage when asked
(``stream_options.include_usage``) and records the ``traceparent`` and body it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

import tracekit
from tracekit import semconv as sc
from tracekit._core import stage_timing
from tracekit._export import tracing
from tracekit.errors import ConfigurationError
from tracekit.integrations import httpx as tracekit_httpx

from ..conftest import settled
from ..helpers import ROOT
from ..loop.proxy import ModelServer

try:  # the model server's own spans, and the OTLP receiver their tests use (issue 15 item 3)
    from ..demo.otlp_collector import collector
except ImportError:
    collector = None

MODEL = "echo-1"
SERVED = "echo-1-2024-12-04"  # the model the app says answered (gen_ai.response.model)
DELAY_S = 0.015  # the app's time per token
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def upstream_app() -> Starlette:
    """OpenAI's chat completions and Anthropic's messages, deterministic; ``app.state.seen``
    holds (traceparent, body) of every model request."""
    seen: list[tuple[str | None, bytes]] = []

    async def chat(request: Request) -> Any:
        raw = await request.body()
        seen.append((request.headers.get("traceparent"), raw))
        body = json.loads(raw)
        n = int(body.get("max_tokens", 4))
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        if not body.get("stream"):
            text = " ".join(WORDS[i % len(WORDS)] for i in range(n))
            return JSONResponse({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": SERVED,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "length"}], "usage": usage})  # fmt: skip
        include = (body.get("stream_options") or {}).get("include_usage") is True

        def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
            data: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                    "model": SERVED, "choices": [{"index": 0, "delta": delta,
                                                                  "finish_reason": reason}]}  # fmt: skip
            if include:
                data["usage"] = None
            return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"

        async def events() -> AsyncIterator[str]:
            await asyncio.sleep(DELAY_S)
            for i in range(n):
                await asyncio.sleep(DELAY_S)
                yield chunk({"content": WORDS[i % len(WORDS)] + " "})
            yield chunk({}, "length")
            if include:
                last = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                        "model": SERVED, "choices": [], "usage": usage}  # fmt: skip
                yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def messages(request: Request) -> Any:
        """Anthropic's streamed messages: named events, usage in message_start and message_delta."""
        raw = await request.body()
        seen.append((request.headers.get("traceparent"), raw))
        n = int(json.loads(raw)["max_tokens"])

        def event(name: str, data: dict[str, Any]) -> str:
            return f"event: {name}\r\ndata: {json.dumps(data)}\r\n\r\n"

        async def events() -> AsyncIterator[str]:
            yield event("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-echo-1",
                "content": [], "usage": {"input_tokens": 11, "output_tokens": 1}}})  # fmt: skip
            yield event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})  # fmt: skip
            yield event("ping", {"type": "ping"})
            for i in range(n):
                await asyncio.sleep(DELAY_S)
                delta = {"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": WORDS[i]}}  # fmt: skip
                yield event("content_block_delta", delta)
            yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                          "usage": {"output_tokens": n}})  # fmt: skip
            yield event("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Any:
        seen.append((request.headers.get("traceparent"), b""))
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/messages", messages, methods=["POST"]),
                            Route("/health", health)])  # fmt: skip
    app.state.seen = seen
    return app


@pytest.fixture
def upstream(serve: Any) -> Any:
    server = serve(upstream_app())
    server.seen = server.server.config.app.state.seen
    return server


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    server = ModelServer("--prefill-ms", "60", "--decode-ms", "20")
    yield server
    server.stop()


@pytest.fixture
def process_wide() -> Iterator[None]:
    """The process-wide switch, always turned off again."""
    tracekit_httpx.instrument()
    try:
        yield
    finally:
        tracekit_httpx.uninstrument()


def sdk(url: str, http_client: Any = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, http_client=http_client)


def closing(client: openai.AsyncOpenAI) -> Any:
    """A lifespan for a gateway app that closes its model client when the server stops (its
    connections, left to the garbage collector, would warn in whichever test collects next)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await client.close()

    return lifespan


async def chat(client: openai.AsyncOpenAI, stream: bool, max_tokens: int = 6, **extra: Any) -> Any:
    """One chat completion; a stream is read to its end: (text, usage)."""
    messages: Any = [{"role": "user", "content": "hello"}]
    if not stream:
        reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens)
        return reply.choices[0].message.content, reply.usage
    text, usage = "", None
    chunks = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                                  stream=True, **extra)  # fmt: skip
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    return text, usage


def model_spans(spans: Sequence[Any]) -> list[Any]:
    return [s for s in spans if s.attributes.get(sc.STAGE_KIND) == sc.KIND_MODEL]


def traceparent_of(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"


# --- the OpenAI SDK on an instrumented client -------------------------------------------------
def test_a_call_is_a_model_stage_with_a_client_span_and_genai_attributes(upstream: Any) -> None:
    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            return await chat(sdk(upstream.url, http), stream=False)

    with tracekit.record() as rec:
        text, usage = asyncio.run(main())
    assert text == "alpha beta gamma delta epsilon zeta" and usage.completion_tokens == 6
    [span] = model_spans(rec.spans)
    a = span.attributes
    assert span.name == "model" and span.kind.name == "CLIENT"
    assert a[sc.STAGE_SHAPE] == sc.SHAPE_COROUTINE
    assert a[sc.GEN_AI_OPERATION_NAME] == "chat" and a[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert a[sc.GEN_AI_REQUEST_MODEL] == MODEL and a[sc.GEN_AI_RESPONSE_MODEL] == SERVED
    assert a[sc.GEN_AI_REQUEST_STREAM] is False and a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 6
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7 and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert a[sc.SERVER_ADDRESS] == "127.0.0.1" and a[sc.SERVER_PORT] == int(upstream.url.rsplit(":", 1)[1])
    # timed like any stage: its wall time split, most of it waiting for the server
    assert a[sc.WAIT_MS] > 0 and a[sc.STEPS] >= 2
    assert a[sc.CPU_MS] + a[sc.WAIT_MS] + a[sc.LOOP_WAIT_MS] <= a[sc.WALL_MS] + 1e-6
    # the server got the stage's own context: its spans would be the stage's children
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(span)]
    assert sc.UPSTREAM_CHUNKS not in a


def test_a_stream_with_usage(upstream: Any) -> None:
    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            return await chat(sdk(upstream.url, http), stream=True, max_tokens=8,
                              stream_options={"include_usage": True})  # fmt: skip

    with tracekit.record() as rec:
        text, usage = asyncio.run(main())
    assert text == "alpha beta gamma delta epsilon zeta eta theta " and usage.completion_tokens == 8
    [span] = model_spans(rec.spans)
    a = span.attributes
    assert a[sc.STAGE_SHAPE] == sc.SHAPE_ASYNC_GENERATOR and a[sc.GEN_AI_REQUEST_STREAM] is True
    assert a[sc.GEN_AI_RESPONSE_MODEL] == SERVED
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7 and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert sc.UPSTREAM_TOKENS_COUNTED not in a
    # 8 text chunks and the finish chunk; the usage-only chunk and [DONE] are not chunks
    assert a[sc.UPSTREAM_CHUNKS] == 9
    # the model's TTFT is the client's less the gateway's own part (its loop waits, its CPU)
    assert 0 < a[sc.UPSTREAM_TTFT_MS] <= a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] * 1000
    # the app's reading of the stream is its consumer time, not the stage's wait
    assert a[sc.CONSUMER_MS] > 0
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(span)]


def test_upstream_ttft_and_gaps_follow_the_model_servers_pace(model_server: ModelServer) -> None:
    """The example model server: 60 ms prefill, then a token every 20 ms, no usage in its
    streams (so output tokens are counted chunks). Wide margins: on a busy 2-core host a read
    delayed by a stall of the test's own loop makes the chunks after it arrive together."""
    tokens = 20

    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            client = sdk(model_server.url, http)
            await chat(client, stream=True, max_tokens=2)  # connection, the SDK's lazy imports
            return await chat(client, stream=True, max_tokens=tokens)

    with tracekit.record() as rec:
        text, usage = asyncio.run(main())
    assert usage is None and len(text.split()) == tokens
    a = model_spans(rec.spans)[-1].attributes
    assert a[sc.GEN_AI_RESPONSE_MODEL] == "sim-1"
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == tokens and a[sc.UPSTREAM_TOKENS_COUNTED] is True
    assert a[sc.UPSTREAM_CHUNKS] == tokens
    assert 60 + 20 - 5 <= a[sc.UPSTREAM_TTFT_MS] <= 80 + 400
    assert 0.5 * 20 <= a[sc.UPSTREAM_ITL_P50_MS] <= 20 + 60
    assert 0.5 * 20 <= a[sc.UPSTREAM_TPOT_MS] <= 20 + 60
    assert a[sc.UPSTREAM_ITL_P50_MS] <= a[sc.UPSTREAM_ITL_P95_MS] <= a[sc.UPSTREAM_ITL_MAX_MS]
    # the stage waited for the model: most of its wall time
    assert a[sc.WAIT_MS] >= 0.5 * (60 + 20 * tokens)


def test_the_models_ttft_leaves_out_the_time_its_first_chunk_waited_for_the_loop(
    model_server: ModelServer, serve: Any
) -> None:
    """A gateway's loop blocked for 250 ms just after its model request went out (60 ms
    prefill, a token every 20 ms): the first chunk arrived in ~80 ms and was read ~250 ms in.
    The call's time to its first chunk says when the gateway read it; the model's TTFT leaves
    the gateway's part out (a new user's saturated gateway: 273 ms against the model server's
    own 26 ms)."""
    client = sdk(model_server.url, tracekit_httpx.instrument(httpx.AsyncClient()))

    async def hog() -> None:
        await asyncio.sleep(0.005)  # the request is sent
        time.sleep(0.25)

    async def completions(request: Request) -> Any:
        task = asyncio.create_task(hog()) if "hog" in request.query_params else None
        text, _ = await chat(client, stream=True, max_tokens=5)
        if task is not None:
            await task
        return JSONResponse({"text": text})

    routes = [Route("/chat", completions, methods=["POST"])]
    gateway = tracekit.TracekitMiddleware(Starlette(routes=routes, lifespan=closing(client)))
    with tracekit.record() as rec:
        server = serve(gateway)
        with httpx.Client(base_url=server.url, timeout=30) as caller:
            caller.post("/chat")  # connection, the SDK's lazy imports
            caller.post("/chat?hog=1")
        spans = settled(rec, 2)
    a = model_spans(spans)[-1].attributes
    read = a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] * 1000
    assert read >= 250, a
    # The gateway's part is left out: its CPU before the chunk, and the block as far as the
    # loop-wait estimate (the probe's overdue timer) placed it before the chunk. Where in a
    # single 250 ms block the chunk arrived the loop cannot know: the estimate put 80 ms of
    # model time quiet, 6 ms in one loaded full-suite run, and in another booked the block
    # as no loop wait at all (the stage's loop wait 1.1 ms); over many calls it averages
    # out (docs/attributes.md).
    model_ttft = a[sc.UPSTREAM_TTFT_MS]
    assert 0 <= model_ttft < read
    assert model_ttft <= read - min(100.0, a[sc.LOOP_WAIT_MS]) + 1.0


def test_the_reply_and_the_request_are_the_same_with_and_without_instrumentation(upstream: Any) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

    async def fetch(http: httpx.AsyncClient) -> tuple[bytes, bytes, Any, Any]:
        whole = await http.post(upstream.url + "/v1/chat/completions", json=body)
        async with http.stream("POST", upstream.url + "/v1/chat/completions",
                               json={**body, "stream": True}) as reply:  # fmt: skip
            streamed = b"".join([chunk async for chunk in reply.aiter_raw()])
        client = sdk(upstream.url, http)
        parsed = await client.chat.completions.create(model=MODEL, messages=body["messages"], max_tokens=5)
        chunks = await client.chat.completions.create(model=MODEL, messages=body["messages"], max_tokens=5,
                                                      stream=True)  # fmt: skip
        return whole.content, streamed, parsed.model_dump(), [c.model_dump() async for c in chunks]

    async def both() -> tuple[Any, Any]:
        async with httpx.AsyncClient() as plain, tracekit_httpx.instrument(httpx.AsyncClient()) as traced:
            return await fetch(plain), await fetch(traced)

    with tracekit.record() as rec:
        plain, traced = asyncio.run(both())
    assert plain == traced
    assert b"data: [DONE]" in plain[1] and plain[2]["usage"]["completion_tokens"] == 5
    assert len(model_spans(rec.spans)) == 4
    bodies = [raw for _, raw in upstream.seen]
    assert bodies[:4] == bodies[4:]  # the server received the same bodies
    assert [tp is None for tp, _ in upstream.seen] == [True] * 4 + [False] * 4


def test_a_json_reply_read_as_a_stream(upstream: Any) -> None:
    """``send(stream=True)`` of a reply that is one JSON document: its usage still read, at the end."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http, \
                http.stream("POST", upstream.url + "/v1/chat/completions", json=body) as reply:  # fmt: skip
            return json.loads(await reply.aread())

    with tracekit.record() as rec:
        assert asyncio.run(main())["usage"]["completion_tokens"] == 3
    a = model_spans(rec.spans)[0].attributes
    assert a[sc.STAGE_SHAPE] == sc.SHAPE_ASYNC_GENERATOR and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert a[sc.GEN_AI_RESPONSE_MODEL] == SERVED and sc.UPSTREAM_CHUNKS not in a


def test_an_anthropic_stream(upstream: Any) -> None:
    """Named events (Anthropic's Messages API): text deltas are the chunks; usage from
    message_start (input) and message_delta (output); the provider from the path."""
    body = {"model": "claude-echo", "max_tokens": 5, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip

    async def main() -> bytes:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http, \
                http.stream("POST", upstream.url + "/v1/messages", json=body) as reply:  # fmt: skip
            return b"".join([chunk async for chunk in reply.aiter_bytes()])

    with tracekit.record() as rec:
        raw = asyncio.run(main())
    assert raw.count(b"content_block_delta") == 10  # the event line and its type field
    a = model_spans(rec.spans)[0].attributes
    assert a[sc.GEN_AI_PROVIDER_NAME] == "anthropic" and a[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert a[sc.GEN_AI_REQUEST_MODEL] == "claude-echo" and a[sc.GEN_AI_RESPONSE_MODEL] == "claude-echo-1"
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 11 and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert a[sc.UPSTREAM_CHUNKS] == 5


def test_a_sync_client(upstream: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with tracekit.record() as rec, tracekit_httpx.instrument(httpx.Client()) as http:
        whole = http.post(upstream.url + "/v1/chat/completions", json=body).json()
        with http.stream("POST", upstream.url + "/v1/chat/completions",
                         json={**body, "stream": True}) as reply:  # fmt: skip
            lines = list(reply.iter_lines())
    assert whole["usage"]["completion_tokens"] == 3 and "data: [DONE]" in lines
    first, second = model_spans(rec.spans)
    assert first.attributes[sc.STAGE_SHAPE] == sc.SHAPE_FUNCTION
    assert first.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert second.attributes[sc.STAGE_SHAPE] == sc.SHAPE_GENERATOR
    assert second.attributes[sc.UPSTREAM_CHUNKS] == 4  # 3 words and the finish chunk
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(first), traceparent_of(second)]


def test_a_stream_the_app_stops_reading_ends_the_stage_when_closed(upstream: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}

    async def main() -> int:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            began = time.perf_counter_ns()
            async with http.stream("POST", upstream.url + "/v1/chat/completions", json=body) as reply:
                chunks: Any = reply.aiter_raw()
                await chunks.__anext__()  # one chunk, and the iterator kept: only the close ends it
            took = time.perf_counter_ns() - began
            await asyncio.sleep(0.2)  # the rest of the stream would have come by now
            await chunks.aclose()
            return took

    with tracekit.record() as rec:
        took = asyncio.run(main())
    [span] = model_spans(rec.spans)
    assert "tracekit.unfinished" not in span.attributes
    assert span.status.status_code.name == "UNSET"
    assert span.end_time - span.start_time <= took  # ended by the close, not later
    assert span.attributes[sc.UPSTREAM_CHUNKS] == 1


def test_the_apps_time_with_a_chunk_is_consumer_time_not_model_wait(upstream: Any) -> None:
    """Between reads the app holds the reply: the stage's consumer time (as for an async
    generator stage), never its wait for the model."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
    hold_s = 0.03

    async def main() -> int:
        reads = 0
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http, \
                http.stream("POST", upstream.url + "/v1/chat/completions", json=body) as reply:  # fmt: skip
            async for _ in reply.aiter_raw():
                reads += 1
                await asyncio.sleep(hold_s)
        return reads

    with tracekit.record() as rec:
        reads = asyncio.run(main())
    a = model_spans(rec.spans)[0].attributes
    assert a[sc.CONSUMER_MS] >= 0.9 * reads * hold_s * 1000
    # the server sends a token every 15 ms, the app reads one every 30 ms: the replies wait for it
    assert a[sc.WAIT_MS] < a[sc.CONSUMER_MS]


def test_other_requests_of_the_client_pass_untouched(upstream: Any) -> None:
    async def main() -> str:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            return (await http.get(upstream.url + "/health")).text

    with tracekit.record() as rec:
        assert asyncio.run(main()) == "ok"
    assert not model_spans(rec.spans)
    assert upstream.seen == [(None, b"")]


# --- in a traced gateway -----------------------------------------------------------------------
def test_in_a_gateway_the_model_call_is_a_child_of_the_request(upstream: Any, serve: Any) -> None:
    """The request span, its model stage (CLIENT), and the server's traceparent naming that
    stage; the gateway's own TTFT includes the model's."""
    client = sdk(upstream.url, tracekit_httpx.instrument(httpx.AsyncClient()))

    async def completions(request: Request) -> Any:
        if request.query_params.get("stream") != "1":
            text, _ = await chat(client, stream=False)
            return JSONResponse({"text": text})
        chunks = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )

        async def relay() -> AsyncIterator[str]:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json()}\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    routes = [Route("/chat", completions, methods=["POST"])]
    gateway = tracekit.TracekitMiddleware(Starlette(routes=routes, lifespan=closing(client)))
    with tracekit.record() as rec:
        server = serve(gateway)
        with httpx.Client(base_url=server.url, timeout=30) as caller:
            assert caller.post("/chat").json() == {"text": "alpha beta gamma delta epsilon zeta"}
            assert caller.post("/chat?stream=1").text.count("data: ") == 7
        spans = settled(rec, 2)
    requests = [s for s in spans if s.kind.name == "SERVER"]
    models = model_spans(spans)
    assert len(requests) == 2 and len(models) == 2
    for request, model in zip(requests, models, strict=True):
        assert model.parent.span_id == request.context.span_id
        assert model.context.trace_id == request.context.trace_id
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(m) for m in models]
    streamed, model = requests[1].attributes, models[1].attributes
    assert streamed[sc.TTFT_MS] >= model[sc.UPSTREAM_TTFT_MS] and streamed[sc.CHUNKS] == 7
    assert streamed[sc.MODEL_WAIT_MS] > 0
    # the analyzer reads the CLIENT stage spans as model stages
    [route] = tracekit.analyze(spans).to_dict()["routes"]
    assert [(s["stage"], s["kind"]) for s in route["stages"]] == [("model", "model")]


def test_the_stage_is_the_parent_sent_under_another_instrumentations_span(upstream: Any, serve: Any) -> None:
    """FastAPI's native telemetry keeps its ``fastapi.endpoint`` span current around the
    endpoint: the model server must still get the model stage's context, not that span's
    (the demo's non-streamed calls went out under fastapi.endpoint's id, and the model
    server's spans joined no model call)."""
    from opentelemetry.sdk.trace import TracerProvider

    client = sdk(upstream.url, tracekit_httpx.instrument(httpx.AsyncClient()))
    framework = TracerProvider().get_tracer("framework")  # a recording span, as FastAPI's

    async def completions(request: Request) -> Any:
        with framework.start_as_current_span("fastapi.endpoint"):
            text, _ = await chat(client, stream=False)
        return JSONResponse({"text": text})

    gateway = tracekit.TracekitMiddleware(Starlette(routes=[Route("/chat", completions, methods=["POST"])]))
    with tracekit.record() as rec:
        server = serve(gateway)
        with httpx.Client(base_url=server.url, timeout=30) as caller:
            assert caller.post("/chat").json() == {"text": "alpha beta gamma delta epsilon zeta"}
        spans = settled(rec, 1)
    [model] = model_spans(spans)
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(model)]


# --- process-wide ------------------------------------------------------------------------------
def test_process_wide_on_and_off(upstream: Any) -> None:
    original = httpx.AsyncClient.send
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def call() -> int:
        async with httpx.AsyncClient() as http:
            return (await http.post(upstream.url + "/v1/chat/completions", json=body)).status_code

    with tracekit.record() as rec:
        tracekit_httpx.instrument()
        try:
            assert httpx.AsyncClient.send is not original
            assert asyncio.run(call()) == 200

            # a client instrumented on its own as well: still one stage a call
            async def both() -> None:
                async with tracekit_httpx.instrument(httpx.AsyncClient(), name="guard-model") as http:
                    await http.post(upstream.url + "/v1/chat/completions", json=body)

            asyncio.run(both())
        finally:
            tracekit_httpx.uninstrument()
        assert httpx.AsyncClient.send is original
        assert asyncio.run(call()) == 200
    assert [s.name for s in model_spans(rec.spans)] == ["model", "guard-model"]
    assert [tp is None for tp, _ in upstream.seen] == [False, False, True]


def test_process_wide_covers_the_openai_sdks_own_client(upstream: Any, process_wide: None) -> None:
    """OpenAI's SDK 3 makes an httpx2 client of its own when given none."""
    pytest.importorskip("httpx2")

    async def main() -> Any:
        async with sdk(upstream.url) as client:
            return await chat(client, stream=False), await chat(
                client, stream=True, stream_options={"include_usage": True}
            )

    with tracekit.record() as rec:
        whole, streamed = asyncio.run(main())
    assert whole[0].startswith("alpha") and streamed[1].completion_tokens == 6
    first, second = model_spans(rec.spans)
    assert first.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert second.attributes[sc.UPSTREAM_CHUNKS] == 7 and second.attributes[sc.CONSUMER_MS] > 0
    assert [tp for tp, _ in upstream.seen] == [traceparent_of(first), traceparent_of(second)]


def test_uninstrument_a_client(upstream: Any) -> None:
    async def main() -> None:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            tracekit_httpx.uninstrument(http)
            assert "send" not in vars(http)
            await chat(sdk(upstream.url, http), stream=False)

    with tracekit.record() as rec:
        asyncio.run(main())
    assert not model_spans(rec.spans) and upstream.seen[0][0] is None


def test_instrument_takes_httpx_clients_and_a_stage_name() -> None:
    with pytest.raises(TypeError, match="httpx Client or AsyncClient"):
        tracekit_httpx.instrument(object())
    with pytest.raises(ConfigurationError, match="stage name"):
        tracekit_httpx.instrument(httpx.AsyncClient(), name="")


def test_the_provider_given(upstream: Any) -> None:
    async def main() -> None:
        async with tracekit_httpx.instrument(httpx.AsyncClient(), name="local", provider="vllm") as http:
            await chat(sdk(upstream.url, http), stream=False)

    with tracekit.record() as rec:
        asyncio.run(main())
    [span] = model_spans(rec.spans)
    assert span.name == "local" and span.attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"


# --- tracekit's failures stay tracekit's --------------------------------------------------------
@pytest.mark.parametrize("broken", ["requested", "_read", "_events", "_attributes"])
def test_a_bug_in_reading_the_call_never_reaches_the_app(upstream: Any, monkeypatch: Any,
                                                        broken: str) -> None:  # fmt: skip
    def fail(*args: Any) -> None:
        raise RuntimeError("tracekit bug")

    monkeypatch.setattr(tracekit_httpx._Call, broken, fail)

    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            client = sdk(upstream.url, http)
            return await chat(client, stream=False), await chat(
                client, stream=True, stream_options={"include_usage": True}
            )

    with tracekit.record() as rec:
        whole, streamed = asyncio.run(main())
    assert whole[0] == "alpha beta gamma delta epsilon zeta" and whole[1].completion_tokens == 6
    assert streamed[0] == "alpha beta gamma delta epsilon zeta " and streamed[1].completion_tokens == 6
    spans = model_spans(rec.spans)
    assert len(spans) == 2 and all("tracekit.unfinished" not in s.attributes for s in spans)


def test_a_bug_opening_the_stage_never_reaches_the_app(upstream: Any, monkeypatch: Any) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("tracekit bug")

    monkeypatch.setattr(stage_timing, "open_ledger", fail)

    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            return await chat(sdk(upstream.url, http), stream=True)

    with tracekit.record():
        text, _ = asyncio.run(main())
    assert text == "alpha beta gamma delta epsilon zeta "


class RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        pass


def test_a_failing_exporter_never_reaches_the_app(upstream: Any, otel_globals: None) -> None:
    exporter = RaisingExporter()
    tracekit.configure(service_name="gateway", exporter=exporter)

    async def main() -> Any:
        async with tracekit_httpx.instrument(httpx.AsyncClient()) as http:
            client = sdk(upstream.url, http)
            return [await chat(client, stream=stream) for stream in (False, True, False)]

    replies = asyncio.run(main())
    tracing.flush_all()
    assert [text for text, _ in replies] == ["alpha beta gamma delta epsilon zeta",
                                             "alpha beta gamma delta epsilon zeta ",
                                             "alpha beta gamma delta epsilon zeta"]  # fmt: skip
    assert exporter.calls > 0


def test_without_httpx_the_error_names_the_extra() -> None:
    code = ("import sys; sys.modules['httpx'] = None\n"
            "try:\n    import tracekit.integrations.httpx\n"
            "except ImportError as e:\n    print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "TRACEKIT_PURE_PYTHON": "1"})  # fmt: skip
    assert "pip install 'tracekit[httpx]'" in out.stdout, out.stderr


# --- with the model server's own spans (vLLM's llm_request) ---------------------------------------
@pytest.mark.slow
def test_one_trace_from_the_gateway_through_the_client_span_to_the_model_servers_span(
    serve: Any, otel_globals: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The OpenAI SDK on an instrumented client in a gateway, the example model server
    exporting its ``llm_request`` spans: each is the child of the call's CLIENT model span,
    and the report splits the model wait into network, queue, prefill and decode."""
    if collector is None:
        pytest.skip(
            "needs the model server's llm_request spans and tests/demo/otlp_collector.py (issue 15 item 3)"
        )
    with collector() as otlp:
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the server exports within 50 ms
        server = ModelServer("--serial", "--prefill-ms", "10", "--decode-ms", "5",
                             "--otlp-traces-endpoint", f"{otlp.url}/v1/traces")  # fmt: skip
        try:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
            tracekit.configure(service_name="gateway", exporter="otlp")
            client = sdk(server.url, tracekit_httpx.instrument(httpx.AsyncClient()))

            async def completions(request: Request) -> Any:
                text, _ = await chat(client, stream=request.query_params.get("stream") == "1", max_tokens=4)
                return JSONResponse({"text": text})

            app = Starlette(routes=[Route("/chat", completions, methods=["POST"])], lifespan=closing(client))
            gateway = serve(tracekit.TracekitMiddleware(app))

            async def drive() -> None:
                async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as caller:

                    async def worker(i: int) -> None:
                        for j in range(3):
                            path = "/chat?stream=1" if (i + j) % 2 else "/chat"
                            (await caller.post(path)).raise_for_status()

                    await asyncio.gather(*(worker(i) for i in range(4)))

            asyncio.run(drive())
            tracing.flush_all()
            assert len(otlp.wait_for(sc.VLLM_REQUEST_SPAN, 12)) == 12
        finally:
            server.stop()
        spans = {s.span_id: (service, s) for service, s in otlp.spans()}
        path = otlp.write_jsonl(tmp_path / "collected.jsonl")
    client_kind = 3  # OTLP's SPAN_KIND_CLIENT
    for service, span in spans.values():
        if span.name == sc.VLLM_REQUEST_SPAN:
            parent_service, parent = spans[span.parent_span_id]
            assert (service, parent_service, parent.name, parent.kind) == ("model-server", "gateway", "model",
                                                                           client_kind)  # fmt: skip
            assert parent.trace_id == span.trace_id
            grand_service, grand = spans[parent.parent_span_id]
            assert grand_service == "gateway" and grand.kind == 2  # the request's SERVER span
    (route,) = tracekit.analyze(str(path)).to_dict()["routes"]
    assert route["requests"] == 12
    split = route["model_wait_split_ms"]
    assert split["requests"] == 12 and split["queue"] > 0 and split["prefill"] > 0 and split["decode"] > 0
