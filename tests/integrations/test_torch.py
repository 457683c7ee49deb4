"""The torch integration on a real gateway (uvicorn on 127.0.0.1, ``tracekit.record()``) with
a tiny model built from a config in code, on CPU; the CUDA path with a test double for the
device and its events; the ``fp32-weights`` rule on what they record."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import tracekit  # noqa: E402
from tests.conftest import Server, settled  # noqa: E402
from tracekit import semconv  # noqa: E402
from tracekit.integrations import torch as traced_torch  # noqa: E402


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 64
    dim: int = 32
    layers: int = 2


class TinyLM(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(config.vocab, config.dim)
        layers = range(config.layers)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(config.dim, config.dim) for _ in layers)
        self.head = torch.nn.Linear(config.dim, config.vocab)

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids)
        for block in self.blocks:
            x = torch.nn.functional.gelu(block(x))
        return self.head(x)


STEPS = 4


def _gateway(model: Any) -> Any:
    @tracekit.stage("model")
    def generate(ids: list[int]) -> list[int]:
        with torch.no_grad():
            tokens = torch.tensor([ids])
            for _ in range(STEPS):
                nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
            return [int(t.item()) for t in tokens[0, -STEPS:]]  # reads back: a sync on CUDA

    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"ids": generate([1, 2, 3])})

    async def bare(request: Request) -> JSONResponse:  # no stage: instrument opens one
        with torch.no_grad():
            return JSONResponse({"n": int(model(torch.tensor([[1, 2]])).shape[-1])})

    return tracekit.TracekitMiddleware(Starlette(routes=[
        Route("/v1/chat", chat, methods=["POST"]), Route("/bare", bare)]))  # fmt: skip


def _run(model: Any, requests: int = 3, path: str = "/v1/chat") -> tuple[list[Any], Any]:
    server = Server(_gateway(model))
    try:
        with tracekit.record() as rec, httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(requests):
                (client.post(path) if path == "/v1/chat" else client.get(path)).raise_for_status()
            spans = settled(rec, requests)
        return [s for s in spans if s.attributes.get(semconv.STAGE) == "model"], rec
    finally:
        server.stop()


def _model() -> Any:
    torch.manual_seed(0)
    return TinyLM(TinyConfig()).eval()


def test_cpu_model_stage_records_the_module() -> None:
    model = traced_torch.instrument(_model())
    stages, rec = _run(model)
    assert len(stages) == 3
    for span in stages:
        a = span.attributes
        assert a[semconv.TORCH_MODULE] == "TinyLM"
        assert a[semconv.TORCH_DEVICE] == "cpu"
        assert a[semconv.TORCH_DTYPE] == "float32"
        params = sum(p.numel() * 4 for p in model.parameters())
        assert a[semconv.TORCH_PARAM_BYTES] == params
        assert a[semconv.TORCH_CALLS] == STEPS
        # forward's host CPU is part of the stage's CPU
        assert 0 < a[semconv.TORCH_LAUNCH_MS] <= a[semconv.CPU_MS] * 1.05 + 0.5
        assert semconv.TORCH_DEVICE_MS not in a and semconv.TORCH_SYNC_MS not in a
    assert not [f for f in rec.report().findings if f.rule == "fp32-weights"]  # CPU: no finding


def test_forward_outside_a_stage_gets_its_own_and_results_are_unchanged() -> None:
    plain = _model()
    expected = plain(torch.tensor([[5, 6, 7]]))
    model = traced_torch.instrument(_model())
    assert traced_torch.instrument(model) is model  # once
    assert torch.equal(model(torch.tensor([[5, 6, 7]])), expected)  # not recording: untouched
    stages, _ = _run(model, 2, "/bare")
    assert len(stages) == 2
    assert all(s.attributes[semconv.TORCH_CALLS] == 1 for s in stages)
    assert all(s.attributes[semconv.STAGE_KIND] == "model" for s in stages)
    with pytest.raises(TypeError):
        traced_torch.instrument(object())  # type: ignore[type-var]


class FakeEvent:
    """A CUDA event double: each (start, end) pair reads EVENT_MS apart once recorded."""

    recorded = 0

    def __init__(self) -> None:
        self.done = False

    def record(self) -> None:
        FakeEvent.recorded += 1
        self.done = True

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done
        return EVENT_MS


EVENT_MS = 2.5
SYNC_S = 0.02


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # The device and its events are doubles; the sync wrappers are the real ones, put back
    # after the test (monkeypatch restores what _wrap_syncs replaces).
    monkeypatch.setattr(traced_torch, "_device_of", lambda module: "cuda:0")
    monkeypatch.setattr(traced_torch, "_new_event", FakeEvent)
    real_item = torch.Tensor.item

    def slow_item(self: Any) -> Any:  # a read-back that waits for the "device"
        time.sleep(SYNC_S)
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "item", slow_item)
    for name in ("tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)


def test_cuda_path_with_event_double(fake_cuda: None) -> None:
    stages, rec = _run(traced_torch.instrument(_model()))
    assert len(stages) == 3
    for span in stages:
        a = span.attributes
        assert a[semconv.TORCH_DEVICE] == "cuda:0"
        assert a[semconv.TORCH_DEVICE_MS] == pytest.approx(STEPS * EVENT_MS)
        # STEPS .item() read-backs of SYNC_S each
        assert STEPS * SYNC_S * 1e3 * 0.9 <= a[semconv.TORCH_SYNC_MS] <= STEPS * SYNC_S * 1e3 * 3
    report = rec.report()
    found = [f for f in report.findings if f.rule == "fp32-weights"]
    assert len(found) == 1
    f = found[0]
    assert f.stage == "model" and "float32" in f.evidence and "TinyLM" in f.evidence
    assert "bfloat16" in f.fix_code
    before, after = f.projection["p50_ms"]
    assert before - after == pytest.approx(STEPS * EVENT_MS / 2, rel=0.3)


def test_fp32_weights_quiet_on_bf16(fake_cuda: None) -> None:
    stages, rec = _run(traced_torch.instrument(_model().to(torch.bfloat16)), 2)
    assert all(s.attributes[semconv.TORCH_DTYPE] == "bfloat16" for s in stages)
    assert not [f for f in rec.report().findings if f.rule == "fp32-weights"]


def test_missing_package_names_the_extra() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import tracekit.integrations.torch\n"
            "except ImportError as e:\n    print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'tracekit[torch]'" in out.stdout, out.stderr
