"""The replay's figures on fixed inputs stay what they were before its speed-ups.

The replay was made faster (the engine's event loop, programs reused across fixes, the
arrivals and loop checks computed once per sample): none of that may change a figure. The
expected values below were produced by the replay as of commit 9c13643 (before those
changes) on the seeded traces built here; a change to the *model* (not to its speed) is
expected to update them, and should say so: ``open_two_routes`` was re-recorded when open
arrivals became Poisson gaps within the loop's busy periods (its as-recorded p95 error went
from +6.0% to +0.0%).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.analysis.factories import Job, Op, simulate_gateway
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix, ReplayConfig, Replayer

CHAT = "POST /v1/chat/completions"
EMBED = "POST /v1/embeddings"
KINDS = {"model": "model", "guardrail": "guardrail", "tokenize": "tokenize"}


def _open_two_routes() -> list[RequestRecord]:
    """Poisson arrivals on two routes sharing the loop; streamed chat with a guardrail."""
    rng = random.Random(11)
    t, jobs = 0.0, []
    for _ in range(500):
        t += rng.expovariate(45 / 1000.0)
        if rng.random() < 0.8:
            chunks = [Op("wait", 8 + 4 * rng.random(), "model", chunk=True) for _ in range(6)]
            ops = [
                Op("cpu", 0.3),
                Op("cpu", 4 + 8 * rng.random(), "tokenize"),
                Op("cpu", 0.6, "guardrail"),
                Op("wait", 20 + 10 * rng.random(), "guardrail"),
                Op("model", 60 + 60 * rng.random(), "model"),
                *chunks,
                Op("cpu", 1.5 + rng.random(), "serialize"),
            ]
            jobs.append(Job(CHAT, ops, t, kinds=KINDS))
        else:
            ops = [Op("cpu", 0.2), Op("cpu", 10 + 10 * rng.random(), "tokenize")]
            jobs.append(Job(EMBED, ops, t, kinds=KINDS))
    return simulate_gateway(jobs)


def _closed(**kw: Any) -> list[RequestRecord]:
    """Closed loop, 10 clients: a thread stage, a model call, a serializer."""
    rng = random.Random(5)
    jobs = [
        Job(
            CHAT,
            [
                Op("cpu", 0.3),
                Op("thread", 5 + 5 * rng.random(), "tokenize"),
                Op("model", 40 + 20 * rng.random(), "model"),
                Op("cpu", 2 + rng.random(), "serialize"),
            ],
            kinds=KINDS,
        )
        for _ in range(200)
    ]
    return simulate_gateway(jobs, clients=10, **kw)


def _figures(records: list[RequestRecord], fixes: list[Fix]) -> dict[str, Any]:
    replayer = Replayer(ReplayConfig(thread_pool_size=6, cores=2))
    validation = replayer.validate(records)
    projections = [replayer.project(records, fix) for fix in fixes]
    return {
        "validation": [validation.ok, validation.p50_error, validation.p95_error],
        # The figures only: the range and the model statement (added later) are tested apart.
        "projections": [_figures_of(projection) or note for projection, note in projections],
    }


def _figures_of(projection: dict[str, Any] | None) -> dict[str, Any] | None:
    if projection is None:
        return None
    return {key: projection[key] for key in ("p50_ms", "p95_ms", "throughput_rps")}


CASES = {
    "open_two_routes": (
        _open_two_routes,
        [
            Fix("thread", CHAT, "tokenize", gil_free=True),
            Fix("process", EMBED, "tokenize", report_route=CHAT),
            Fix("shrink", CHAT, "serialize", factor=0.05),
            Fix("gather", CHAT, "guardrail", other="model"),
            Fix("process", CHAT, None),
            Fix("thread", EMBED, "tokenize"),
        ],
    ),
    "closed_lock": (
        lambda: _closed(locked_stage="model"),
        [
            Fix("model_overlap", CHAT, "model", queue="outside"),
            Fix("model_overlap", CHAT, "model", queue="outside", capacity=2),
            Fix("shrink", CHAT, "serialize", factor=0.05),
        ],
    ),
    "closed_server": (
        lambda: _closed(servers={"model": 1}),
        [
            Fix("model_overlap", CHAT, "model", queue="inside"),
            Fix("process", CHAT, "serialize"),
        ],
    ),
}


def _close(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_close(actual[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return len(actual) == len(expected) and all(map(_close, actual, expected))
    if isinstance(expected, float):
        return bool(actual == pytest.approx(expected, rel=1e-9, abs=1e-9))
    return bool(actual == expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_replay_figures_are_unchanged_by_the_speed_ups(case: str) -> None:
    build, fixes = CASES[case]
    actual = _figures(build(), fixes)
    assert _close(actual, EXPECTED[case]), actual


EXPECTED: dict[str, dict[str, Any]] = {
    "open_two_routes": {
        "validation": [True, 0.0037174716075205616, 1.7763568394002505e-15],
        "projections": [
            {"p50_ms": [189.688, 184.837], "p95_ms": [221.353, 219.232], "throughput_rps": [37.265, 37.265]},
            {"p50_ms": [189.688, 186.012], "p95_ms": [221.353, 218.506], "throughput_rps": [37.265, 37.265]},
            {"p50_ms": [189.688, 187.704], "p95_ms": [221.353, 218.531], "throughput_rps": [37.265, 37.27]},
            {"p50_ms": [189.688, 160.477], "p95_ms": [221.353, 194.967], "throughput_rps": [37.265, 37.363]},
            {"p50_ms": [189.688, 191.465], "p95_ms": [221.353, 222.942], "throughput_rps": [37.265, 37.265]},
            {"p50_ms": [15.515, 24.568], "p95_ms": [19.847, 46.038], "throughput_rps": [10.512, 10.506]},
        ],
    },
    "closed_lock": {
        "validation": [True, 1.1102230246251565e-15, 6.661338147750939e-16],
        "projections": [
            {"p50_ms": [500.407, 62.367], "p95_ms": [535.99, 72.771], "throughput_rps": [19.89, 151.783]},
            {"p50_ms": [500.407, 249.509], "p95_ms": [535.99, 271.029], "throughput_rps": [19.89, 39.652]},
            {"p50_ms": [499.73, 497.428], "p95_ms": [532.925, 530.933], "throughput_rps": [19.877, 19.966]},
        ],
    },
    "closed_server": {
        "validation": [True, 2.220446049250313e-16, 6.661338147750939e-16],
        "projections": [
            {"p50_ms": [500.407, 61.463], "p95_ms": [535.99, 70.635], "throughput_rps": [19.89, 155.523]},
            {"p50_ms": [499.73, 499.73], "p95_ms": [532.925, 532.925], "throughput_rps": [19.877, 19.877]},
        ],
    },
}
