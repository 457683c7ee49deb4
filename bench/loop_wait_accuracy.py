"""How accurate is tracekit's loop-wait estimate? Cases where the truth is known.

Two coroutines on one real asyncio loop (stdlib, or uvloop with --uvloop):

- timer:  B awaits ``asyncio.sleep(S)`` inside a model stage; A then holds the loop for H ms
          (pure-Python CPU in a sync stage). Truth: B was ready at S and resumed when A let go.
- socket: B awaits a read on a socket; another thread writes the byte at a known time T
          (recorded with the same clock) while A holds the loop. Truth: resume - T.

The truth is measured from B's actual resumption time minus its known ready time; the
estimate is B's ``tracekit.loop_wait_ms``. Prints a table and a JSON summary.

Run: .venv/bin/python bench/loop_wait_accuracy.py [--uvloop] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time

import tracekit
from tracekit import semconv as sc


def spin_until(deadline: float) -> None:
    while time.perf_counter() < deadline:
        pass


@tracekit.stage("tokenize")
def hold_loop(ms: float) -> None:
    spin_until(time.perf_counter() + ms / 1000)


async def timer_case(sleep_ms: float, hold_ms: float) -> float:
    resumed: list[float] = []

    @tracekit.stage("model")
    async def b() -> None:
        await asyncio.sleep(sleep_ms / 1000)
        resumed.append(time.perf_counter())

    started = time.perf_counter()
    task = asyncio.create_task(b())
    await asyncio.sleep(0)  # B is now asleep
    hold_loop(hold_ms)
    await task
    return max(0.0, (resumed[0] - (started + sleep_ms / 1000)) * 1000)


async def socket_case(arrive_ms: float, hold_ms: float) -> float:
    reader_sock, writer_sock = socket.socketpair()
    reader, _ = await asyncio.open_connection(sock=reader_sock)
    arrived: list[float] = []
    resumed: list[float] = []

    def write_later() -> None:
        time.sleep(arrive_ms / 1000)
        arrived.append(time.perf_counter())
        writer_sock.send(b"x")

    @tracekit.stage("model")
    async def b() -> None:
        await reader.readexactly(1)
        resumed.append(time.perf_counter())

    task = asyncio.create_task(b())
    await asyncio.sleep(0)
    threading.Thread(target=write_later, daemon=True).start()
    hold_loop(hold_ms)
    await task
    writer_sock.close()
    reader_sock.close()
    return max(0.0, (resumed[0] - arrived[0]) * 1000)


def run(case: str, a: float, hold: float, use_uvloop: bool) -> tuple[float, float]:
    with tracekit.record() as rec:
        coro = timer_case(a, hold) if case == "timer" else socket_case(a, hold)
        if use_uvloop:
            import uvloop

            truth = uvloop.run(coro)
        else:
            truth = asyncio.run(coro)
        spans = rec.spans
    (model,) = [s for s in spans if s.name == "model"]
    return truth, model.attributes[sc.LOOP_WAIT_MS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = [("timer", 50, 200), ("timer", 10, 100), ("timer", 90, 100), ("timer", 150, 100),
             ("socket", 50, 200), ("socket", 20, 100), ("socket", 80, 100), ("socket", 150, 100)]  # fmt: skip
    rows = []
    print(f"{'case':8} {'ready ms':>8} {'hold ms':>8} {'truth ms':>9} {'estimate':>9} {'error ms':>9}")
    for case, ready, hold in cases:
        pairs = [run(case, ready, hold, args.uvloop) for _ in range(args.repeat)]
        truth = statistics.median(t for t, _ in pairs)
        estimate = statistics.median(e for _, e in pairs)
        rows.append({"case": case, "ready_ms": ready, "hold_ms": hold, "truth_ms": truth,
                     "estimate_ms": estimate, "error_ms": estimate - truth})  # fmt: skip
        print(f"{case:8} {ready:8.0f} {hold:8.0f} {truth:9.1f} {estimate:9.1f} {estimate - truth:+9.1f}")
    print(json.dumps({"loop": "uvloop" if args.uvloop else "asyncio", "rows": rows}))


if __name__ == "__main__":
    main()
