"""Service-level objectives and goodput.

An SLO is a set of latency targets, given on the command line as ``ttft=500ms,itl=50ms,e2e=5s``
(units ``us``, ``ms``, ``s``; a unit is required so that ``e2e=5`` cannot silently mean 5 ms).
A request is *good* only if it meets every target that was given; **goodput** is the number of
good requests per second of the observed window, and the fraction of requests that were good.

Per-request meaning of each key (the spans carry per-request summaries, not every chunk):

=======  ======================================================================================
key      a request meets it when ...
=======  ======================================================================================
``e2e``  its wall time (request start to last body byte) is at most the target.
``ttft`` its time to first token (``tracekit.ttft_ms``) is at most the target. A request with no
         TTFT attribute (not streamed, or not instrumented) uses its time to first byte, else its
         wall time: for a one-chunk body the first token arrives with the whole body.
``itl``  the 95th percentile of its own inter-chunk gaps (``tracekit.itl_p95_ms``) is at most the
         target; one slow gap in twenty is tolerated, a stall that recurs is not. Falls back to
         ``itl_max_ms``. A request with fewer than two chunks has no gap and meets it.
``tpot`` its time per output token, ``(last chunk - first chunk) / (chunks - 1)``, is at most the
         target (vLLM's per-request TPOT goodput). Fewer than two chunks: met.
=======  ======================================================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracekit.analysis.model import RequestRecord
from tracekit.errors import ConfigurationError

_KEYS = ("ttft", "itl", "e2e", "tpot")
_UNITS_MS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)\s*$")


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets in milliseconds; ``None`` means no target on that metric."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None

    def meets(self, req: RequestRecord) -> bool:
        """Whether ``req`` meets every target of this SLO.

        Args:
            req: an assembled request.

        Returns:
            True when no given target is exceeded (see the module docstring for each key).
        """
        if self.e2e_ms is not None and req.wall_ms > self.e2e_ms:
            return False
        if self.ttft_ms is not None and _ttft(req) > self.ttft_ms:
            return False
        streamed = req.chunks is not None and req.chunks > 1
        if self.itl_ms is not None and streamed:
            itl = request_itl_ms(req)
            if itl is not None and itl > self.itl_ms:
                return False
        if self.tpot_ms is not None and streamed:
            tpot = request_tpot_ms(req)
            if tpot is not None and tpot > self.tpot_ms:
                return False
        return True

    def to_dict(self) -> dict[str, float | None]:
        """The report's ``slo`` object: ``{"ttft_ms", "itl_ms", "e2e_ms", "tpot_ms"}``."""
        return {
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "e2e_ms": self.e2e_ms,
            "tpot_ms": self.tpot_ms,
        }


def _ttft(req: RequestRecord) -> float:
    if req.ttft_ms is not None:
        return req.ttft_ms
    if req.ttfb_ms is not None:
        return req.ttfb_ms
    return req.wall_ms


def request_itl_ms(req: RequestRecord) -> float | None:
    """The inter-chunk latency one streamed request is judged by (the ``itl`` target, the
    report's ``streaming.itl_ms``): its p95 gap (``tracekit.itl_p95_ms``), else its longest
    (``tracekit.itl_max_ms``), else ``None``."""
    return req.itl_p95_ms if req.itl_p95_ms is not None else req.itl_max_ms


def request_tpot_ms(req: RequestRecord) -> float | None:
    """Time per output token of one streamed request, in ms.

    Args:
        req: an assembled request.

    Returns:
        ``tracekit.tpot_ms`` when recorded, else ``(wall - ttft) / (chunks - 1)`` (the request
        span ends when the last chunk leaves), else ``None`` (fewer than two chunks).
    """
    if req.tpot_ms is not None:
        return req.tpot_ms
    if req.chunks is None or req.chunks < 2 or req.ttft_ms is None:
        return None
    return max(0.0, req.wall_ms - req.ttft_ms) / (req.chunks - 1)


def parse_slo(spec: str | Mapping[str, Any] | SLO | None) -> SLO | None:
    """Parse an SLO given as ``"ttft=500ms,itl=50ms,e2e=5s"`` or as a mapping.

    Args:
        spec: the text form; or a mapping with keys ``ttft``/``itl``/``e2e``/``tpot`` (values
            like ``"500ms"`` or numbers in ms) or the same keys suffixed ``_ms``; an
            :class:`SLO` (returned as is); or ``None``.

    Returns:
        The :class:`SLO`, or ``None`` when ``spec`` is ``None``.

    Raises:
        ConfigurationError: unknown key, repeated key, missing unit, bad or non-positive number,
            or an empty spec; the message is one line naming the culprit.
    """
    if spec is None or isinstance(spec, SLO):
        return spec
    if isinstance(spec, str):
        items = _split(spec)
    elif isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        raise ConfigurationError(f"SLO must be a string like 'ttft=500ms,e2e=5s', not {spec!r}")
    targets: dict[str, float] = {}
    for key, value in items:
        name = key.strip().lower().removesuffix("_ms")
        if name not in _KEYS:
            raise ConfigurationError(f"unknown SLO key {key!r}; use {', '.join(_KEYS)}")
        if name in targets:
            raise ConfigurationError(f"SLO key {name!r} given twice")
        targets[name] = _to_ms(value)
    if not targets:
        raise ConfigurationError("empty SLO; give e.g. 'ttft=500ms,itl=50ms,e2e=5s'")
    return SLO(**{f"{k}_ms": v for k, v in targets.items()})


def _split(spec: str) -> list[tuple[str, str]]:
    items = []
    for part in spec.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigurationError(
                f"bad SLO item {part.strip()!r}; expected KEY=VALUE like ttft=500ms"
            )
        items.append((key, value))
    return items


def _to_ms(value: Any) -> float:
    # Numbers only come from a mapping (the Python API), where they are ms like every
    # duration in tracekit; text must carry its unit.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ms = float(value)
    elif isinstance(value, str):
        match = _VALUE.match(value)
        if match is None:
            raise ConfigurationError(
                f"bad SLO value {value.strip()!r}; "
                "expected a number with a unit (us, ms, s), e.g. 500ms"
            )
        ms = float(match.group(1)) * _UNITS_MS[match.group(2)]
    else:
        raise ConfigurationError(f"bad SLO value {value!r}; expected e.g. '500ms'")
    if not math.isfinite(ms) or ms <= 0:
        raise ConfigurationError(f"SLO value {value!r} must be a positive, finite duration")
    return ms
