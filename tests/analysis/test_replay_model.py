"""The replay states its model and gives a range: cores from the trace or ``--cores``, closed-
and open-loop arrivals, projections checked against the system with the fix applied, and the
severity that follows the projection."""

from __future__ import annotations

import json
import os
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from tests.analysis.factories import Job, Op, simulate_gateway
from tracekit import semconv
from tracekit._percentile import percentile
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix, ReplayConfig, Replayer
from tracekit.analysis.replay.fixes import no_cpu_won
from tracekit.analysis.replay.host import cpu_count, others_of, quantile_range, widen
from tracekit.analysis.replay.sim import LOOP, Simulation, lone_rate
from tracekit.analysis.rules.common import finding
from tracekit.analysis.rules.findings import RuleContext, assess_severity, severity_for
from tracekit.analysis.stats.loop_windows import LoopCpu
from tracekit.cli import main

ROUTE = "POST /v1/chat/completions"
KINDS = {"model": "model", "tokenize": "tokenize"}


def _ops(rng: random.Random, tokenize: str) -> list[Op]:
    # Tokenize on the loop ("cpu") or on a worker thread ("thread": the fix applied).
    return [Op("cpu", 0.3), Op(tokenize, 18 + 8 * rng.random(), "tokenize"),
            Op("model", 60 + 40 * rng.random(), "model"), Op("cpu", 0.5)]  # fmt: skip


def _system(
    tokenize: str, *, clients: int | None = None, arrivals: list[float] | None = None
) -> list[RequestRecord]:
    rng = random.Random(5)  # the same jobs before and after the fix
    n = len(arrivals) if arrivals is not None else 300
    at = arrivals or [0.0] * n
    jobs = [Job(ROUTE, _ops(rng, tokenize), at[i], kinds=KINDS) for i in range(n)]
    return simulate_gateway(jobs, clients=clients, think_ms=1.0)


def _poisson(n: int, rps: float) -> list[float]:
    rng, t, out = random.Random(11), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rps / 1000.0)
        out.append(t)
    return out


def _measured(records: list[RequestRecord]) -> dict[str, float]:
    walls = [r.wall_ms for r in records]
    span_s = (max(r.end_ns for r in records) - min(r.start_ns for r in records)) / 1e9
    return {"p50_ms": percentile(walls, 0.5), "p95_ms": percentile(walls, 0.95),
            "throughput_rps": len(records) / span_s}  # fmt: skip


# The simulated gateway's worker threads do not share cores: neither does a replay on 16.
CONFIG = ReplayConfig(cores=16, thread_pool_size=16)
FIX = Fix("thread", ROUTE, "tokenize", gil_free=True)


@pytest.mark.parametrize(
    ("kind", "load"),
    [("closed", {"clients": 6}), ("open", {"arrivals": _poisson(400, 30.0)})],
)
def test_closed_and_open_loop_load_reproduce_and_the_projection_holds(
    kind: str, load: dict[str, Any]
) -> None:
    before, after = _system("cpu", **load), _system("thread", **load)
    replayer = Replayer(CONFIG)
    validation = replayer.validate(before)
    assert validation.ok, validation.reason
    assert abs(validation.p50_error or 0) < 0.05 and abs(validation.p95_error or 0) < 0.08
    projection, note = replayer.project(before, FIX)
    assert projection is not None, note
    model = projection["model"]
    assert model["arrivals"] == kind and model["cores"] == 16 and model["cores_source"] == "--cores"
    if kind == "closed":
        assert model["clients"] == 6
    else:  # the recorded rate: 400 requests over the Poisson arrivals at 30/s
        assert model["rate_rps"] == pytest.approx(30.0, rel=0.15)
    # The fixed system, served the same load, lands within the stated range (the loop, ~23 ms
    # a request under 6 clients or 30/s, is 65-100% busy before the fix: the gain is large, so
    # a range that held only by being wide would fail the last assertion).
    truth = _measured(after)
    spread = projection["range"]
    for key in ("p50_ms", "p95_ms", "throughput_rps"):
        lo, hi = spread[key]
        assert lo <= projection[key][1] <= hi, (key, projection)
        assert lo <= truth[key] <= hi, (key, truth[key], spread[key], projection[key])
    assert spread["p95_ms"][1] < projection["p95_ms"][0]  # a gain outside the noise


