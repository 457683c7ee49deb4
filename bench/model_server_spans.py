"""The model server's own spans joined to a gateway's trace, and what the analyzer makes of them.

A small gateway (Starlette + ``TracekitMiddleware``, a ``model`` stage that posts to the model
server with the stage's ``traceparent``) served by uvicorn on 127.0.0.1, the simulated model
server (``tracekit.demo.model_server``, vLLM's ``--otlp-traces-endpoint`` and
``--max-num-seqs``) in a process of its own, both exporting OTLP/HTTP to one collector
stand-in (``tests/demo/otlp_collector.py``), closed-loop load; then ``tracekit analyze`` of
what the collector received. Prints, per server setting: the route's model wait and its
split (network, queue, prefill, decode), and the ``serialized-model-calls`` finding.

Run: .venv/bin/python bench/model_server_spans.py [--requests 64] [--concurrency 8]
     [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from opentelemetry import propagate  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import tracekit  # noqa: E402
from tests.analysis.test_model_server_spans import gateway_trace  # noqa: E402
from tests.conftest import Server  # noqa: E402
from tests.demo.otlp_collector import Collector, collector  # noqa: E402
from tests.loop.proxy import ModelServer  # noqa: E402
from tracekit import semconv as sc  # noqa: E402
from tracekit._core import current  # noqa: E402
from tracekit.analysis.assembly.grouping import assemble  # noqa: E402

SETTINGS = {
    "one at a time (--serial)": ["--serial"],
    "batching (--max-num-seqs 8 --batch-cost 0.1)": ["--max-num-seqs", "8", "--batch-cost", "0.1"],
}
MODEL = ["--prefill-ms", "10", "--decode-ms", "2"]


@tracekit.stage("model")
async def complete(client: httpx.AsyncClient) -> Any:
    headers: dict[str, str] = {}
    propagate.inject(headers)  # the model stage's traceparent
    body = {"messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 16}
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    return response.json()


def gateway(model_url: str) -> Any:
    client = httpx.AsyncClient(base_url=model_url, timeout=60)

    async def chat(request: Request) -> JSONResponse:
        return JSONResponse(await complete(client))

    return tracekit.TracekitMiddleware(Starlette(routes=[Route("/v1/chat", chat, methods=["POST"])]))


def drive(url: str, requests: int, concurrency: int) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            todo = iter(range(requests))

            async def worker() -> None:
                for _ in todo:
                    (await client.post("/v1/chat", json={})).raise_for_status()

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(run())


def measure(otlp: Collector, args: list[str], requests: int, concurrency: int, path: Path) -> dict[str, Any]:
    since = len(otlp.requests)
    model = ModelServer(*MODEL, *args, "--otlp-traces-endpoint", f"{otlp.url}/v1/traces")
    server = Server(gateway(model.url))
    try:
        drive(server.url, requests, concurrency)
    finally:
        server.stop()
        if current.active_runtime is not None:
            current.active_runtime.flush()
        otlp.wait_for(sc.VLLM_REQUEST_SPAN, requests, since=since)
        model.stop()
    report = tracekit.analyze(str(otlp.write_jsonl(path, since))).to_dict()
    routes = {r["route"]: r for r in report["routes"]}
    route = routes["POST /v1/chat"]
    serialized = [f for f in report["findings"] if f["rule"] == "serialized-model-calls"]
    return {
        "routes": sorted(routes),
        "latency_p50_ms": route["latency_ms"]["p50"],
        "model_wait_ms": route["breakdown_ms"]["model_wait"],
        "model_wait_split_ms": route.get("model_wait_split_ms"),
        "serialized_model_calls": serialized[0]["evidence"] if serialized else None,
        "projection": serialized[0]["projection"] if serialized else None,
        "projection_note": serialized[0]["projection_note"] if serialized else None,
    }


def assembly_cost(requests: int = 20_000) -> dict[str, float]:
    """Assembly's time per request (us), with and without a model server's span each."""
    spans = []
    for i in range(requests):
        spans += gateway_trace(i * 50.0, 130, (10, 120), {"queue": 5, "prefill": 20, "decode": 70})
    without = [s for s in spans if s.name != sc.VLLM_REQUEST_SPAN]

    def once(these: list[Any]) -> float:
        start = time.perf_counter()
        assert sum(1 for _ in assemble(these)) == requests
        return (time.perf_counter() - start) * 1e6 / requests

    runs: dict[str, list[float]] = {"without_us": [], "with_us": []}
    for _ in range(9):  # interleaved, best of each: a shared host's noise hits both alike
        runs["without_us"].append(once(without))
        runs["with_us"].append(once(spans))
    return {key: min(values) for key, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="a folder to keep the collected OTLP JSON Lines in")
    options = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch, collector() as otlp:
        folder = options.keep or Path(scratch)
        # Both processes export to the one collector; each setting's spans are written apart.
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp.url
        tracekit.configure(service_name="gateway", exporter="otlp")
        for i, (name, args) in enumerate(SETTINGS.items()):
            path = Path(folder) / f"collected-{i}.jsonl"
            results[name] = result = measure(otlp, args, options.requests, options.concurrency, path)
            split = result["model_wait_split_ms"] or {}
            print(f"{name}: routes {result['routes']}, p50 {result['latency_p50_ms']:.1f} ms, "
                  f"model wait {result['model_wait_ms']:.1f} ms = "
                  + ", ".join(f"{k} {split.get(k, 0):.1f}" for k in ("network", "queue", "prefill", "decode"))
                  + f" ({split.get('requests')} requests)")  # fmt: skip
            print(f"  serialized-model-calls: {result['serialized_model_calls']}")
            projection = result["projection"]
            if projection is not None:
                print(f"  projected p50 {projection['p50_ms']}, p95 {projection['p95_ms']}")
            elif result["projection_note"]:
                print(f"  no projection: {result['projection_note']}")
    results["assembly"] = cost = assembly_cost()
    print(f"assembly: {cost['without_us']:.1f} us per request without the server's span, "
          f"{cost['with_us']:.1f} us with it (+{cost['with_us'] - cost['without_us']:.1f} us)")
    if options.json:
        options.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
