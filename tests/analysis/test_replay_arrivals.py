"""Closed loop or open arrivals: the requests in flight tell them apart.

A closed loop of N clients holds about N requests in flight throughout; open arrivals let the
count vary. Clients slow to send again (the idle gap between a response and the next request
longer than the chaining allows) used to read as open arrivals.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tests.analysis.factories import Job, Op, request, simulate_gateway
from tracekit.analysis.replay import ReplayConfig, Replayer
from tracekit.analysis.replay.arrivals import CLOSED_DISPERSION, _expected_gap, arrivals, in_flight

ROUTE = "POST /v1/chat"


def test_the_in_flight_count_is_time_weighted() -> None:
    # 0-100 ms: one request; 100-300: two; 300-400: one. Mean (100 + 400 + 100) / 400 = 1.5;
    # the square's mean (100 + 800 + 100) / 400 = 2.5: variance 0.25, dispersion 1/6.
    group = [request(ROUTE, 0, 300), request(ROUTE, 100, 400)]
    flight = in_flight(group)
    assert (flight.mean, flight.variance, flight.most) == (pytest.approx(1.5), pytest.approx(0.25), 2)
    assert flight.dispersion == pytest.approx(1 / 6) and flight.closed
    assert flight.to_dict() == {"mean": 1.5, "max": 2, "dispersion": 0.17}
    # Requests that never overlap: one in flight, then none; the count swings.
    apart = in_flight([request(ROUTE, 0, 10), request(ROUTE, 100, 110)])
    assert apart.mean == pytest.approx(20 / 110) and apart.dispersion > CLOSED_DISPERSION


def test_slow_clients_read_as_the_closed_loop_they_are() -> None:
    # 4 clients, each sending 8 ms after its last response: the loop idles 8 ms between an end
    # and the start it causes, more than the chaining's 2 ms, so no request chained and the
    # trace read as open arrivals. The count holds ~4 in flight: closed, 4 clients.
    ops = [Op("cpu", 2.0, "work"), Op("wait", 40.0, "backend"), Op("cpu", 1.0)]
    jobs = [Job(ROUTE, list(ops), kinds={"backend": "other"}) for _ in range(200)]
    records = simulate_gateway(jobs, clients=4, think_ms=8.0)
    plan = arrivals(records, records[0].start_ns, "auto", 2.0, 0.6)
    assert plan.read_by == "in flight" and plan.in_flight is not None
    assert plan.in_flight.most == 4 and plan.in_flight.dispersion <= CLOSED_DISPERSION
    assert len(plan.ready) == 4 and len(plan.chains) == 196  # every request after the first 4
    assert Replayer(ReplayConfig(cores=2)).validate(records).ok
    # The same requests as open Poisson arrivals: the count varies, the chains decide (few).
    rng = random.Random(3)
    at, jobs = 0.0, []
    for _ in range(200):
        at += rng.expovariate(4 / 51.0)  # the closed loop's rate: 4 per 51 ms
        jobs.append(Job(ROUTE, list(ops), at, kinds={"backend": "other"}))
    records = simulate_gateway(jobs)
    plan = arrivals(records, records[0].start_ns, "auto", 2.0, 0.6)
    assert plan.in_flight is not None and plan.in_flight.dispersion > 0.7
    assert (plan.read_by, plan.chains) == ("chains", {})


def test_clients_that_think_are_chained_by_their_think_time() -> None:
    # tracekit demo's load: 8 clients starting 100 ms apart, each sending again 800 ms after
    # its response, most of the time thinking (about 1.5 in flight). Chained to the earliest
    # end, a head started after the first end took it, and the clients read as 4 with short,
    # varied think times; the fixed gateway was projected 7-12% slower than measured. The
    # think-time peak chains each request to its own client's previous one.
    ops = [Op("cpu", 2.0, "work"), Op("wait", 150.0, "backend"), Op("cpu", 1.0)]
    jobs = [Job(ROUTE, list(ops), kinds={"backend": "other"}) for _ in range(160)]
    records = simulate_gateway(jobs, clients=8, think_ms=800.0, ramp_ms=100.0)
    plan = arrivals(records, records[0].start_ns, "auto", 2.0, 0.6)
    assert plan.read_by == "think time" and plan.think_ms == pytest.approx(805, abs=5)
    assert len(plan.ready) == 8 and len(plan.chains) == 152
    for pred, (succ, think) in plan.chains.items():
        assert (records[succ].start_ns - records[pred].end_ns) / 1e6 == pytest.approx(800, abs=3)
        assert think == pytest.approx(800, abs=3)
    assert Replayer(ReplayConfig(cores=2)).validate(records).ok
    # A start is recorded when the loop first runs it: on a busy loop up to 40 ms after the
    # client sent it (the demo's fixed gateway). Those are still their clients' requests, but
    # for a late start nearer another client's end + think: nearest pairs first is greedy.
    rng = random.Random(11)
    late: list[tuple[int, int, float]] = []  # (client, its request, recorded start ms)
    group = []
    for client in range(8):
        start = 100.0 * client
        for k in range(20):
            start += rng.uniform(0, 40) if rng.random() < 0.3 else 0.0
            end = start + rng.uniform(120, 180)
            late.append((client, k, start))
            group.append(request(ROUTE, start, end))
            start = end + 800.0
    order = sorted(range(len(group)), key=lambda i: group[i].start_ns)
    group, late = [group[i] for i in order], [late[i] for i in order]
    plan = arrivals(group, group[0].start_ns, "auto", 2.0, 0.6)
    assert plan.read_by == "think time" and 8 <= len(plan.ready) <= 10  # 38 within 10 ms of the peak
    same = [late[p][0] == late[s][0] and late[s][1] == late[p][1] + 1 for p, (s, _) in plan.chains.items()]
    assert len(same) >= 150 and sum(same) >= 0.95 * len(same)
    # Open arrivals leave no peak: test_slow_clients_read_as_the_closed_loop_they_are.


# --- real recordings: uvicorn on 127.0.0.1, a closed loop and a Poisson load --------------------
def test_open_arrivals_that_queued_behind_a_busy_loop_arrived_before_they_started() -> None:
    """Requests that started back to back after a 60 ms blocking call arrived during it (their
    sockets waited for the loop): each is read as ready an expected Poisson gap after the one
    before it, within the busy period and before its start; one that started on an idle loop
    was ready at its start."""
    route = "POST /chat"
    first = request(route, 0, 70, slices=[(0, 60)])  # holds the loop 60 ms
    queued = [request(route, 60 + 2 * k, 100 + 2 * k, slices=[(60 + 2 * k, 62 + 2 * k)]) for k in range(3)]
    idle = request(route, 400, 420, slices=[(400, 401)])  # the loop idle for 300 ms before it
    group = [first, *queued, idle]
    plan = arrivals(group, first.start_ns, "open", 1.0, 0.5)
    assert not plan.chains
    ready = [plan.ready[i] for i in range(len(group))]
    assert ready[0] == 0.0 and ready[-1] == pytest.approx(400.0)
    assert 0 < ready[1] < ready[2] < ready[3] < 60  # during the blocking call, in order
    # Five arrivals in 400 ms: a mean gap of 100 ms, so within a 60 ms window the expected
    # gap is less than half of it.
    assert ready[1] == pytest.approx(_expected_gap(4 / 400e6, 60e6) / 1e6, rel=1e-3)
    assert ready[1] < 30


def test_the_expected_gap_within_a_window() -> None:
    rate = 1 / 50e6  # one arrival in 50 ms on average, per ns
    assert _expected_gap(rate, 1e3) == pytest.approx(500, rel=1e-3)  # a short window: its middle
    assert _expected_gap(rate, 1e12) == pytest.approx(50e6)  # a long one: the mean gap
    assert 0 < _expected_gap(rate, 50e6) < 25e6  # earlier than the middle: gaps are short more often
    assert _expected_gap(rate, 0.0) == 0.0


def _app() -> Any:
    @tracekit.stage("work")
    def work() -> int:
        deadline = time.thread_time() + 0.002  # 2 ms of CPU on the loop
        n = 0
        while time.thread_time() < deadline:
            n += 1
        return n

    @tracekit.stage("backend", kind="other")
    async def backend() -> None:
        await asyncio.sleep(0.03)

    async def chat(request: Any) -> JSONResponse:
        n = work()
        await backend()
        return JSONResponse({"n": n})

    return tracekit.TracekitMiddleware(Starlette(routes=[Route("/v1/chat", chat, methods=["POST"])]))


async def _closed(url: str, clients: int, each: int, think_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one() -> None:
            for _ in range(each):
                assert (await client.post("/v1/chat")).status_code == 200
                await asyncio.sleep(think_s)  # a client slow to send again

        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(clients))), 60)


async def _poisson(url: str, rate: float, n: int) -> None:
    rng = random.Random(5)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one() -> None:
            assert (await client.post("/v1/chat")).status_code == 200

        tasks = []
        for _ in range(n):
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.wait_for(asyncio.gather(*tasks), 60)


def _model(rec: Any) -> tuple[dict[str, Any], str]:
    # The report's model statement, and the report's text (one line).
    assert rec.settle()
    report = rec.report()
    model = report.validation.get("model")
    assert model is not None
    return model, " ".join(report.to_text(width=80, color=False).split())


@pytest.mark.slow
def test_recorded_closed_and_poisson_loads_read_apart(serve: Any) -> None:
    server = serve(_app())
    # 3 clients, 6 ms from a response to the next request (the load generator in this
    # process shares the host, as a real one does): the loop idles longer than the chaining
    # allows between them.
    with tracekit.record() as rec:
        asyncio.run(_closed(server.url, clients=3, each=30, think_s=0.006))
        closed, text = _model(rec)
    assert (closed["arrivals"], closed["clients"], closed["arrivals_read_by"]) == ("closed", 3, "in flight")
    assert "assumed: a closed loop of 3 clients (read from the requests in flight: mean" in text
    assert closed["in_flight"]["max"] == 3 and closed["in_flight"]["dispersion"] <= CLOSED_DISPERSION
    # Poisson arrivals at about the same rate: the count varies, read as open arrivals.
    with tracekit.record() as rec:
        asyncio.run(_poisson(server.url, rate=60.0, n=90))
        poisson, text = _model(rec)
    assert poisson["arrivals"] == "open" and poisson["arrivals_read_by"] == "chains"
    assert "assumed: open arrivals at " in text
    assert poisson["in_flight"]["dispersion"] > CLOSED_DISPERSION
