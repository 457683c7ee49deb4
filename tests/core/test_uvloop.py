"""The same attribution on uvloop (DESIGN §1: both loops must work)."""

from __future__ import annotations

import httpx
import pytest

import tracekit
from tracekit import semconv as sc

from ..conftest import settled
from . import apps

pytest.importorskip("uvloop")


def _server_span(spans: list, path: str):  # type: ignore[no-untyped-def]
    (span,) = [s for s in spans if s.kind.name == "SERVER" and s.attributes[sc.URL_PATH] == path]
    return span


def test_attribution_on_uvloop(serve) -> None:  # type: ignore[no-untyped-def]
    with tracekit.record() as rec:
        server = serve(apps.traced_app(), loop="uvloop")
        httpx.get(f"{server.url}/cpu?ms=50")
        httpx.get(f"{server.url}/sleep?s=0.1")
        httpx.get(f"{server.url}/block")
        apps.a_sleeps_while_b_burns(server.url)
        spans = settled(rec, 6)
    cpu = [s for s in spans if s.name == "tokenize" and s.attributes[sc.MAX_BLOCK_MS] >= 40]
    assert cpu[0].attributes[sc.ON_LOOP] is True and cpu[0].attributes[sc.MAX_BLOCK_MS] >= 40
    models = sorted((s for s in spans if s.name == "model"), key=lambda s: s.start_time)
    slept = models[0].attributes  # 100 ms, suspended (a busy host wakes it later, never sooner)
    assert slept[sc.WAIT_MS] + slept[sc.LOOP_WAIT_MS] >= 95 and slept[sc.CPU_MS] < 5
    # the sleep-deadline estimator reads the sleep frame, which uvloop runs the same way
    assert models[1].attributes[sc.LOOP_WAIT_MS] == pytest.approx(150, rel=0.3)
    block = _server_span(spans, "/block")
    assert block.attributes[sc.MAX_BLOCK_MS] >= 80
    assert "in blocking_handler" in block.attributes[sc.BLOCKED_AT]
