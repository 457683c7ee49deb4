"""Accounting arithmetic to the exact microsecond, with FakeClock; the loop-wait estimator."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

import tracekit
from tracekit import semconv as sc
from tracekit._core import clock, event_loop, ledger
from tracekit._core.ledger import covered_ns
from tracekit.testing import FakeClock

from ..conftest import by_name

MS = 1_000_000


def test_exact_split_of_nested_sync_and_async_stages() -> None:
    with FakeClock() as clock, tracekit.record() as rec:

        @tracekit.stage("tokenize")
        def tokenize() -> None:
            clock.burn(30)
            clock.block(5)  # e.g. time.sleep: off-CPU but holding the loop

        @tracekit.stage("model")
        async def model() -> None:
            clock.burn(2)
            await clock.sleep(100)
            clock.burn(1)

        @tracekit.stage("request")
        async def root() -> None:
            clock.burn(1)
            tokenize()
            await model()
            clock.burn(0.5)

        asyncio.run(root())
        spans = by_name(rec.spans)

    tok, mod, req = (spans[n].attributes for n in ("tokenize", "model", "request"))
    assert (tok[sc.WALL_MS], tok[sc.CPU_MS], tok[sc.WAIT_MS], tok[sc.LOOP_WAIT_MS]) == (35, 30, 5, 0)
    assert tok[sc.MAX_BLOCK_MS] == 35 and tok[sc.ON_LOOP] is True
    assert (mod[sc.WALL_MS], mod[sc.CPU_MS], mod[sc.WAIT_MS], mod[sc.LOOP_WAIT_MS]) == (103, 3, 100, 0)
    assert mod[sc.MAX_BLOCK_MS] == 2 and mod[sc.STEPS] == 2
    assert req[sc.WALL_MS] == 139.5 and req[sc.CPU_MS] == 1.5 and req[sc.CHILDREN_MS] == 138
    assert req[sc.WAIT_MS] == 0
    assert spans["model"].end_time - spans["model"].start_time == 103 * MS


def test_exclusive_cpu_with_three_levels() -> None:
    with FakeClock() as clock, tracekit.record() as rec:

        @tracekit.stage("c")
        def c() -> None:
            clock.burn(4)

        @tracekit.stage("b")
        def b() -> None:
            clock.burn(2)
            c()
            clock.burn(1)

        @tracekit.stage("a")
        def a() -> None:
            clock.burn(8)
            b()

        a()
        spans = by_name(rec.spans)
    assert [spans[n].attributes[sc.CPU_MS] for n in "abc"] == [8, 3, 4]
    assert [spans[n].attributes[sc.WALL_MS] for n in "abc"] == [15, 7, 4]


def test_async_generator_consumer_time_is_separate() -> None:
    with FakeClock() as clock, tracekit.record() as rec:

        @tracekit.stage("model")
        async def tokens():  # type: ignore[no-untyped-def]
            for i in range(3):
                await clock.sleep(10)
                clock.burn(1)
                yield i

        async def consume() -> None:
            async for _ in tokens():
                clock.block(4)  # the consumer's work between items

        asyncio.run(consume())
        (span,) = rec.spans
    a = span.attributes
    assert a[sc.WALL_MS] == 3 * 11 + 3 * 4
    assert (a[sc.CPU_MS], a[sc.WAIT_MS], a[sc.CONSUMER_MS]) == (3, 30, 12)
    assert a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(0.011)


def test_streaming_metrics_exact() -> None:
    from .asgi import call, http_scope

    with FakeClock() as clock, tracekit.record() as rec:

        async def app(scope: Any, receive: Any, send: Any) -> None:
            clock.advance(7)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for gap in (5, 10, 20, 30):
                clock.advance(gap)
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
            clock.advance(1)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        asyncio.run(call(tracekit.TracekitMiddleware(app), http_scope("/s")))
        (server,) = rec.spans
    a = server.attributes
    assert (a[sc.TTFB_MS], a[sc.TTFT_MS], a[sc.CHUNKS]) == (7, 12, 4)
    # gaps 10, 20, 30 ms; percentiles interpolate between the closest ranks (p95: 20 + 0.9 * 10)
    assert (a[sc.ITL_P50_MS], a[sc.ITL_P95_MS], a[sc.ITL_MAX_MS]) == pytest.approx((20, 29, 30))
    assert a[sc.TPOT_MS] == 20  # (last - first) / (chunks - 1) = 60 / 3
    assert a[sc.WALL_MS] == 73  # ends when the last (empty) body message left


def test_covered_is_the_union_clipped() -> None:
    assert covered_ns([(0, 10), (5, 20), (30, 40)], 0, 35) == 25
    assert covered_ns([(-5, 3)], 0, 100) == 3
    assert covered_ns(None, 0, 10) == 0


def _state(*slices_ms: tuple[float, float]) -> event_loop.ThreadState:
    state = event_loop.ThreadState()
    for start, end in slices_ms:
        event_loop.record_slice(state, int(start * MS), int(end * MS))
    return state


class _Awaiting:
    def __init__(self, awaited: Any) -> None:
        self.cr_await = awaited


def test_estimator_no_loop_activity_means_no_loop_wait() -> None:
    assert event_loop.estimate_loop_wait(_state(), 0, 100 * MS, None) == 0
    assert event_loop.estimate_loop_wait(_state((0, 5)), 10 * MS, 100 * MS, None) == 0


def test_estimator_uses_the_sleep_deadline() -> None:
    sleeping = asyncio.sleep(0.05)  # a real (unstarted) sleep coroutine: its frame has `delay`
    try:
        state = _state((1, 200))
        waited = event_loop.estimate_loop_wait(state, 0, 200 * MS, _Awaiting(sleeping))
        assert waited == 150 * MS
        idle_before_deadline = _state((1, 30))
        assert event_loop.estimate_loop_wait(idle_before_deadline, 0, 60 * MS, _Awaiting(sleeping)) == 0
    finally:
        sleeping.close()


def test_estimator_takes_the_probed_lag_for_unknown_readiness() -> None:
    state = _state((10, 40), (40.2, 100))  # the loop busy from 10 ms up to 100 ms
    state.lag, state.lag_at = 30 * MS, 95 * MS  # what the loop probe measured last, and when
    assert event_loop.estimate_loop_wait(state, 0, int(100.5 * MS), None) == 30 * MS
    # Never more than the busy run, clipped to the suspension.
    assert event_loop.estimate_loop_wait(state, 90 * MS, int(100.5 * MS), None) == int(10.5 * MS)
    # A measurement in the probe period before the suspension still speaks for it (a short
    # suspension, a stream's next chunk, mostly contains none), clipped to the suspension...
    assert event_loop.estimate_loop_wait(state, 96 * MS, int(100.5 * MS), None) == int(4.5 * MS)
    # ... and one older than that says nothing about it.
    state.lag_at = 96 * MS - event_loop.PROBE_NS
    assert event_loop.estimate_loop_wait(state, 96 * MS, int(100.5 * MS), None) == 0
    # The probe's timer overdue since 80.5 ms, longer than the lag: clipped to the suspension.
    state.probe_due = int(80.5 * MS)
    assert event_loop.estimate_loop_wait(state, 96 * MS, int(100.5 * MS), None) == int(4.5 * MS)
    # The loop idle for longer than GAP_NS before the resumption: the readiness came then.
    assert event_loop.estimate_loop_wait(state, 0, 100 * MS + event_loop.GAP_NS + 1, None) == 0


def test_estimator_reads_an_idle_gap_before_the_resumption_by_the_loops_cpu() -> None:
    # Another request's block held the loop from 10 to 32 ms; the probe measured a 20 ms lag
    # right after it. This reply came later: the loop's last traced slice ended at 33 ms and
    # the coroutine resumed at 41 ms, with the loop thread on CPU 0.3 ms in between (idle).
    state = event_loop.ThreadState()
    event_loop.record_slice(state, 10 * MS, 32 * MS, cpu=500 * MS)
    event_loop.record_slice(state, int(32.2 * MS), 33 * MS, cpu=501 * MS)
    state.lag, state.lag_at = 20 * MS, int(32.1 * MS)
    idle = int(501.3 * MS)
    assert event_loop.estimate_loop_wait(state, 0, 41 * MS, None, idle) == int(0.3 * MS)
    # Without the CPU reading, as before: the lag.
    assert event_loop.estimate_loop_wait(state, 0, 41 * MS, None) == 20 * MS
    # The loop thread on CPU for most of the gap (untraced work held it): the lag stands.
    assert event_loop.estimate_loop_wait(state, 0, 41 * MS, None, 507 * MS) == 20 * MS
    # A resumption right after the block (a gap under IDLE_GAP_NS): the lag stands.
    assert event_loop.estimate_loop_wait(state, 0, int(33.5 * MS), None, int(501.1 * MS)) == 20 * MS


def test_estimator_counts_the_probes_overdue_time_whole_after_short_slices() -> None:
    # A saturated loop: the probe's timer was due at 50 ms, and many short slices have run
    # since; work made ready by then has waited 50 ms at 100 ms, more than the last lag.
    state = event_loop.ThreadState()
    state.probe_due = 50 * MS
    for start in range(0, 100, 2):
        event_loop.record_slice(state, start * MS, start * MS + 1_900_000)
    state.lag, state.lag_at = 20 * MS, 45 * MS
    assert event_loop.estimate_loop_wait(state, 10 * MS, 100 * MS, None) == 50 * MS


def test_estimator_counts_half_of_one_block_across_the_probes_deadline() -> None:
    # One traced slice held the loop from 40 to 100 ms across the deadline at 50 ms: the
    # readiness came at an unknown point of it, so half of its 50 ms after the deadline.
    state = event_loop.ThreadState()
    state.probe_due = 50 * MS
    event_loop.record_slice(state, 40 * MS, 100 * MS)
    assert event_loop.estimate_loop_wait(state, 10 * MS, 100 * MS, None) == 25 * MS
    # Short slices after the block count whole: 25 ms of the block and the 10 ms after it.
    event_loop.record_slice(state, 100 * MS, 105 * MS)
    event_loop.record_slice(state, 105 * MS, 110 * MS)
    assert event_loop.estimate_loop_wait(state, 10 * MS, 110 * MS, None) == 35 * MS
    # The next deadline, with no slice across it: the earlier block is not this one's.
    state.probe_due = 120 * MS
    event_loop.record_slice(state, 110 * MS, 119 * MS)
    event_loop.record_slice(state, 121 * MS, 130 * MS)
    assert event_loop.estimate_loop_wait(state, 10 * MS, 130 * MS, None) == 10 * MS


def test_only_the_checkpoint_right_before_a_wait_for_io_is_part_of_it() -> None:
    # anyio's stream yields after writing a request's headers (the server waits for the
    # body: loop wait), writes the body in a short step, yields again (the model works
    # meanwhile: part of the wait for the reply), then waits for the reply.
    state = event_loop.ThreadState()
    event_loop.record_slice(state, 0, 100 * MS)  # another request holds the loop throughout
    state.lag, state.lag_at = 10 * MS, 95 * MS
    led = ledger.Ledger(ledger.Site("model", "model"), None, None, 1, start=0)
    for suspended, resumed, ready in ((0, 20 * MS, True), (20 * MS + 50_000, 40 * MS, True),
                                      (40 * MS, 100 * MS, False)):  # fmt: skip
        led.suspended_at, led.suspended_ready = suspended, ready
        ledger.resume(led, state, None, resumed)
    assert led.loop_wait == 20 * MS + 10 * MS  # the first checkpoint, and the reply's wait
    assert led.waits == [(0, 20 * MS), (90 * MS, 10 * MS)]  # the intervals say the same


def test_very_long_streams_keep_a_bounded_sample_of_gaps() -> None:
    from tracekit import middleware

    from .asgi import call, http_scope

    n = middleware.MAX_GAPS * 3
    with FakeClock() as clock, tracekit.record() as rec:

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(n):
                clock.advance(50 if i == n - 1 else (1 if i % 2 else 3))  # one long gap, at the end
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        asyncio.run(call(tracekit.TracekitMiddleware(app), http_scope("/long")))
        (server,) = rec.spans
    a = server.attributes
    assert a[sc.CHUNKS] == n
    assert a[sc.ITL_MAX_MS] == 50  # the exact maximum, even if the sample missed it
    assert 1 <= a[sc.ITL_P50_MS] <= 3 and a[sc.ITL_P95_MS] == 3


class _CountingClock:
    """A real-looking clock for cpu_now: wall set by the test, CPU reads counted."""

    def __init__(self) -> None:
        self.wall = 10 * MS
        self.cpu = 5 * MS
        self.reads = 0

    def cpu_ns(self) -> int:
        self.reads += 1
        return self.cpu

    def install(self) -> None:
        from tracekit._core import clock

        clock.install(lambda: self.wall, self.cpu_ns, 0)


def test_cpu_readings_close_together_are_inferred_with_a_bounded_error() -> None:
    fake = _CountingClock()
    fake.install()
    try:
        state = event_loop.ThreadState()
        assert event_loop.cpu_now(state, fake.wall) == 5 * MS and fake.reads == 1
        # 8 us later, the thread having run 3 us of it: inferred, high by 5 us at most
        fake.wall += 8_000
        fake.cpu += 3_000
        assert event_loop.cpu_now(state, fake.wall) == 5 * MS + 8_000 and fake.reads == 1
        # past the window (measured from the last real reading): a real reading again
        fake.wall += event_loop.CPU_REUSE_NS
        fake.cpu += 1_000
        assert event_loop.cpu_now(state, fake.wall) == fake.cpu and fake.reads == 2
        # a fake that went backwards (another fake installed) is never trusted
        assert event_loop.cpu_now(state, fake.wall - 1) == fake.cpu and fake.reads == 3
    finally:
        clock.restore()


def test_a_burst_of_stages_reads_the_cpu_clock_a_few_times_not_at_every_boundary() -> None:
    fake = _CountingClock()
    fake.install()
    gc.disable()  # a collection reads the clocks too (tracekit._core.gc_pauses)
    try:
        with tracekit.record() as rec:

            @tracekit.stage("tokenize")
            def tokenize() -> None:
                fake.wall += 1_000
                fake.cpu += 1_000

            for _ in range(5):
                tokenize()
            spans = rec.spans
    finally:
        gc.enable()
        clock.restore()
    assert len(spans) == 5
    assert fake.reads == 1  # 10 step boundaries within 20 us of wall time: one real read
    assert all(s.attributes[sc.CPU_MS] == 0.001 for s in spans)