def test_the_as_recorded_replay_stays_within_its_sampling_range() -> None:
    # The range's sampling part alone (no residual carried): the measured p50 and p95 of a
    # closed-loop trace fall within the order-statistic interval of the replayed latencies.
    records = _system("cpu", clients=6)
    replayer = Replayer(CONFIG)
    assert replayer.validate(records).ok
    run = replayer._baseline(None)
    simulated = [run.latency[i] for i in range(len(records)) if i in run.latency]
    for q in (0.5, 0.95):
        lo, hi = quantile_range(simulated, q)
        assert lo <= percentile([r.wall_ms for r in records], q) <= hi


def test_the_range_allows_the_replays_error_on_the_recording_either_way() -> None:
    # The range is read against the replay's own before: a replay 20% faster than the
    # recording may be 20% off after the fix in either direction (the fix may remove what
    # the model missed, or bring what it does not model), whichever the error's sign.
    assert widen((100.0, 110.0), -0.2) == [83.333, 132.0]
    assert widen((100.0, 110.0), 0.2) == [83.333, 132.0]
    assert widen((100.0, 110.0), 0.0) == [100.0, 110.0]


def _with_cpus(records: list[RequestRecord], **attributes: Any) -> list[RequestRecord]:
    return [replace(r, attributes={**r.attributes, **attributes}) for r in records]


def test_cores_come_from_the_trace_then_the_option_then_this_machine() -> None:
    records = _system("cpu", clients=10)
    traced = _with_cpus(records, **{semconv.PROCESS_CPUS: 1, semconv.HOST_CPUS: 8})
    one, _ = Replayer(ReplayConfig()).project(traced, FIX)
    assert one is not None
    assert (one["model"]["cores"], one["model"]["cores_source"]) == (1, "trace")
    assert one["model"]["thread_pool_size"] == 12  # asyncio's min(32, 8 + 4) on that host
    four, _ = Replayer(ReplayConfig(cores=4)).project(traced, FIX)
    assert four is not None and (four["model"]["cores"], four["model"]["cores_source"]) == (4, "--cores")
    # GIL-free tokenize off the loop runs on the cores: one core is the loop's bottleneck
    # again, four are not.
    assert four["p50_ms"][1] < 0.8 * one["p50_ms"][1]
    plain, _ = Replayer(ReplayConfig()).project(records, FIX)
    assert plain is not None
    assert plain["model"]["cores"] == (os.cpu_count() or 1)
    assert plain["model"]["cores_source"] == "this machine"


def test_the_hosts_other_load_is_read_from_the_loops_wait_for_a_cpu() -> None:
    # The loop got 80% of a CPU while ready to run, on 2 cores: 1.5 other runnable threads.
    # The as-recorded replay hardly changes (recorded slices hold their waits for a CPU; the
    # CPU of unrecorded steps holds the loop 25% longer, out of its recorded delays); the
    # tokenizer moved beside the loop gets less of a core than on a free host, so the
    # projected gain is smaller.
    traced = _with_cpus(_system("cpu", clients=10), **{semconv.PROCESS_CPUS: 2})
    shares = {traced[0].service: LoopCpu(share=0.8, waited=0.05)}
    busy, _ = Replayer(ReplayConfig(), shares).project(traced, FIX)
    free, _ = Replayer(ReplayConfig()).project(traced, FIX)
    assert busy is not None and free is not None
    assert busy["model"]["loop_cpu_share"] == 0.8
    assert lone_rate(2, busy["model"]["host_others"]) == pytest.approx(0.8, abs=0.01)
    assert "host_others" not in free["model"]
    assert busy["p50_ms"][0] == pytest.approx(free["p50_ms"][0], rel=0.02)
    assert busy["p50_ms"][1] > 1.05 * free["p50_ms"][1]
    # --cores says the cores free for the gateway: the trace's reading is not used.
    given, _ = Replayer(ReplayConfig(cores=2), shares).project(traced, FIX)
    assert given is not None and "host_others" not in given["model"]
    assert given["p50_ms"] == free["p50_ms"]
    # A loop that never waited for a CPU: the cores are free.
    idle, _ = Replayer(ReplayConfig(), {traced[0].service: LoopCpu(1.0, 0.0)}).project(traced, FIX)
    assert idle is not None and "host_others" not in idle["model"]


