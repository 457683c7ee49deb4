"""What tracekit.integrations.tokenizers adds to a tokenizer call, and what the OpenInference
attributes add to span building.

Tokenizer: a small BPE trained here (no download); ``encode`` of a 12-word prompt (the
cheapest call a gateway makes, so the worst case as a share) and ``encode_batch`` of 8 of them.
Bare and instrumented calls run in alternating blocks of ``--calls`` calls, ``--blocks`` blocks
each, and the fastest block of each is kept (load on a shared machine only ever adds time, and
alternating puts both under the same load):

- with no tracekit runtime (nothing is recorded: the wrapper only calls the method);
- inside one traced request (``tracekit.record()``, the middleware): each instrumented call is
  a ``tokenize`` stage; this is the request path's share, the span is built later on the
  span-building thread (its cost per stage: docs/performance.md).

``TOKENIZERS_PARALLELISM=false`` unless set (the pool's threads would add their own noise).

OpenInference: the cost of a model stage's ``gen_ai.*`` values repeated as ``llm.*``
(:func:`tracekit._export.span_attributes.openinference_llm`), on the span-building thread.

Run: PYTHONPATH=. python bench/tokenizers_overhead.py [--calls 200] [--blocks 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import random
import time
import timeit
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import tracekit
from tracekit import semconv
from tracekit._export.span_attributes import openinference_llm
from tracekit.integrations.tokenizers import instrument


def _tokenizer() -> tuple[Tokenizer, Callable[[int], str]]:
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]  # fmt: skip

    def text(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.train_from_iterator([text(200) for _ in range(200)], trainer)
    return tokenizer, text


def _fastest_blocks(calls: dict[str, Callable[[], Any]], per_block: int, blocks: int) -> dict[str, float]:
    """µs per call of each variant: its fastest block, the variants' blocks alternating."""
    best = dict.fromkeys(calls, float("inf"))
    clock = time.perf_counter
    for _ in range(blocks):
        for name, fn in calls.items():
            t0 = clock()
            for _ in range(per_block):
                fn()
            best[name] = min(best[name], (clock() - t0) / per_block * 1e6)
    return best


def _in_a_request(calls: dict[str, Callable[[], Any]], per_block: int, blocks: int) -> dict[str, float]:
    """:func:`_fastest_blocks` run inside one traced request."""
    out: dict[str, float] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        out.update(_fastest_blocks(calls, per_block, blocks))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat", "raw_path": b"/v1/chat", "root_path": "",
             "query_string": b"", "headers": []}  # fmt: skip
    with tracekit.record():
        asyncio.run(tracekit.TracekitMiddleware(app)(scope, receive, send))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bare, text = _tokenizer()
    traced: Tokenizer = instrument(pickle.loads(pickle.dumps(bare)))
    prompt = text(12)
    batch = [text(12) for _ in range(8)]
    for name, bare_call, traced_call in (
        ("encode", lambda: bare.encode(prompt), lambda: traced.encode(prompt)),
        ("encode_batch", lambda: bare.encode_batch(batch), lambda: traced.encode_batch(batch)),
    ):
        calls = {"bare": bare_call, "instrumented": traced_call}
        alone = _fastest_blocks(calls, args.calls, args.blocks)
        inside = _in_a_request(calls, args.calls, args.blocks)
        print(f"{name:13s} no runtime: bare {alone['bare']:6.2f} us, instrumented "
              f"{alone['instrumented']:6.2f} us (+{alone['instrumented'] - alone['bare']:.2f}) | "
              f"in a traced request: bare {inside['bare']:6.2f} us, as a stage "
              f"{inside['instrumented']:6.2f} us (+{inside['instrumented'] - inside['bare']:.2f})")
    attrs = {semconv.GEN_AI_PROVIDER_NAME: "openai", semconv.GEN_AI_REQUEST_MODEL: "m",
             semconv.GEN_AI_RESPONSE_MODEL: "m-1", semconv.GEN_AI_USAGE_INPUT_TOKENS: 120,
             semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 40}  # fmt: skip
    n = 100_000
    mirror = min(timeit.repeat(lambda: openinference_llm(dict(attrs)), number=n, repeat=5))
    copy = min(timeit.repeat(lambda: dict(attrs), number=n, repeat=5))
    print(f"openinference llm.* attributes of a model span: {(mirror - copy) / n * 1e6:.2f} us "
          "(span-building thread)")


if __name__ == "__main__":
    main()
