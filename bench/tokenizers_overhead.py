"""What tracekit.integrations.tokenizers adds to a tokenizer call, and what the OpenInference
attributes add to span building.

Tokenizer: a small BPE trained here (no download); ``encode`` of a 12-word prompt (the
cheapest call a gateway makes, so the worst case as a share) and ``encode_batch`` of 8 of them,
each timed bare and instrumented

- inside a traced request (``tracekit.record()`` around a request driven by the middleware:
  each call is a ``tokenize`` stage, span built and recorded), per call = (the request with N
  calls - the request with none) / N;
- with no tracekit runtime (nothing recorded: the wrapper only calls the method).

``TOKENIZERS_PARALLELISM=false`` unless set. Best of ``--rounds`` rounds of ``--calls`` calls
(noise on a shared machine only adds time).

OpenInference: the cost of building a model stage's attributes with the ``gen_ai.*`` values
repeated as ``llm.*`` (:func:`tracekit._export.span_attributes.openinference_llm`), on the
span-building thread, not the request path.

Run: PYTHONPATH=. python bench/tokenizers_overhead.py [--calls 2000] [--rounds 5]
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


def _request_us(call: Callable[[], Any], calls: int) -> float:
    """Wall µs of one traced request that makes ``calls`` calls (recorded, span built)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for _ in range(calls):
            call()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def one() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            pass

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat", "raw_path": b"/v1/chat",
                 "root_path": "", "query_string": b"", "headers": []}  # fmt: skip
        await tracekit.TracekitMiddleware(app)(scope, receive, send)

    with tracekit.record() as rec:
        t0 = time.perf_counter()
        asyncio.run(one())
        elapsed = time.perf_counter() - t0
        rec.spans  # noqa: B018 (the spans are built before the recording ends)
    return elapsed * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # One thread per call: the pool's threads would add their own noise to a µs figure.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bare, text = _tokenizer()
    traced: Tokenizer = instrument(pickle.loads(pickle.dumps(bare)))
    prompt = text(12)
    batch = [text(12) for _ in range(8)]
    for name, bare_call, traced_call in (
        ("encode", lambda: bare.encode(prompt), lambda: traced.encode(prompt)),
        ("encode_batch", lambda: bare.encode_batch(batch), lambda: traced.encode_batch(batch)),
    ):
        n = args.calls
        alone = min(timeit.repeat(bare_call, number=n, repeat=args.rounds)) / n * 1e6
        unrecorded = min(timeit.repeat(traced_call, number=n, repeat=args.rounds)) / n * 1e6
        rounds = []
        for _ in range(args.rounds):
            empty = _request_us(lambda: None, n)
            with_bare = _request_us(bare_call, n)
            with_traced = _request_us(traced_call, n)
            rounds.append(((with_traced - empty) / n, (with_bare - empty) / n))
        traced_us, bare_us = min(r[0] for r in rounds), min(r[1] for r in rounds)
        print(f"{name:13s} bare {alone:7.2f} us/call | no runtime: instrumented {unrecorded:7.2f} us "
              f"(+{unrecorded - alone:.2f}) | in a traced request: bare {bare_us:7.2f} us, "
              f"as a stage {traced_us:7.2f} us (+{traced_us - bare_us:.2f} per call, span included)")
    attrs = {semconv.GEN_AI_PROVIDER_NAME: "openai", semconv.GEN_AI_REQUEST_MODEL: "m",
             semconv.GEN_AI_RESPONSE_MODEL: "m-1", semconv.GEN_AI_USAGE_INPUT_TOKENS: 120,
             semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 40}  # fmt: skip
    n = 100_000
    mirror = min(timeit.repeat(lambda: openinference_llm(dict(attrs)), number=n, repeat=args.rounds))
    copy = min(timeit.repeat(lambda: dict(attrs), number=n, repeat=args.rounds))
    print(f"openinference llm.* attributes of a model span: {(mirror - copy) / n * 1e6:.2f} us "
          "(span-building thread)")


if __name__ == "__main__":
    main()
