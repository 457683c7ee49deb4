"""Programs reused across replays (``ProgramMemo``) are exactly the programs built afresh."""

from __future__ import annotations

import random

import pytest

from tests.analysis.factories import BASE_NS, Job, Op, request, simulate_gateway, stage
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay import Fix
from tracekit.analysis.replay.build import ProgramBuilder
from tracekit.analysis.replay.fixes import ModelCall
from tracekit.analysis.replay.host import FROM_TRACE, Host
from tracekit.analysis.replay.memo import ProgramMemo
from tracekit.analysis.replay.sim import DELAY, LOOP
from tracekit.analysis.stats.intervals import StageTree

ROUTE = "POST /v1/chat/completions"
KINDS = {"model": "model", "guardrail": "guardrail", "tokenize": "tokenize"}


def _nested(t: float) -> RequestRecord:
    """A handler stage around tokenize and a guardrail, a streamed model stage whose
    consumer runs beside it (an async generator), fan-out calls, a blocking serializer."""
    handler = stage("handler", t + 1, t + 60, cpu_ms=3.0, wait_ms=40, slices=[(t + 1, t + 3)])
    tok = stage("tokenize", t + 3, t + 13, cpu_ms=10, wait_ms=0, slices=[(t + 3, t + 13)],
                parent=handler.span_id)  # fmt: skip
    guard = stage("guardrail", t + 14, t + 58, kind="guardrail", cpu_ms=1, wait_ms=43,
                  parent=handler.span_id, waits=[(t + 40, t + 42)])  # fmt: skip
    model = stage("model", t + 61, t + 161, kind="model", cpu_ms=0.5, wait_ms=90,
                  attributes={"tracekit.consumer_ms": 6.0})  # fmt: skip
    calls = [
        stage("lookup", t + 162 + 5 * i, t + 166 + 5 * i, cpu_ms=0.1, wait_ms=3.9,
              span_kind="client")  # fmt: skip
        for i in range(3)
    ]
    ser = stage("serialize", t + 178, t + 190, cpu_ms=2, wait_ms=0, max_block_ms=12,
                slices=[(t + 178, t + 190)])  # fmt: skip
    return request(ROUTE, t, t + 191, [handler, tok, guard, model, *calls, ser], cpu_ms=30.0,
                   slices=[(t, t + 1), (t + 100, t + 103)], waits=[(t + 98, t + 100)],
                   chunks=5)  # fmt: skip


def _records() -> list[RequestRecord]:
    rng = random.Random(3)
    jobs = [
        Job(
            ROUTE,
            [
                Op("cpu", 0.3),
                Op("cpu", 3 + 6 * rng.random(), "tokenize"),
                Op("cpu", 0.5, "guardrail"),
                Op("wait", 10 + 10 * rng.random(), "guardrail"),
                Op("model", 30 + 30 * rng.random(), "model"),
                *(Op("cpu", 0.2, "model", chunk=True) for _ in range(3)),
                Op("thread", 2.0, "serialize"),
            ],
            20.0 * i,
            kinds=KINDS,
        )
        for i in range(60)
    ]
    return [*simulate_gateway(jobs), *(_nested(5000.0 + 300 * i) for i in range(5))]


FIXES = [
    None,
    Fix("thread", ROUTE, "tokenize", gil_free=True),
    Fix("process", ROUTE, None),
    Fix("shrink", ROUTE, "serialize", factor=0.05),
    Fix("gather", ROUTE, "guardrail", other="model"),
    Fix("gather", ROUTE, "tokenize", other="guardrail"),  # inside the handler stage
    Fix("fanout", ROUTE, "lookup"),
    Fix("thread", ROUTE, "handler"),
    Fix("thread", "GET /other", "tokenize"),
]


def _calls(req: RequestRecord, wrap: bool) -> dict[str, ModelCall]:
    return {
        s.span_id: ModelCall("model:gateway:model", 1.5, 2.5, wrap)
        for s in req.stages
        if s.kind == "model"
    }


def _endpoint(req: RequestRecord) -> RequestRecord:
    """``req`` with a plain span beside its stages that covers them all (FastAPI's)."""
    start = (min(s.start_ns for s in req.stages) - BASE_NS) / 1e6
    req.stages.insert(0, stage("endpoint", start, (req.end_ns - BASE_NS) / 1e6,
                               parent=req.span_id))  # fmt: skip
    return req


