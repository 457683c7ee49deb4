"""The watchdog's GIL-free poll (tracekit/_core/_slicewatch.c) and the watchdog thread around it.

That the watchdog blames the right line, through this poll (compiled build) and through the
Python one (the plain-Python rerun of the core suite), is tested end to end in
test_attribution.py and test_uvloop.py."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from array import array

import pytest

from tracekit._core import event_loop, ledger, watchdog
from tracekit._core.watchdog import Watchdog

MS = 1_000_000


def test_make_test_builds_the_gil_free_poll() -> None:
    if not os.environ.get("TRACEKIT_REQUIRE_COMPILED"):
        pytest.skip("TRACEKIT_REQUIRE_COMPILED is not set (make test sets it)")
    assert watchdog.GIL_FREE_WAIT is not None, "tracekit/_core/_slicewatch.c is not built: make build"


needs_poll = pytest.mark.skipif(watchdog.GIL_FREE_WAIT is None, reason="_slicewatch not built")


def _wait(cells: tuple[array[int], ...], seen: array[int], control: array[int],
          max_wait_ms: float = 200) -> tuple[list[int], float]:  # fmt: skip
    t0 = time.perf_counter()
    over = watchdog.GIL_FREE_WAIT(cells, seen, control, 20 * MS, 1 * MS, int(max_wait_ms * MS))
    return over, (time.perf_counter() - t0) * 1000


@needs_poll
def test_wait_reports_a_slice_past_the_threshold_once() -> None:
    old = array("q", [time.perf_counter_ns() - 50 * MS])
    idle, young = array("q", [0]), array("q", [time.perf_counter_ns() + 10_000 * MS])
    seen, control = array("q", [0, 0, 0]), array("q", [0, 0])
    over, took = _wait((idle, old, young), seen, control)
    assert over == [1] and took < 150
    assert seen.tolist() == [0, old[0], 0]  # remembered: the same slice is not reported again
    over, took = _wait((idle, old, young), seen, control, max_wait_ms=60)
    assert over == [] and took >= 55
    old[0] += 1  # a new slice (another start), also old
    assert _wait((idle, old, young), seen, control)[0] == [1]


@needs_poll
def test_wait_with_no_cells_sleeps_until_max_wait() -> None:
    over, took = _wait((), array("q"), array("q", [0, 0]), max_wait_ms=60)
    assert over == [] and took >= 55


@needs_poll
def test_wait_ends_on_a_new_generation_or_stop() -> None:
    cell, seen = array("q", [0]), array("q", [0])
    for index, value in ((1, 7), (0, 1)):  # a thread was watched; stop
        control = array("q", [0, 0])
        timer = threading.Timer(0.05, control.__setitem__, (index, value))
        timer.start()
        over, took = _wait((cell,), seen, control, max_wait_ms=5000)
        timer.join()
        assert over == [] and 40 < took < 2000


@needs_poll
def test_wait_releases_the_gil() -> None:
    counted = 0
    done = threading.Event()

    def count() -> None:
        nonlocal counted
        while not done.is_set():
            counted += 1

    counter = threading.Thread(target=count)
    cell, seen, control = array("q", [0]), array("q", [0]), array("q", [0, 0])
    counter.start()
    try:
        time.sleep(0.02)
        before = counted
        _wait((cell,), seen, control, max_wait_ms=200)
        during = counted - before
    finally:
        done.set()
        counter.join()
    assert during > 100_000  # the counting thread ran freely for the 200 ms of the wait


@needs_poll
@pytest.mark.parametrize("bad", [
    ((array("i", [0]),), array("q", [0]), array("q", [0, 0])),  # not 8-byte items
    ((array("q", [0]),), array("q", []), array("q", [0, 0])),  # seen shorter than cells
    ((array("q", [0]),), array("q", [0]), array("q", [0])),  # control needs two items
    ((b"12345678",), array("q", [0]), array("q", [0, 0])),  # not an array('q')
])  # fmt: skip
def test_wait_rejects_bad_cells(bad: tuple[object, object, object]) -> None:
    with pytest.raises((TypeError, BufferError)):
        watchdog.GIL_FREE_WAIT(*bad, 20 * MS, MS, MS)
    with pytest.raises(ValueError):
        watchdog.GIL_FREE_WAIT((), array("q"), array("q", [0, 0]), 20 * MS, 0, MS)


@needs_poll
def test_a_busy_healthy_loop_does_not_wake_the_watchdog() -> None:
    # Polling in Python takes the GIL every threshold / 2 (here 50 times in half a second),
    # and each of those waits costs the loop thread a futex wake-up per GIL release.
    watchdog = Watchdog(threshold_ms=20)

    async def busy() -> None:
        state = event_loop.thread_state()
        watchdog.watch(state)
        deadline = time.perf_counter() + 0.5
        while time.perf_counter() < deadline:  # short slices, one after another
            event_loop.slice_begin(state, time.perf_counter_ns(), 0)
            sum(range(200))
            event_loop.slice_end(state, time.perf_counter_ns(), 0, True)
            await asyncio.sleep(0)

    try:
        asyncio.run(busy())
        assert watchdog.wakes <= 3
    finally:
        watchdog.stop()


def test_a_failing_gil_free_poll_falls_back_to_polling_in_python(caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: object) -> list[int]:
        raise TypeError("broken")

    watchdog = Watchdog(threshold_ms=20)
    watchdog.gil_free_wait = broken
    try:
        watchdog.watch(event_loop.thread_state())
        deadline = time.monotonic() + 5
        while watchdog.wakes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdog.wakes >= 3 and watchdog.gil_free_wait is None
        assert "watchdog poll" in caplog.text
    finally:
        watchdog.stop()


def _calls(*filenames: str) -> object:
    """A frame whose callers' code lives in ``filenames`` (outermost first), as sampled."""
    import functools
    import sys

    call: object = sys._getframe
    for filename in reversed(filenames):  # partial: no frame of its own between them
        namespace: dict[str, object] = {}
        exec(compile("def f(inner):\n    return inner()\n", filename, "exec"), namespace)
        call = functools.partial(namespace["f"], call)  # type: ignore[arg-type]
    return call()  # type: ignore[operator]


