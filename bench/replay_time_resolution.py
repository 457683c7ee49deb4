"""How the replay's validation moves when span times lose their nanoseconds.

Trace backends keep microseconds (Jaeger; Phoenix, docs/integrations.md), so a report read back
from one can differ from the in-memory recording's. This records 32 requests (4 at a time, a
12 ms CPU-bound tokenize stage on the loop, a 10 ms model wait), then analyses the same spans
twice with ``--cores 2``: as recorded, and with every ``start_ns`` / ``end_ns`` floored to the
microsecond, and prints the replay's validation (p50 and p95 errors) of each.

Run: PYTHONPATH=. python bench/replay_time_resolution.py
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

import tracekit
from tracekit import semconv
from tracekit.analysis.readers.common import ReadStats
from tracekit.analysis.readers.memory import memory_spans


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    end = time.thread_time() + 0.012
    while time.thread_time() < end:
        pass
    return [ord(c) for c in text]


@tracekit.stage("model")
async def model(tokens: list[int]) -> str:
    await asyncio.sleep(0.01)
    return "ok"


async def app(scope: Any, receive: Any, send: Any) -> None:
    await model(tokenize("hello"))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def load() -> None:
    gateway = tracekit.TracekitMiddleware(app)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat", "raw_path": b"/v1/chat", "root_path": "",
             "query_string": b"", "headers": []}  # fmt: skip
    for _ in range(8):
        await asyncio.gather(*(gateway(dict(scope), receive, send) for _ in range(4)))


def main() -> None:
    with tracekit.record() as rec:
        asyncio.run(load())
        spans = [s for s in memory_spans(rec.spans, ReadStats()) if s.name != semconv.LOOP_SPAN]
    floored = [msgspec.structs.replace(s, start_ns=s.start_ns // 1000 * 1000,
                                       end_ns=s.end_ns // 1000 * 1000) for s in spans]  # fmt: skip
    for label, run in (("ns (as recorded)", spans), ("us (floored)", floored)):
        v = tracekit.analyze(run, cores=2).to_dict()["validation"]
        print(f"{label:17s} validation ok={v['ok']} p50 error {v['p50_error']:+.1%} "
              f"p95 error {v['p95_error']:+.1%}")


if __name__ == "__main__":
    main()
