"""Generate tracekit-shaped traces as OTLP JSON Lines, from a simulated gateway under load.

The gateway is simulated, not sampled from a table: requests arrive as a Poisson process and
run through one event loop (a FIFO single server). Each request runs its handler, then four
stages -- ``tokenize`` (CPU on the loop), ``guardrail`` (an I/O call), ``model`` (waits for the
model server, then streams chunks, each sent by a short step on the loop) and ``serialize``
(CPU on the loop) -- so a long tokenize of one request delays the chunks of every other
request, exactly the effect tracekit measures. Every step that becomes ready while the loop
is busy waits for it; that wait is the step's ``loop_wait``. The spans carry the attributes
tracekit's middleware and stages write (``tracekit.semconv``), including loop slices and
loop waits of 1 ms or more, and are written in end order in batches of up to 512 spans, one
``TracesData`` per line, as the core's ``jsonl`` exporter does.

Usage::

    python bench/gen_traces.py --spans 1000000 -o /tmp/traces.jsonl [--rate 40] [--seed 1]

The builders :func:`attr`, :func:`otlp_span` and :func:`traces_data` are also used by the tests
to write small hand-made traces.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracekit import semconv
from tracekit.exporters.jsonl import otlp_value

BATCH = 512
ROUTE = "/v1/chat/completions"
MODEL = "llama-3.1-8b-instruct"
_OTLP_KIND = {"internal": 1, "server": 2, "client": 3}
_MS = 1_000_000  # ns per ms


# --- OTLP JSON builders ----------------------------------------------------------------------
def attr(key: str, value: Any) -> dict[str, Any]:
    """One OTLP JSON attribute ``{"key", "value": {...Value}}`` for a Python value."""
    return {"key": key, "value": otlp_value(value)}


def otlp_span(
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    name: str,
    kind: str,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any] | None = None,
    *,
    error: bool = False,
) -> dict[str, Any]:
    """One OTLP JSON span (ids as hex, times as decimal strings, kind as its integer)."""
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": _OTLP_KIND[kind],
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [attr(k, v) for k, v in (attributes or {}).items()],
        "status": {"code": 2 if error else 0},
    }
    if parent_id:
        span["parentSpanId"] = parent_id
    return span


def traces_data(spans: list[dict[str, Any]], service: str = "gateway") -> dict[str, Any]:
    """A ``TracesData`` document holding ``spans`` of one service."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attr(semconv.SERVICE_NAME, service)]},
                "scopeSpans": [
                    {"scope": {"name": semconv.SCOPE_NAME, "version": "0.1.0"}, "spans": spans}
                ],
            }
        ]
    }


