"""The pyinstrument drill-down on a real gateway (uvicorn on 127.0.0.1, ``tracekit.record()``):
the profile of a CPU-heavy stage names the helper two calls down that burns the time, the
``cpu-on-loop`` finding and the HTML report carry it; sampling, the threshold, a blocked
loop window, and the missing extra."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tests.conftest import Server, settled
from tracekit import semconv
from tracekit.stage import set_probe

pytest.importorskip("pyinstrument")
from tracekit.integrations import pyinstrument


def _slow_helper(text: str, rounds: int) -> int:
    total = 0
    for _ in range(rounds):
        for ch in text:
            total = (total * 31 + ord(ch)) % 1_000_003
    return total


def _normalize(text: str, rounds: int) -> int:
    return _slow_helper(text.lower(), rounds)


@tracekit.stage("tokenize")
def tokenize(text: str, rounds: int) -> int:
    return _normalize(text, rounds)


async def chat(request: Request) -> JSONResponse:
    rounds = int(request.query_params.get("rounds", "400"))
    return JSONResponse({"n": tokenize("Hello World " * 20, rounds)})


def _block(seconds: float) -> None:
    time.sleep(seconds)


async def blocking(request: Request) -> JSONResponse:
    _block(0.3)
    return JSONResponse({"ok": True})


APP = tracekit.TracekitMiddleware(Starlette(routes=[
    Route("/v1/chat", chat, methods=["POST"]), Route("/block", blocking)]))  # fmt: skip


@pytest.fixture
def profiling() -> Iterator[Any]:
    yield pyinstrument
    pyinstrument.disable()
    set_probe(None)


def _stages(spans: list[Any]) -> list[Any]:
    return [s for s in spans if s.attributes.get(semconv.STAGE) == "tokenize"]


def _drive(rec: Any, requests: int, rounds: int = 400) -> list[Any]:
    server = Server(APP)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(requests):
                client.post(f"/v1/chat?rounds={rounds}").raise_for_status()
        return settled(rec, requests)
    finally:
        server.stop()


def test_profile_names_the_helper_two_calls_down(profiling: Any) -> None:
    profiling.enable(every=1, min_ms=5.0, loop=False)
    with tracekit.record() as rec:
        spans = _drive(rec, 4)
    stages = _stages(spans)
    assert len(stages) == 4
    for span in stages:
        hot = span.attributes[semconv.PROFILE_HOT]
        first = _hottest_python(span.attributes)  # ord, the builtin it calls, can rank first
        assert first.startswith("_slow_helper (tests/integrations/test_pyinstrument.py:"), hot
        assert len(hot.splitlines()) <= 5
        tree = span.attributes[semconv.PROFILE_TREE]
        # the tree runs tokenize -> _normalize -> _slow_helper, tracekit's wrapper left out
        names = [line.split(" ms ", 1)[1].split(" (")[0] for line in tree.splitlines()]
        assert names[:3] == ["tokenize", "_normalize", "_slow_helper"], tree
        assert "stage.py" not in tree
        assert len(tree) <= pyinstrument.TREE_CHARS
        assert span.attributes[semconv.PROFILE_MS] >= 5.0
    report = rec.report()
    finding = next(f for f in report.findings if f.rule == "cpu-on-loop" and f.stage == "tokenize")
    assert "_slow_helper (tests/integrations/test_pyinstrument.py:" in finding.evidence
    html = report.to_html()
    assert "_slow_helper" in html and "call tree" in html.lower()


def test_one_call_in_every_is_profiled_and_cheap_calls_are_not_attached(profiling: Any) -> None:
    profiling.enable(every=3, min_ms=5.0, loop=False)
    with tracekit.record() as rec:
        spans = _drive(rec, 7)
    profiled = [s for s in _stages(spans) if semconv.PROFILE_HOT in s.attributes]
    assert len(profiled) == 3  # calls 1, 4 and 7
    profiling.enable(every=1, min_ms=50.0, loop=False)
    with tracekit.record() as rec:
        spans = _drive(rec, 3, rounds=1)  # well under 50 ms of code each
    assert not [s for s in _stages(spans) if semconv.PROFILE_HOT in s.attributes]


def test_off_by_default_and_disable_removes_it(profiling: Any) -> None:
    with tracekit.record() as rec:
        spans = _drive(rec, 2)
    assert not [s for s in _stages(spans) if semconv.PROFILE_HOT in s.attributes]
    profiling.enable(every=1, loop=False)
    profiling.disable()
    with tracekit.record() as rec:
        spans = _drive(rec, 2)
    assert not [s for s in _stages(spans) if semconv.PROFILE_HOT in s.attributes]


def test_a_blocked_loop_window_is_profiled(profiling: Any) -> None:
    # A stage call lets the watch find the loop; then the loop is blocked for 0.3 s at a
    # time: the check runs late, the next window is profiled and lands on a loop span.
    profiling.enable(every=1000, loop=True, window_s=0.5, block_ms=50.0)
    server = Server(APP)
    try:
        with tracekit.record() as rec, httpx.Client(base_url=server.url, timeout=30) as client:
            client.post("/v1/chat?rounds=1").raise_for_status()
            deadline = time.monotonic() + 20
            profiled: list[Any] = []
            while not profiled and time.monotonic() < deadline:
                client.get("/block").raise_for_status()
                profiled = [s for s in rec.spans if s.name == semconv.LOOP_SPAN
                            and semconv.PROFILE_HOT in s.attributes]  # fmt: skip
    finally:
        server.stop()
    assert profiled, "no loop window was profiled"
    attrs = profiled[0].attributes
    assert attrs[semconv.PROFILE_REASON].startswith(("blocked", "saturated"))
    assert "_block (tests/integrations/test_pyinstrument.py:" in attrs[semconv.PROFILE_TREE]


def test_missing_package_names_the_extra() -> None:
    code = ("import sys; sys.modules['pyinstrument'] = None\n"
            "try:\n    import tracekit.integrations.pyinstrument\n"
            "except ImportError as e:\n    print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'tracekit[pyinstrument]'" in out.stdout, out.stderr


def test_bad_arguments() -> None:
    for kwargs in ({"every": 0}, {"min_ms": -1}, {"interval_ms": 0}, {"top": 0}):
        with pytest.raises(ValueError):
            pyinstrument.enable(**kwargs)


# --- the other stage forms, errors, the summary -------------------------------------------------
def _spin_async_helper(ms: float) -> None:
    # Python CPU only (a C call such as time.thread_time() would show as its own frame)
    end = time.perf_counter_ns() + int(ms * 1e6)
    n = 0
    while n < 10**9:
        n += 1
        if n % 2000 == 0 and time.perf_counter_ns() > end:
            return


def _hottest_python(attrs: Any) -> str:
    # The hottest line that is a Python function: pyinstrument samples at call events, and the
    # helper's only ones are its clock reads, so on a busy host the builtin it calls can rank
    # first with the time the thread was descheduled (seen: perf_counter_ns 26.9 of 38.5 ms).
    lines = attrs[semconv.PROFILE_HOT].splitlines()
    return next((line for line in lines if "(<built-in>)" not in line), "")


@tracekit.stage("guardrail")
async def guard() -> None:
    await asyncio.sleep(0.05)  # a wait: not the stage's time, not in the profile
    _spin_async_helper(30)


@tracekit.stage("tokenize")
def failing() -> None:
    _spin_async_helper(10)
    raise KeyError("boom")


def test_async_stage_and_block_and_errors(profiling: Any) -> None:
    profiling.enable(every=1, min_ms=5.0, loop=False)

    async def main() -> None:
        await guard()
        with tracekit.stage("serialize"):
            _spin_async_helper(20)
        with pytest.raises(KeyError, match="boom"):  # the app's exception, unchanged
            failing()

    with tracekit.record() as rec:  # each stage a tree of its own (no request around them)
        asyncio.run(main())
        spans = {s.attributes.get(semconv.STAGE): s for s in rec.spans}
    guard_attrs = spans["guardrail"].attributes
    assert _hottest_python(guard_attrs).startswith("_spin_async_helper ("), guard_attrs
    # ~30 ms of code sampled; the 50 ms sleep is not in it
    assert 15 <= guard_attrs[semconv.PROFILE_MS] < 60  # with the sleep it would be >= 80
    assert _hottest_python(spans["serialize"].attributes).startswith("_spin_async_helper (")
    # the block's tree starts at the function the block runs in
    assert "main (tests/integrations/test_pyinstrument.py:" in spans["serialize"].attributes[
        semconv.PROFILE_TREE].splitlines()[0]  # fmt: skip
    assert _hottest_python(spans["tokenize"].attributes).startswith("_spin_async_helper (")
    assert spans["tokenize"].status.status_code.name == "ERROR"


# tracekit's frames: its package's, and its integrations' (beside tracekit/ in a checkout).
_CHECKOUT_INTEGRATIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "integrations", "pyinstrument.py")  # fmt: skip
_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(tracekit.__file__)), "stage.py")


@pytest.mark.parametrize("wrapper", [_PACKAGE, _CHECKOUT_INTEGRATIONS], ids=["package", "integrations"])
def test_summarize_bounds_and_leaves_out_waits_and_tracekit(wrapper: str) -> None:
    me = "f\x00/app/x.py\x001"
    own = f"sync_stage\x00{wrapper}\x0010"
    records: list[tuple[list[str], float]] = [
        (["<thread>\x00<thread>\x000", "root\x00/app/r.py\x001", own, me, "g\x00/app/x.py\x005"], 0.004),
        (["<thread>\x00<thread>\x000", "root\x00/app/r.py\x001", own, me], 0.001),
        (["<thread>\x00<thread>\x000", "root\x00/app/r.py\x001", own, me, "[await]\x00<await>\x000"], 0.5),
    ]
    start = ["<thread>\x00<thread>\x000", "root\x00/app/r.py\x001\x01l3", own]
    profile = pyinstrument.summarize(records, start, top=5)
    assert profile is not None
    assert profile.samples == 2 and profile.ms == pytest.approx(5.0)
    assert profile.hot.splitlines()[0] == "g (/app/x.py:5) self 4.0 ms, total 4.0 ms"
    assert profile.hot.splitlines()[1] == "f (/app/x.py:1) self 1.0 ms, total 5.0 ms"
    # a decorated function: the tree starts at it (tracekit's wrapper, where the profile
    # started, left out)
    assert profile.tree.splitlines() == ["5.0 ms f (/app/x.py:1)", "  4.0 ms g (/app/x.py:5)"]
    # a block: the start's last frame (the function the block runs in) is kept as the root
    block = [(r[:2] + r[3:], t) for r, t in records]
    in_block = pyinstrument.summarize(block, start[:2])
    assert in_block is not None
    assert in_block.tree.splitlines()[:2] == ["5.0 ms root (/app/r.py:1)", "  5.0 ms f (/app/x.py:1)"]
    deep = [(["<thread>\x00<thread>\x000"] + [f"fn{i}\x00/app/{'d' * 80}.py\x00{i}" for i in range(60)],
             0.001)]  # fmt: skip
    big = pyinstrument.summarize(deep, [], top=5)
    assert big is not None and len(big.tree) <= pyinstrument.TREE_CHARS
    assert len(big.tree.splitlines()) <= pyinstrument.TREE_DEPTH
    assert pyinstrument.summarize(records[2:], start) is None  # only waits


def test_a_profiled_loop_window_reaches_loop_saturated_the_report_and_the_html() -> None:
    from tests.analysis.test_loop_view import _saturated
    from tracekit.analysis.api import analyze_spans

    spans = _saturated()
    window = next(s for s in spans if s.name == semconv.LOOP_SPAN)
    window.attributes.update({
        semconv.PROFILE_HOT: "render_json (app/views.py:40) self 310.0 ms, total 420.0 ms",
        semconv.PROFILE_TREE: "420.0 ms render_json (app/views.py:40)",
        semconv.PROFILE_MS: 900.0, semconv.PROFILE_SAMPLES: 900,
        semconv.PROFILE_REASON: "saturated: loop thread busy 95% of the last 1 s"})  # fmt: skip
    report = analyze_spans(spans)
    (f,) = [f for f in report.findings if f.rule == "loop-saturated"]
    assert ("pyinstrument profiled the loop thread for a window (saturated: loop thread busy 95% "
            "of the last 1 s; 900 ms sampled): most self time in render_json (app/views.py:40)"
            ) in f.evidence
    (loop,) = report.to_dict()["loop"]["loops"]
    assert loop["profile"]["hot"].startswith("render_json (app/views.py:40)")
    html = report.to_html()
    assert "the loop thread&#x27;s call tree" in html or "the loop thread's call tree" in html
    # without a profile: no such clause, no profile key
    plain = analyze_spans(_saturated())
    assert "pyinstrument" not in next(f for f in plain.findings if f.rule == "loop-saturated").evidence
    assert "profile" not in plain.to_dict()["loop"]["loops"][0]
