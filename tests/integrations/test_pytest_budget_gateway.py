"""Budgets on a real gateway: the proxy-shaped gateway of tests/loop/proxy.py served by uvicorn
on 127.0.0.1, calling the simulated model server in a process of its own.

The first test is what a user writes (the marker, checked by the plugin after the test); the
second shows the same budgets catch a gateway whose tokenize stage burns 100 units of CPU
(~100 ms here; 5x its budget even on a machine twice as fast).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tracekit.integrations.pytest_budgets import check
from tracekit.recording import Recording

from ..loop.proxy import ModelServer, Proxy, drive_load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    server = ModelServer("--prefill-ms", "40", "--decode-ms", "2")
    yield server
    server.stop()


# The default proxy, one request at a time: measured on this 2-core host at a load average of 7,
# tokenize p95 17 ms, max block 129 ms (the first request), overhead ratio 0.36, loop wait p95
# 30 ms, TTFT p95 181 ms (a quiet host: a tenth of the CPU figures).
@pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 250}, max_block_ms=1000, overhead_ratio=0.8,
                             loop_wait_p95_ms=500, ttft_p95_ms=5000)  # fmt: skip
def test_a_gateway_served_by_uvicorn_meets_its_budget(model: ModelServer, serve: Any) -> None:
    server = serve(Proxy(model.url).app)
    latencies = drive_load(server.url, requests=16, concurrency=1, stream_every=4)
    assert len(latencies) == 16


def test_the_same_budgets_catch_a_slow_tokenize(model: ModelServer, serve: Any,
                                                tracekit_record: Recording) -> None:  # fmt: skip
    server = serve(Proxy(model.url, tokenize_units=100).app)
    assert len(drive_load(server.url, requests=12, concurrency=2)) == 12
    assert tracekit_record.settle()  # the server hands a request on after its client has it
    servers = [s for s in tracekit_record.spans if s.kind.name == "SERVER"]
    assert len(servers) == 12

    outcome = check(tracekit_record, {"stage_p95_ms": {"tokenize": 20}, "overhead_ratio": 0.3,
                                      "max_block_ms": 2000})  # fmt: skip
    assert outcome.requests == 12
    budgets = [b.budget for b in outcome.breaches]
    assert budgets == ["stage_p95_ms[tokenize] <= 20 ms", "overhead_ratio <= 0.3"]
    assert outcome.breaches[0].requests.startswith("12 of 12 over: POST /v1/chat/completions x12")
    table = outcome.table()
    assert table.startswith("tracekit budget exceeded (12 requests recorded):\n  budget ")
    assert "max_block_ms" not in table  # met: the tokenize stage holds the loop ~100 ms