def test_tracekits_own_work_is_not_an_application_block() -> None:
    """Starting tracekit's export thread on a first request (a catch a validation run showed
    as the app's blocking call) is tracekit's own work; the app's code calling a library is
    the app's, whatever tracekit frame is outside it; tracekit's frames are never shown."""
    package = os.path.dirname(os.path.dirname(watchdog.__file__))
    app = os.path.join(os.getcwd(), "app", "handlers.py")
    middleware = os.path.join(package, "middleware.py")
    exporting = os.path.join(package, "_export", "tracing.py")
    library = os.path.join(os.path.dirname(threading.__file__), "threading.py")

    frames, own = watchdog._stack(_calls(middleware, app, exporting, library))  # type: ignore[arg-type]
    assert own and [f for f, _, _ in frames[:2]] == [library, app]
    frames, own = watchdog._stack(_calls(exporting, middleware, app, library))  # type: ignore[arg-type]
    assert not own and watchdog._blame(frames).startswith("app/handlers.py:2 in f")
    assert not any(f.startswith(package) for f, _, _ in frames)
    # tracekit demo's gateway is an application, even where tracekit is an installed package
    demo = os.path.join(package, "demo", "gateway.py")
    frames, own = watchdog._stack(_calls(middleware, demo, library))  # type: ignore[arg-type]
    assert not own and watchdog._blame(frames).endswith("demo/gateway.py:2 in f")


def test_tracekits_integrations_are_tracekits_frames_in_a_checkout_too() -> None:
    """A checkout (and its editable install) keeps ``integrations/`` beside ``tracekit/``
    (installed as ``tracekit.integrations``): their stage wrappers were blamed as the app's
    blocking call ("blocked at .../integrations/tokenizers.py in tokenize_stage")."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    app = os.path.join(os.getcwd(), "app", "handlers.py")
    wrapper = os.path.join(root, "integrations", "tokenizers.py")
    library = os.path.join(os.path.dirname(threading.__file__), "threading.py")

    frames, own = watchdog._stack(_calls(app, wrapper, library))  # type: ignore[arg-type]
    assert not own and [f for f, _, _ in frames[:2]] == [library, app]
    assert watchdog._blame(frames).startswith("app/handlers.py:2 in f")


def test_a_step_begun_late_in_a_long_slice_is_sampled_only_once_it_has_held_the_loop() -> None:
    """A guardrail then the model call's start run back to back in one step of a request: the
    slice passed the threshold in the guardrail, and a sample taken as the model call began
    blamed its socket check (a new user's run: every model stage "blocked at httpcore").
    The watchdog puts such a sample off once, by one poll interval: a slice that ends first
    gets none; one that goes on is sampled then, whatever runs (a loop calling a short stage
    again and again is that stage's doing)."""
    parked, done = threading.Event(), threading.Event()
    states: list[event_loop.ThreadState] = []

    def hold() -> None:  # the loop thread, parked inside the step
        states.append(event_loop.ThreadState())
        parked.set()
        done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert parked.wait(10)
        (state,) = states
        led = ledger.Ledger(ledger.Site("model", "model"), None, None, 1)
        dog = Watchdog(threshold_ms=20.0)
        now = time.perf_counter_ns()
        state.seq, state.slice_start, state.top = 1, now - 30 * MS, led
        led.step_t0 = now - 1 * MS  # the model call's step began 1 ms ago, 29 ms into the slice
        assert dog._check([state]) == [state] and led.blocked is None
        state.seq, state.slice_start = 2, 0  # the slice ended before the next poll: no sample
        assert dog._check([state]) == [] and led.blocked is None
        # A new slice, 30 ms long, whose innermost step is fresh at both polls (a short stage
        # called again and again): put off once, then sampled.
        now = time.perf_counter_ns()
        state.seq, state.slice_start, led.step_t0 = 3, now - 30 * MS, now - 1 * MS
        assert dog._check([state]) == [state] and led.blocked is None
        assert dog._check([state]) == [] and led.blocked is not None
        ((_, held_ms, blamed, _),) = led.blocked
        assert held_ms >= 30 and "in hold" in blamed
        # A step that has run half the threshold itself is sampled at once.
        led.blocked = None
        now = time.perf_counter_ns()
        state.seq, state.slice_start, led.step_t0 = 4, now - 30 * MS, now - 12 * MS
        assert dog._check([state]) == [] and led.blocked is not None
    finally:
        done.set()
        thread.join()