def test_on_a_host_short_of_cpu_the_range_reaches_the_fix_winning_no_cpu() -> None:
    # The loop waited for a CPU 15% of the time (the report calls the host short of CPU from
    # 10%): the tokenizer moved to a thread may win no CPU from the host. The projection's
    # point stays the fair-sharing replay's; its range reaches the replay where the moved
    # work shares the loop's one core (as if it held the GIL), which gains less.
    traced = _with_cpus(_system("cpu", clients=10), **{semconv.PROCESS_CPUS: 2})
    service = traced[0].service
    calm, _ = Replayer(ReplayConfig(), {service: LoopCpu(0.8, 0.05)}).project(traced, FIX)
    short, _ = Replayer(ReplayConfig(), {service: LoopCpu(0.8, 0.15)}).project(traced, FIX)
    one_core, _ = Replayer(ReplayConfig(), {service: LoopCpu(0.8, 0.05)}).project(
        traced, Fix("thread", ROUTE, "tokenize", gil_free=False)
    )
    assert calm is not None and short is not None and one_core is not None
    assert short["p50_ms"] == calm["p50_ms"] and short["p95_ms"] == calm["p95_ms"]
    assert short["model"]["host_short"] is True and "host_short" not in calm["model"]
    assert one_core["p50_ms"][1] > calm["range"]["p50_ms"][1]  # outside the fair replay's range
    for key in ("p50_ms", "p95_ms"):
        assert short["range"][key][0] == calm["range"][key][0]
        assert short["range"][key][1] >= one_core[key][1]
    assert short["range"]["throughput_rps"][0] <= one_core["throughput_rps"][1]
    # --cores says the cores are free for the gateway: no such case.
    given, _ = Replayer(ReplayConfig(cores=2), {service: LoopCpu(0.8, 0.15)}).project(traced, FIX)
    assert given is not None and "host_short" not in given["model"]
    assert given["range"]["p50_ms"][1] < one_core["p50_ms"][1]


def test_only_fixes_that_move_cpu_off_the_loop_have_a_no_cpu_won_case() -> None:
    assert no_cpu_won(FIX) == Fix("thread", ROUTE, "tokenize", gil_free=False)
    assert no_cpu_won(Fix("process", ROUTE, "tokenize")) == Fix("thread", ROUTE, "tokenize")
    for fix in (
        Fix("thread", ROUTE, "tokenize"),
        Fix("shrink", ROUTE, "tokenize", factor=0.5),
        Fix("gather", ROUTE, "tokenize", other="model"),
        Fix("model_overlap", ROUTE, "model"),
    ):
        assert no_cpu_won(fix) is None


def test_the_other_load_read_from_a_cpu_share_falls_to_none_as_the_share_nears_one() -> None:
    # A lone thread's share falls as the others grow; a few wake-up delays on an idle host
    # (a share near 1) read as almost no other load, not as a core's worth of it.
    shares = [0.5, 0.7, 0.9, 0.99, 0.999]
    others = [others_of(2, s) for s in shares]
    assert others == sorted(others, reverse=True)
    assert [lone_rate(2, o) for o in others] == pytest.approx(shares, abs=1e-6)
    assert others[-1] < 0.1 and others[0] > 2.0
    assert lone_rate(2, 0.0) == 1.0 and lone_rate(16, 10.0) == pytest.approx(0.99, abs=0.01)
    # A loop that got next to no CPU (hostile or broken windows): the reading stops at 500
    # others, where the replay's rates are still positive.
    assert others_of(2, 1e-12) == pytest.approx(500.0)
    assert lone_rate(2, others_of(2, 1e-12)) > 0


def test_cpu_counts_are_read_forgivingly() -> None:
    assert [cpu_count(v) for v in (4, "4", " 2 ", 0, -1, "x", True, 2.5, None)] == [
        4, 4, 2, None, None, None, None, None, None,
    ]  # fmt: skip


