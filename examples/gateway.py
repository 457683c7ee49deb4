"""An LLM gateway as people write them, instrumented with tracekit.

FastAPI app: ``POST /v1/chat/completions`` tokenizes the prompt (a real Hugging Face
``tokenizers`` BPE, trained locally at start-up: nothing is downloaded), runs an input
guardrail (pure-Python regexes), calls the model server (OpenAI-compatible, streaming or
not) with httpx, and serializes the reply. It has the classic defects on purpose: the
tokenizer and the guardrail run on the event loop, and the guardrail runs before the model
call instead of beside it. tracekit finds both.

Run (with examples/model_server.py on port 8001):
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 \\
    uvicorn examples.gateway:app --port 8000       # traces to Jaeger / any OTLP backend
or  OTEL_TRACES_EXPORTER=jsonl:traces.jsonl uvicorn examples.gateway:app --port 8000
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import tracekit

MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:8001")
GUARDRAIL_ROUNDS = int(os.environ.get("GUARDRAIL_ROUNDS", "120"))


def train_tokenizer() -> Tokenizer:
    """A small BPE tokenizer trained on a generated corpus (real library, no hub)."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ("gateway latency token model stream request batch queue guardrail serialize "
             "prompt answer event loop thread python asyncio vllm cuda kernel").split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(2000)]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"]))
    return tokenizer


TOKENIZER = train_tokenizer()
BLOCKLIST = [re.compile(rf"\b{w}\w*\b", re.IGNORECASE) for w in
             ("password", "credit", "exploit", "malware", "ssn", "secret", "bomb", "hack")]  # fmt: skip

app = FastAPI(title="example gateway")
client = httpx.AsyncClient(base_url=MODEL_URL, timeout=30)


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    return TOKENIZER.encode(text).ids  # holds the GIL, on the event loop: a finding


@tracekit.stage("guardrail")
def input_guardrail(text: str) -> bool:
    hits = 0
    for _ in range(GUARDRAIL_ROUNDS):  # a pure-Python policy check, as many are
        hits += sum(len(p.findall(text)) for p in BLOCKLIST)
    return hits == 0


@tracekit.stage("model")
async def complete(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    response = await client.post("/v1/chat/completions",
                                 json={"messages": messages, "max_tokens": max_tokens})  # fmt: skip
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


@tracekit.stage("model")
async def stream_completion(messages: list[dict[str, str]], max_tokens: int):  # type: ignore[no-untyped-def]
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


@tracekit.stage("serialize")
def serialize(reply: dict[str, Any], tokens: int) -> bytes:
    reply["usage"]["prompt_tokens"] = tokens
    return json.dumps(reply).encode()


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    body = await request.json()
    messages = body.get("messages") or []
    prompt = " ".join(m.get("content", "") for m in messages)
    tokens = tokenize(prompt)
    if not input_guardrail(prompt):
        raise HTTPException(400, "prompt rejected by the input guardrail")
    max_tokens = int(body.get("max_tokens", 16))
    if body.get("stream"):
        async def sse():  # type: ignore[no-untyped-def]
            async for chunk in stream_completion(messages, max_tokens):
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")
    reply = await complete(messages, max_tokens)
    return Response(serialize(reply, len(tokens)), media_type="application/json")


tracekit.configure(service_name="example-gateway")  # exporter from OTEL_TRACES_EXPORTER, else otlp
app.add_middleware(tracekit.TracekitMiddleware)
