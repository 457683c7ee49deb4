"""Helpers for testing code instrumented with tracekit (and tracekit itself).

:func:`measure_overhead` measures the CPU tracekit adds to each request of an ASGI app, for a
test to assert on (``result.cpu_us < 300``). The pytest plugin's fixture and budgets:
:mod:`tracekit.integrations.pytest_plugin`.

:class:`FakeClock` replaces tracekit's clock (:mod:`tracekit._core.clock`), so accounting can be
asserted to the exact microsecond::

    with FakeClock() as clock:
        @tracekit.stage("tokenize")
        def tokenize():
            clock.burn(30)      # 30 ms on CPU
            clock.block(5)      # 5 ms blocked off-CPU (e.g. time.sleep)

        @tracekit.stage("model")
        async def model():
            await clock.sleep(100)  # suspended 100 ms (waiting on the model)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json as jsonlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from tracekit._core import clock
from tracekit.errors import ConfigurationError
from tracekit.semconv import LOOP_SPAN


class FakeClock:
    """A manual clock: wall time and per-thread CPU time advance only when told.

    Args:
        start_ms: the initial wall reading.
        epoch_ns: the Unix time that wall reading 0 maps to (span timestamps).
    """

    def __init__(self, start_ms: float = 1000.0, epoch_ns: int = 1_700_000_000_000_000_000) -> None:
        self._wall = int(start_ms * 1e6)
        self._cpu: dict[int, int] = {}
        self._epoch = epoch_ns
        self._lock = threading.Lock()

    def wall_ns(self) -> int:
        """Current fake wall time in ns."""
        return self._wall

    def cpu_ns(self) -> int:
        """Current fake CPU time of the calling thread in ns."""
        return self._cpu.get(threading.get_ident(), 0)

    def burn(self, ms: float) -> None:
        """The calling thread runs on CPU for ``ms``: wall and its CPU advance together."""
        ns = int(round(ms * 1e6))
        with self._lock:
            self._wall += ns
            ident = threading.get_ident()
            self._cpu[ident] = self._cpu.get(ident, 0) + ns

    def block(self, ms: float) -> None:
        """The calling thread is blocked off-CPU for ``ms`` (e.g. ``time.sleep``)."""
        self.advance(ms)

    def advance(self, ms: float) -> None:
        """Wall time passes with no CPU on the calling thread (waiting, or others running)."""
        with self._lock:
            self._wall += int(round(ms * 1e6))

    async def sleep(self, ms: float) -> None:
        """Suspend the calling coroutine while ``ms`` of wall time passes: an await of I/O,
        which completes (a callback of the loop's) once this task has yielded."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def complete() -> None:
            self.advance(ms)
            done.set_result(None)

        loop.call_soon(complete)
        await done

    def __enter__(self) -> FakeClock:
        clock.install(self.wall_ns, self.cpu_ns, self._epoch)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        clock.restore()


class HTTPRequest:
    """One request for :func:`measure_overhead` (and ``bench/overhead.py``) to send.

    Args:
        method: the HTTP method.
        path: the path, with its query string if any (``/v1/models?limit=5``).
        body: the request body.
        json: a body to send as JSON (sets ``content-type: application/json``).
        headers: extra request headers.
    """

    def __init__(self, method: str, path: str, *, body: bytes = b"", json: Any = None,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        if not path.startswith("/"):
            raise ConfigurationError(f"HTTPRequest path must start with '/', not {path!r}")
        self.method = method.upper()
        self.path = path
        self.body = body if json is None else jsonlib.dumps(json).encode()
        fields = [("host", "tracekit.test"), *(headers or {}).items()]
        if json is not None:
            fields.append(("content-type", "application/json"))
        self.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in fields]

    def __repr__(self) -> str:
        return f"HTTPRequest({self.method!r}, {self.path!r})"

    def scope(self) -> dict[str, Any]:
        """The ASGI HTTP scope of this request (a fresh dict: apps may change it)."""
        path, _, query = self.path.partition("?")
        return {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": self.method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": query.encode(), "headers": list(self.headers),
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        }  # fmt: skip


async def drive(app: Any, requests: Sequence[HTTPRequest], count: int,
                state: dict[str, Any] | None = None) -> list[int]:  # fmt: skip
    """Call ``app`` directly (no sockets) ``count`` times, one request after another, cycling
    through ``requests``; the client never disconnects.

    Args:
        app: the ASGI app.
        requests: what to send.
        count: how many requests in all.
        state: the lifespan state (:class:`Lifespan`), copied into each request's scope.

    Returns:
        The status each of ``requests`` last answered (0: no response was started).
    """
    statuses = [0] * len(requests)
    forever = asyncio.get_running_loop().create_future()  # no disconnect: wait until cancelled
    pending = b""
    more = False

    async def receive() -> dict[str, Any]:
        nonlocal more
        if more:
            more = False
            return {"type": "http.request", "body": pending, "more_body": False}
        await asyncio.shield(forever)
        return {"type": "http.disconnect"}

    for i in range(count):
        index = i % len(requests)
        request = requests[index]
        pending, more = request.body, True

        async def send(message: dict[str, Any], index: int = index) -> None:
            if message["type"] == "http.response.start":
                statuses[index] = message["status"]

        scope = request.scope()
        if state is not None:
            scope["state"] = dict(state)
        await app(scope, receive, send)
    return statuses


class Lifespan:
    """The app's ASGI lifespan, run as a server runs it (uvicorn's ``lifespan="auto"``):
    :meth:`start` before the first request, :meth:`stop` after the last; an app that does not
    speak the protocol (it raises, returns or answers something else) runs without one.

    Attributes:
        state: what the app's startup stored (``scope["state"]``), for :func:`drive`.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Future[Any] | None = None
        self._running = False

    async def start(self) -> None:
        """Send ``lifespan.startup`` and wait for the app's answer.

        Raises:
            ConfigurationError: the app answered ``lifespan.startup.failed``.
        """
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        self._task = asyncio.ensure_future(self.app(scope, self._inbox.get, self._outbox.put))
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._reply()
        if reply.get("type") == "lifespan.startup.failed":
            await asyncio.wait({self._task}, timeout=5)  # the app raises after answering: collect it
            self._end()
            # Starlette sends the whole traceback: its last line says what failed.
            lines = str(reply.get("message", "")).strip().splitlines() or ["(no message)"]
            raise ConfigurationError(f"the app's lifespan startup failed: {lines[-1]}")
        self._running = reply.get("type") == "lifespan.startup.complete"
        if not self._running:
            self._end()

    async def stop(self) -> None:
        """Send ``lifespan.shutdown`` and wait for the app to finish (if it started)."""
        if self._running:
            self._running = False
            await self._inbox.put({"type": "lifespan.shutdown"})
            await self._reply()
            self._end()

    async def _reply(self) -> dict[str, Any]:
        # The app's next message, or {} when it returned or raised first.
        assert self._task is not None
        message = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait({message, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if message.done():
            return message.result()
        message.cancel()
        return {}

    def _end(self) -> None:
        # An app that does not speak the protocol may wait on receive() forever: cancel it;
        # its exception, if any, is the server's "lifespan unsupported".
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        elif task is not None and not task.cancelled():
            task.exception()


@dataclass(frozen=True)
class OverheadResult:
    """What :func:`measure_overhead` measured; CPU is the process's (all threads), per request.

    Attributes:
        cpu_us: the CPU tracekit adds per request: ``traced_cpu_us - bare_cpu_us``.
        bare_cpu_us: per request with tracing off (the middleware and stages pass through).
        traced_cpu_us: per request with every request recorded, spans built and delivered.
        requests: requests per variant in each round.
        rounds: rounds run (the best of each variant is kept).
        spans_per_request: spans recorded per request (traced variant; the loop's window
            spans, which do not grow with requests, left out).
    """

    cpu_us: float
    bare_cpu_us: float
    traced_cpu_us: float
    requests: int
    rounds: int
    spans_per_request: float

    def __str__(self) -> str:
        return (f"tracekit adds {self.cpu_us:.1f} µs CPU per request ({self.traced_cpu_us:.1f} traced, "
                f"{self.bare_cpu_us:.1f} untraced; {self.spans_per_request:.1f} spans a request; "
                f"best of {self.rounds} rounds of {self.requests} requests)")  # fmt: skip


def measure_overhead(app: Any, requests: Sequence[HTTPRequest], *, repeat: int = 200,
                     rounds: int = 5) -> OverheadResult:  # fmt: skip
    """Measure the CPU tracekit adds to each request of ``app``: middleware, stages, span
    building (CPU, not wall time: on a shared CI runner wall time is mostly other processes).

    ``app`` is the ASGI app as served, with its ``TracekitMiddleware``; it is called directly
    (no sockets) with ``requests``, ``repeat`` times each, once with tracing off and once
    recording every request, in ``rounds`` interleaved rounds, as ``bench/overhead.py``
    measures tracekit. Each variant's best round counts: noise only adds time. Every round
    runs on one event loop (as a server has: clients made at import, such as a module-level
    ``httpx.AsyncClient``, keep working), each inside the app's lifespan (:class:`Lifespan`:
    startup and shutdown are not timed). Whatever the app awaits (an upstream model, say) runs for
    real, so point it at a local fake.

    Args:
        app: the ASGI app.
        requests: the requests to send (each answered with a status below 400).
        repeat: how many times each request is sent per variant and round.
        rounds: how many rounds.

    Returns:
        The :class:`OverheadResult`; assert on ``result.cpu_us``.

    Raises:
        ConfigurationError: no requests, a bad ``repeat``/``rounds``, a request answered 400
            or above (or not at all), no request traced (no ``TracekitMiddleware``), the
            app's lifespan startup failed, or an event loop is running in this thread (an
            async test).

    Cost: ``2 * rounds`` runs of ``len(requests) * repeat`` requests, plus a quarter of that
    each as warm-up.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigurationError("measure_overhead runs event loops of its own: call it from a "
                                 "synchronous test (or another thread)")  # fmt: skip
    requests = list(requests)
    if not requests or not all(isinstance(r, HTTPRequest) for r in requests):
        raise ConfigurationError("measure_overhead needs a list of tracekit.testing.HTTPRequest")
    for name, value in (("repeat", repeat), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"measure_overhead: {name} must be a whole number >= 1, not {value!r}")
    count = repeat * len(requests)
    bare: list[float] = []
    traced: list[float] = []
    spans = 0
    # One event loop for every round, as a server has: an app may hold objects bound to the
    # loop it first ran on (a module-level httpx.AsyncClient's connection pool).
    loop = asyncio.new_event_loop()
    try:
        with _tracekit_set_aside():
            for _ in range(rounds):
                bare.append(_timed(app, loop, requests, count, traced=False)[0])
                cpu, recorded = _timed(app, loop, requests, count, traced=True)
                traced.append(cpu)
                spans = max(spans, recorded)
    finally:
        loop.close()
    return OverheadResult(min(traced) - min(bare), min(bare), min(traced), count, rounds, spans / count)