# --- the simulated gateway -------------------------------------------------------------------
@dataclass
class _Stage:
    name: str
    span_id: str
    start_ns: int = 0
    end_ns: int = 0
    cpu_ns: int = 0
    loop_wait_ns: int = 0
    max_block_ns: int = 0
    slices: list[tuple[int, int]] = field(default_factory=list)
    waits: list[tuple[int, int]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Request:
    trace_id: str
    span_id: str
    start_ns: int
    streamed: bool
    steps: list[tuple[str | None, str, int]]  # (stage or None for the handler, "cpu"|"wait", ns)
    inflight: int
    step: int = 0
    stages: dict[str, _Stage] = field(default_factory=dict)
    own: _Stage | None = None
    chunk_times: list[int] = field(default_factory=list)


class Gateway:
    """A seeded simulation of the gateway (see the module docstring).

    Args:
        rate: mean arrivals per second.
        seed: random seed (the output is a pure function of the arguments).
        tokenize_ms: mean CPU of the tokenize stage (on the loop).
        stream_fraction: share of requests that stream their response.
    """

    def __init__(
        self,
        *,
        rate: float = 40.0,
        seed: int = 1,
        tokenize_ms: float = 6.0,
        stream_fraction: float = 0.9,
    ) -> None:
        self.rate = rate
        self.rng = random.Random(seed)
        self.tokenize_ms = tokenize_ms
        self.stream_fraction = stream_fraction
        self.t0 = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z

    def _id(self, bits: int) -> str:
        return f"{self.rng.getrandbits(bits):0{bits // 4}x}"

    def _ms(self, mean: float, sigma: float = 0.35) -> int:
        # Log-normal with the given mean: service times are skewed, never negative.
        mu = -0.5 * sigma * sigma
        return int(mean * self.rng.lognormvariate(mu, sigma) * _MS)

    def _request(self, start_ns: int, inflight: int) -> _Request:
        streamed = self.rng.random() < self.stream_fraction
        prompt_tokens = int(self.rng.lognormvariate(6.5, 0.6))
        steps: list[tuple[str | None, str, int]] = [(None, "cpu", self._ms(0.3))]
        steps += [("tokenize", "cpu", self._ms(self.tokenize_ms * prompt_tokens / 800))]
        steps += [("guardrail", "cpu", self._ms(0.4)), ("guardrail", "wait", self._ms(25))]
        steps += [("guardrail", "cpu", self._ms(0.2))]
        steps += [("model", "cpu", self._ms(0.3)), ("model", "wait", self._ms(120, 0.5))]
        chunks = self.rng.randint(8, 24) if streamed else 1
        for i in range(chunks):
            if i:
                steps.append(("model", "wait", self._ms(12, 0.3)))
            steps.append(("model", "chunk", self._ms(0.08)))
        steps += [("serialize", "cpu", self._ms(1.5)), (None, "cpu", self._ms(0.1))]
        return _Request(self._id(128), self._id(64), start_ns, streamed, steps, inflight)

    def spans(self, n_spans: int) -> Iterator[dict[str, Any]]:
        """Yield at least ``n_spans`` OTLP JSON spans, in end order."""
        ready: list[tuple[int, int, _Request]] = []  # (ready_ns, seq, request)
        seq = 0
        emitted = 0
        next_arrival = self.t0
        loop_free = self.t0
        active = 0
        while emitted < n_spans or ready:
            if emitted < n_spans and (not ready or next_arrival <= ready[0][0]):
                active += 1
                req = self._request(next_arrival, active - 1)
                heapq.heappush(ready, (next_arrival, seq, req))
                seq += 1
                next_arrival += int(self.rng.expovariate(self.rate) * 1e9)
                continue
            ready_ns, _, req = heapq.heappop(ready)
            now = max(ready_ns, loop_free)
            waited = now - ready_ns
            # The request holds the loop through consecutive CPU steps (no await between
            # them), possibly across stages, until its next wait or its end.
            while True:
                stage_name, what, duration = req.steps[req.step]
                stage = self._stage(req, stage_name, now)
                if waited:
                    stage.loop_wait_ns += waited
                    if waited >= _MS:
                        stage.waits.append((ready_ns, waited))
                    waited = 0
                stage.cpu_ns += duration
                stage.max_block_ns = max(stage.max_block_ns, duration)
                if duration >= _MS:
                    stage.slices.append((now, duration))
                now += duration
                if what == "chunk":
                    req.chunk_times.append(now)
                req.step += 1
                yield from self._finish_stage(req, stage_name, now)
                if req.step == len(req.steps):
                    active -= 1
                    emitted += len(req.stages) + 1
                    yield self._server_span(req, now)
                    break
                if req.steps[req.step][1] == "wait":
                    heapq.heappush(ready, (now + req.steps[req.step][2], seq, req))
                    seq += 1
                    req.step += 1
                    break
            loop_free = now

    def _stage(self, req: _Request, name: str | None, now: int) -> _Stage:
        if name is None:
            if req.own is None:
                req.own = _Stage("request", req.span_id, start_ns=req.start_ns)
            return req.own
        stage = req.stages.get(name)
        if stage is None:
            stage = req.stages[name] = _Stage(name, self._id(64), start_ns=now)
        return stage

    def _finish_stage(self, req: _Request, name: str | None, now: int) -> Iterator[dict[str, Any]]:
        if name is None:
            return
        nxt = req.steps[req.step][0] if req.step < len(req.steps) else None
        if nxt == name:
            return
        stage = req.stages[name]
        stage.end_ns = now
        yield otlp_span(
            req.trace_id,
            stage.span_id,
            req.span_id,
            name,
            "internal",
            stage.start_ns,
            stage.end_ns,
            self._stage_attrs(req, stage),
        )

    def _stage_attrs(self, req: _Request, stage: _Stage) -> dict[str, Any]:
        wall = stage.end_ns - stage.start_ns
        a: dict[str, Any] = {
            semconv.STAGE: stage.name,
            semconv.STAGE_KIND: stage.name,
            semconv.WALL_MS: wall / _MS,
            semconv.CPU_MS: stage.cpu_ns / _MS,
            semconv.WAIT_MS: max(0, wall - stage.cpu_ns - stage.loop_wait_ns) / _MS,
            semconv.LOOP_WAIT_MS: stage.loop_wait_ns / _MS,
            semconv.MAX_BLOCK_MS: stage.max_block_ns / _MS,
            semconv.ON_LOOP: True,
            semconv.CODE_FUNCTION: stage.name,
            semconv.CODE_NAMESPACE: "gateway.app",
        }
        _add_pairs(a, stage, stage.start_ns)
        if stage.name == "model":
            a[semconv.GEN_AI_OPERATION_NAME] = "chat"
            a[semconv.GEN_AI_REQUEST_MODEL] = MODEL
            a[semconv.GEN_AI_REQUEST_STREAM] = req.streamed
            a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = 4 * len(req.chunk_times)
        return a

    def _server_span(self, req: _Request, end_ns: int) -> dict[str, Any]:
        own = req.own if req.own is not None else _Stage("request", req.span_id)
        stages = req.stages.values()
        model = req.stages["model"]
        model_wait = model.end_ns - model.start_ns - model.cpu_ns - model.loop_wait_ns
        guard = req.stages["guardrail"]
        io_wait = guard.end_ns - guard.start_ns - guard.cpu_ns - guard.loop_wait_ns
        cpu = own.cpu_ns + sum(s.cpu_ns for s in stages)
        loop_wait = own.loop_wait_ns + sum(s.loop_wait_ns for s in stages)
        wall = end_ns - req.start_ns
        a: dict[str, Any] = {
            semconv.HTTP_REQUEST_METHOD: "POST",
            semconv.HTTP_ROUTE: ROUTE,
            semconv.URL_PATH: ROUTE,
            semconv.HTTP_RESPONSE_STATUS_CODE: 200,
            semconv.WALL_MS: wall / _MS,
            semconv.CPU_MS: cpu / _MS,
            semconv.LOOP_WAIT_MS: loop_wait / _MS,
            semconv.MODEL_WAIT_MS: model_wait / _MS,
            semconv.IO_WAIT_MS: io_wait / _MS,
            semconv.OVERHEAD_MS: (wall - model_wait) / _MS,
            semconv.MAX_BLOCK_MS: max(s.max_block_ns for s in (own, *stages)) / _MS,
            semconv.ON_LOOP: True,
            semconv.INFLIGHT: req.inflight,
        }
        _add_pairs(a, own, req.start_ns)
        chunks = req.chunk_times
        a[semconv.TTFB_MS] = (chunks[0] - req.start_ns) / _MS
        if req.streamed and len(chunks) > 1:
            gaps = sorted(b - a_ for a_, b in itertools.pairwise(chunks))
            a[semconv.TTFT_MS] = (chunks[0] - req.start_ns) / _MS
            a[semconv.ITL_P50_MS] = gaps[len(gaps) // 2] / _MS
            a[semconv.ITL_P95_MS] = gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] / _MS
            a[semconv.ITL_MAX_MS] = gaps[-1] / _MS
            a[semconv.TPOT_MS] = (chunks[-1] - chunks[0]) / (len(chunks) - 1) / _MS
            a[semconv.CHUNKS] = len(chunks)
        name = f"POST {ROUTE}"
        return otlp_span(req.trace_id, req.span_id, None, name, "server", req.start_ns, end_ns, a)


def _add_pairs(a: dict[str, Any], stage: _Stage, base_ns: int) -> None:
    # The core keeps the 32 longest; offsets and durations in whole microseconds.
    slices = sorted(stage.slices, key=lambda s: -s[1])[:32]
    waits = sorted(stage.waits, key=lambda w: -w[1])[:32]
    if slices:
        a[semconv.LOOP_SLICES_US] = [
            v for s, d in sorted(slices) for v in ((s - base_ns) // 1000, d // 1000)
        ]
    if waits:
        a[semconv.LOOP_WAITS_US] = [
            v for s, d in sorted(waits) for v in ((s - base_ns) // 1000, d // 1000)
        ]


def write_jsonl(path: Path, n_spans: int, *, batch_size: int = BATCH, **gateway: Any) -> int:
    """Write at least ``n_spans`` simulated spans to ``path`` as OTLP JSON Lines.

    Args:
        path: the output file.
        n_spans: how many spans (whole requests are written, so a few more may follow).
        batch_size: spans per line (the core's exporter writes up to 512).
        **gateway: :class:`Gateway` options.

    Returns:
        The number of spans written.
    """
    written = 0
    batch: list[dict[str, Any]] = []
    with path.open("wb") as out:
        for span in Gateway(**gateway).spans(n_spans):
            batch.append(span)
            if len(batch) == batch_size:
                out.write(orjson.dumps(traces_data(batch)) + b"\n")
                written += len(batch)
                batch = []
        if batch:
            out.write(orjson.dumps(traces_data(batch)) + b"\n")
            written += len(batch)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--spans", type=int, default=1_000_000, help="spans to write (default 1,000,000)"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="output .jsonl file")
    parser.add_argument("--rate", type=float, default=40.0, help="arrivals per second (default 40)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--tokenize-ms", type=float, default=6.0, help="mean tokenize CPU on the loop (default 6)"
    )
    args = parser.parse_args(argv)
    n = write_jsonl(
        args.output, args.spans, rate=args.rate, seed=args.seed, tokenize_ms=args.tokenize_ms
    )
    print(f"wrote {n:,} spans to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
