"""A simulated OpenAI-compatible model server (what vLLM would be), for the examples and tests.

``POST /v1/chat/completions`` with ``{"messages": [...], "max_tokens": N, "stream": bool}``:
it "prefills" for ``--prefill-ms``, then "decodes" one token every ``--decode-ms``. A
non-streamed reply carries the server's own service time in the ``x-model-ms`` header (a
measure of the model wait independent of the gateway's tracing). With
``--serial`` it serves one request at a time (a lock: a server without continuous batching);
otherwise requests decode concurrently, as a continuous-batching server does.

Run: python -m tracekit.demo.model_server --port 8001 [--serial]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route
except ImportError as error:  # a plain install: one line naming the extra, not a bare traceback
    raise ImportError("the simulated model server needs pip install 'tracekit[fastapi]'") from error

WORDS = "the model answers with plain words so the demo has something to stream".split()


def make_app(prefill_ms: float = 20.0, decode_ms: float = 5.0, serial: bool = False) -> Starlette:
    lock = asyncio.Lock() if serial else None

    async def generate(n: int) -> AsyncIterator[str]:
        await asyncio.sleep(prefill_ms / 1000)
        for i in range(n):
            await asyncio.sleep(decode_ms / 1000)
            yield WORDS[i % len(WORDS)]

    async def completions(request: Request) -> Any:
        began = time.perf_counter()
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        created = int(time.time())
        if not body.get("stream"):
            if lock is not None:
                async with lock:
                    words = [w async for w in generate(n)]
            else:
                words = [w async for w in generate(n)]
            return JSONResponse({
                "id": "cmpl-sim", "object": "chat.completion", "created": created, "model": "sim-1",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n},
            }, headers={"x-model-ms": f"{(time.perf_counter() - began) * 1000:.3f}",
                "x-model-done-ns": str(time.perf_counter_ns())})  # fmt: skip

        async def events() -> AsyncIterator[str]:
            if lock is not None:
                await lock.acquire()
            try:
                async for word in generate(n):
                    chunk = {"id": "cmpl-sim", "object": "chat.completion.chunk", "model": "sim-1",
                             "choices": [{"index": 0, "delta": {"content": word + " "}}]}  # fmt: skip
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if lock is not None:
                    lock.release()

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--prefill-ms", type=float, default=20.0)
    parser.add_argument("--decode-ms", type=float, default=5.0)
    parser.add_argument("--serial", action="store_true", help="one request at a time (no batching)")
    args = parser.parse_args()
    app = make_app(args.prefill_ms, args.decode_ms, args.serial)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
