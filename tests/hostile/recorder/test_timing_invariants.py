"""Stage timing invariants under garbage collection and thread contention (issue 11, item 5).

Whatever the load, a stage's split must be physically possible: its CPU fits in its wall time,
and its own CPU plus the wall time of its children fits too (each nanosecond counted once).
Garbage collections are forced at arbitrary allocation points (``gc.set_threshold(1)``), inside
the application's code and inside tracekit's own bookkeeping, and made expensive (a
``gc.callbacks`` hook that burns CPU), so any place where a collection falls between a stage's
wall-clock and CPU-clock readings shows up as time counted twice.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tracekit
from tracekit import semconv as sc

# Attributes are milliseconds as floats: allow for their rounding only.
EPS_MS = 1e-6
GC_BURN_S = 0.0003  # CPU each collection costs, so double counting is far above rounding


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.fixture
def expensive_gc() -> Iterator[None]:
    """Every few allocations collect, and every collection burns CPU on the calling thread."""

    def slow(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _burn(GC_BURN_S)

    threshold = gc.get_threshold()
    gc.set_threshold(3, 1, 1)
    gc.callbacks.append(slow)
    try:
        yield
    finally:
        gc.callbacks.remove(slow)
        gc.set_threshold(*threshold)


def check_invariants(spans: list[Any]) -> None:
    assert spans
    for span in spans:
        a = span.attributes
        if sc.STAGE not in a:
            continue
        wall, cpu = a[sc.WALL_MS], a[sc.CPU_MS]
        children = a.get(sc.CHILDREN_MS, 0.0)
        where = f"{span.name}: wall {wall:.4f} cpu {cpu:.4f} children {children:.4f}"
        assert cpu <= wall + EPS_MS, where
        assert cpu + children <= wall + EPS_MS, where
        assert a[sc.WAIT_MS] >= 0 and a[sc.LOOP_WAIT_MS] >= 0, where
        if a[sc.WAIT_MS] + a[sc.LOOP_WAIT_MS] > 0:
            total = (cpu + children + a[sc.WAIT_MS] + a[sc.LOOP_WAIT_MS] + a.get(sc.CONSUMER_MS, 0.0)
                     + a.get(sc.GC_MS, 0.0) + a.get(sc.QUEUE_WAIT_MS, 0.0))
            assert total == pytest.approx(wall, abs=1e-3), where


# A stage tree: ("sync", work, children) | ("async", work, children, sleep) | ("block", work, children)
trees = st.recursive(
    st.tuples(st.sampled_from(["sync", "async", "block"]), st.integers(0, 200), st.just(())),
    lambda inner: st.tuples(st.sampled_from(["sync", "async", "block"]), st.integers(0, 200),
                            st.lists(inner, max_size=3).map(tuple)),  # fmt: skip
    max_leaves=8,
)


def _work(units: int) -> None:
    junk = [[i] for i in range(units)]  # allocations: collections happen in here too
    del junk


@tracekit.stage("node")
def sync_node(tree: Any) -> None:
    _, work, children = tree
    _work(work)
    for child in children:
        run_sync(child)
    _work(work)


def run_sync(tree: Any) -> None:
    if tree[0] == "block":
        with tracekit.stage("block"):
            _work(tree[1])
            for child in tree[2]:
                run_sync(child)
    else:  # an async node under a sync one runs as a sync node
        sync_node(tree)


@tracekit.stage("anode")
async def async_node(tree: Any) -> None:
    _, work, children = tree
    _work(work)
    await asyncio.sleep(0)
    for child in children:
        await run_async(child)
    _work(work)


async def run_async(tree: Any) -> None:
    kind = tree[0]
    if kind == "sync":
        sync_node(tree)
    elif kind == "block":
        async with tracekit.stage("ablock"):
            _work(tree[1])
            await asyncio.sleep(0)
            for child in tree[2]:
                await run_async(child)
    else:
        await async_node(tree)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
@example(tree=("sync", 0, (("block", 0, (("block", 0, ()),)),)))  # nested blocks in a sync call
def test_invariants_hold_with_collections_inside_stages(expensive_gc: None, tree: Any) -> None:
    with tracekit.record() as rec:
        run_sync(tree)
        asyncio.run(run_async(tree))
    check_invariants(rec.spans)


def test_invariants_hold_with_threads_contending_for_the_gil(expensive_gc: None) -> None:
    tree = ("sync", 50, (("sync", 100, ()), ("block", 20, (("sync", 10, ()),)), ("sync", 5, ())))

    def worker() -> None:
        for _ in range(30):
            run_sync(tree)

    with tracekit.record() as rec:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    check_invariants(rec.spans)
