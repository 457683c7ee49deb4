"""A simulated OpenAI-compatible model server (what vLLM would be), for the examples and tests.

``POST /v1/chat/completions`` with ``{"messages": [...], "max_tokens": N, "stream": bool}``:
a request waits for a slot among ``--max-num-seqs`` running sequences (FIFO, like vLLM's
scheduler queue), then "prefills" for ``--prefill-ms`` and "decodes" one token per step of
the engine, which steps every running sequence at once. A step takes
``--decode-ms * (1 + --batch-cost * (running - 1))``, ``running`` being the sequences holding
a slot at that step: continuous batching, where each sequence added to the
batch makes every step a little slower (``--batch-cost 0``, the default, keeps a step at
``--decode-ms`` whatever the batch, as this server always did). ``--serial`` is
``--max-num-seqs 1``: one request at a time, a server without continuous batching. The
default, 256, is vLLM's.

A non-streamed reply carries the server's own service time, from the whole request received,
in the ``x-model-ms`` header (a measure of the model wait independent of the gateway's
tracing), and the moment it was done in ``x-model-done-ns`` (``perf_counter_ns``); a
streamed reply, the moment its headers were sent in ``x-sent-ns``, and, when the request has
the header ``x-stamp-chunks: 1``, each of its chunks the moment it was sent in ``x_sent_ns``
(``bench/loop_wait_truth.py``).

With ``--otlp-traces-endpoint URL`` (vLLM's flag), each request ends with a SERVER span
``llm_request`` exported over OTLP, in the trace of the caller's ``traceparent`` header,
carrying vLLM's attributes (``tracekit.semconv``: ``VLLM_*``, in seconds as vLLM writes
them): time in queue, time to first token, end-to-end, prefill, decode, inference, token
counts, the request id. The definitions are vLLM's: prefill is from leaving the queue to the
first token, decode from the first token to the last. The protocol is
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (``http/protobuf``, the default here, or ``grpc``,
vLLM's default, which needs ``tracekit[grpc]``); the URL is given to the exporter as is
(``http://host:4318/v1/traces`` for OTLP/HTTP).

With ``--traces-file PATH`` the same spans are appended to ``PATH`` as OTLP JSON Lines
(tracekit's ``jsonl`` exporter), which may be the gateway's own trace file: ``tracekit
analyze`` then joins each ``llm_request`` to the call it answered, with no collector running.

Run: python -m tracekit.demo.model_server --port 8001 [--serial | --max-num-seqs N]
     [--batch-cost 0.1] [--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces]
     [--traces-file traces.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route
except ImportError as error:  # a plain install: one line naming the extra, not a bare traceback
    raise ImportError("the simulated model server needs pip install 'tracekit[fastapi]'") from error

from tracekit import semconv

WORDS = "the model answers with plain words so the demo has something to stream".split()
#: vLLM's default --max-num-seqs.
DEFAULT_MAX_NUM_SEQS = 256


class Engine:
    """The scheduler: at most ``max_num_seqs`` sequences run; the others wait, first come
    first served. ``running`` sets the decode step's time (see the module docstring)."""

    def __init__(self, prefill_ms: float, decode_ms: float, max_num_seqs: int, batch_cost: float) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, not {max_num_seqs}")
        if batch_cost < 0:
            raise ValueError(f"batch_cost must be >= 0, not {batch_cost}")
        self.prefill_s = prefill_ms / 1000
        self.decode_s = decode_ms / 1000
        self.max_num_seqs = max_num_seqs
        self.batch_cost = batch_cost
        self.running = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self._step: asyncio.Future[None] | None = None  # the decode step under way
        self._due = -1.0  # when the last step was due to end (the loop's clock)

    async def admit(self) -> None:
        """Wait for a slot (FIFO)."""
        if self.running < self.max_num_seqs and not self.waiting:
            self.running += 1
            return
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():  # granted as the caller went away
                self.release()
            raise

    def release(self) -> None:
        """Free a slot and hand it to the next waiting request."""
        self.running -= 1
        while self.waiting and self.running < self.max_num_seqs:
            slot = self.waiting.popleft()
            if not slot.done():
                self.running += 1
                slot.set_result(None)

    def step_s(self) -> float:
        """One decode step's time at the current batch size."""
        return self.decode_s * (1 + self.batch_cost * (self.running - 1))

    async def step(self) -> None:
        """Wait for the end of a decode step, which yields one token to every sequence
        waiting on it: one timer for the whole batch, as an engine steps its batch. A step
        that follows the last one back to back is due one step after the last was due, not
        after the timer fired: timers fire early or late (uvloop's are whole milliseconds:
        2.2 ms steps alone and 2.8 ms among two or three at --decode-ms 2.5 --batch-cost
        0.05, measured, where 2.5 and 2.6-2.75 were asked), and this keeps their mean."""
        if self._step is None:
            loop = asyncio.get_running_loop()
            length = self.step_s()
            now = loop.time()
            self._due = (self._due if now - self._due < length else now) + length
            step = self._step = loop.create_future()
            loop.call_at(self._due, self._end_step, step)
        await asyncio.shield(self._step)  # a caller going away does not cancel the others' step

    def _end_step(self, step: asyncio.Future[None]) -> None:
        self._step = None
        step.set_result(None)


