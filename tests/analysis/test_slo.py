"""SLO parsing and the per-request meaning of each target."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.factories import request
from tracekit.analysis.slo import SLO, parse_slo, request_itl_ms, request_tpot_ms
from tracekit.errors import ConfigurationError


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("ttft=500ms,itl=50ms,e2e=5s", SLO(ttft_ms=500.0, itl_ms=50.0, e2e_ms=5000.0)),
        (" TTFT = 0.5s , tpot=20ms ", SLO(ttft_ms=500.0, tpot_ms=20.0)),
        ("e2e=1500us,", SLO(e2e_ms=1.5)),
        ("itl=2.5e1ms", SLO(itl_ms=25.0)),
        ({"ttft": "250ms", "e2e_ms": 900}, SLO(ttft_ms=250.0, e2e_ms=900.0)),
        (None, None),
    ],
)
def test_valid_specs(spec: Any, expected: SLO | None) -> None:
    assert parse_slo(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty SLO"),
        ("ttft", "expected KEY=VALUE"),
        ("ttft=5", "with a unit"),
        ("ttft=5h", "with a unit"),
        ("latency=5ms", "unknown SLO key 'latency'"),
        ("ttft=0ms", "positive"),
        ("ttft=1ms,ttft=2ms", "given twice"),
        ("ttft=abc", "bad SLO value 'abc'"),
        ({"e2e": True}, "bad SLO value"),
        ({"e2e": float("inf")}, "positive, finite"),
        (42, "must be a string"),
    ],
)
def test_bad_specs_are_one_line_configuration_errors(spec: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        parse_slo(spec)
    assert "\n" not in str(info.value)


def test_e2e_and_ttft_with_their_fallbacks() -> None:
    slo = SLO(ttft_ms=100.0, e2e_ms=300.0)
    assert slo.meets(request("r", 0, 300, ttft_ms=90.0))
    assert not slo.meets(request("r", 0, 301, ttft_ms=90.0))
    assert not slo.meets(request("r", 0, 200, ttft_ms=101.0))
    assert slo.meets(request("r", 0, 200, ttfb_ms=99.0))  # no TTFT: time to first byte
    assert not slo.meets(request("r", 0, 200))  # neither: the whole body is the first token


def test_itl_and_tpot_apply_to_streamed_requests_only() -> None:
    slo = SLO(itl_ms=20.0, tpot_ms=10.0)
    assert slo.meets(request("r", 0, 500, chunks=1, itl_p95_ms=99.0))
    assert not slo.meets(request("r", 0, 100, chunks=5, itl_p95_ms=21.0))
    assert not slo.meets(request("r", 0, 100, chunks=5, itl_max_ms=21.0))  # p95 missing
    assert slo.meets(request("r", 0, 100, chunks=5, itl_p95_ms=15.0, itl_max_ms=80.0))
    # (100 - 40) / (5 - 1) = 15 ms per output chunk > 10.
    assert not slo.meets(request("r", 0, 100, chunks=5, ttft_ms=40.0))
    assert slo.meets(request("r", 0, 100, chunks=5, ttft_ms=40.0, tpot_ms=9.0))


def test_request_tpot() -> None:
    assert request_tpot_ms(request("r", 0, 100, chunks=5, ttft_ms=40.0)) == 15.0
    assert request_tpot_ms(request("r", 0, 100, chunks=1, ttft_ms=40.0)) is None
    assert request_tpot_ms(request("r", 0, 100, chunks=3)) is None


def test_request_itl_is_the_p95_gap_else_the_longest() -> None:
    assert request_itl_ms(request("r", 0, 100, chunks=5, itl_p95_ms=21.0, itl_max_ms=80.0)) == 21.0
    assert request_itl_ms(request("r", 0, 100, chunks=5, itl_max_ms=80.0)) == 80.0
    assert request_itl_ms(request("r", 0, 100, chunks=5)) is None


def test_to_dict_names_every_target_in_ms() -> None:
    assert parse_slo("ttft=1s").to_dict() == {  # type: ignore[union-attr]
        "ttft_ms": 1000.0,
        "itl_ms": None,
        "e2e_ms": None,
        "tpot_ms": None,
    }
