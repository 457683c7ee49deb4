"""``fp32-weights``: an in-process CUDA model held in float32 (seed 000, the first fix).

Reads the ``tracekit.torch.*`` attributes that :mod:`tracekit.integrations.torch` puts on
the stage that ran the module: its device and the dtype of its floating-point weights.
Fires, per route and stage, when the module ran on a CUDA device in float32 (not on CPU:
bf16 matmuls on most CPUs are not faster; not in bf16/fp16 already).

Why it matters: decoding is bound by memory bandwidth, and float32 moves twice the bytes per
weight of bfloat16/float16 (and misses the tensor-core paths). The fix loads or casts the
model to bfloat16 (float16 where ``torch.cuda.is_bf16_supported()`` is false).

Projection, when the traces carry the device time (``tracekit.torch.device_ms``): each
request's latency less half its device time, the best a halving of bytes moved gives (a
bound, memory-bound kernels): ``model: {"method": "halved device time"}``. Without device
time, the severity comes from the module's size alone: it is ``low`` (no measured impact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.rules.common import by_route, ms, p50_latency
from tracekit.analysis.rules.findings import Finding, RuleContext, assess_severity

FIX_TITLE = "Load the model in bfloat16 (float16 on GPUs without bf16): half the bytes moved per token"
FIX_CODE = """\
# torch: cast once, at load time (not per request)
dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
model = model.to(dtype)
# transformers: AutoModelForCausalLM.from_pretrained(name, torch_dtype=dtype)
# vLLM: vllm serve MODEL --dtype bfloat16
"""


def _is_fp32_cuda(attrs: dict[str, Any]) -> bool:
    device = attrs.get(semconv.TORCH_DEVICE)
    return (isinstance(device, str) and device.startswith("cuda")
            and attrs.get(semconv.TORCH_DTYPE) == "float32")  # fmt: skip


def _float(attrs: dict[str, Any], key: str) -> float | None:
    value = attrs.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class Fp32Weights:
    """Rule ``fp32-weights``.

    Args:
        min_requests: requests of the route that ran the float32 CUDA module needed (1: one
            trace of a float32 model is enough to say so).
    """

    id = "fp32-weights"

    def __init__(self, min_requests: int = 1) -> None:
        self.min_requests = min_requests

    def __call__(self, requests: Sequence[RequestRecord], ctx: RuleContext) -> list[Finding]:
        """One finding per route and stage that ran a CUDA module in float32."""
        out = []
        for route, reqs in sorted(by_route(requests, ctx).items()):
            hits: dict[str, list[tuple[RequestRecord, dict[str, Any]]]] = {}
            for req in reqs:
                for stage in req.stages:
                    if _is_fp32_cuda(stage.attributes):
                        hits.setdefault(stage.name, []).append((req, stage.attributes))
            for name in sorted(hits):
                if len({id(r) for r, _ in hits[name]}) >= self.min_requests:
                    out.append(self._finding(route, name, hits[name], reqs))
        return out

    def _finding(self, route: str, name: str, hits: list[tuple[RequestRecord, dict[str, Any]]],
                 reqs: list[RequestRecord]) -> Finding:  # fmt: skip
        attrs = hits[0][1]
        device_ms: dict[int, float] = {}
        for req, a in hits:
            value = _float(a, semconv.TORCH_DEVICE_MS)
            if value is not None:
                device_ms[id(req)] = device_ms.get(id(req), 0.0) + value
        size = _float(attrs, semconv.TORCH_PARAM_BYTES)
        module = attrs.get(semconv.TORCH_MODULE, "the module")
        evidence = (
            f"{name} ran {module} on {attrs.get(semconv.TORCH_DEVICE)} with float32 weights"
            + (f" ({_size(size)}; {_size(size / 2)} in bf16)" if size else "")
            + f" in {len({id(r) for r, _ in hits})} of {len(reqs)} {route} requests"
        )
        projection = None
        note: str | None = "no device time in the traces (tracekit.torch.device_ms): dtype alone"
        impact = 0.0
        if device_ms:
            values = sorted(device_ms.values())
            evidence += (f"; device time per request p50 {ms(percentile(values, 0.5))}, "
                         f"p95 {ms(percentile(values, 0.95))}")  # fmt: skip
            projection = _projection(reqs, device_ms)
            impact = projection["p50_ms"][0] - projection["p50_ms"][1]
            note = None
        severity, reason = assess_severity(impact, p50_latency(reqs), projection)
        return Finding(
            rule=self.id, route=route, stage=name, function=None,
            severity=severity, severity_reason=reason, impact_ms=impact,
            evidence=evidence, fix_title=FIX_TITLE,
            fix_code=FIX_CODE + ("# projected: each request less half its device time (memory-bound "
                                 "kernels move half the bytes): an upper bound on the gain\n"
                                 if projection is not None else ""),
            projection=projection, projection_note=note,
        )  # fmt: skip


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _projection(reqs: list[RequestRecord], device_ms: dict[int, float]) -> dict[str, Any]:
    before = sorted(r.wall_ms for r in reqs)
    after = sorted(max(0.0, r.wall_ms - device_ms.get(id(r), 0.0) / 2) for r in reqs)
    span_s = (max(r.end_ns for r in reqs) - min(r.start_ns for r in reqs)) / 1e9
    rps = len(reqs) / span_s if span_s > 0 else 0.0
    return {
        "p50_ms": [percentile(before, 0.5), percentile(after, 0.5)],
        "p95_ms": [percentile(before, 0.95), percentile(after, 0.95)],
        "throughput_rps": [rps, rps],
        "model": {"method": "halved device time", "bound": "upper"},
    }