@dataclass
class Timeline:
    """One request's times on the server (``perf_counter`` seconds, ``arrival_ns`` epoch),
    the fields vLLM's ``RequestStateStats`` keeps."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_ns: int = field(default_factory=time.time_ns)
    arrival: float = field(default_factory=time.perf_counter)
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0

    def attributes(self, now: float) -> dict[str, Any]:
        """vLLM's ``llm_request`` attributes (seconds), as its output processor sets them."""
        scheduled = self.scheduled if self.scheduled is not None else now
        first = self.first_token if self.first_token is not None else now
        last = self.last_token if self.last_token is not None else first
        return {
            semconv.VLLM_REQUEST_ID: self.request_id,
            semconv.GEN_AI_REQUEST_MAX_TOKENS: self.max_tokens,
            semconv.VLLM_USAGE_PROMPT_TOKENS: self.prompt_tokens,
            semconv.VLLM_USAGE_COMPLETION_TOKENS: self.tokens,
            semconv.VLLM_LATENCY_TIME_IN_QUEUE: scheduled - self.arrival,
            semconv.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: first - self.arrival,
            semconv.VLLM_LATENCY_E2E: now - self.arrival,
            semconv.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: first - scheduled,
            semconv.VLLM_LATENCY_TIME_IN_MODEL_DECODE: last - first,
            semconv.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: last - scheduled,
        }


