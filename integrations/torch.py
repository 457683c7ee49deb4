"""torch: CPU against GPU inside an in-process model call.

One line::

    from tracekit.integrations.torch import instrument
    model = instrument(model)          # a torch.nn.Module; returns it, forward wrapped

Each ``forward`` call made while a request is recorded adds to the innermost ``model``
stage (or, when none is open, runs in a ``model`` stage of its own):

- ``tracekit.torch.module``, ``.device``, ``.dtype`` (of its floating-point parameters, by
  bytes), ``.param_bytes`` (parameters and buffers);
- ``tracekit.torch.calls``; ``tracekit.torch.launch_ms``: the host CPU time spent inside
  ``forward`` (on CUDA: mostly launching kernels; on CPU: the computation itself);
- on CUDA, ``tracekit.torch.device_ms``: GPU time between two CUDA events recorded around
  each ``forward``, read once the events have completed (checked, never waited for, at the
  next ``forward`` and after each synchronizing call below): a forward whose work is still
  running when the stage's last synchronizing call returned is not counted;
- on CUDA, ``tracekit.torch.sync_ms``: wall time inside the calls that wait for the device
  (``torch.cuda.synchronize``, ``Tensor.item``, ``Tensor.tolist``, ``Tensor.cpu``) made in a
  stage where an instrumented CUDA module ran. These are wrapped process-wide the first time
  a CUDA module is instrumented; outside such stages the wrapper costs one context lookup.

The analyzer reads these (rule ``fp32-weights``: a CUDA model held in float32).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, TypeVar

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test
    raise ImportError(
        "tracekit.integrations.torch needs torch: pip install 'tracekit[torch]'"
    ) from exc

import tracekit
from tracekit import semconv
from tracekit._core import clock
from tracekit._core.current import get_ledger
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import REQUEST, Ledger

__all__ = ["instrument"]

M = TypeVar("M", bound="torch.nn.Module")
MS: Final = 1e6
#: Event pairs kept per stage waiting to complete (a stage making more forwards than this
#: between two synchronizations counts the oldest as they complete, drops the rest).
MAX_PENDING: Final = 4096


def _device_of(module: torch.nn.Module) -> str:
    # The device of the module's first parameter (or buffer): where forward runs.
    for param in module.parameters():
        return str(param.device)
    for buffer in module.buffers():
        return str(buffer.device)
    return "cpu"


def _new_event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def describe(module: torch.nn.Module) -> dict[str, Any]:
    """The module's attributes: class name, device, dominant floating dtype, bytes held."""
    by_dtype: dict[str, int] = {}
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        size = tensor.numel() * tensor.element_size()
        total += size
        if tensor.is_floating_point():
            name = str(tensor.dtype).removeprefix("torch.")
            by_dtype[name] = by_dtype.get(name, 0) + size
    attrs: dict[str, Any] = {semconv.TORCH_MODULE: type(module).__name__,
                             semconv.TORCH_DEVICE: _device_of(module),
                             semconv.TORCH_PARAM_BYTES: total}  # fmt: skip
    if by_dtype:
        attrs[semconv.TORCH_DTYPE] = max(by_dtype, key=lambda k: (by_dtype[k], k))
    return attrs


# Event pairs of CUDA forwards waiting to complete, per stage ledger (id -> ledger, pairs).
_pending: dict[int, tuple[Ledger, list[tuple[Any, Any]]]] = {}


def _add(led: Ledger, key: str, value: float) -> None:
    attrs = led.attributes
    led.set_attribute(key, (attrs.get(key, 0.0) if attrs else 0.0) + value)


def _settle(led: Ledger) -> None:
    """Add the device time of ``led``'s completed event pairs (never waits)."""
    entry = _pending.get(id(led))
    if entry is None or entry[0] is not led:
        return
    pairs = entry[1]
    done = 0
    for start, end in pairs:
        if not end.query():
            break
        _add(led, semconv.TORCH_DEVICE_MS, float(start.elapsed_time(end)))
        done += 1
    del pairs[:done]
    if not pairs:
        del _pending[id(led)]


