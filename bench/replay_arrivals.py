"""Open arrivals as the replay reads them, against the load generator's own send times.

Serves one of ``bench/validate.py``'s gateways (uvicorn, the simulated model server) under
Poisson arrivals from a load generator that notes when it sent each request, then compares
the replay's ready time of each request (:mod:`tracekit.analysis.replay.arrivals`) with the
send time (+1 ms for the client and the loopback), next to the middle-of-the-busy-run estimate
the replay used before. Requests are matched in order (the first sent is the first started).
Then replays the recording as recorded three times, each request ready at its estimate, at
the old one, and at its send time (the host's other load not read: the same model for the
three), and prints each replay's p50 and p95 error against the recorded latencies.

Run: .venv/bin/python bench/replay_arrivals.py [--case blocking-call-on-loop] [--rate 20]
     [--requests 240]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import validate
from servers import free_port, start, stop, wait_ready

import tracekit
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import ReplayConfig
from tracekit.analysis.replay.arrivals import BusyIndex, arrivals
from tracekit.analysis.replay.build import ProgramBuilder
from tracekit.analysis.replay.run import Loops, errors, simulate

SEND_TO_SERVER_MS = 1.0  # the client's own work and the loopback, roughly


async def _drive(port: int, rate: float, requests: int) -> list[int]:
    """Poisson arrivals; the send time (ns, wall clock) of each request, in order."""
    import httpx

    sent: list[int] = []
    payload = {"prompt": "explain the event loop and the gil to a gateway engineer please "}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits) as client:

        async def one(note: bool) -> None:
            if note:
                sent.append(time.time_ns())
            await client.post(validate.ROUTE, json=payload)

        for _ in range(2):  # warm-up: first-request imports, connections
            await one(False)
        rng, due, tasks = random.Random(1), time.monotonic(), []
        for _ in range(requests):
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(one(True)))
        await asyncio.gather(*tasks)
    return sent


def _errors(estimates: list[float], truth: list[float]) -> str:
    errors = [e - t for e, t in zip(estimates, truth, strict=True)]
    absolute = sorted(abs(e) for e in errors)
    return (f"mean {statistics.mean(errors):+.1f} ms, mean |error| {statistics.mean(absolute):.1f} ms, "
            f"p95 |error| {absolute[int(0.95 * (len(absolute) - 1))]:.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="blocking-call-on-loop", choices=sorted(validate.CASES))
    parser.add_argument("--rate", type=float, default=20.0, help="Poisson arrivals a second")
    parser.add_argument("--requests", type=int, default=240)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["PYTHONPATH"] = str(validate.ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        model_port, port = free_port(), free_port()
        model = start(["-m", "tracekit.demo.model_server", "--port", str(model_port),
                       *validate.CASES[args.case].model_args], env)  # fmt: skip
        gateway = start([validate.__file__, "--serve", args.case, "--port", str(port),
                         "--model-port", str(model_port)],
                        {**env, "OTEL_TRACES_EXPORTER": f"jsonl:{traces}"})  # fmt: skip
        try:
            wait_ready(model_port, model)
            wait_ready(port, gateway)
            sent = asyncio.run(_drive(port, args.rate, args.requests))
            time.sleep(0.5)
        finally:
            stop(gateway)
            stop(model)
        requests: list[RequestRecord] = []
        report = tracekit.analyze(str(traces), observe=requests.append).to_dict()
    group = sorted((r for r in requests if r.instrumented), key=lambda r: r.start_ns)
    if len(group) < len(sent):
        raise SystemExit(f"replay_arrivals: {len(group)} requests traced of {len(sent)} sent")
    group = group[len(group) - len(sent) :]  # the warm-up requests came first
    t0 = group[0].start_ns
    config = ReplayConfig()
    plan = arrivals(group, t0, config.arrivals, config.closed_loop_gap_ms, config.closed_loop_fraction)
    if plan.chains:
        raise SystemExit("replay_arrivals: the trace reads as a closed loop, not open arrivals")
    busy = BusyIndex(group)
    truth = [(s - t0) / 1e6 + SEND_TO_SERVER_MS for s in sent]
    middle = [(r.start_ns - busy.run_before(r.start_ns) // 2 - t0) / 1e6 for r in group]
    print(f"{args.case}, Poisson arrivals at {args.rate:g}/s, {len(group)} requests")
    print("ready time - send time:")
    print(f"  recorded start          {_errors([(r.start_ns - t0) / 1e6 for r in group], truth)}")
    print(f"  middle of the busy run  {_errors(middle, truth)}")
    print(f"  the replay's estimate   {_errors([plan.ready[i] for i in range(len(group))], truth)}")
    print("replayed as recorded, each request ready at (p50 and p95 error):")
    config = ReplayConfig()
    for name, ready in (("the replay's estimate", None), ("the middle of the busy run", middle),
                        ("its send time", truth)):  # fmt: skip
        loops = Loops(group, config.arrivals, config.closed_loop_gap_ms, config.closed_loop_fraction)
        if ready is not None:
            loops.services[group[0].service].plan.ready.update(enumerate(ready))
        run = simulate(loops, lambda req, host: ProgramBuilder(req, 0, cpu_wait=host.cpu_wait).program(), {})
        p50, p95 = errors(group, run, group[0].route)
        print(f"  {name:26s} p50 {p50:+.0%}, p95 {p95:+.0%}")
    check = report["validation"]
    print(f"tracekit analyze's self-check (the host's other load read): p50 {check['p50_error']:+.0%}, "
          f"p95 {check['p95_error']:+.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