class Tracing:
    """The ``llm_request`` spans: an SDK tracer provider of its own, exporting over OTLP to
    ``endpoint`` and/or appending OTLP JSON Lines to ``file`` (tracekit's ``jsonl`` exporter:
    the gateway's own file can be given, both processes append whole lines to it)."""

    def __init__(self, endpoint: str | None = None, file: str | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        service = os.environ.get("OTEL_SERVICE_NAME") or "model-server"
        self.provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: service}))
        if endpoint is not None:
            self.provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
        if file is not None:
            from tracekit.exporters.jsonl import JsonLinesSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(file)))
        self.tracer = self.provider.get_tracer("tracekit.demo.model_server")
        self.propagator = TraceContextTextMapPropagator()
        self.kind = SpanKind.SERVER

    def record(self, timeline: Timeline, headers: Mapping[str, str], now: float) -> None:
        """End a request: its span, parented by the caller's ``traceparent`` when there is one."""
        carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
        context = self.propagator.extract(carrier)
        end_ns = timeline.arrival_ns + int((now - timeline.arrival) * 1e9)
        span = self.tracer.start_span(semconv.VLLM_REQUEST_SPAN, context, self.kind,
                                      timeline.attributes(now), start_time=timeline.arrival_ns)  # fmt: skip
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is left."""
        self.provider.shutdown()


def _exporter(endpoint: str) -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc import trace_exporter
        except ImportError as error:
            raise ImportError("OTLP over gRPC needs pip install 'tracekit[grpc]'") from error
        return trace_exporter.OTLPSpanExporter(endpoint=endpoint)
    raise ValueError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r}: use http/protobuf or grpc")


def _prompt_tokens(messages: Any) -> int:
    # A stand-in for tokenization: the prompt's words.
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def make_app(prefill_ms: float = 20.0, decode_ms: float = 5.0, serial: bool = False,
             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, batch_cost: float = 0.0,
             tracing: Tracing | None = None) -> Starlette:  # fmt: skip
    """The server's app.

    Args:
        prefill_ms: time from leaving the queue to the first decode step.
        decode_ms: one decode step's time with one sequence running.
        serial: one request at a time (``max_num_seqs=1``).
        max_num_seqs: sequences run together; further requests wait in a FIFO queue.
        batch_cost: the share of ``decode_ms`` each further running sequence adds to a step.
        tracing: where the ``llm_request`` spans go, or ``None`` for none.
    """
    engine = Engine(prefill_ms, decode_ms, 1 if serial else max_num_seqs, batch_cost)
    ids = itertools.count(1)

    async def generate(timeline: Timeline) -> AsyncIterator[str]:
        # Holds a slot from the queue to the last token (or until the caller goes away).
        # The request reaches the engine now (vLLM's arrival_time): for a stream, after the
        # response has started, so the time before (the first stream's lazy imports, 45 ms
        # measured) is not read as time in the engine's queue.
        timeline.arrival_ns, timeline.arrival = time.time_ns(), time.perf_counter()
        await engine.admit()
        try:
            timeline.scheduled = time.perf_counter()
            await asyncio.sleep(engine.prefill_s)
            for i in range(timeline.max_tokens):
                await engine.step()
                timeline.last_token = time.perf_counter()
                if timeline.first_token is None:
                    timeline.first_token = timeline.last_token
                timeline.tokens += 1
                yield WORDS[i % len(WORDS)]
        finally:
            engine.release()

    def usage(timeline: Timeline) -> dict[str, int]:
        return {"prompt_tokens": timeline.prompt_tokens, "completion_tokens": timeline.tokens,
                "total_tokens": timeline.prompt_tokens + timeline.tokens}  # fmt: skip

    def finish(timeline: Timeline, request: Request) -> None:
        if tracing is not None:
            tracing.record(timeline, request.headers, time.perf_counter())

    async def completions(request: Request) -> Any:
        body = await request.json()
        # From the whole request received: not the wait for a body a busy caller sends late.
        began = time.perf_counter()
        timeline = Timeline(f"cmpl-{next(ids)}", _prompt_tokens(body.get("messages")),
                            int(body.get("max_tokens", 16)))  # fmt: skip
        created = int(time.time())
        if not body.get("stream"):
            words = [w async for w in generate(timeline)]
            finish(timeline, request)
            return JSONResponse({
                "id": timeline.request_id, "object": "chat.completion", "created": created, "model": "sim-1",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                             "finish_reason": "length"}],
                "usage": usage(timeline),
            }, headers={"x-model-ms": f"{(time.perf_counter() - began) * 1000:.3f}",
                "x-model-done-ns": str(time.perf_counter_ns())})  # fmt: skip

        stamped = request.headers.get("x-stamp-chunks") == "1"

        async def events() -> AsyncIterator[str]:
            async for word in generate(timeline):
                chunk: dict[str, Any] = {
                    "id": timeline.request_id, "object": "chat.completion.chunk", "model": "sim-1",
                    "choices": [{"index": 0, "delta": {"content": word + " "}}]}  # fmt: skip
                if stamped:  # as x-model-done-ns, per chunk
                    chunk["x_sent_ns"] = time.perf_counter_ns()
                yield f"data: {json.dumps(chunk)}\n\n"
            finish(timeline, request)
            if (body.get("stream_options") or {}).get("include_usage"):  # as OpenAI and vLLM do
                last = {"id": timeline.request_id, "object": "chat.completion.chunk", "model": "sim-1",
                        "choices": [], "usage": usage(timeline)}  # fmt: skip
                yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-sent-ns": str(time.perf_counter_ns())})  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # Here, not after uvicorn.run: on SIGTERM uvicorn shuts down, then raises the signal
        # again with its default action, which ends the process before any ``finally``.
        if tracing is not None:
            tracing.shutdown()

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])], lifespan=lifespan)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``--serial`` sets ``max_num_seqs`` to 1)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--prefill-ms", type=float, default=20.0)
    parser.add_argument("--decode-ms", type=float, default=5.0, help="a decode step with one sequence")
    parser.add_argument("--serial", action="store_true", help="one request at a time (--max-num-seqs 1)")
    parser.add_argument("--max-num-seqs", type=_positive, default=DEFAULT_MAX_NUM_SEQS,
                        help="sequences decoded together; more requests wait in a queue (vLLM's flag)")
    parser.add_argument("--batch-cost", type=_non_negative, default=0.0,
                        help="each further running sequence adds this share of --decode-ms to a step")
    parser.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                        help="export an llm_request span per request over OTLP (vLLM's flag)")  # fmt: skip
    parser.add_argument("--traces-file", default=None, metavar="PATH",
                        help="append the llm_request spans to PATH as OTLP JSON Lines "
                             "(the gateway's OTEL_TRACES_EXPORTER=jsonl:PATH file may be given)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.serial:
        args.max_num_seqs = 1
    return args


def _number(cast: Callable[[str], Any], low: float, what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


_positive = _number(int, 1, "an integer >= 1")
_non_negative = _number(float, 0.0, "a number >= 0")


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    args = parse_args(argv)
    try:
        tracing = (
            Tracing(args.otlp_traces_endpoint, args.traces_file)
            if args.otlp_traces_endpoint or args.traces_file
            else None
        )
    except (ValueError, ImportError) as error:  # a bad protocol, a missing exporter: one line
        raise SystemExit(f"model_server: error: {error}") from None
    app = make_app(args.prefill_ms, args.decode_ms, max_num_seqs=args.max_num_seqs,
                   batch_cost=args.batch_cost, tracing=tracing)  # fmt: skip
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
