"""GPU check of tracekit.integrations.torch and the fp32-weights rule (needs CUDA).

On a CUDA machine, with torch and tracekit importable (no network, no server):

1. a module running a known matmul loop (``--iters`` float32 matmuls of ``--n`` x ``--n``)
   is instrumented and called in a recorded ``model`` stage, ``--calls`` times, each call
   followed by a read-back (``.item()``: a synchronization);
2. the same forward is timed independently with a pair of ``torch.cuda.Event`` around it
   (and, as a second witness, the CUDA kernel time torch.profiler reports for it);
3. checks: tracekit's ``tracekit.torch.device_ms`` for the stage within 15% (or 0.5 ms) of
   the independent event time (median over calls), and of the profiler's kernel time
   within 25%; ``tracekit.torch.sync_ms`` > 0; ``tracekit.torch.dtype`` = float32 and
   ``device`` = cuda:N; the ``fp32-weights`` finding present for the float32 module and
   absent when the same module is cast to bfloat16 (float16 without bf16 support).

Prints every number; exits 1 on a failed check, 2 when CUDA is absent. Takes well under a
minute on one GPU.

Run (repository root): PYTHONPATH=. python bench/torch_cuda_check.py [--n 2048] [--iters 20]
     [--calls 10]
It needs torch (with CUDA) and tracekit's own dependencies (opentelemetry-api,
opentelemetry-sdk, msgspec): ``pip install -e .`` or ``pip install opentelemetry-sdk msgspec``
with PYTHONPATH=. ; set TRACEKIT_PURE_PYTHON=1 if the mypyc modules are not built.
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
from tracekit import semconv
from tracekit.integrations.torch import instrument


class MatmulLoop(torch.nn.Module):
    """``iters`` matmuls of x with a fixed n x n weight: a known amount of GPU work."""

    def __init__(self, n: int, iters: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n) / n**0.5)
        self.iters = iters

    def forward(self, x: Any) -> Any:
        for _ in range(self.iters):
            x = x @ self.weight
        return x


def recorded_run(module: Any, x: Any, calls: int) -> tuple[list[dict[str, Any]], Any]:
    """``calls`` requests' worth of model stages, recorded; their attributes and the report."""

    @tracekit.stage("model")
    def generate() -> float:
        return float(module(x).sum().item())  # the read-back synchronizes

    with tracekit.record() as rec:
        for _ in range(calls):
            with tracekit.stage("request"):  # a root span per call: one "request" each
                generate()
    spans = [s for s in rec.spans if s.attributes.get(semconv.STAGE) == "model"]
    return [dict(s.attributes) for s in spans], rec.report()


def event_times(module: Any, x: Any, calls: int) -> list[float]:
    """The same forward timed by a pair of CUDA events, not by tracekit."""
    out = []
    forward = getattr(module.forward, "__wrapped__", module.forward)  # tracekit's wrapper left out
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        forward(x)
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def profiler_kernel_ms(module: Any, x: Any, calls: int) -> float | None:
    """CUDA kernel time per forward from torch.profiler (None if it reports none)."""
    from torch.profiler import ProfilerActivity, profile

    forward = getattr(module.forward, "__wrapped__", module.forward)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            forward(x)
        torch.cuda.synchronize()
    # The kernels themselves (device-side events): an operator's own device time counts the
    # kernels it launched again, so summing every event's would count each kernel twice.
    total_us = sum(evt.device_time_total for evt in prof.events()
                   if evt.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    return total_us / 1e3 / calls if total_us else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing checked")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # plain fp32 matmuls: a known workload
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("PASS " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"n={args.n} iters={args.iters} calls={args.calls}")  # fmt: skip
    module = instrument(MatmulLoop(args.n, args.iters).to(device).eval())
    x = torch.randn(64, args.n, device=device)
    with torch.no_grad():
        for _ in range(3):  # warm-up (cuBLAS handles, kernels): not measured
            module(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        attrs, report = recorded_run(module, x, args.calls)
        wall = time.perf_counter() - t0
        independent = event_times(module, x, args.calls)
        kernel_ms = profiler_kernel_ms(module, x, args.calls)
    tk = [a.get(semconv.TORCH_DEVICE_MS, 0.0) for a in attrs]
    print(f"recorded {len(attrs)} model stages in {wall:.2f} s")
    print(f"tracekit device_ms per stage: median {statistics.median(tk):.3f} "
          f"(min {min(tk):.3f}, max {max(tk):.3f})")  # fmt: skip
    print(f"independent CUDA events per forward: median {statistics.median(independent):.3f} ms")
    shown = "none reported" if kernel_ms is None else f"{kernel_ms:.3f} ms"
    print(f"torch.profiler kernel time per forward: {shown}")
    print(f"launch_ms median {statistics.median(a.get(semconv.TORCH_LAUNCH_MS, 0.0) for a in attrs):.3f}, "
          f"sync_ms median {statistics.median(a.get(semconv.TORCH_SYNC_MS, 0.0) for a in attrs):.3f}, "
          f"dtype {attrs[0].get(semconv.TORCH_DTYPE)}, device {attrs[0].get(semconv.TORCH_DEVICE)}")
    ref = statistics.median(independent)
    got = statistics.median(tk)
    check(len(attrs) == args.calls, f"{args.calls} model stages recorded")
    check(abs(got - ref) <= max(0.15 * ref, 0.5), f"device_ms {got:.3f} within 15% of the events' {ref:.3f}")
    if kernel_ms is not None:
        check(abs(got - kernel_ms) <= 0.25 * kernel_ms,
              f"device_ms {got:.3f} within 25% of the profiler's kernel time {kernel_ms:.3f}")
    check(all(a.get(semconv.TORCH_SYNC_MS, 0.0) > 0 for a in attrs), "sync_ms > 0 in every stage")
    check(attrs[0].get(semconv.TORCH_DTYPE) == "float32", "dtype float32")
    check(str(attrs[0].get(semconv.TORCH_DEVICE, "")).startswith("cuda"), "device cuda")
    fp32 = [f for f in report.findings if f.rule == "fp32-weights"]
    check(len(fp32) == 1, "fp32-weights fires on the float32 module")
    if fp32:
        print(f"  evidence: {fp32[0].evidence}")
        projection = fp32[0].projection
        print(f"  severity {fp32[0].severity}, projection p50 {projection and projection['p50_ms']}")
    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    module_half = instrument(MatmulLoop(args.n, args.iters).to(device, half).eval())
    with torch.no_grad():
        attrs_half, report_half = recorded_run(module_half, x.to(half), 3)
    print(f"half-precision module: dtype {attrs_half[0].get(semconv.TORCH_DTYPE)}, device_ms median "
          f"{statistics.median(a.get(semconv.TORCH_DEVICE_MS, 0.0) for a in attrs_half):.3f}")
    check(not [f for f in report_half.findings if f.rule == "fp32-weights"],
          f"fp32-weights quiet on the {half} module")
    print("OK" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
