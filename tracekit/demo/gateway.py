"""The demo's LLM gateway: the seeds' problems on purpose, each with a switch that fixes it.

FastAPI app, ``POST /v1/chat/completions`` (OpenAI-style, streamed or not): tokenize the prompt
(a real Hugging Face ``tokenizers`` BPE, trained at start-up on a generated corpus: nothing is
downloaded), run the input guardrail (pure-Python regexes, :mod:`tracekit.demo.policy`), call
the model server (``tracekit.demo.model_server``; OpenAI-compatible) with an httpx client that
:mod:`tracekit.integrations.httpx` instruments (the ``model`` stage, a CLIENT span carrying
``traceparent``), and serialize
the reply, which echoes the prompt's tokens (``prompt_tokens_details``, as gateways that return
token ids do).

The problems, and the switch (``--fix NAME``, or ``TRACEKIT_DEMO_FIXES=name,name``) that fixes
each one:

==========  =========================================  ===========================================
switch      the problem (left as is)                   the fix (switched on)
==========  =========================================  ===========================================
tokenize    ``Tokenizer.encode`` on the event loop     ``encode_batch`` (GIL-free) in a thread
guardrail   the guardrail's Python CPU on the loop     a process pool runs it
overlap     the guardrail, then the model call         the model call starts beside the guardrail
                                                       and is cancelled if the prompt is refused
serialize   ``json.dumps`` of the reply on the loop    ``orjson.dumps``
==========  =========================================  ===========================================

The fifth problem is the model server's: ``--serial`` serves one request at a time (no
continuous batching); the demo's fix starts it with ``--max-num-seqs 16 --batch-cost 0.05``.

Run (with ``python -m tracekit.demo.model_server --port 8001 --serial``)::

    python -m tracekit.demo.gateway --port 8000 --model-url http://127.0.0.1:8001 [--fix NAME]...
    # or: MODEL_URL=... uvicorn --factory tracekit.demo.gateway:create_app --port 8000
    # traces: OTEL_EXPORTER_OTLP_ENDPOINT (Jaeger, any OTLP backend), or
    #         OTEL_TRACES_EXPORTER=jsonl:traces.jsonl for a file ``tracekit analyze`` reads
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing
import os
import random
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

try:
    import httpx
    import orjson
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import Response, StreamingResponse
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError as error:  # a plain install: one line naming the extra
    raise ImportError("the demo gateway needs pip install 'tracekit[demo]'") from error

import tracekit
from tracekit.demo import policy
from tracekit.integrations import httpx as tracekit_httpx

#: The switches, in the order the table above gives them.
FIXES = ("tokenize", "guardrail", "overlap", "serialize")
MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:8001")
#: Passes of the guardrail's patterns: ~15 ms of Python CPU per request on one core.
GUARDRAIL_ROUNDS = int(os.environ.get("GUARDRAIL_ROUNDS", "60"))
#: Prompt tokens the reply echoes (a gateway caps what it returns; above the demo's longest
#: prompts, ~25,500 tokens).
ECHO_TOKENS = 32768
#: The stand-in log-probabilities, one per token id (see with_prompt_tokens).
LOGPROBS = [-math.log(1.5 + (i * 7919) % 401) / 3.0 for i in range(512)]


def fixes_from_env() -> frozenset[str]:
    """The switches turned on in ``TRACEKIT_DEMO_FIXES`` (comma-separated :data:`FIXES`)."""
    names = {n.strip() for n in os.environ.get("TRACEKIT_DEMO_FIXES", "").split(",") if n.strip()}
    unknown = names - set(FIXES)
    if unknown:
        raise SystemExit(f"TRACEKIT_DEMO_FIXES: unknown {sorted(unknown)}; expected some of {FIXES}")
    return frozenset(names)


def vocabulary(seed: int = 7, size: int = 4000) -> list[str]:
    """Made-up words (syllables joined): the demo's prompts and the tokenizer's corpus."""
    rng = random.Random(seed)
    syllables = "ka lo mi ne tu ra si po de ga vu be zo fi ly qua ter on an in".split()
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(size)]


def train_tokenizer() -> Tokenizer:
    """A small BPE tokenizer trained on a generated corpus (~0.1 s; the real library, no hub)."""
    words = vocabulary()
    rng = random.Random(11)
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(2000)]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


# The one gateway of this process, set by create_app (module-level functions, as gateways
# write them, so that the analyzer's fixes apply to their shape).
FIXED: frozenset[str] = frozenset()
TOKENIZER: Tokenizer | None = None
client: httpx.AsyncClient | None = None
# The guardrail fix's pool. "spawn": fresh interpreters, since forking a process that runs
# threads (tracekit's, httpx's) is unsafe; a worker imports the main module (which starts
# nothing outside its __main__ guard), tracekit.demo.policy, and tracekit's hand-off wrapper.
_pool: ProcessPoolExecutor | None = None


@tracekit.stage("tokenize")
def tokenize(text: str) -> Any:
    assert TOKENIZER is not None
    return TOKENIZER.encode(text)  # holds the GIL; on the event loop when called from it


@tracekit.stage("tokenize")
def tokenize_batch(text: str) -> Any:
    assert TOKENIZER is not None
    return TOKENIZER.encode_batch([text])[0]  # releases the GIL: a worker thread runs beside


@tracekit.stage("guardrail")
def input_guardrail(text: str) -> bool:
    return policy.check_input(text, GUARDRAIL_ROUNDS)


@tracekit.stage("guardrail")
async def input_guardrail_in_pool(text: str) -> bool:
    assert _pool is not None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, policy.check_input, text, GUARDRAIL_ROUNDS)


async def complete(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    assert client is not None
    response = await client.post("/v1/chat/completions",
                                 json={"messages": messages, "max_tokens": max_tokens})  # fmt: skip
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


async def stream_completion(messages: list[dict[str, str]], max_tokens: int) -> AsyncIterator[Any]:
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True}
    assert client is not None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


@tracekit.stage("serialize")
def serialize(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply).encode()


@tracekit.stage("serialize")
def serialize_orjson(reply: dict[str, Any]) -> bytes:
    return orjson.dumps(reply)


def with_prompt_tokens(reply: dict[str, Any], encoding: Any) -> dict[str, Any]:
    """The reply with the prompt's token ids and a log-probability per token, as vLLM returns
    them on request (``prompt_logprobs``); the simulated model server has none, so a fixed
    table stands in. Floats are what makes ``json.dumps`` slow (and allocate no objects the
    garbage collector tracks: GC is not one of the demo's problems)."""
    ids = encoding.ids[:ECHO_TOKENS]
    reply["usage"]["prompt_tokens"] = len(encoding.ids)
    reply["prompt_token_ids"] = ids
    reply["prompt_logprobs"] = [LOGPROBS[i % len(LOGPROBS)] for i in ids]
    return reply


async def _pump(chunks: AsyncIterator[Any], queue: asyncio.Queue[Any]) -> None:
    # The streamed model call, run ahead in a task (the overlap fix); None ends the stream.
    try:
        async for chunk in chunks:
            await queue.put(chunk)
    finally:
        await queue.put(None)


async def _guardrail(prompt: str) -> None:
    ok = await input_guardrail_in_pool(prompt) if "guardrail" in FIXED else input_guardrail(prompt)
    if not ok:
        raise HTTPException(400, "prompt rejected by the input guardrail")


async def chat(request: Request) -> Response:
    body = await request.json()
    messages = body.get("messages") or []
    prompt = " ".join(m.get("content", "") for m in messages)
    max_tokens = int(body.get("max_tokens", 16))
    stream = bool(body.get("stream"))
    encoding = await asyncio.to_thread(tokenize_batch, prompt) if "tokenize" in FIXED else tokenize(prompt)

    if "overlap" in FIXED:  # start the model call now; cancel it if the guardrail refuses
        queue: asyncio.Queue[Any] = asyncio.Queue()
        call = asyncio.create_task(
            _pump(stream_completion(messages, max_tokens), queue) if stream
            else complete(messages, max_tokens)
        )
        try:
            await _guardrail(prompt)
        except BaseException:
            call.cancel()
            raise
        if not stream:
            reply: dict[str, Any] = await call  # type: ignore[assignment]
        else:
            async def sse_ahead() -> AsyncIterator[str]:
                while (chunk := await queue.get()) is not None:
                    yield f"data: {json.dumps(chunk)}\n\n"
                await call  # the model call's error, if any, ends the body
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse_ahead(), media_type="text/event-stream")
    else:
        await _guardrail(prompt)
        if stream:
            async def sse() -> AsyncIterator[str]:
                async for chunk in stream_completion(messages, max_tokens):
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        reply = await complete(messages, max_tokens)
    reply = with_prompt_tokens(reply, encoding)
    body_bytes = serialize_orjson(reply) if "serialize" in FIXED else serialize(reply)
    return Response(body_bytes, media_type="application/json")


