"""The share of a CPU a tokenizer call gets on the event loop's thread and in a worker thread.

The validation's ``cpu-on-loop`` gateway (bench/validate.py) moves HF ``tokenizers``'
``encode`` off the loop as ``await asyncio.to_thread(tokenizer.encode_batch, [text])``.
This times both, alternately, on one asyncio loop and without a server: each call's wall
time and the CPU of the thread that ran it (``CLOCK_THREAD_CPUTIME_ID``), 20 ms apart, and
prints the medians and the CPU / wall share. Run it on a quiet host and beside CPU hogs to
see whether a thread a fix adds gets the share of a CPU the loop thread had (the replay
assumes it does).

Run: cd bench && ../.venv/bin/python thread_share.py [--calls 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import validate


def _thread_cpu_ms() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID) * 1e3


async def measure(calls: int) -> dict[str, tuple[float, float]]:
    tokenizer = validate._train_tokenizer()
    text = "explain the event loop and the gil to a gateway engineer please " * validate.TOKENIZE_REPEAT
    samples: dict[str, list[tuple[float, float]]] = {"encode on the loop": [], "encode_batch in a worker": []}

    def in_worker() -> float:
        began = _thread_cpu_ms()
        tokenizer.encode_batch([text])
        return _thread_cpu_ms() - began

    for _ in range(calls):
        wall, cpu = time.perf_counter(), _thread_cpu_ms()
        tokenizer.encode(text)
        samples["encode on the loop"].append(((time.perf_counter() - wall) * 1e3, _thread_cpu_ms() - cpu))
        await asyncio.sleep(0.02)
        wall = time.perf_counter()
        worker_cpu = await asyncio.to_thread(in_worker)
        samples["encode_batch in a worker"].append(((time.perf_counter() - wall) * 1e3, worker_cpu))
        await asyncio.sleep(0.02)
    return {name: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s))
            for name, s in samples.items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    results = asyncio.run(measure(parser.parse_args().calls))
    for name, (wall, cpu) in results.items():
        print(f"{name:26s} wall {wall:5.1f} ms, thread CPU {cpu:5.1f} ms: {100 * cpu / wall:3.0f}% of a CPU")


if __name__ == "__main__":
    main()
