"""End to end against a real trace backend: Arize Phoenix (Jaeger cannot be installed here).

tracekit exports OTLP/HTTP protobuf to a real Phoenix server on 127.0.0.1; the spans are read
back through Phoenix's REST API with their names, parent links, tracekit attributes and
OpenInference span kinds, and ``tracekit analyze --phoenix`` reports on them what the
in-memory recording of the same requests reports.

Opt-in (Phoenix is ~850 MB in its own virtual environment): set ``TRACEKIT_PHOENIX`` to its
``phoenix`` executable. ``make test`` does (``.venv-phoenix``, made on first use), or::

    python3 -m venv /tmp/phoenix && /tmp/phoenix/bin/pip install arize-phoenix==20.26.1
    TRACEKIT_PHOENIX=/tmp/phoenix/bin/phoenix .venv/bin/python -m pytest tests/e2e -q
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

import tracekit
from tracekit import semconv as sc
from tracekit._core import current
from tracekit.analysis.readers.common import RESOURCE_KEYS, ReadStats
from tracekit.analysis.readers.memory import memory_spans
from tracekit.analysis.readers.phoenix_api import phoenix_spans

from ..core.asgi import call, http_scope
from .phoenix_server import running_phoenix

PHOENIX = os.environ.get("TRACEKIT_PHOENIX")
pytestmark = pytest.mark.skipif(not PHOENIX, reason="set TRACEKIT_PHOENIX to a phoenix executable")


@pytest.fixture(scope="module")
def phoenix() -> Iterator[str]:
    """One Phoenix for the module (it takes ~20 s to start): each test has its own project."""
    assert PHOENIX is not None
    with running_phoenix(PHOENIX) as url:
        yield url


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


def _spans(url: str, want: int, project: str = "default") -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    spans: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000, "sort": "start_time", "order": "asc"}
        if cursor:
            params["cursor"] = cursor
        response = httpx.get(f"{url}/v1/projects/{project}/spans", params=params)
        if response.status_code != 404:  # the project exists once its first span arrived
            response.raise_for_status()
            page = response.json()
            spans += page["data"]
            cursor = page["next_cursor"]
            if cursor:
                continue
        if len(spans) >= want or time.monotonic() > deadline:
            return spans
        spans, cursor = [], None
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
    # OpenInference span kinds: Phoenix shows the request as a chain, the model call as LLM.
    kinds = {name: {s["span_kind"] for s in group} for name, group in by_name.items()}
    assert kinds == {"POST": {"CHAIN"}, "tokenize": {"CHAIN"}, "model": {"LLM"}}


@tracekit.stage("tokenize")
def busy_tokenize(text: str) -> list[int]:
    end = time.thread_time() + 0.012  # CPU on the loop: the finding the report must carry
    while time.thread_time() < end:
        pass
    return [ord(c) for c in text]


@tracekit.stage("guardrail")
def guardrail(tokens: list[int]) -> bool:
    return bool(tokens)


async def busy_app(scope: Any, receive: Any, send: Any) -> None:
    tokens = busy_tokenize("hello")
    guardrail(tokens)
    await model(tokens)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _assert_same(got: Any, want: Any, where: str = "report") -> None:
    # Phoenix keeps times to the microsecond: epoch times may differ by < 1 µs, and figures
    # computed from span timestamps (wall times, the replay's inputs) by a few µs.
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-3, abs=0.01), (where, got, want)
    elif isinstance(want, int) and where.endswith("_ns"):
        assert abs(got - want) < 1000, (where, got, want)
    else:
        assert got == want, (where, got, want)


def test_analyze_reads_phoenix_back(phoenix: str, otel_globals: None, monkeypatch: pytest.MonkeyPatch,
                                    tmp_path: Any) -> None:  # fmt: skip
    """A gateway exports to Phoenix over OTLP; ``tracekit analyze --phoenix`` reads the spans
    back and reports what the in-memory recording of the same requests reports."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=e2e-analyze")
    tracekit.configure(service_name="e2e-gateway", exporter="otlp")
    gateway = tracekit.TracekitMiddleware(busy_app)

    async def load() -> None:
        async def one() -> None:
            await call(gateway, http_scope("/v1/chat", "POST"))

        for _ in range(8):
            await asyncio.gather(*(one() for _ in range(4)))

    with tracekit.record() as rec:
        asyncio.run(load())
        assert current.active_runtime is not None
        current.active_runtime.flush()
        recorded = rec.spans  # the flush also ends the loop's last window (a tracekit.loop span)
    spans = _spans(phoenix, len(recorded), project="e2e-analyze")
    assert sum(s.name != sc.LOOP_SPAN for s in recorded) == 32 * 4
    assert {s["context"]["span_id"] for s in spans} == {f"{s.context.span_id:016x}" for s in recorded}
    assert {s["span_kind"] for s in spans if s["name"] == "guardrail"} == {"GUARDRAIL"}

    # Phoenix keeps no resource attributes (service.name, tracekit.host.cpus, ...) and keeps
    # times to the microsecond (rounded through a float): each time it gives back is within
    # 1 µs of the recorded one, and the recording is analysed with Phoenix's times and without
    # the resource, so that what differs is only what the reader does. (The replay is
    # sensitive to sub-microsecond ties: with times cut to the µs, its validation error moved
    # by 15 points on this load.)
    stats = ReadStats()
    back = {s.span_id: s for s in phoenix_spans(phoenix, "e2e-analyze", "1h", 30, 2**30, stats)}
    assert not stats.skipped
    bare = []
    for span in memory_spans(recorded, stats):
        got_back = back[span.span_id]
        assert abs(got_back.start_ns - span.start_ns) <= 1000
        assert abs(got_back.end_ns - span.end_ns) <= 1000
        bare.append(msgspec.structs.replace(span, service="", start_ns=got_back.start_ns,
            end_ns=got_back.end_ns, events=got_back.events, attributes={
                k: v for k, v in span.attributes.items() if k not in RESOURCE_KEYS}))  # fmt: skip
    assert not stats.skipped
    expected = tracekit.analyze(bare, cores=2).to_dict()
    assert expected["requests"] == 32
    assert [f["rule"] for f in expected["findings"]] == ["cpu-on-loop"]  # a report worth comparing
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "tracekit", "analyze", "--phoenix", phoenix, "--project",
         "e2e-analyze", "--cores", "2", "--format", "json", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = json.loads(out.read_text())
    assert got["source"] == phoenix
    _assert_same({**got, "source": None}, {**expected, "source": None})