def create_app(model_url: str | None = None, fixes: frozenset[str] | None = None) -> FastAPI:
    """The gateway app (one per process): trains the tokenizer, configures tracekit.

    Args:
        model_url: the model server (default ``MODEL_URL``, else http://127.0.0.1:8001).
        fixes: the switches on (default ``TRACEKIT_DEMO_FIXES``).
    """
    global FIXED, TOKENIZER, client
    FIXED = fixes_from_env() if fixes is None else fixes
    TOKENIZER = train_tokenizer()
    # The model calls are the client's: each POST a `model` stage with a CLIENT span whose
    # traceparent the model server's llm_request span joins (its queue, prefill, decode).
    client = tracekit_httpx.instrument(httpx.AsyncClient(base_url=model_url or MODEL_URL, timeout=60))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        global _pool
        # Garbage collection is not one of the demo's problems: what start-up built is frozen,
        # as production gateways do, so that full collections do not walk it.
        gc.collect()
        gc.freeze()
        if "guardrail" in FIXED:
            _pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(_pool, policy.warm_up) for _ in range(2)))
        try:
            yield
        finally:
            assert client is not None
            await client.aclose()
            if _pool is not None:
                _pool.shutdown(cancel_futures=True)

    # FastAPI's own tracing off, as tracekit advises when configure() turned it on (its
    # spans cost ~0.5 ms a request: docs/composition.md); tracekit makes the server span.
    app = FastAPI(title="tracekit demo gateway", lifespan=lifespan, telemetry={"tracing": False})
    app.post("/v1/chat/completions")(chat)
    tracekit.configure(service_name="demo-gateway")  # exporter: OTEL_TRACES_EXPORTER, else otlp
    app.add_middleware(tracekit.TracekitMiddleware)
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-url", default=MODEL_URL)
    parser.add_argument("--fix", action="append", choices=FIXES, default=[],
                        help="turn a problem's fix on (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    app = create_app(args.model_url, frozenset(args.fix) | fixes_from_env())
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    # Run the imported module's main, not this copy's (__main__): stage functions are then
    # named tracekit.demo.gateway.*, as when uvicorn imports the app.
    from tracekit.demo.gateway import main as gateway_main

    gateway_main()
