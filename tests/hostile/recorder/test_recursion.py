"""A recursive function decorated with ``@stage`` recurses as deep as it does undecorated
(issue 11, item 9): tracing must not turn a working recursion into a ``RecursionError``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest

import tracekit
from tracekit.stage import FREE_CALLS


def deepest(decorated: bool) -> int:
    """How deep a one-frame-per-level recursion gets before ``RecursionError``."""
    reached = [0]

    def down(n: int) -> int:
        reached[0] += 1
        return 0 if n == 0 else 1 + step(n - 1)

    step: Callable[[int], int] = tracekit.stage("walk")(down) if decorated else down
    with pytest.raises(RecursionError):
        step(10 * sys.getrecursionlimit())
    return reached[0]


def test_a_recursive_stage_reaches_the_depth_it_reaches_undecorated() -> None:
    limit = sys.getrecursionlimit()
    plain = deepest(False)
    assert deepest(True) >= plain - 5
    with tracekit.record():
        assert deepest(True) >= plain - 5  # recording adds no frame either
    assert sys.getrecursionlimit() == limit  # given back, after a RecursionError too


def test_a_recursion_that_fits_undecorated_fits_traced_and_is_recorded() -> None:
    depth = deepest(False) - 20

    @tracekit.stage("walk")
    def walk(n: int) -> int:
        return 0 if n == 0 else 1 + walk(n - 1)

    with tracekit.record() as rec:
        assert walk(depth) == depth
    walks = [s for s in rec.spans if s.name == "walk"]
    assert len(walks) == depth + 1


def test_many_threads_in_one_stage_leave_the_limit_as_it_was() -> None:
    limit = sys.getrecursionlimit()
    inside = threading.Barrier(FREE_CALLS + 8)

    @tracekit.stage("wait")
    def wait() -> None:
        inside.wait(10)

    threads = [threading.Thread(target=wait) for _ in range(FREE_CALLS + 8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sys.getrecursionlimit() == limit
