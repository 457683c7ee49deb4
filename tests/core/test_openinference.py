"""OpenInference span kinds and llm.* attributes on tracekit's spans (issue 15, item 4).

Phoenix and other OpenInference-aware tools show a span as an LLM call, a guardrail or a
chain step from ``openinference.span.kind``; without it every span is UNKNOWN.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tracekit
from tracekit import semconv as sc
from tracekit._core import current

from ..conftest import by_name
from .asgi import call, http_scope


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


@tracekit.stage("guardrail")
def guardrail(tokens: list[int]) -> bool:
    return bool(tokens)


@tracekit.stage("serialize")
def serialize(text: str) -> bytes:
    return text.encode()


@tracekit.stage("model")
async def model(tokens: list[int]) -> str:
    # What a model-client integration records on the model stage (gen_ai.*, semconv 1.37).
    led = current.get_ledger()
    assert led is not None
    led.set_attribute(sc.GEN_AI_PROVIDER_NAME, "openai")
    led.set_attribute(sc.GEN_AI_REQUEST_MODEL, "tiny")
    led.set_attribute(sc.GEN_AI_RESPONSE_MODEL, "tiny-2026-12-01")
    led.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, len(tokens))
    led.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 7)
    await asyncio.sleep(0.001)
    return "ok"


@tracekit.stage("lookup")
async def lookup() -> None:
    await asyncio.sleep(0)


async def app(scope: Any, receive: Any, send: Any) -> None:
    tokens = tokenize("hello")
    guardrail(tokens)
    await lookup()
    text = await model(tokens)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": serialize(text)})


def test_every_span_has_its_openinference_kind() -> None:
    with tracekit.record() as rec:
        asyncio.run(call(tracekit.TracekitMiddleware(app), http_scope("/v1/chat", "POST")))
        spans = by_name(rec.spans)
    kinds = {name: span.attributes[sc.OPENINFERENCE_SPAN_KIND] for name, span in spans.items()}
    assert kinds == {"POST": "CHAIN", "tokenize": "CHAIN", "guardrail": "GUARDRAIL",
                     "lookup": "CHAIN", "model": "LLM", "serialize": "CHAIN"}  # fmt: skip


def test_model_stage_repeats_gen_ai_under_llm_names() -> None:
    with tracekit.record() as rec:
        asyncio.run(call(tracekit.TracekitMiddleware(app), http_scope("/v1/chat", "POST")))
        spans = by_name(rec.spans)
    attrs = spans["model"].attributes
    assert attrs[sc.LLM_MODEL_NAME] == "tiny-2026-12-01"  # the response's model wins
    assert attrs[sc.LLM_PROVIDER] == attrs[sc.LLM_SYSTEM] == "openai"
    assert attrs[sc.LLM_TOKEN_COUNT_PROMPT] == 5
    assert attrs[sc.LLM_TOKEN_COUNT_COMPLETION] == 7
    assert attrs[sc.LLM_TOKEN_COUNT_TOTAL] == 12
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 5  # the GenAI names stay
    # Only model stages get llm.* names: a stage without gen_ai.* values gets none.
    assert not any(key.startswith("llm.") for key in spans["tokenize"].attributes)
