"""The loop view (``tracekit.loop`` windows) in the report, and the loop rules on synthetic
spans: ``loop-saturated``, ``gc-pauses``, ``background-on-loop``; GC pauses blamed on no stage.

The spans are built as the recorder exports them (``tests/analysis/loop_factories.py``) and go
through the whole pipeline (``analyze_spans``); every figure checked is recomputed here from
what was fed. Real spans from a served gateway: ``test_loop_view_real.py``.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import orjson
import pytest

from tests.analysis.factories import request, stage
from tests.analysis.loop_factories import loop_span, request_spans
from tests.helpers import gen_traces
from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.api import analyze_spans
from tracekit.analysis.model import RequestRecord, Span
from tracekit.analysis.pipeline import Pipeline, Settings
from tracekit.analysis.replay import Replayer
from tracekit.analysis.replay.sim import fair_rates, lone_rate
from tracekit.analysis.rules import BlockingCallOnLoop, CpuOnLoop, Rule, run_rules
from tracekit.analysis.rules.findings import RuleContext
from tracekit.analysis.rules.loop_load import _residence, queueing_projection, utilisation_factor
from tracekit.analysis.rules.loop_saturated import TARGET_BUSY
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.analysis.stats.loop_windows import LoopWindows
from tracekit.render.text import render_text

ROUTE = "POST /v1/chat"


def _windows(n: int, **kw: object) -> list[Span]:
    return [loop_span(i * 1000.0, **kw) for i in range(n)]  # type: ignore[arg-type]


def _traffic(seconds: int, rps: int, stages: list[tuple[str, float, float]], **kw: object) -> list[Span]:
    # Requests at a steady rate, each 50 ms long, loop waits growing with i (known spread).
    spans: list[Span] = []
    # One request in four carries a GC pause ``gc`` (its latency includes it).
    extra, wait, gc = (float(kw.get(k, 0.0)) for k in ("extra", "loop_wait", "gc"))  # type: ignore[arg-type]
    for i in range(seconds * rps):
        pause = gc if i % 4 == 0 else 0.0
        spans += request_spans(i * 1000.0 / rps, 50.0 + extra * (i % 5) + pause, stages,
                               loop_wait=wait * (i % 5), gc_ms=pause)  # fmt: skip
    return spans


# --- the report's loop section --------------------------------------------------------------
def test_the_loop_section_is_what_the_windows_say() -> None:
    windows = [
        loop_span(0, requests=300, gc_cpu=20, tracekit_cpu=10, background=70, gc_ms=25,
                  gc_counts=(30, 3, 0), gc_max=(4.0, 1), lag=(0.5, 2.0, 6.0), probes=100,
                  inflight=4, tasks=40),
        loop_span(1000, requests=500, gc_cpu=60, tracekit_cpu=10, background=30, gc_ms=70,
                  gc_counts=(50, 5, 1), gc_max=(41.0, 2), lag=(1.5, 9.0, 30.0), probes=100,
                  inflight=9, tasks=55),
        loop_span(2000, requests=100, background=20, lag=(0.2, 1.0, 2.0), probes=90, inflight=1),
    ]  # fmt: skip
    reqs = _traffic(3, 20, [("tokenize", 2.0, 0.0), ("guardrail", 3.0, 0.0)])
    report = analyze_spans([*windows, *reqs])
    assert report.requests == 60 and not report.warnings  # windows are neither requests nor orphans
    loop = report.to_dict()["loop"]
    assert loop["windows"] == 3
    (one,) = loop["loops"]
    assert (one["service"], one["thread"], one["processes"], one["windows"]) == (
        "gateway",
        "MainThread",
        1,
        3,
    )
    busy = [0.4, 0.6, 0.12]
    assert one["busy"]["p50"] == pytest.approx(percentile(busy, 0.5))
    assert one["busy"]["max"] == pytest.approx(0.6)
    assert one["busy_mean"] == pytest.approx(1120 / 3000)
    assert one["cpu_ms"] == pytest.approx(
        {"total": 1120, "requests": 900, "gc": 80, "tracekit": 20, "background": 120}
    )
    assert one["cpu_share"]["requests"] == pytest.approx(900 / 1120)
    assert one["cpu_share"]["background"] == pytest.approx(120 / 1120)
    gc = dict(one["gc"])
    assert gc.pop("counts") == [80, 8, 1]
    assert gc == pytest.approx({"pause_ms": 95, "share": 95 / 3000, "max_ms": 41.0, "max_generation": 2})
    # Lag over windows: median of the p50s, p95 of the p95s, the largest max.
    assert one["lag_ms"] == pytest.approx({"p50": 0.5, "p95": percentile([2.0, 9.0, 1.0], 0.95), "max": 30.0})
    assert (one["probes"], one["tasks_max"], one["inflight_max"]) == (290, 55, 9)
    (route,) = loop["routes"]
    assert route["route"] == ROUTE and route["cpu_on_loop_ms"] == pytest.approx(60 * 5.0)
    assert route["loop_cpu_share"] == pytest.approx(300 / 1120)
    text = report.to_text(width=100, color=False)
    assert "event loop gateway/MainThread" in text and "p50 40%  p95 58%  max 60%" in text
    assert "POST /v1/chat: 27% of the loop's CPU" in text
    html = report.to_html()
    assert "Event loop" in html and "MainThread" in html


def test_without_loop_windows_the_section_is_null_and_breakdown_has_gc_and_queue_wait() -> None:
    spans = request_spans(0, 80.0, [("tokenize", 2.0, 0.0)], gc_ms=6.0, queue_wait=9.0)
    spans += request_spans(100, 80.0, [("tokenize", 2.0, 0.0)])
    d = analyze_spans(spans).to_dict()
    assert d["loop"] is None
    breakdown = d["routes"][0]["breakdown_ms"]
    assert breakdown["gc"] == pytest.approx(3.0) and breakdown["queue_wait"] == pytest.approx(4.5)


def test_worker_processes_sharing_a_thread_name_are_counted() -> None:
    # Two processes' windows of the same key overlap: two loops at once.
    windows = _windows(3, requests=200) + [loop_span(i * 1000.0 + 500, requests=100) for i in range(3)]
    d = analyze_spans([*windows, *_traffic(3, 5, [("tokenize", 1.0, 0.0)])]).to_dict()
    (one,) = d["loop"]["loops"]
    assert one["processes"] == 2 and one["windows"] == 6
    # Its seconds are the processes' together (a new user read 14 s for a 7 s run).
    said = " ".join(render_text(d, width=100, color=False).split())
    assert "6 windows (6 s of loop time, all processes) · 2 processes" in said
    assert "by_process" not in one  # windows that do not name their process


def test_each_worker_process_has_its_busy_share() -> None:
    # gunicorn with two workers (a new user's trial): one 60-88% busy, the other ~17%; pooled,
    # the windows read "busy p50 18%" and hid the hot one.
    hot = [loop_span(i * 1000.0, requests=800, pid=4102) for i in range(3)]
    cold = [loop_span(i * 1000.0 + 500, requests=170, pid=4101) for i in range(3)]
    spans = [*hot, *cold, *_traffic(3, 5, [("tokenize", 1.0, 0.0)])]
    one = analyze_spans(spans).to_dict()["loop"]["loops"][0]
    assert one["by_process"] == [
        {"pid": 4102, "windows": 3, "busy_mean": pytest.approx(0.8)},
        {"pid": 4101, "windows": 3, "busy_mean": pytest.approx(0.17)},
    ]
    said = " ".join(render_text(analyze_spans(spans).to_dict(), width=100, color=False).split())
    assert "by process pid 4102 busy 80% (3 windows) · pid 4101 busy 17% (3 windows)" in said
    html = analyze_spans(spans).to_html()
    assert "by process: pid 4102 busy 80% (3 windows) · pid 4101 busy 17% (3 windows)" in html
    # The parallel reader's halves merge to the same.
    assert _merged_halves(spans).loops.to_dict()["loops"][0]["by_process"] == one["by_process"]


def _merged_halves(spans: list[Span]) -> Aggregator:
    # As the parallel reader does: each byte range's aggregator, pickled to the parent, merged.
    halves = [Pipeline(Settings()), Pipeline(Settings())]
    for part, pipeline in zip((spans[::2], spans[1::2]), halves, strict=True):
        pipeline.add(part)
        pipeline.finish()
    merged = pickle.loads(pickle.dumps(halves[0].aggregator))
    merged.merge(pickle.loads(pickle.dumps(halves[1].aggregator)))
    return merged


def test_loop_windows_merge_exactly_as_the_parallel_reader_merges_them() -> None:
    # Each byte range's pipeline has its own aggregator (pickled to the parent, merged there):
    # the merged loop view is the one a single pass gives, whatever the split.
    spans = [*_windows(6, requests=300, background=50, gc_ms=3, gc_counts=(5, 1, 0),
                       gc_max=(2.5, 0), lag=(1.0, 3.0, 7.0), probes=100, tasks=20),
             *_traffic(6, 4, [("tokenize", 2.0, 0.0)])]  # fmt: skip
    one = Pipeline(Settings())
    one.add(spans)
    one.finish()
    merged = _merged_halves(spans)
    assert merged.loops.to_dict() == one.aggregator.loops.to_dict()
    assert [w.key for w in merged.loops.windows()] == [w.key for w in one.aggregator.loops.windows()]


def test_kept_windows_are_the_earliest_whatever_the_order() -> None:
    loops = LoopWindows(max_kept=3)
    spans = _windows(6, requests=100)
    for span in reversed(spans):
        loops.offer([span])
    assert [w.start_ns for w in loops.windows()] == [s.start_ns for s in spans[:3]]
    assert len(loops) == 6  # the statistics count every window


def test_malformed_window_attributes_never_raise() -> None:
    span = loop_span(0, requests=10)
    span.attributes.update({semconv.LOOP_CPU_MS: "nan", semconv.LOOP_GC_COUNTS: "[1, x",
                            semconv.LOOP_GC_MAX_GENERATION: 7, semconv.LOOP_LAG_P95_MS: -4})  # fmt: skip
    loops = LoopWindows()
    assert loops.offer([span]) == 1
    (w,) = loops.windows()
    assert (w.cpu_ms, w.gc_counts, w.gc_max_generation, w.lag_p95_ms) == (0.0, (0, 0, 0), None, 0.0)


# --- loop-saturated ---------------------------------------------------------------------------
SHORT = [("tokenize", 3.0, 0.0), ("guardrail", 4.0, 0.0), ("render", 2.0, 0.0)]


def _saturated(stages: list[tuple[str, float, float]] = SHORT, **window: object) -> list[Span]:
    # 100 requests a second, 9 ms of on-loop CPU each: the loop 95% busy (900 requests + 50
    # untraced ms a second), with work made ready waiting 25 ms (lag p95).
    kw = {"requests": 900.0, "background": 40.0, "tracekit_cpu": 10.0, "lag": (8.0, 25.0, 60.0),
          "probes": 100, "inflight": 12, **window}  # fmt: skip
    return [*_windows(4, **kw), *_traffic(4, 100, stages, loop_wait=20.0, extra=10.0)]


def test_loop_saturated_fires_on_many_short_slices_with_its_figures() -> None:
    report = analyze_spans(_saturated())
    found = [f for f in report.findings if f.rule == "loop-saturated"]
    assert [f.rule for f in report.findings if f.rule in ("cpu-on-loop", "blocking-call-on-loop")] == []
    (f,) = found
    assert f.route == ROUTE and f.stage is None
    assert "busy 95% of the time its requests were in flight (median of 4 windows" in f.evidence
    assert "work made ready waited 8.0 ms for it (median window lag p50; p95 25 ms)" in f.evidence
    assert "runnable more than it ran" not in f.evidence  # 95% on-CPU: not short of CPU
    assert "each request ran 9.0 ms of CPU on it" in f.evidence
    assert "guardrail 4.0 ms (44%), tokenize 3.0 ms (33%), render 2.0 ms (22%)" in f.evidence
    assert "0.50 ms per request that no request owns" in f.evidence  # (40 + 10) ms / 100 requests
    # The wait before a request's span begins is not in its latency, and the finding says so.
    assert "which no latency here includes: clients saw more" in f.evidence
    # The worker count aims at TARGET_BUSY.
    workers = math.ceil(0.95 / TARGET_BUSY)
    servers = ("uvicorn app:app", "gunicorn app:app -k uvicorn.workers.UvicornWorker", "hypercorn app:app")
    for server in servers:
        assert f"{server} --workers {workers}\n" in f.fix_code
    # The requests chain as closed-loop clients: more workers answer them sooner, so they send
    # more (mean value analysis, not a fixed arrival rate), and the loops fill again.
    p = f.projection
    assert p is not None and p["model"]["arrivals"] == "closed" and p["model"]["workers"] == workers
    assert p["model"]["clients"] == report.to_dict()["validation"]["model"]["clients"]
    (p50_before, p50_after), (rps_before, rps_after) = p["p50_ms"], p["throughput_rps"]
    assert p50_after < p50_before and rps_before < rps_after < workers * rps_before
    for metric in ("p50_ms", "p95_ms", "throughput_rps"):
        low, high = p["range"][metric]
        assert low <= p[metric][1] <= high
    assert f"{rps_before:.0f} -> {rps_after:.0f} req/s" in f.fix_code
    assert "guardrail (POST /v1/chat): 4.0 ms per request" in f.fix_code  # the biggest stage first
    assert f.severity == "high"


def test_loop_saturated_keeps_open_arrivals_rate_and_scales_each_loop_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Arrivals the replay reads as open keep their rate: M/M/1, each loop wait scaled.
    monkeypatch.setattr(Replayer, "statement", lambda self, route: {"arrivals": "open"})
    report = analyze_spans(_saturated())
    (f,) = [f for f in report.findings if f.rule == "loop-saturated"]
    workers = math.ceil(0.95 / TARGET_BUSY)
    factor = utilisation_factor(0.95, 0.95 / workers)
    reqs = [r for r in report.sample if r.route == ROUTE]
    before = [r.wall_ms for r in reqs]
    after = [r.wall_ms - (r.loop_wait_ms or 0.0) * (1 - factor) for r in reqs]
    assert f.projection is not None and f.projection["model"]["arrivals"] == "open"
    assert f.projection["p50_ms"] == pytest.approx([percentile(before, 0.5), percentile(after, 0.5)])
    assert f.projection["p95_ms"] == pytest.approx([percentile(before, 0.95), percentile(after, 0.95)])
    rps = f.projection["throughput_rps"]
    assert rps[0] == rps[1]


def test_the_closed_loop_residence_is_mean_value_analysis() -> None:
    # Hand-worked MVA for one station (10 ms a visit) and 10 ms away between visits:
    # 1 client: R 10, Q 10/20 = 0.5; 2: R 10 x 1.5 = 15, Q 2 x 15/25 = 1.2; 3: R 22.
    assert [_residence(n, 10.0, 10.0) for n in (1, 2, 3)] == pytest.approx([10.0, 15.0, 22.0])
    assert _residence(2.5, 10.0, 10.0) == pytest.approx(18.5)  # between 2 and 3 clients
    assert _residence(0.5, 10.0, 10.0) == pytest.approx(10.0)  # alone: no queue
    # Saturated (demand over the whole cycle): N clients queue, R -> N x D - outside.
    assert _residence(40, 10.0, 10.0) == pytest.approx(390.0, rel=1e-3)


def test_loop_saturated_gives_the_measured_wait_before_the_spans_as_a_lower_bound() -> None:
    spans = _saturated()
    servers = [s for s in spans if s.kind == "server"]
    for i, span in enumerate(servers):
        span.attributes[semconv.START_WAIT_MS] = float(i % 10)  # 0-9 ms: p50 4.5, p95 9
    (f,) = [f for f in analyze_spans(spans).findings if f.rule == "loop-saturated"]
    assert "start their tasks (at least 4.5 ms p50, p95 9.0 ms: from the server making" in f.evidence


def test_loop_saturated_does_not_fire_on_an_idle_loop() -> None:
    spans = [*_windows(4, requests=90.0, background=4.0, lag=(0.1, 0.4, 1.0), probes=100),
             *_traffic(4, 10, SHORT)]  # fmt: skip
    assert [f.rule for f in analyze_spans(spans).findings if f.rule.startswith(("loop", "gc", "back"))] == []


def _saturation(spans: list[Span]) -> str:
    (f,) = [f for f in analyze_spans(spans).findings if f.rule == "loop-saturated"]
    return f.evidence


def test_high_lag_on_a_loop_under_full_cpu_is_saturation_and_says_why_as_far_as_measured() -> None:
    # busy 70%, lag p95 25 ms: saturated. Why not busier: what the run-queue delay says.
    evidence = _saturation(_saturated(requests=650.0))  # the trace does not say
    assert "busy 70% of the time" in evidence
    assert "may have waited for a CPU or the GIL (other processes or threads; this trace" in evidence
    evidence = _saturation(_saturated(requests=650.0, runqueue=300.0))
    assert "waited for a CPU 30% of the time (run-queue delay: the host is short of CPU)" in evidence
    # There the queueing model's core per worker is not there: no projection for more workers
    # (a new user's run got "p50 -42%" and HIGH from it on a host 22% short).
    (f,) = [f for f in analyze_spans(_saturated(requests=650.0, runqueue=300.0)).findings
            if f.rule == "loop-saturated"]  # fmt: skip
    assert f.projection is None and "# projected for" not in f.fix_code
    assert f.projection_note is not None and f.projection_note.startswith("more workers need free cores")
    assert f.projection_note.endswith("with --cores N (the cores free for the gateway's workers) it projects")
    assert f.severity_reason is not None and f.severity_reason.endswith("(no projection)")
    # --cores N: the user says N cores are free for the workers, and the projection is made.
    (f,) = [f for f in analyze_spans(_saturated(requests=650.0, runqueue=300.0), cores=2).findings
            if f.rule == "loop-saturated"]  # fmt: skip
    assert f.projection is not None and "# projected for" in f.fix_code
    # Measured and small: no shortage of CPU is claimed (a new user's gateway: 0.9%).
    evidence = _saturation(_saturated(requests=650.0, runqueue=9.0))
    assert "waited for a CPU only 0.9% of the time: its work came in bursts" in evidence
    assert "short of CPU" not in evidence and "may have" not in evidence
    (f,) = [f for f in analyze_spans(_saturated(requests=650.0, runqueue=9.0)).findings
            if f.rule == "loop-saturated"]  # fmt: skip
    assert f.projection is not None and "# projected for" in f.fix_code
    spans = _saturated(requests=650.0, lag=(1.0, 3.0, 9.0))
    assert "loop-saturated" not in [f.rule for f in analyze_spans(spans).findings]


def test_a_loop_busy_while_requests_are_in_flight_is_busy_in_its_edge_windows_too() -> None:
    # A burst from 0.8 s to 3.2 s (a short recording, as a first try is): its first and last
    # windows hold 0.2 s of it each. 9 ms of loop CPU every 10 ms is 90% busy while serving;
    # read over the whole windows the edges were 18% and the median 54%.
    windows = [loop_span(i * 1000.0, requests=cpu, lag=(8.0, 25.0, 60.0), probes=100)
               for i, cpu in enumerate([180.0, 900.0, 900.0, 180.0])]  # fmt: skip
    reqs = [span for t in range(800, 3160, 10) for span in request_spans(float(t), 50.0, SHORT)]
    evidence = _saturation([*windows, *reqs])
    assert "busy 90% of the time its requests were in flight (median of 4 windows, p95 90%" in (
        evidence
    )
    assert "may have waited" not in evidence  # 90% is busy: no reason for less is needed


def test_saturation_from_a_long_slice_stage_is_cpu_on_loops_finding() -> None:
    # One stage holds the loop in long slices: cpu-on-loop reports it, loop-saturated folds.
    spans = [*_windows(4, requests=960.0, lag=(8.0, 25.0, 60.0), probes=100)]
    for i in range(320):
        spans += request_spans(i * 12.5, 50.0, [("guardrail", 12.0, 0.0)], loop_wait=20.0)
        spans[-2].attributes[semconv.MAX_BLOCK_MS] = 12.0  # the guardrail's one slice
    rules = [f.rule for f in analyze_spans(spans).findings]
    assert "cpu-on-loop" in rules and "loop-saturated" not in rules


def test_cpu_moved_off_the_loop_is_projected_with_the_hosts_other_load() -> None:
    # A tokenizer moved to a thread on a host 15% short of CPU made the route slower
    # (validation run K): the replay reads the host's other load from the loop windows'
    # run-queue delay and gives the moved work what the other threads leave of the cores.
    def tokenize_model(runqueue: float, **analyze: object) -> dict:
        spans = [*_windows(4, requests=160.0, lag=(1.0, 4.0, 9.0), probes=100, runqueue=runqueue)]
        for i in range(80):
            spans += request_spans(i * 50.0, 40.0, [("tokenize", 20.0, 0.0)])
            spans[-2].attributes[semconv.MAX_BLOCK_MS] = 20.0  # the stage's one slice
        report = analyze_spans(spans, **analyze)  # type: ignore[arg-type]
        (f,) = [f for f in report.findings if f.rule == "cpu-on-loop"]
        assert f.projection is not None, f.projection_note
        return f.projection["model"]

    busy = tokenize_model(150.0)  # the loop got 640 of 1240 ms ready to run
    assert busy["loop_cpu_share"] == pytest.approx(640 / 1240, abs=1e-3)
    assert lone_rate(busy["cores"], busy["host_others"]) == pytest.approx(640 / 1240, abs=0.01)
    assert "host_others" not in tokenize_model(150.0, cores=2)  # --cores: the user says


# --- gc-pauses -------------------------------------------------------------------------------
def test_gc_pauses_fires_with_its_figures_and_the_projection_without_the_pauses() -> None:
    spans = [*_windows(4, requests=300.0, gc_cpu=40.0, gc_ms=45.0, gc_counts=(60, 6, 1),
                       gc_max=(38.0, 2), probes=100, lag=(0.5, 2.0, 40.0)),
             *_traffic(4, 20, [("tokenize", 2.0, 0.0)], gc=30.0)]  # fmt: skip
    report = analyze_spans(spans)
    (f,) = [f for f in report.findings if f.rule == "gc-pauses"]
    assert f.route == ROUTE and f.stage is None
    assert "spent 160 ms of CPU in garbage collection in 4 s of windows (4.0% of its time" in f.evidence
    assert "268 collections: 240 generation 0, 24 generation 1, 4 generation 2" in f.evidence
    # (its CPU estimated from the window's: traces before tracekit.loop.gc_max_cpu_ms)
    assert "the longest pause 38 ms (34 ms of CPU) (generation 2)" in f.evidence
    assert "20 of 80 POST /v1/chat requests were hit" in f.evidence
    assert "gc.freeze()" in f.fix_code
    reqs = [r for r in report.sample if r.route == ROUTE]
    after = [r.wall_ms - float(r.attributes.get(semconv.GC_MS, 0.0)) for r in reqs]
    assert f.projection is not None
    assert f.projection["p95_ms"] == pytest.approx(
        [percentile([r.wall_ms for r in reqs], 0.95), percentile(after, 0.95)]
    )
    # No stage is blamed for the collector.
    assert [x.rule for x in report.findings if x.stage is not None] == []


def test_gc_pauses_judges_the_collector_by_its_cpu_not_a_busy_hosts_stalls() -> None:
    # The same windows, the pauses' wall time 8x their CPU: the thread was descheduled
    # during tiny collections (a busy host). The collector is not to blame ...
    def spans(gc_cpu: float, gc_ms: float, longest: tuple[float, float | None]) -> list[Span]:
        return [*_windows(4, requests=300.0, gc_cpu=gc_cpu, gc_ms=gc_ms, gc_counts=(60, 0, 0),
                          gc_max=(longest[0], 0), gc_max_cpu=longest[1], probes=100,
                          lag=(0.5, 2.0, 40.0)),
                *_traffic(4, 20, [("tokenize", 2.0, 0.0)], gc=30.0)]  # fmt: skip

    assert "gc-pauses" not in [f.rule for f in analyze_spans(spans(5.0, 40.0, (38.0, 0.5))).findings]
    # Recorded before the longest pause's CPU was written: estimated from the window's share.
    assert "gc-pauses" not in [f.rule for f in analyze_spans(spans(5.0, 40.0, (38.0, None))).findings]
    # ... where the collections' own CPU is long, it is; and the stall is told apart.
    (f,) = [f for f in analyze_spans(spans(30.0, 90.0, (38.0, 12.0))).findings if f.rule == "gc-pauses"]
    assert "spent 120 ms of CPU in garbage collection in 4 s of windows (3.0% of its time" in f.evidence
    assert "240 ms more of wall time passed during them, the thread descheduled by a busy host" in f.evidence
    assert "the longest pause 38 ms (12 ms of CPU) (generation 0)" in f.evidence
    assert "the longest took\n# 12.0 ms of CPU (generation 0)" in f.fix_code


def test_short_young_collections_are_not_a_finding() -> None:
    spans = [*_windows(4, requests=300.0, gc_cpu=5.0, gc_ms=6.0, gc_counts=(60, 0, 0),
                       gc_max=(0.4, 0), probes=100, lag=(0.5, 2.0, 4.0)),
             *_traffic(4, 20, [("tokenize", 2.0, 0.0)], gc=0.3)]  # fmt: skip
    assert "gc-pauses" not in [f.rule for f in analyze_spans(spans).findings]


def test_a_young_pause_the_host_stretched_is_not_a_finding() -> None:
    # A demo run on a busy host: one generation-0 collection took 18.4 ms of wall time in a
    # window whose collections held 1.45 ms of GC CPU in 19.7 ms (the thread lost its core
    # inside it); no gc.freeze() or threshold shortens that. The same pause with its CPU fires.
    def spans(gc_cpu: float) -> list[Span]:
        return [*_windows(4, requests=300.0, gc_cpu=gc_cpu, gc_ms=19.7, gc_counts=(17, 1, 0),
                          gc_max=(18.4, 0), probes=100, lag=(0.5, 2.0, 20.0)),
                *_traffic(4, 20, [("tokenize", 2.0, 0.0)], gc=0.5)]  # fmt: skip

    assert "gc-pauses" not in [f.rule for f in analyze_spans(spans(1.45)).findings]
    assert "gc-pauses" in [f.rule for f in analyze_spans(spans(19.0)).findings]


def test_a_gc_pause_inside_a_stage_is_not_a_blocking_call_of_the_stage() -> None:
    # The stage held the loop 31 ms: 1 ms of CPU and a 30 ms collection. Without the GC
    # attribute the same record is a blocking call; with it, no stage rule fires.
    def records(gc: float | None) -> list[RequestRecord]:
        out = []
        for i in range(10):
            t = i * 100.0
            attrs = {semconv.GC_MS: gc} if gc is not None else {}
            s = stage(
                "parse",
                t,
                t + 31,
                cpu_ms=1.0,
                wait_ms=0.0,
                max_block_ms=31.0,
                slices=[(t, t + 31)],
                attributes=attrs,
            )
            out.append(request(ROUTE, t, t + 40, [s], loop_wait_ms=0.0))
        return out

    rules: list[Rule] = [BlockingCallOnLoop(), CpuOnLoop()]
    assert [f.rule for f in run_rules(records(None), RuleContext(), rules)] == ["blocking-call-on-loop"]
    assert run_rules(records(30.0), RuleContext(), rules) == []


def test_cpu_on_loops_longest_slice_leaves_a_gc_pause_out() -> None:
    # A new user's LiteLLM: the handler's "longest slice 517 ms" was the 517 ms generation-2
    # collection gc-pauses reported as well.
    out = []
    for i in range(10):
        t = i * 100.0
        gc = {semconv.GC_MS: 40.0} if i == 3 else {}
        s = stage("parse", t, t + 60, cpu_ms=15.0, wait_ms=0.0, max_block_ms=55.0 if i == 3 else 15.0,
                  slices=[(t, t + 15)], attributes=gc)  # fmt: skip
        out.append(request(ROUTE, t, t + 70, [s], loop_wait_ms=0.0))
    (f,) = run_rules(out, RuleContext(), [CpuOnLoop()])
    assert "longest slice 15 ms, GC pauses left out)" in f.evidence, f.evidence


# --- background-on-loop ---------------------------------------------------------------------
def test_background_on_loop_fires_when_untraced_work_is_heavy() -> None:
    spans = [*_windows(4, requests=200.0, background=350.0, tracekit_cpu=5.0, probes=100,
                       lag=(2.0, 9.0, 20.0), tasks=230),
             *_traffic(4, 50, [("tokenize", 2.0, 0.0)], loop_wait=4.0)]  # fmt: skip
    report = analyze_spans(spans)
    (f,) = [f for f in report.findings if f.rule == "background-on-loop"]
    assert (
        "ran 350 ms per second of work that no traced request owns (63% of its CPU, 7.0 ms per request"
        in f.evidence
    )
    assert "up to 230 tasks alive" in f.evidence and "QueueHandler" in f.fix_code
    rho = 555 / 1000
    factor = utilisation_factor(rho, rho - 0.35)
    reqs = [r for r in report.sample if r.route == ROUTE]
    after = [r.wall_ms - (r.loop_wait_ms or 0.0) * (1 - factor) for r in reqs]
    assert f.projection is not None and f.projection["p50_ms"][1] == pytest.approx(percentile(after, 0.5))
    assert "loop-saturated" not in [x.rule for x in report.findings]


def test_background_on_loop_names_the_tasks_that_took_the_most_of_it() -> None:
    tasks = {"app.cache.refresh": 210.0, "app.metrics.flush": 60.0, "app.tiny": 5.0}
    spans = [*_windows(4, requests=200.0, background=350.0, tracekit_cpu=5.0, probes=100,
                       lag=(2.0, 9.0, 20.0), tasks=230, background_tasks=tasks),
             *_traffic(4, 50, [("tokenize", 2.0, 0.0)], loop_wait=4.0)]  # fmt: skip
    report = analyze_spans(spans)
    (f,) = [f for f in report.findings if f.rule == "background-on-loop"]
    # Named when they took a tenth of the background or more, most first.
    assert ("background tasks: app.cache.refresh 210 ms per second, "
            "app.metrics.flush 60 ms per second") in f.evidence  # fmt: skip
    assert "app.tiny" not in f.evidence
    assert f.fix_title.startswith("Move app.cache.refresh's work off the loop")
    assert "#   task app.metrics.flush: 60 ms a second" in f.fix_code
    (loop,) = report.to_dict()["loop"]["loops"]
    assert loop["background_tasks"][0] == {"task": "app.cache.refresh", "cpu_ms": 840.0}
    text = render_text(report.to_dict(), width=100)
    assert "tasks of no request: app.cache.refresh 840 ms" in text


def test_background_task_names_are_read_forgivingly() -> None:
    from tracekit.analysis.stats.loop_windows import window_of

    span = loop_span(0, background=10.0)
    span.attributes[semconv.LOOP_BACKGROUND_TASKS] = '["a.b", 7, "c.d", "e"]'  # Jaeger's JSON text
    span.attributes[semconv.LOOP_BACKGROUND_TASKS_CPU_MS] = [1.5, 2.0, "x"]
    window = window_of(span)
    assert window is not None and window.background_tasks == (("a.b", 1.5),)


def test_the_servers_own_background_is_not_a_finding() -> None:
    # 0.3 ms of background per request (uvicorn's parsing and writes) at 100 requests a second.
    spans = [*_windows(4, requests=300.0, background=30.0, probes=100, lag=(0.3, 1.0, 3.0)),
             *_traffic(4, 100, [("tokenize", 2.0, 0.0)])]  # fmt: skip
    assert "background-on-loop" not in [f.rule for f in analyze_spans(spans).findings]


def test_the_parallel_reader_carries_the_loop_windows(tmp_path: Path) -> None:
    # The file cut into three byte ranges, one worker process each: the loop view is the one
    # pass's (windows straddle the boundaries between requests' lines).
    from tracekit.analysis.readers.parallel import analyze_plan, plan_file

    gen = gen_traces()
    spans = [*_windows(6, requests=300, background=50, gc_ms=3, gc_counts=(5, 1, 0),
                       gc_max=(2.5, 0), lag=(1.0, 3.0, 7.0), probes=100, tasks=20),
             *_traffic(6, 4, [("tokenize", 2.0, 0.0)])]  # fmt: skip
    spans.sort(key=lambda s: s.end_ns)  # as exporters write them
    path = tmp_path / "loop.jsonl"
    with path.open("wb") as file:
        for i in range(0, len(spans), 7):
            batch = [gen.otlp_span(s.trace_id, s.span_id, s.parent_id, s.name, s.kind, s.start_ns,
                                   s.end_ns, s.attributes) for s in spans[i : i + 7]]  # fmt: skip
            file.write(orjson.dumps(gen.traces_data(batch)) + b"\n")
    one = Pipeline(Settings())
    one.add(spans)
    one.finish()
    plan = plan_file(str(path), str(path), workers=3, min_range_bytes=1)
    assert plan is not None and len(plan.bounds) == 4
    agg, found = analyze_plan(plan, Settings())
    assert found.left_out == (0, 0, 0, 0)
    assert agg.loops.to_dict() == one.aggregator.loops.to_dict()
    assert agg.loops.to_dict()["windows"] == 6  # type: ignore[index]


def test_saturation_from_a_blocking_call_is_blocking_call_on_loops_finding() -> None:
    # A new user's gateway: a sync cache lookup sleeping 30 ms on the loop (0.3 ms of CPU) and
    # a 2 ms render, the loop's lag high. By CPU the cache is 13% of the requests' on-loop work
    # and loop-saturated blamed the rest, "no stage's longest slice reached 5 ms"; by the time
    # held it is 94%: blocking-call-on-loop's finding is the fix, and loop-saturated is quiet.
    spans = [*_windows(4, requests=400.0, lag=(8.0, 25.0, 60.0), probes=100)]
    for i in range(48):
        spans += request_spans(i * 80.0, 60.0, [("cache", 0.3, 0.0), ("render", 2.0, 0.0)], loop_wait=20.0)
        cache = next(s for s in spans[-3:] if s.name == "cache")
        cache.end_ns = cache.start_ns + 31_000_000
        cache.attributes.update({semconv.WALL_MS: 31.0, semconv.WAIT_MS: 30.7, semconv.MAX_BLOCK_MS: 30.0,
                                 semconv.LOOP_SLICES_US: [0, 30_000]})  # fmt: skip
    rules = [f.rule for f in analyze_spans(spans).findings]
    assert "blocking-call-on-loop" in rules and "loop-saturated" not in rules
    # Saturated all the same with the cache's CPU-free hold shorter than the gate: the finding
    # names its longest slice only when one reached it.
    for s in spans:
        if s.name == "cache":
            s.attributes.update({semconv.MAX_BLOCK_MS: 0.9, semconv.LOOP_SLICES_US: [0, 300]})
    (f,) = [f for f in analyze_spans(spans).findings if f.rule == "loop-saturated"]
    assert "in short slices (no stage's longest slice reached 5.0 ms)" in f.evidence


def test_the_queueing_model_scales_queue_waits_with_loop_waits_and_its_range_keeps_them() -> None:
    # A saturated loop's lock and pool waits are its holders' waits for the loop: in every
    # measured case they fell with more workers (bench/validate.py's loop-saturated rows).
    reqs = [request(ROUTE, i * 10.0, i * 10.0 + 100.0, loop_wait_ms=40.0,
                    attributes={semconv.QUEUE_WAIT_MS: 20.0}) for i in range(100)]  # fmt: skip
    p = queueing_projection(reqs, ROUTE, 0.25)
    assert p is not None
    assert p["p50_ms"] == pytest.approx([100.0, 100.0 - 60.0 * 0.75])  # both waits to a quarter
    low, high = p["range"]["p50_ms"]
    assert low <= 55.0 and high == pytest.approx(100.0 - 40.0 * 0.75)  # queue waits kept


def test_more_workers_on_a_small_host_may_share_its_cores_with_what_else_runs_there() -> None:
    # The loop's wait for a CPU sees its own core only: on 2 cores the far end of the range
    # takes the other core as busy (a load generator, a model server): 0.74 of a CPU each.
    spans = _saturated()
    report = analyze_spans(spans)
    (f,) = [f for f in report.findings if f.rule == "loop-saturated"]
    low, high = f.projection["model"]["worker_cpu_share"]
    assert high == 1.0 and low == pytest.approx(fair_rates(2, 1, 1, 1.0)[0], abs=1e-3) and low < 0.75
    assert f.projection["range"]["p50_ms"][1] > f.projection["p50_ms"][1]


def test_with_the_cores_given_the_far_end_keeps_the_other_threads_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --cores N: the N cores were free for the gateway, so the far end does not take the
    # other cores as busy.
    statement = {"arrivals": "closed", "clients": 7, "cores": 2, "cores_source": "--cores"}
    monkeypatch.setattr(Replayer, "statement", lambda self, route: statement)
    (f,) = [f for f in analyze_spans(_saturated()).findings if f.rule == "loop-saturated"]
    assert f.projection["model"]["worker_cpu_share"] == [1.0, 1.0]


def test_a_saturated_loop_of_unstaged_handler_code_still_gets_more_workers() -> None:
    # An unmodified proxy (a new user's LiteLLM): every request's CPU is the handler's own
    # code. cpu-on-loop flags it (its fix: wrap parts in stages, which needs the proxy's
    # source); the saturated loop's own fix, more workers, must still be said.
    windows = _windows(4, requests=900.0, background=40.0, tracekit_cpu=10.0, lag=(8.0, 25.0, 60.0),
                       probes=100, inflight=12)  # fmt: skip
    traffic = [span for i in range(400)
               for span in request_spans(i * 10.0, 50.0 + 10.0 * (i % 5), [], own_cpu=12.0,
                                         loop_wait=20.0 * (i % 5))]  # fmt: skip
    rules = {f.rule: f for f in analyze_spans([*windows, *traffic]).findings}
    assert "loop-saturated" in rules and "--workers" in rules["loop-saturated"].fix_code
    assert rules["cpu-on-loop"].stage is None  # the own code is still named, with its words