def test_a_decline_says_what_would_let_it_project() -> None:
    # Requests one after another claim 100 ms of waiting for a loop nobody else used, and
    # 60 ms each on locks: the replay comes out too fast, and says what it lacks.
    from tests.analysis.test_replay import _inconsistent

    slow = [replace(r, attributes={**r.attributes, semconv.QUEUE_WAIT_MS: 60.0}) for r in _inconsistent()]
    projection, note = Replayer(ReplayConfig()).project(slow, FIX)
    assert projection is None and note is not None
    assert "what would let it project" in note and "--cores N" in note
    assert "waited 60.0 ms each on locks and queues" in note
    assert "work outside the requests" in note
    # One core already: no hint to pass fewer (a new user was told "fewer than 1").
    _, one = Replayer(ReplayConfig(cores=1)).project(slow, FIX)
    assert one is not None and "fewer than" not in one and "work outside the requests" in one


# --- severity -------------------------------------------------------------------------------
def _projection(p50: tuple[float, float], p95: tuple[float, float], noise: float = 0.02) -> dict[str, Any]:
    return {"p50_ms": list(p50), "p95_ms": list(p95), "throughput_rps": [10.0, 10.0],
            "range": {"p50_ms": [p50[1] * (1 - noise), p50[1] * (1 + noise)],
                      "p95_ms": [p95[1] * (1 - noise), p95[1] * (1 + noise)]}}  # fmt: skip


def test_severity_follows_the_projection() -> None:
    # A large measured impact does not make a finding high when the projected gain is none.
    assert severity_for(500.0, 1000.0) == "high"
    assert severity_for(500.0, 1000.0, _projection((1000, 1010), (6000, 6010))) == "low"
    # The case: the p95 gets worse: rated on the weaker of the two gains.
    assert severity_for(500.0, 1000.0, _projection((1000, 700), (5999, 6010))) == "low"
    # Within noise: the after's range reaches the before.
    assert severity_for(0.0, 1000.0, _projection((1000, 960), (2000, 1900), noise=0.06)) == "low"
    # Outside the noise: the thresholds of the contract, on each percentile's own before.
    assert severity_for(0.0, 1000.0, _projection((1000, 700), (2000, 1400))) == "high"
    assert severity_for(0.0, 100.0, _projection((100, 90), (200, 150))) == "medium"
    assert severity_for(0.0, 100.0, _projection((100, 97), (200, 150))) == "low"
    # A projection without a range (an older report) is judged on its gain alone.
    bare = {"p50_ms": [1000, 700], "p95_ms": [2000, 1400], "throughput_rps": [1, 1]}
    assert severity_for(0.0, 1000.0, bare) == "high"


def test_the_severity_says_why() -> None:
    # The figure that decided, in words: the weaker percentile's projected change and range.
    assert assess_severity(0.0, 100.0, _projection((100, 90), (200, 150))) == (
        "medium", "projected p50 -10% (-10 ms, range -12 to -8%)")
    assert assess_severity(0.0, 1000.0, _projection((1000, 960), (2000, 1900), noise=0.06)) == (
        "low", "projected p50 -4% (-40 ms, range -10 to +2%): the range reaches the before")
    assert assess_severity(500.0, 1000.0, _projection((1000, 700), (5999, 6010))) == (
        "low", "projected p95 +0% (+11 ms, range -2 to +2%): no gain")
    bare = {"p50_ms": [1000, 700], "p95_ms": [2000, 1400], "throughput_rps": [1, 1]}
    assert assess_severity(0.0, 1000.0, bare) == ("high", "projected p50 -30% (-300 ms)")
    # Without a projection: the measured impact against the route's p50.
    assert assess_severity(38.0, 100.0) == (
        "high", "measured 38 ms per request, 38% of the route's p50 (no projection)")
    assert assess_severity(2.0, None) == ("low", "measured 2.0 ms per request (no projection)")


def test_a_rule_finding_takes_the_projections_severity() -> None:
    def project(requests: Any, fix: Fix) -> tuple[dict[str, Any] | None, str | None]:
        return _projection((1000, 1005), (6000, 6010)), None

    def make(ctx: RuleContext) -> tuple[str, str | None]:
        found = finding(rule="sequential-independent", route=ROUTE, stage="guardrail",
                        function=None, impact_ms=400.0, route_p50_ms=1000.0, evidence="",
                        fix=("", ""), requests=[], ctx=ctx, model=FIX)  # fmt: skip
        assert found.to_dict()["severity_reason"] == found.severity_reason
        return found.severity, found.severity_reason

    said = "projected p50 +0% (+5.0 ms, range -2 to +3%): no gain"
    assert make(RuleContext(project=project)) == ("low", said)
    # No projection: the measured impact.
    said = "measured 400 ms per request, 40% of the route's p50 (no projection)"
    assert make(RuleContext()) == ("high", said)