@pytest.mark.parametrize("order", [1, -1])
def test_programs_from_the_memo_equal_programs_built_afresh(order: int) -> None:
    records = _records()
    for req in [*records, *(_endpoint(r) for r in records[::7])]:
        memo = ProgramMemo()
        variants = [(fix, {}) for fix in FIXES] + [(None, _calls(req, w)) for w in (False, True)]
        for fix, calls in [*variants[::order], *variants]:
            fresh = ProgramBuilder(req, 0, fix, calls, None).program()
            reused = ProgramBuilder(req, 0, fix, calls, memo).program()
            assert reused == fresh, (fix, calls)


def test_a_plain_span_that_covers_stages_is_not_a_node() -> None:
    # FastAPI's endpoint span: a sibling of the stages, covering them.
    req = _endpoint(_nested(0.0))
    tree = StageTree(req)
    endpoint = req.stages[0]
    assert tree.transparent == {endpoint.span_id}
    names = ["handler", "model", "lookup", "lookup", "lookup", "serialize"]
    assert [s.name for s in tree.kids(None)] == names
    assert all(tree.parent(s) is None for s in tree.kids(None))
    # The request's own slice at 100-103 ms lies inside the endpoint span: still its own.
    assert tree.own_slices(None, req) == [(0 + BASE_NS, 1_000_000 + BASE_NS),
                                          (100_000_000 + BASE_NS, 103_000_000 + BASE_NS)]


def test_a_plain_parent_of_stages_is_not_a_node_and_a_plain_leaf_is() -> None:
    # A manual span around two stages (their parent), and a plain CLIENT call (a leaf).
    outer = stage("retrieval", 1, 50, parent=None)
    first = stage("embed", 2, 20, cpu_ms=1.0, wait_ms=17.0, parent=outer.span_id)
    second = stage("search", 21, 49, cpu_ms=1.0, wait_ms=27.0, parent=outer.span_id)
    call = stage("HTTP GET", 52, 60, span_kind="client")
    req = request(ROUTE, 0, 61, [outer, first, second, call], cpu_ms=3.0)
    tree = StageTree(req)
    assert tree.transparent == {outer.span_id}
    assert tree.kids(None) == [first, second, call]
    assert tree.parent(first) is None and tree.kids(outer) == []
    program = ProgramBuilder(req, 0).program()
    assert (DELAY, 8.0) in program  # the plain call: a recorded delay
    # Without the instrumented stages the span is a plain subtree: it stays a node.
    plain = request(ROUTE, 0, 61, [outer, stage("x", 2, 20, parent=outer.span_id)])
    assert StageTree(plain).transparent == set() and StageTree(plain).kids(None) == [outer]


def _example_gateway_request() -> RequestRecord:
    """A non-streamed request of examples/gateway.py under load (concurrency 16), as recorded
    (``make demo``; times in ms from the request's start)."""
    model_waits = [(350.687, 495.194), (607.833, 719.915), (721.909, 723.549), (884.661, 885.728)]
    stages = [
        stage("fastapi.dependencies", 0.262, 0.339, namespace=None),
        stage("fastapi.endpoint", 0.596, 889.118, namespace=None),
        stage("tokenize", 0.66, 1.4, cpu_ms=0.701, wait_ms=0.038, max_block_ms=0.74),
        stage("guardrail", 4.65, 50.897, kind="guardrail", cpu_ms=39.354, wait_ms=6.894,
              max_block_ms=46.247, slices=[(4.65, 50.897)]),
        stage("model", 50.948, 889.009, kind="model", cpu_ms=3.801, wait_ms=574.646,
              loop_wait_ms=259.613, max_block_ms=1.374, slices=[(50.948, 52.322)],
              waits=model_waits),
        stage("serialize", 889.02, 889.07, cpu_ms=0.049, wait_ms=0.0, max_block_ms=0.049),
    ]  # fmt: skip
    return request(ROUTE, 0, 891.857, stages, cpu_ms=44.59, slices=[(0.019, 50.873)])


