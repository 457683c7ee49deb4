"""Stage forms, nesting, child tasks and threads (no server needed: ASGI-free)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import anyio
import pytest

import tracekit
from tracekit import semconv as sc
from tracekit._core import event_loop
from tracekit.stage import Stage

from ..conftest import by_name
from .apps import burn_cpu, spin


def test_bare_decorator_named_and_kind_from_name() -> None:
    @tracekit.stage
    def guardrail(x: int) -> int:
        return x + 1

    @tracekit.stage("post", kind="serialize")
    def post(x: int) -> int:
        return x

    with tracekit.record() as rec:
        assert guardrail(1) == 2
        assert post(3) == 3
    spans = by_name(rec.spans)
    assert spans["guardrail"].attributes[sc.STAGE_KIND] == "guardrail"
    assert spans["post"].attributes[sc.STAGE_KIND] == "serialize"
    assert guardrail.__name__ == "guardrail"  # functools.wraps


def test_unknown_name_is_other_and_bad_kind_is_an_error() -> None:
    assert Stage("embed").kind == "other"
    with pytest.raises(ValueError, match="unknown stage kind"):
        tracekit.stage("x", kind="gpu")
    with pytest.raises(ValueError):
        tracekit.stage("")


def test_no_spans_and_no_cost_when_nothing_records() -> None:
    @tracekit.stage("tokenize")
    def tokenize() -> str:
        return "same"

    assert tokenize() == "same"


def test_nested_cpu_is_exclusive() -> None:
    @tracekit.stage("tokenize")
    def inner() -> None:
        spin(30)

    @tracekit.stage("outer")
    def outer() -> None:
        spin(10)
        inner()

    with tracekit.record() as rec:
        outer()
    spans = by_name(rec.spans)
    o, i = spans["outer"].attributes, spans["tokenize"].attributes
    assert spans["tokenize"].parent.span_id == spans["outer"].context.span_id
    # its own 10 units of work, not the child's 30 (fixed work: a ratio, whatever the load)
    assert 0.2 <= o[sc.CPU_MS] / i[sc.CPU_MS] <= 0.5
    assert o[sc.CHILDREN_MS] == pytest.approx(i[sc.WALL_MS], abs=0.5)


def test_async_stages_in_gather_and_taskgroup_attach_to_their_parent() -> None:
    @tracekit.stage("guardrail")
    async def guard() -> str:
        await asyncio.sleep(0.02)
        return "ok"

    @tracekit.stage("model")
    async def model() -> str:
        await asyncio.sleep(0.03)
        return "text"

    @tracekit.stage("pipeline")
    async def pipeline() -> list[str]:
        first = await asyncio.gather(guard(), model())
        if sys.version_info >= (3, 11):
            async with asyncio.TaskGroup() as group:
                task = group.create_task(model())
            first.append(task.result())
        return first

    with tracekit.record() as rec:
        result = asyncio.run(pipeline())
    assert result[:2] == ["ok", "text"]
    spans = rec.spans
    (root,) = [s for s in spans if s.name == "pipeline"]
    children = [s for s in spans if s.name in ("guardrail", "model")]
    assert len(children) == (3 if sys.version_info >= (3, 11) else 2)
    assert all(s.parent.span_id == root.context.span_id for s in children)
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    # concurrent children overlap: covered time is their union, not their sum
    assert root.attributes[sc.CHILDREN_MS] < sum(s.attributes[sc.WALL_MS] for s in children)


def test_to_thread_and_anyio_threads_keep_the_parent() -> None:
    @tracekit.stage("tokenize")
    def tokenize() -> int:
        return burn_cpu(10)

    @tracekit.stage("request")
    async def handler() -> None:
        await asyncio.to_thread(tokenize)
        await anyio.to_thread.run_sync(tokenize)

    with tracekit.record() as rec:
        asyncio.run(handler())
    spans = rec.spans
    (root,) = [s for s in spans if s.name == "request"]
    tokens = [s for s in spans if s.name == "tokenize"]
    assert len(tokens) == 2
    for span in tokens:
        assert span.parent.span_id == root.context.span_id
        assert span.attributes[sc.ON_LOOP] is False
    assert root.attributes[sc.CPU_MS] < 5  # the workers' CPU is theirs, not the parent's


def test_async_generator_stage_times_its_iterations_not_the_consumer() -> None:
    @tracekit.stage("model")
    async def stream_tokens(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            await asyncio.sleep(0.01)
            yield i

    async def consume() -> list[int]:
        out = []
        async for item in stream_tokens(5):
            time.sleep(0.01)  # the consumer's time is not the model's
            out.append(item)
        return out

    with tracekit.record() as rec:
        assert asyncio.run(consume()) == [0, 1, 2, 3, 4]
    (model,) = rec.spans
    a = model.attributes
    assert a[sc.STEPS] >= 10
    assert a[sc.CONSUMER_MS] == pytest.approx(50, rel=0.4)
    assert a[sc.WAIT_MS] == pytest.approx(50, rel=0.4)
    assert a[sc.GEN_AI_REQUEST_STREAM] is True
    assert 0.005 <= a[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] <= 0.05


def test_async_generator_closed_early_still_ends_its_span() -> None:
    @tracekit.stage("model")
    async def stream_tokens():  # type: ignore[no-untyped-def]
        for i in range(100):
            await asyncio.sleep(0)
            yield i

    async def take_two() -> list[int]:
        gen = stream_tokens()
        out = [await gen.__anext__(), await gen.__anext__()]
        await gen.aclose()
        return out

    with tracekit.record() as rec:
        assert asyncio.run(take_two()) == [0, 1]
    (model,) = rec.spans
    assert "tracekit.unfinished" not in model.attributes


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_stream_its_relay_stops_reading_at_done_ends_at_its_last_item(loop_kind: str) -> None:
    # A proxy's relay breaks out of the model stream at "[DONE]" without aclose(): the
    # stage ends at its last item, not when the request's linger ends (it showed ~1 s of
    # model wait in a 150 ms request then).
    @tracekit.stage("model")
    async def stream_model():  # type: ignore[no-untyped-def]
        for i in range(5):
            await asyncio.sleep(0.01)
            yield str(i)
        yield "[DONE]"
        await asyncio.sleep(5)  # never reached: nobody asks for more

    async def relay(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        async for data in stream_model():
            if data == "[DONE]":
                break
            await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> None:
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "root_path": "",
                 "query_string": b"", "headers": [], "scheme": "http", "http_version": "1.1"}  # fmt: skip
        await tracekit.TracekitMiddleware(relay)(scope, receive, send)

    started = time.monotonic()
    with tracekit.record() as rec:
        if loop_kind == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
        spans = rec.spans
    assert time.monotonic() - started < 0.9  # handed on without waiting for the linger
    model = next(s.attributes for s in spans if s.name == "model")
    request = next(s.attributes for s in spans if s.kind.name == "SERVER")
    assert "tracekit.unfinished" not in model
    assert 45 <= model[sc.WALL_MS] < 150, model
    assert request[sc.MODEL_WAIT_MS] <= request[sc.WALL_MS], request


def test_with_and_async_with_blocks() -> None:
    async def handler() -> None:
        with tracekit.stage("serialize"):
            spin(10)
        async with tracekit.stage("guardrail"):
            await asyncio.sleep(0.03)

    @tracekit.stage("request")
    async def root() -> None:
        await handler()

    with tracekit.record() as rec:
        asyncio.run(root())
    spans = by_name(rec.spans)
    ser, guard = spans["serialize"].attributes, spans["guardrail"].attributes
    assert ser[sc.CPU_MS] >= 2 and ser[sc.ON_LOOP] is True
    assert guard[sc.WAIT_MS] == pytest.approx(30, rel=0.4)
    assert guard[sc.CPU_MS] < 5
    assert spans["serialize"].parent.span_id == spans["request"].context.span_id
    assert spans["request"].attributes[sc.CPU_MS] < 5


def test_one_stage_object_shared_by_concurrent_tasks() -> None:
    guard = tracekit.stage("guardrail")

    async def check(delay: float) -> float:
        start = time.perf_counter()
        async with guard:
            await asyncio.sleep(delay)
        return (time.perf_counter() - start) * 1000  # the block lies within this

    @tracekit.stage("request")
    async def root() -> list[float]:
        return list(await asyncio.gather(check(0.03), check(0.01)))

    with tracekit.record() as rec:
        around = sorted(asyncio.run(root()))
    walls = sorted(s.attributes[sc.WALL_MS] for s in rec.spans if s.name == "guardrail")
    # Each block's own span: at least its sleep, at most the time around it (on a busy host
    # both only grow); a span timed from the other task's entry or exit would cross a bound.
    assert 9.5 <= walls[0] <= around[0] and 29.5 <= walls[1] <= around[1]


def test_exceptions_pass_through_stages_unchanged() -> None:
    error = KeyError("boom")

    @tracekit.stage("guardrail")
    def sync_fail() -> None:
        raise error

    @tracekit.stage("model")
    async def async_fail() -> None:
        await asyncio.sleep(0)
        raise error

    with tracekit.record() as rec:
        with pytest.raises(KeyError) as sync_info:
            sync_fail()
        with pytest.raises(KeyError) as async_info:
            asyncio.run(async_fail())
        with pytest.raises(KeyError) as block_info, tracekit.stage("serialize"):
            raise error
    assert sync_info.value is error and async_info.value is error and block_info.value is error
    assert all(s.status.status_code.name == "ERROR" for s in rec.spans)


def test_cancellation_passes_through() -> None:
    @tracekit.stage("model")
    async def forever() -> None:
        await asyncio.sleep(10)

    async def main() -> bool:
        task = asyncio.create_task(forever())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    with tracekit.record() as rec:
        assert asyncio.run(main()) is True
    (model,) = rec.spans
    assert model.status.status_code.name == "UNSET"  # a cancellation is not an error


def test_tokenize_counts_tokens() -> None:
    @tracekit.stage("tokenize")
    def tokenize(text: str) -> list[int]:
        return [ord(c) for c in text]

    with tracekit.record() as rec:
        tokenize("hello")
    assert rec.spans[0].attributes[sc.TOKENS] == 5


def test_sync_generator_stage_times_each_item_in_its_thread() -> None:
    @tracekit.stage("serialize")
    def chunks(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            spin(2)
            yield f"data: {i}\n\n"

    @tracekit.stage("request")
    async def handler() -> list[str]:
        return await asyncio.to_thread(lambda: list(chunks(4)))  # as Starlette iterates it

    with tracekit.record() as rec:
        assert asyncio.run(handler()) == [f"data: {i}\n\n" for i in range(4)]
    spans = by_name(rec.spans)
    a = spans["serialize"].attributes
    assert spans["serialize"].parent.span_id == spans["request"].context.span_id
    assert a[sc.STEPS] == 5  # four items and the final StopIteration
    assert a[sc.ON_LOOP] is False and a[sc.CPU_MS] >= 2
    assert "tracekit.unfinished" not in a


def test_a_block_in_a_task_no_driver_steps_keeps_wall_time_only() -> None:
    # The child task runs no tracekit driver: its block cannot see its own suspensions, so
    # it must not take steps, which would charge the parent's CPU to it while it is parked.
    async def child() -> None:
        async with tracekit.stage("guardrail"):
            await asyncio.sleep(0.03)

    @tracekit.stage("request")
    async def root() -> None:
        task = asyncio.ensure_future(child())
        await asyncio.sleep(0)  # the child enters its block and parks in it
        spin(20)  # while the parent burns CPU
        await task

    with tracekit.record() as rec:
        asyncio.run(root())
    spans = by_name(rec.spans)
    guard, request = spans["guardrail"].attributes, spans["request"].attributes
    # Its wall time also covers the parent's spin (it cannot resume before the spin ends).
    assert guard[sc.WALL_MS] >= 25 and guard[sc.STEPS] == 0
    assert guard[sc.CPU_MS] == 0
    assert request[sc.CPU_MS] >= 5  # the spin stayed the parent's
    assert spans["guardrail"].parent.span_id == spans["request"].context.span_id


def test_an_async_stage_in_a_driven_step_takes_the_step_over() -> None:
    # Its steps are its own: the enclosing code's step ends where it enters and resumes where
    # it returns, so the parent's longest hold of the loop does not include the child's.
    @tracekit.stage("guardrail")
    async def guardrail() -> None:
        time.sleep(0.03)  # holds the loop: a blocking call inside the child
        await asyncio.sleep(0.01)

    @tracekit.stage("request")
    async def root() -> None:
        await guardrail()

    with tracekit.record() as rec:
        asyncio.run(root())
    spans = by_name(rec.spans)
    guard, request = spans["guardrail"].attributes, spans["request"].attributes
    assert guard[sc.MAX_BLOCK_MS] >= 25 and guard[sc.STEPS] == 2
    assert guard[sc.WAIT_MS] == pytest.approx(40, abs=15)  # blocked off-CPU, then suspended
    assert request[sc.MAX_BLOCK_MS] < 10 and request[sc.CPU_MS] < 5


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks need Python 3.12")
def test_an_eager_child_task_does_not_take_over_its_parents_step() -> None:
    # An eager task's first step runs inside its parent's: its stage must drive itself.
    @tracekit.stage("guardrail")
    async def guardrail() -> None:
        await asyncio.sleep(0.02)

    @tracekit.stage("request")
    async def root() -> None:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        task = asyncio.create_task(guardrail())
        spin(10)
        await task

    with tracekit.record() as rec:
        asyncio.run(root())
    spans = by_name(rec.spans)
    assert spans["guardrail"].attributes[sc.WAIT_MS] == pytest.approx(20, abs=15)
    assert spans["request"].attributes[sc.CPU_MS] >= 3  # the spin stayed the parent's


def test_a_block_inside_a_sync_stage_in_a_worker_thread_leaves_no_slice_open() -> None:
    @tracekit.stage("tokenize")
    def tokenize() -> None:
        spin(2)
        with tracekit.stage("guardrail"):  # takes the sync stage's step over, then hands it back
            spin(2)
        spin(2)

    def worker() -> event_loop.ThreadState:
        tokenize()
        return event_loop.thread_state()

    @tracekit.stage("request")
    async def root() -> event_loop.ThreadState:
        return await asyncio.to_thread(worker)

    with tracekit.record() as rec:
        state = asyncio.run(root())
    # The call's slice ended with it (and the step of the handed-off work around it).
    assert (state.slice_start, state.top) == (0, None)
    spans = by_name(rec.spans)
    assert spans["guardrail"].parent.span_id == spans["tokenize"].context.span_id
    assert spans["guardrail"].attributes[sc.CPU_MS] > 0 and spans["tokenize"].attributes[sc.CPU_MS] > 0


def test_each_span_names_the_shape_of_what_its_stage_wraps() -> None:
    @tracekit.stage("sync_fn")
    def sync_fn() -> int:
        return 1

    @tracekit.stage("coro")
    async def coro() -> int:
        return 2

    @tracekit.stage("agen")
    async def agen():  # type: ignore[no-untyped-def]
        yield 3

    @tracekit.stage("gen")
    def gen():  # type: ignore[no-untyped-def]
        yield 4

    async def main() -> None:
        assert sync_fn() == 1 and await coro() == 2
        assert [x async for x in agen()] == [3] and list(gen()) == [4]
        async with tracekit.stage("blk"):
            pass

    with tracekit.record() as rec:
        asyncio.run(main())
    shapes = {n: s.attributes[sc.STAGE_SHAPE] for n, s in by_name(rec.spans).items()}
    assert shapes == {"sync_fn": "function", "coro": "coroutine", "agen": "async_generator",
                      "gen": "generator", "blk": "block"}  # fmt: skip