# --- the host in the trace, and --cores -------------------------------------------------------
def test_configure_records_the_hosts_cpus_on_the_resource() -> None:
    from tracekit.config import host_cpus

    cpus = host_cpus()
    assert cpus[semconv.HOST_CPUS] == os.cpu_count()
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cpus[semconv.PROCESS_CPUS] == expected


def _otlp_file(path: Path, cpus: int | None) -> None:
    # An OTLP JSON document of a generated gateway, with the host's CPUs on the resource.
    from tests.helpers import gen_traces

    gen = gen_traces()
    spans = list(gen.Gateway(seed=3).spans(1500))
    doc = gen.traces_data(spans)
    if cpus is not None:
        for rs in doc["resourceSpans"]:
            value = {"key": semconv.PROCESS_CPUS, "value": {"intValue": str(cpus)}}
            rs["resource"]["attributes"].append(value)
    path.write_text(json.dumps(doc))


def test_cli_cores_option_and_the_trace_resource(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traced = tmp_path / "traced.json"
    _otlp_file(traced, cpus=3)
    assert main(["analyze", str(traced), "--format", "json"]) == 0
    model = json.loads(capsys.readouterr().out)["validation"]["model"]
    assert (model["cores"], model["cores_source"]) == (3, "trace")
    assert main(["analyze", str(traced), "--format", "json", "--cores", "5"]) == 0
    model = json.loads(capsys.readouterr().out)["validation"]["model"]
    assert (model["cores"], model["cores_source"]) == (5, "--cores")
    assert main(["analyze", str(traced), "--cores", "0"]) == 2
    err = capsys.readouterr().err
    assert "--cores" in err and "Traceback" not in err


def test_jaeger_process_tags_and_otlp_resources_reach_the_request_spans() -> None:
    from tracekit.analysis.readers.common import ReadStats
    from tracekit.analysis.readers.jaeger import _trace_spans

    span = {"traceID": "ab", "spanID": "01", "operationName": "POST /x", "startTime": 1,
            "duration": 5, "processID": "p1", "tags": [{"key": "span.kind", "value": "server"}]}  # fmt: skip
    child = {**span, "spanID": "02", "references": [{"refType": "CHILD_OF", "spanID": "01"}],
             "tags": []}  # fmt: skip
    tags = [{"key": semconv.PROCESS_CPUS, "type": "int64", "value": 6}]
    processes = {"p1": {"serviceName": "gw", "tags": tags}}
    trace = {"traceID": "ab", "spans": [span, child], "processes": processes}
    server, inner = _trace_spans(trace, ReadStats(), "test")
    assert server.attributes[semconv.PROCESS_CPUS] == 6
    assert semconv.PROCESS_CPUS not in inner.attributes  # only spans that can be requests


@pytest.mark.parametrize("rate_per_s", [20, 30, 40])
def test_the_loop_queues_requests_as_queueing_theory_says(rate_per_s: int) -> None:
    """One 20 ms step a request on the loop, Poisson arrivals: an M/D/1 queue, whose mean
    wait is rho * S / (2 (1 - rho)) (6.7, 15 and 40 ms at 20, 30 and 40 a second)."""
    service_ms, rng, at, arrivals = 20.0, random.Random(2), 0.0, []
    for _ in range(20_000):
        at += rng.expovariate(rate_per_s / 1000)
        arrivals.append(at)
    sim = Simulation(cores=16, capacities={})
    sim.run([[(LOOP, 0.0, service_ms)]] * len(arrivals), arrivals)
    waited = statistics.mean(first - arrived for first, arrived in zip(sim.first_run, arrivals, strict=True))
    rho = rate_per_s * service_ms / 1000
    assert waited == pytest.approx(rho * service_ms / (2 * (1 - rho)), rel=0.1)
