"""End to end against a real trace backend: Arize Phoenix (Jaeger cannot be installed here).

tracekit exports OTLP/HTTP protobuf to a real Phoenix server on 127.0.0.1; the spans are read
back through Phoenix's REST API with their names, parent links and tracekit attributes.

Opt-in (Phoenix is ~850 MB in its own virtual environment): set ``TRACEKIT_PHOENIX`` to its
``phoenix`` executable, e.g.::

    python3 -m venv /tmp/phoenix && /tmp/phoenix/bin/pip install arize-phoenix==20.26.1
    TRACEKIT_PHOENIX=/tmp/phoenix/bin/phoenix .venv/bin/python -m pytest tests/e2e -q
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import tracekit
from tracekit import semconv as sc
from tracekit._core import current

from ..core.asgi import call, http_scope

PHOENIX = os.environ.get("TRACEKIT_PHOENIX")
pytestmark = pytest.mark.skipif(not PHOENIX, reason="set TRACEKIT_PHOENIX to a phoenix executable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def phoenix() -> Iterator[str]:
    port, grpc_port = _free_port(), _free_port()
    workdir = tempfile.mkdtemp(prefix="phoenix-")
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_WORKING_DIR": workdir,
           "PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
           "PHOENIX_DISABLE_AGENT_ASSISTANT": "true", "PHOENIX_ENABLE_MCP_SERVER": "false",
           "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true", "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
           "PHOENIX_AGENTS_DISABLE_BASH": "true"}  # fmt: skip
    process = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "phoenix exited"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "phoenix not ready after 120 s"
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


@tracekit.stage("model")
async def model(tokens: list[int]) -> str:
    await asyncio.sleep(0.01)
    return "ok"


async def app(scope: Any, receive: Any, send: Any) -> None:
    await model(tokenize("hello"))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _spans(url: str, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        response = httpx.get(f"{url}/v1/projects/default/spans",
                             params={"limit": 100, "sort": "start_time", "order": "asc"})  # fmt: skip
        response.raise_for_status()
        spans: list[dict[str, Any]] = response.json()["data"]
        if len(spans) >= want or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def test_spans_arrive_in_phoenix(phoenix: str, otel_globals: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)
    tracekit.configure(service_name="e2e-gateway", exporter="otlp")

    async def load() -> None:
        for _ in range(3):
            await call(tracekit.TracekitMiddleware(app), http_scope("/v1/chat", "POST"))

    asyncio.run(load())
    assert current.active_runtime is not None
    current.active_runtime.flush()
    spans = _spans(phoenix, 9)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    assert {name: len(v) for name, v in by_name.items()} == {"POST": 3, "tokenize": 3, "model": 3}
    server_ids = {s["context"]["span_id"] for s in by_name["POST"]}
    for stage in by_name["tokenize"] + by_name["model"]:
        assert stage["parent_id"] in server_ids
    model_span = by_name["model"][0]
    assert model_span["attributes"][sc.STAGE_KIND] == "model"
    assert model_span["attributes"][sc.WAIT_MS] >= 5
    assert by_name["POST"][0]["attributes"][sc.HTTP_RESPONSE_STATUS_CODE] == 200
