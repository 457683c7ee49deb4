"""How tracekit splits a wait on an HTTP client's connection lock, against the truth.

Serves ``bench/validate.py``'s gateway of one case (uvicorn, the simulated model server, the
same load generator) with anyio's ``Lock`` wrapped in the gateway process to time every
contended acquire: the queue wait (from the waiter's suspension until the holder's
``release`` handed the lock over) and the loop wait after it (from the release until the
waiter ran again). httpcore guards each connection with such locks. Prints the totals beside
the queue wait tracekit recorded (``tracekit.queue_wait_ms`` over all requests), which
should equal the true queue wait (the loop wait after the release is loop wait).

Run: .venv/bin/python bench/lock_wait_truth.py [--case blocking-call-on-loop]
     [--load open:20] [--requests 240]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import validate
from servers import free_port, start, stop, wait_ready

import tracekit


def serve(case: str, port: int, model_port: int, out: Path) -> None:
    """The gateway with anyio's Lock timed; the totals are written to ``out`` every 0.2 s
    (uvicorn ends the process on SIGTERM)."""
    import anyio._backends._asyncio as backend
    import uvicorn

    ready_at: dict[Any, int] = {}
    totals = {"waits": 0, "queue_ns": 0, "loop_ns": 0}
    acquire, release = backend.Lock.acquire, backend.Lock.release

    def timed_release(self: Any) -> None:
        for task, future in self._waiters:  # the waiter the lock is handed to
            if not future.cancelled():
                ready_at[task] = time.perf_counter_ns()
                break
        release(self)

    async def timed_acquire(self: Any) -> None:
        began = time.perf_counter_ns()
        await acquire(self)
        ready = ready_at.pop(asyncio.current_task(), None)
        if ready is not None:  # it waited for a holder
            totals["waits"] += 1
            totals["queue_ns"] += ready - began
            totals["loop_ns"] += time.perf_counter_ns() - ready

    backend.Lock.acquire, backend.Lock.release = timed_acquire, timed_release  # type: ignore[method-assign]

    def dump() -> None:
        while True:
            time.sleep(0.2)
            out.write_text(json.dumps(totals))

    threading.Thread(target=dump, daemon=True).start()
    app = validate.make_app(case, False, f"http://127.0.0.1:{model_port}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="blocking-call-on-loop", choices=sorted(validate.CASES))
    parser.add_argument("--load", default="open:20", help="closed:C or open:RATE")
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        case, port, model_port, out = args.serve
        serve(case, int(port), int(model_port), Path(out))
        return
    kind, _, value = args.load.partition(":")
    with tempfile.TemporaryDirectory() as tmp:
        traces, truth = Path(tmp) / "traces.jsonl", Path(tmp) / "truth.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["PYTHONPATH"] = str(validate.ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        model_port, port = free_port(), free_port()
        model = start(["-m", "tracekit.demo.model_server", "--port", str(model_port),
                       *validate.CASES[args.case].model_args], env)  # fmt: skip
        gateway = start([__file__, "--serve", args.case, str(port), str(model_port), str(truth)],
                        {**env, "OTEL_TRACES_EXPORTER": f"jsonl:{traces}"})  # fmt: skip
        try:
            wait_ready(model_port, model)
            wait_ready(port, gateway)
            asyncio.run(validate._drive(port, (kind, float(value)), args.requests, deadline_s=120))
            time.sleep(0.6)  # the last totals written
        finally:
            stop(gateway)
            stop(model)
        totals = json.loads(truth.read_text())
        report = tracekit.analyze(str(traces)).to_dict()
    recorded = sum(r["breakdown_ms"]["queue_wait"] * r["requests"] for r in report["routes"])
    requests = sum(r["requests"] for r in report["routes"])
    print(f"{totals['waits']} contended lock acquires in {requests} requests")
    print(f"true queue wait {totals['queue_ns'] / 1e6:.0f} ms; loop wait after the release "
          f"{totals['loop_ns'] / 1e6:.0f} ms; tracekit's queue wait {recorded:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