@contextlib.contextmanager
def _tracekit_set_aside() -> Iterator[None]:
    # The caller's tracekit (a configured runtime, open recordings: the budget plugin's) is
    # put aside while measuring, and restored after.
    from tracekit._export import tracing

    previous = tracing.install(None)
    recorders = tracing.recorders[:]
    tracing.recorders.clear()
    try:
        yield
    finally:
        tracing.recorders[:] = recorders
        tracing.install(previous)


def _timed(app: Any, loop: asyncio.AbstractEventLoop, requests: list[HTTPRequest], count: int,
           *, traced: bool) -> tuple[float, int]:  # fmt: skip
    """(process CPU µs per request, spans recorded) of one variant's round on ``loop``."""
    from tracekit._export import tracing
    from tracekit.recording import record

    with contextlib.ExitStack() as stack:
        if traced:
            recording = stack.enter_context(record())
        else:  # installed and off: the middleware and stages pass the request through
            tracing.install(tracing.Runtime(None, None))
            stack.callback(tracing.install, None)
        lifespan = Lifespan(app)
        loop.run_until_complete(lifespan.start())
        stack.callback(loop.run_until_complete, lifespan.stop())
        warm_up = drive(app, requests, max(1, count // 4), lifespan.state)
        _check_statuses(requests, loop.run_until_complete(warm_up))
        tracing.build_all()
        if traced:
            recording.clear()
        gc.collect()
        cpu = time.process_time()
        loop.run_until_complete(drive(app, requests, count, lifespan.state))
        tracing.build_all()
        cpu = time.process_time() - cpu
        spans = [s for s in recording.spans if s.name != LOOP_SPAN] if traced else []
        if traced and not any(span.kind.name == "SERVER" for span in spans):
            raise ConfigurationError(
                "measure_overhead: no request was traced: is TracekitMiddleware in the app?"
            )
    return cpu / count * 1e6, len(spans)


def _check_statuses(requests: list[HTTPRequest], statuses: list[int]) -> None:
    for request, status in zip(requests, statuses, strict=True):
        if not 100 <= status < 400:
            answer = f"answered {status}" if status else "sent no response"
            raise ConfigurationError(
                f"measure_overhead: {request.method} {request.path} {answer}: it needs requests "
                "the app serves (status below 400)"
            )