def _forget_closed() -> None:
    for key, (led, _) in list(_pending.items()):
        if led.end:  # the stage closed: what is left was never synchronized on
            del _pending[key]


def _torch_stage() -> Ledger | None:
    # The innermost open stage, when it ran an instrumented CUDA module.
    led = get_ledger()
    if led is None or led.site is REQUEST or not led.attributes:
        return None
    device = led.attributes.get(semconv.TORCH_DEVICE)
    return led if isinstance(device, str) and device.startswith("cuda") else None


def _timed_sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def synchronizing(*args: Any, **kwargs: Any) -> Any:
        led = _torch_stage()
        if led is None:
            return fn(*args, **kwargs)
        t0 = clock.wall_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                _add(led, semconv.TORCH_SYNC_MS, (clock.wall_ns() - t0) / MS)
                _settle(led)
            except Exception:
                internal_error("torch sync")

    synchronizing.__tracekit_sync__ = True  # type: ignore[attr-defined]
    return synchronizing


def _wrap_syncs() -> None:
    """Time the calls that wait for the device (once per process)."""
    if getattr(torch.cuda.synchronize, "__tracekit_sync__", False):
        return
    torch.cuda.synchronize = _timed_sync(torch.cuda.synchronize)
    for name in ("item", "tolist", "cpu"):
        setattr(torch.Tensor, name, _timed_sync(getattr(torch.Tensor, name)))


def instrument(module: M, *, stage: str = "model") -> M:
    """Record what ``module``'s forward calls cost (see the module docstring); returns it.

    Args:
        module: a ``torch.nn.Module``; its ``forward`` is wrapped on the instance.
        stage: the stage a forward call runs in when no stage of kind ``model`` is open.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"instrument() takes a torch.nn.Module, got {type(module).__name__}")
    forward = module.forward
    if getattr(forward, "__tracekit_forward__", False):
        return module
    own_stage = tracekit.stage(stage, kind=semconv.KIND_MODEL)
    described: list[dict[str, Any]] = []

    def timed(led: Ledger, args: Any, kwargs: Any) -> Any:
        try:
            if not described:
                described.append(describe(module))
                if str(described[0][semconv.TORCH_DEVICE]).startswith("cuda"):
                    _wrap_syncs()
            attrs = described[0]
            cuda = str(attrs[semconv.TORCH_DEVICE]).startswith("cuda")
            if not led.attributes or semconv.TORCH_MODULE not in led.attributes:
                for key, value in attrs.items():  # once per stage
                    led.set_attribute(key, value)
            start = end = None
            if cuda:
                _settle(led)
                start, end = _new_event(), _new_event()
                start.record()
            c0 = clock.cpu_ns()
        except Exception:
            internal_error("torch forward start")
            return forward(*args, **kwargs)
        out = forward(*args, **kwargs)
        try:
            launch = clock.cpu_ns() - c0
            if cuda:
                end.record()  # type: ignore[union-attr]
                _forget_closed()
                pairs = _pending.setdefault(id(led), (led, []))[1]
                if len(pairs) < MAX_PENDING:
                    pairs.append((start, end))
            _add(led, semconv.TORCH_LAUNCH_MS, launch / MS)
            calls = led.attributes.get(semconv.TORCH_CALLS, 0) if led.attributes else 0
            led.set_attribute(semconv.TORCH_CALLS, calls + 1)
        except Exception:
            internal_error("torch forward end")
        return out

    @functools.wraps(forward)
    def traced_forward(*args: Any, **kwargs: Any) -> Any:
        led = get_ledger()
        if led is None or led.request is None:
            return forward(*args, **kwargs)  # nothing recorded
        if led.site is REQUEST or led.site.kind != semconv.KIND_MODEL:
            with own_stage:
                inner = get_ledger()
                if inner is None or inner is led:
                    return forward(*args, **kwargs)
                return timed(inner, args, kwargs)
        return timed(led, args, kwargs)

    traced_forward.__tracekit_forward__ = True  # type: ignore[attr-defined]
    module.forward = traced_forward
    return module
