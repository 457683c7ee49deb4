"""Measures the constants the rules' fixes use (:mod:`tracekit.analysis.rules.fixes`).

Reproduce (the figures and how they were taken are in ``docs/analyzer-rules.md``, "Measured
constants")::

    python -m tracekit.analysis.rules.calibration            # both measurements
    python -m tracekit.analysis.rules.calibration tokenizers

- ``ORJSON_SPEEDUP``: ``json.dumps(payload).encode()`` time / ``orjson.dumps(payload)`` time
  on :func:`chat_completion_payload`, an OpenAI-style ``chat.completion`` response of
  ~2.6 kB (a 400-word answer with non-ASCII text, usage, ids).
- ``TOKENIZERS_GIL``: the speed a pure-Python thread keeps (vs. running alone) while another
  thread tokenizes with HF ``tokenizers``: little beside ``Tokenizer.encode`` (it holds the
  GIL), nearly all beside ``encode_batch`` (it releases it). Measured with
  ``TOKENIZERS_PARALLELISM=false`` so that the batch encoder's own threads do not compete for
  the CPUs: the figure isolates the GIL.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from tracekit._percentile import percentile
from tracekit.analysis.rules.fixes import ORJSON_SPEEDUP, TOKENIZERS_GIL

# Mostly ASCII, like an English answer, with a few non-ASCII words (json escapes them).
_WORDS = (
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "be",
    "this",
    "are",
    "by",
    "an",
    "from",
    "or",
    "at",
    "model",
    "returns",
    "answer",
    "code",
    "list",
    "table",
    "value",
    "request",
    "latency",
    "throughput",
    "batch",
    "prefill",
    "decode",
    "cache",
    "token",
    "server",
    "client",
    "gpu",
    "memory",
    "queue",
    "stream",
    "chunk",
    "response",
    "user",
    "system",
    "function",
    "result",
    "error",
    "data",
    "time",
    "python",
    "async",
    "await",
    "loop",
    "thread",
    "process",
    "naïve",
    "café",
)


def chat_completion_payload(words: int = 400, seed: int = 1) -> dict[str, Any]:
    """A realistic OpenAI-style ``chat.completion`` response body (deterministic).

    Args:
        words: length of the assistant's answer.
        seed: seed of the word choice.

    Returns:
        The response as a dict.
    """
    rng = random.Random(seed)
    content = " ".join(rng.choice(_WORDS) for _ in range(words))
    return {
        "id": "chatcmpl-9x8Yz3kQ2mN7vB1c",
        "object": "chat.completion",
        "created": 1733140000,
        "model": "llama-3.1-8b-instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 812, "completion_tokens": 431, "total_tokens": 1243},
        "system_fingerprint": "fp_44709d6fcb",
    }


def _best_us(fn: Any, number: int, repeat: int) -> float:
    # The thread's CPU time: other jobs on a shared host take turns, not CPU, from it.
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(number):
            fn()
        best = min(best, (time.thread_time() - t0) / number)
    return best * 1e6


def measure_serializer(number: int = 2000, repeat: int = 5) -> dict[str, float]:
    """CPU time of json vs orjson on :func:`chat_completion_payload` (best of ``repeat``).

    Returns:
        ``{"bytes", "json_us", "orjson_us", "speedup"}``.
    """
    import orjson

    payload = chat_completion_payload()
    json_us = _best_us(lambda: json.dumps(payload).encode(), number, repeat)
    orjson_us = _best_us(lambda: orjson.dumps(payload), number, repeat)
    return {
        "bytes": float(len(orjson.dumps(payload))),
        "json_us": json_us,
        "orjson_us": orjson_us,
        "speedup": json_us / orjson_us,
    }


def measure_tokenizers_gil(repeat: int = 5) -> dict[str, float]:
    """How far a pure-Python thread gets *during* one tokenizer call in another thread.

    Trains a small BPE tokenizer in memory (no download); a background thread counts in a
    pure-Python loop; the main thread reads the count before and after one call of
    ``encode(text)`` / ``encode_batch([text])`` on a 100,000-word document. A call that holds
    the GIL leaves the counter (almost) still; one that releases it lets it run at its solo
    rate. Other load on the machine slows both cases alike, so the contrast survives it. The
    document is long so that the counter's turns with the GIL right before and after the call
    (up to one switch interval, 5 ms, each) stay a small part of the reading. The batch
    encoder runs with ``TOKENIZERS_PARALLELISM=false`` (for one text it has nothing to
    spread, but its idle pool threads would compete for the CPUs): the figure isolates the GIL.

    Returns:
        ``{"encode": fraction, "encode_batch": fraction}``: the counter's rate during the
        call over its rate during a sleep of the same length (median of ``repeat``).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]  # fmt: skip

    def text(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator([text(200) for _ in range(300)], trainer)
    doc = text(100_000)
    count = [0]
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            for _ in range(100):
                count[0] += 1

    def rate(call: Any) -> float:
        time.sleep(0.02)  # let the counter get going
        c0, t0 = count[0], time.perf_counter()
        call()
        return (count[0] - c0) / (time.perf_counter() - t0)

    thread = threading.Thread(target=counter, daemon=True)
    parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by tokenizers at each call
    thread.start()
    try:
        out: dict[str, list[float]] = {"encode": [], "encode_batch": []}
        for _ in range(repeat):
            t0 = time.perf_counter()
            encode_rate = rate(lambda: tokenizer.encode(doc))
            length = time.perf_counter() - t0
            batch_rate = rate(lambda: tokenizer.encode_batch([doc]))
            solo = rate(lambda length=length: time.sleep(length))
            out["encode"].append(encode_rate / solo)
            out["encode_batch"].append(batch_rate / solo)
    finally:
        stop.set()
        thread.join()
        if parallelism is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = parallelism
    return {key: percentile(values, 0.5) for key, values in out.items()}


def main(argv: list[str]) -> int:
    """Print the measurements (``serializer``, ``tokenizers`` or both)."""
    which = set(argv) or {"serializer", "tokenizers"}
    if "serializer" in which:
        m = measure_serializer()
        print(
            f"chat.completion payload {m['bytes']:.0f} B: json {m['json_us']:.2f} us, "
            f"orjson {m['orjson_us']:.2f} us, orjson {m['speedup']:.1f}x faster "
            f"(constant in use: {ORJSON_SPEEDUP})"
        )
    if "tokenizers" in which:
        g = measure_tokenizers_gil()
        print(
            f"a pure-Python thread keeps {g['encode']:.0%} of its speed beside Tokenizer.encode, "
            f"{g['encode_batch']:.0%} beside encode_batch (constants in use: {TOKENIZERS_GIL})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
