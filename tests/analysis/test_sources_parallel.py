"""The parallel reader of large OTLP JSON Lines files gives exactly what one pass gives.

The workers are real processes; the windows are made small and the byte ranges many, so
that most traces near a boundary straddle it, some traces are spread far apart, others have
no root, arrive late or repeat span ids.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import gen_traces
from tracekit import semconv
from tracekit.analysis import api
from tracekit.analysis.assembly.grouping import assemble
from tracekit.analysis.readers import parallel as parallel_reader
from tracekit.analysis.readers import read_spans
from tracekit.analysis.readers.parallel import Settings, analyze_plan, plan_file, worker_count
from tracekit.analysis.slo import parse_slo
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import ConfigurationError, TraceFormatError


def one_pass(path: Path, settings: Settings) -> tuple[Aggregator, dict[str, Any]]:
    """What one pass finds in ``path``, without the pipeline the workers share: read_spans ->
    assemble -> Aggregator, counting spans and services and filtering routes here."""
    agg = Aggregator(slo=settings.slo, sample_size=settings.sample_size)
    stream = read_spans(path)
    spans = list(stream)
    matched: dict[str, None] = {}
    for req in assemble(spans, max_open_traces=settings.max_open_traces,
                        flush_after=settings.flush_after):  # fmt: skip
        if settings.route is None or settings.route in (req.route, req.route.partition(" ")[2]):
            matched[req.route] = None
            agg.add(req)
        else:
            agg.add(req, counted=False)
    stats = stream.stats
    return agg, {
        "spans": len(spans),
        "services": sorted({span.service for span in spans} - {""}),
        "matched": list(matched),
        "stats": (stats.format, stats.skipped, stats.truncated, stats.reasons),
    }


def in_parallel(path: Path, settings: Settings, workers: int) -> tuple[Aggregator, dict[str, Any]]:
    plan = plan_file(str(path), str(path), workers=workers, min_range_bytes=1)
    assert plan is not None and len(plan.bounds) == workers + 1
    agg, found = analyze_plan(plan, settings)
    stats = found.stats
    return agg, {
        "spans": found.spans,
        "services": sorted(found.services),
        "matched": found.matched,
        "stats": (stats.format, stats.skipped, stats.truncated, stats.reasons),
    }


def same(path: Path, settings: Settings, workers: int) -> Aggregator:
    expected_agg, expected = one_pass(path, settings)
    got_agg, got = in_parallel(path, settings, workers)
    assert got == expected
    assert got_agg.requests == expected_agg.requests > 0
    assert got_agg.routes() == expected_agg.routes()
    assert got_agg.sample() == expected_agg.sample()
    assert got_agg.slowest == expected_agg.slowest
    assert got_agg.instrumented == expected_agg.instrumented
    return got_agg


SMALL = Settings(slo=parse_slo("ttft=300ms,e2e=2s"), route=None, max_open_traces=60,
                 flush_after=40, sample_size=150)  # fmt: skip


def test_generated_traces_in_three_ranges(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 12_000, batch_size=64)
    agg = same(path, SMALL, workers=3)
    assert agg.requests > 2_000


# --- messy files ----------------------------------------------------------------------------
def messy_file(path: Path, seed: int, traces: int = 300) -> Path:
    """OTLP JSON Lines of traces whose spans come spread out, late, rootless, repeated."""
    g = gen_traces()
    rng = random.Random(seed)
    placed: list[tuple[float, int, dict[str, Any]]] = []
    for t in range(traces):
        trace = f"{rng.getrandbits(128) | 1:032x}"
        root = f"{rng.getrandbits(64) | 1:016x}"
        start = 1_767_225_600 * 10**9 + t * 7_000_000
        route = rng.choice(["/a", "/b", "/c"])
        spans = []
        if rng.random() < 0.85:  # some traces lost their root
            attrs = {semconv.HTTP_ROUTE: route, semconv.HTTP_REQUEST_METHOD: "GET",
                     semconv.CPU_MS: rng.uniform(0, 5), semconv.CHUNKS: rng.choice([1, 9]),
                     semconv.TTFT_MS: rng.uniform(10, 400)}  # fmt: skip
            kind = "server" if rng.random() < 0.8 else "internal"
            spans.append(g.otlp_span(trace, root, None, f"GET {route}", kind, start,
                                     start + rng.randint(10**6, 10**9), attrs))  # fmt: skip
        ids = [root]
        for c in range(rng.randint(0, 6)):
            child = f"{rng.getrandbits(64) | 1:016x}"
            parent = rng.choice([*ids, f"{rng.getrandbits(64) | 1:016x}"])
            name = rng.choice(["tokenize", "model", "serialize", "db"])
            attrs = {semconv.STAGE: name, semconv.CPU_MS: rng.uniform(0, 3),
                     semconv.WAIT_MS: rng.uniform(0, 30), semconv.ON_LOOP: rng.random() < 0.7,
                     semconv.MAX_BLOCK_MS: rng.uniform(0, 9),
                     semconv.LOOP_SLICES_US: [0, rng.randint(1000, 9000)]}  # fmt: skip
            kind = rng.choice(["internal", "internal", "client", "server"])
            b = start + c * 1_000_000
            spans.append(g.otlp_span(trace, child, parent, name, kind, b, b + 5_000_000,
                                     attrs if name != "db" else {}))  # fmt: skip
            ids.append(child)
        if spans and rng.random() < 0.05:
            spans.append(dict(spans[-1]))  # a repeated span id
        for span in spans:
            # Mostly close together, sometimes far later than any window.
            late = rng.expovariate(1 / 200) if rng.random() < 0.1 else rng.expovariate(1 / 8)
            placed.append((t * 4 + late, len(placed), span))
    placed.sort()
    lines, i = [], 0
    while i < len(placed):
        n = rng.randint(1, 30)
        lines.append(orjson.dumps(g.traces_data([s for _, _, s in placed[i : i + n]],
                                                service=rng.choice(["gw", "gw", "db"]))))  # fmt: skip
        i += n
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize(("seed", "workers"), [(1, 2), (2, 3), (3, 5), (4, 8)])
def test_messy_traces_straddling_every_boundary(tmp_path: Path, seed: int, workers: int) -> None:
    # With 8 workers, ranges are shorter than a window's reach: all of a range waits for
    # its neighbour's state.
    same(messy_file(tmp_path / "m.jsonl", seed), SMALL, workers)


def test_default_windows_and_a_route_filter(tmp_path: Path) -> None:
    path = messy_file(tmp_path / "m.jsonl", 7, traces=600)
    settings = Settings(slo=None, route="/b")
    agg = same(path, settings, workers=3)
    assert {r["route"] for r in agg.routes()} == {"GET /b"}


def test_malformed_spans_are_skipped_and_named_as_in_one_pass(tmp_path: Path) -> None:
    path = messy_file(tmp_path / "m.jsonl", 11)
    lines = path.read_bytes().splitlines()
    for i in (3, len(lines) // 2, len(lines) - 2):
        lines[i] = lines[i].replace(b'"traceId":"', b'"traceId":"zz', 1)  # one bad id
    path.write_bytes(b"\n".join(lines) + b"\n")
    agg, found = in_parallel(path, SMALL, workers=3)
    assert found["stats"][1] == 3 and "line" in found["stats"][3][-1]
    same(path, SMALL, workers=3)


def test_a_byte_order_mark_blank_lines_and_no_final_newline(tmp_path: Path) -> None:
    path = messy_file(tmp_path / "m.jsonl", 13)
    lines = path.read_bytes().splitlines()
    for i in (5, len(lines) // 3, len(lines) // 2):
        lines.insert(i, b"   \r")
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines))
    same(path, SMALL, workers=4)


def test_a_bad_line_fails_with_the_message_of_one_pass(tmp_path: Path) -> None:
    path = messy_file(tmp_path / "m.jsonl", 12)
    lines = path.read_bytes().splitlines()
    lines[len(lines) * 2 // 3] = b'{"resourceSpans": [{"scopeSpans": [oops'
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceFormatError) as single:
        one_pass(path, SMALL)
    with pytest.raises(TraceFormatError) as parallel:
        in_parallel(path, SMALL, workers=3)
    assert str(parallel.value) == str(single.value)
    assert f"line {len(lines) * 2 // 3 + 1}" in str(parallel.value)


def test_analyze_uses_the_workers_and_reports_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(path, 6_000)
    monkeypatch.setattr(parallel_reader, "MIN_RANGE_BYTES", 1)
    monkeypatch.setenv(parallel_reader.ENV_WORKERS, "1")
    single = api.analyze(path, slo="ttft=500ms")
    monkeypatch.setenv(parallel_reader.ENV_WORKERS, "3")
    calls: list[Any] = []
    real = parallel_reader.analyze_plan
    monkeypatch.setattr(parallel_reader, "analyze_plan", lambda *a: calls.append(a) or real(*a))
    parallel = api.analyze(path, slo="ttft=500ms")
    assert len(calls) == 1 and len(calls[0][0].bounds) == 4
    assert parallel.to_dict() == single.to_dict()
    assert parallel.findings and parallel.warnings == single.warnings
    with pytest.raises(ConfigurationError, match="no request has route"):
        api.analyze(path, route="/nowhere")


# --- when not to split ----------------------------------------------------------------------
def test_only_large_uncompressed_otlp_json_lines_are_split(tmp_path: Path) -> None:
    lines = tmp_path / "t.jsonl"
    gen_traces().write_jsonl(lines, 2_000, batch_size=16)
    assert plan_file(str(lines), "t", workers=4, min_range_bytes=1) is not None
    assert plan_file(str(lines), "t", workers=1, min_range_bytes=1) is None
    assert plan_file(str(lines), "t", workers=4) is None  # smaller than two ranges
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(lines.read_bytes()))
    one_doc = tmp_path / "one.json"
    one_doc.write_bytes(lines.read_bytes().splitlines()[0] + b"\n")
    jaeger = tmp_path / "j.jsonl"
    jaeger.write_bytes(b'{"data": []}\n' * 3)
    pretty = tmp_path / "p.json"
    pretty.write_bytes(orjson.dumps(orjson.loads(one_doc.read_bytes()), option=orjson.OPT_INDENT_2))
    for path in (packed, one_doc, jaeger, pretty, tmp_path / "missing.jsonl", tmp_path):
        assert plan_file(str(path), "x", workers=4, min_range_bytes=1) is None


def test_worker_count_from_argument_environment_or_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(parallel_reader.ENV_WORKERS, raising=False)
    assert worker_count(3) == 3 and worker_count(0) == 1 and worker_count() >= 1
    monkeypatch.setenv(parallel_reader.ENV_WORKERS, "2")
    assert worker_count() == 2
    monkeypatch.setenv(parallel_reader.ENV_WORKERS, "many")
    with pytest.warns(UserWarning, match="TRACEKIT_ANALYZE_WORKERS"):
        assert worker_count() >= 1
