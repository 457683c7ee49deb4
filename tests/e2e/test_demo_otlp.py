"""``tracekit demo --otlp`` against a real trace backend: Arize Phoenix (Jaeger cannot be
installed here; docs/jaeger.md). Every request of both runs reaches Phoenix as a trace: the
same trace ids as the demo's own trace files, with the stages under the server span and
tracekit's attributes on them.

Opt-in (Phoenix is ~850 MB in its own virtual environment): set ``TRACEKIT_PHOENIX`` to its
``phoenix`` executable, e.g.::

    python3 -m venv /tmp/phoenix && /tmp/phoenix/bin/pip install arize-phoenix==20.26.1
    TRACEKIT_PHOENIX=/tmp/phoenix/bin/phoenix .venv/bin/python -m pytest tests/e2e/test_demo_otlp.py

With ``TRACEKIT_PHOENIX_SCREENSHOT=FILE`` it also saves Phoenix's trace list as headless
Chromium renders it (the screenshot in docs/jaeger.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .phoenix_server import running_phoenix

PHOENIX = os.environ.get("TRACEKIT_PHOENIX")
pytestmark = [
    pytest.mark.skipif(not PHOENIX, reason="set TRACEKIT_PHOENIX to a phoenix executable"),
    pytest.mark.slow,
]
STAGES = {"tokenize", "guardrail", "model", "serialize"}
ROUTE = "POST /v1/chat/completions"


@pytest.fixture
def phoenix() -> Iterator[str]:
    assert PHOENIX is not None
    with running_phoenix(PHOENIX) as url:
        yield url


def phoenix_spans(url: str) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000, "sort": "start_time", "order": "asc"}
        if cursor:
            params["cursor"] = cursor
        response = httpx.get(f"{url}/v1/projects/default/spans", params=params, timeout=30)
        response.raise_for_status()
        page = response.json()
        spans += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def file_trace_ids(path: Path) -> set[str]:
    ids = set()
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                ids.update(s["traceId"] for s in scope["spans"] if s["name"] == ROUTE)
    return ids


def test_demo_traces_reach_phoenix(phoenix: str, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix, "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-m", "tracekit", "demo", "--otlp", "--out", str(out),
                             "--requests", "24", "--concurrency", "6"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"traces also go to {phoenix}" in result.stdout
    expected = file_trace_ids(out / "before.jsonl") | file_trace_ids(out / "after.jsonl")
    assert len(expected) == 48  # 24 requests a run, one trace each

    deadline = time.monotonic() + 30
    while True:
        spans = phoenix_spans(phoenix)
        roots = {s["context"]["trace_id"]: s for s in spans if s["name"] == ROUTE}
        if set(roots) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(roots) == expected
    by_id = {s["context"]["span_id"]: s for s in spans}
    stages = [s for s in spans if s["name"] in STAGES]
    assert {s["name"] for s in stages} == STAGES
    for stage in stages:
        # Under its request's server span (FastAPI's endpoint span may sit in between).
        parent = by_id[stage["parent_id"]]
        while parent["name"] != ROUTE:
            parent = by_id[parent["parent_id"]]
        assert stage["attributes"]["tracekit.stage.kind"] == stage["name"]
        assert stage["attributes"]["tracekit.wall_ms"] > 0
    root = next(iter(roots.values()))
    assert root["attributes"]["tracekit.model_wait_ms"] > 0

    shot = os.environ.get("TRACEKIT_PHOENIX_SCREENSHOT")
    if shot:
        profile = tempfile.mkdtemp(prefix="chromium-")
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                        "--window-size=1400,900", "--virtual-time-budget=15000",
                        f"--screenshot={shot}", f"{phoenix}/projects/UHJvamVjdDox"],  # Project:1
                       check=True, timeout=120, capture_output=True)  # fmt: skip
