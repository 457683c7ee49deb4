"""CPU per ``forward`` added by tracekit.integrations.torch, on CPU.

A small model (2 Linear layers of 32, batch 1: a forward of a few tens of µs, so the
wrapper's cost is not hidden in the model's) is called ``--calls`` times inside one recorded
``model`` stage, plain and instrumented, interleaved over ``--rounds`` rounds; prints the
thread CPU per forward (median over rounds) and the difference. The CUDA path adds two
``torch.cuda.Event`` records per forward, measured only on a GPU (bench/torch_cuda_check.py).

Run: PYTHONPATH=. TRACEKIT_PURE_PYTHON=1 .venv/bin/python bench/torch_overhead.py
     [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import tracekit
from tracekit.integrations.torch import instrument


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 32)).eval()


def _per_forward_us(model: Any, x: Any, calls: int) -> float:
    with torch.no_grad(), tracekit.stage("model"):
        c0 = time.thread_time_ns()
        for _ in range(calls):
            model(x)
        return (time.thread_time_ns() - c0) / calls / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, traced = _model(), instrument(_model())
    x = torch.randn(1, 32)
    results: dict[str, list[float]] = {"plain": [], "instrumented": []}
    with tracekit.record():
        _per_forward_us(plain, x, 200)
        _per_forward_us(traced, x, 200)
        for i in range(args.rounds):  # alternating which goes first
            order = [("plain", plain), ("instrumented", traced)]
            for name, model in order if i % 2 == 0 else order[::-1]:
                results[name].append(_per_forward_us(model, x, args.calls))
    base = statistics.median(results["plain"])
    print(f"{args.calls} forwards x {args.rounds} rounds in one recorded model stage, CPU, 1 thread")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<13} {med:8.1f} us/forward  {med - base:+7.1f}")


if __name__ == "__main__":
    main()