def test_a_recorded_example_gateway_request_replays_step_by_step() -> None:
    req = _example_gateway_request()
    dependencies, endpoint = req.stages[:2]
    tree = StageTree(req)
    # FastAPI's endpoint span covers the stages; its dependencies span ran inside the
    # request's first step: neither is a node.
    assert tree.transparent == {dependencies.span_id, endpoint.span_id}
    program = ProgramBuilder(req, 0).program()
    delays = [n[1] for n in program if n[0] == DELAY]
    assert max(delays) < 300  # no delay stands for the endpoint span (889 ms)
    steps = [n for n in program if n[0] == LOOP]
    # The first step holds the loop from the request's start to the guardrail's end: the
    # request's own code, tokenize and the guardrail, in one step.
    assert steps[1][1] + steps[1][2] == pytest.approx(50.897 - 0.019, abs=0.01)
    # The model call's first step (a recorded slice), then one step at each of its 4
    # recorded loop waits' ends, then serialize.
    assert len(steps) == 1 + 1 + 1 + 4 + 1
    waited = sum(b - a for a, b in [(350.687, 495.194), (607.833, 719.915),
                                    (721.909, 723.549), (884.661, 885.728)])  # fmt: skip
    total = sum(n[1] + n[2] if n[0] == LOOP else n[1] for n in program)
    assert total == pytest.approx(891.857 - waited, abs=1e-6)


def test_cpu_outside_recorded_slices_holds_the_loop_for_its_waits_for_a_cpu() -> None:
    """On a busy host the loop thread waits for a CPU inside each step: a recorded slice's wall
    time holds that wait, the CPU of shorter steps does not, so the replay adds
    ``cpu_wait`` ms per ms of it as the step's blocking part, taken out of the delays the
    recording put it in (the request's recorded time is unchanged)."""
    req = _example_gateway_request()

    def loop_held(program: list) -> float:
        return sum(n[1] + n[2] for n in program if n[0] == LOOP)

    def total(program: list) -> float:
        return sum(n[1] + n[2] if n[0] == LOOP else n[1] for n in program)

    plain = ProgramBuilder(req, 0).program()
    busy = ProgramBuilder(req, 0, cpu_wait=1.0).program()
    # The model call's four resumptions (CPU not in a slice) hold the loop twice as long.
    resumed = [n for n in plain if n[0] == LOOP and n[1] == pytest.approx(0.60675)]
    assert len(resumed) == 4
    assert [n for n in busy if n[0] == LOOP and n[1] == pytest.approx(0.60675)] == [
        (LOOP, n[1], n[1]) for n in resumed
    ]
    # The recorded slices (the first step: the request's code, tokenize, the guardrail; the
    # model call's first step) keep their recorded wall time: their waits are in it already.
    slices = [(LOOP, 40.74, pytest.approx(10.138)), (LOOP, 1.374, 0.0)]
    assert [n for n in plain if n[0] == LOOP and n[1] > 1] == slices
    assert [n for n in busy if n[0] == LOOP and n[1] > 1] == slices
    # serialize (0.049 ms of CPU in 0.05 ms) cannot hold the loop longer than it took.
    assert busy[-2][1] + busy[-2][2] == pytest.approx(0.05)
    assert loop_held(busy) > loop_held(plain)
    assert total(busy) == pytest.approx(total(plain), abs=1e-6)


def test_host_cpu_wait_is_read_from_the_loop_threads_cpu_share() -> None:
    assert Host(2, FROM_TRACE, 2, 6, 1.0, 0.5).cpu_wait == pytest.approx(1.0)
    assert Host(2, FROM_TRACE, 2, 6, 0.0, None).cpu_wait == 0.0  # not measured: none assumed


def test_a_fix_reuses_the_nodes_it_does_not_touch() -> None:
    req = _nested(0.0)
    memo = ProgramMemo()
    baseline = ProgramBuilder(req, 0, None, None, memo).program()
    model = next(s for s in req.stages if s.name == "model")
    kept = memo.items[id(model)]
    fixed = ProgramBuilder(req, 0, Fix("thread", ROUTE, "tokenize"), None, memo).program()
    assert fixed != baseline
    assert memo.items[id(model)] is kept  # the model stage's program was reused
