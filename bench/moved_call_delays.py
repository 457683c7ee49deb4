"""What a blocking call moved to a thread (``asyncio.to_thread``) waits for, besides itself.

A loop serves ``--clients`` closed-loop clients; each request runs 3 ms of CPU on the loop,
then ``await asyncio.to_thread(time.sleep, 0.005)``, then 1 ms of CPU. Timestamps taken in the
worker split each call's time beyond the 5 ms into: the worker's start (the call made to the
worker running: a thread waiting for a core), the worker's wait for the GIL after the sleep
(another request's slice holds it), and the loop's resumption of the caller. Also prints the
loop thread's run-queue wait per time it was scheduled (``/proc/thread-self/schedstat``), to
compare with the worker's start. Run it beside busy processes to see a busy host (issue 14:
the busy-host ``blocking-call-on-loop`` case).

Run: .venv/bin/python bench/moved_call_delays.py [--clients 2] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

SLEEP_S = 0.005


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def blocking() -> tuple[float, float]:
    started = time.perf_counter()
    time.sleep(SLEEP_S)
    return started, time.perf_counter()  # the second read needs the GIL back


async def client(calls: int, rows: list[tuple[float, float, float]]) -> None:
    for _ in range(calls):
        spin(3)
        called = time.perf_counter()
        started, slept = await asyncio.to_thread(blocking)
        resumed = time.perf_counter()
        rows.append(((started - called) * 1000, (slept - started - SLEEP_S) * 1000,
                     (resumed - slept) * 1000))  # fmt: skip
        spin(1)
        await asyncio.sleep(0.002)  # the client's turn-around


def schedstat() -> list[int]:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return [int(x) for x in f.read().split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300, help="per client")
    args = parser.parse_args()
    rows: list[tuple[float, float, float]] = []

    async def serve() -> None:
        await asyncio.gather(*(client(args.calls, rows) for _ in range(args.clients)))

    before = schedstat()
    asyncio.run(serve())
    after = schedstat()
    runs = after[2] - before[2]
    print(f"loop thread: run-queue wait {(after[1] - before[1]) / 1e6 / max(1, runs):.3f} ms per scheduling")
    names = ("worker start", "worker's wait for the GIL", "loop resuming the caller")
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        ordered = sorted(column)
        print(f"{name:28s} p50 {ordered[len(ordered) // 2]:.2f}  p90 {ordered[int(len(ordered) * 0.9)]:.2f}"
              f"  mean {statistics.mean(ordered):.2f} ms")  # fmt: skip
    excess = sorted(sum(row) for row in rows)
    print(f"{'in all, beyond the sleep':28s} p50 {excess[len(excess) // 2]:.2f}"
          f"  mean {statistics.mean(excess):.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
