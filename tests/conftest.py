"""Shared fixtures: a real uvicorn server on 127.0.0.1, recordings, leak checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest

from tracekit._core import current, event_loop
from tracekit._core.current import current_ledger
from tracekit._export import tracing

PLUGIN = "tracekit.integrations.pytest_plugin"
# tracekit's pytest plugin loads through its pytest11 entry point where tracekit is installed
# with it; a checkout run from PYTHONPATH (or an install older than the plugin) loads it here.
if not any(ep.value == PLUGIN for ep in entry_points(group="pytest11")):
    pytest_plugins = [PLUGIN]


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Every test leaves no runtime, no open stage and no open step behind."""
    before = current.active_runtime
    yield
    assert current_ledger.get() is None, "a stage leaked into the test's context"
    assert event_loop.thread_state().top is None, "a step was left open on the test thread"
    if current.active_runtime is not before:
        leaked = current.active_runtime
        tracing.install(before)
        if leaked is not None:
            leaked.shutdown()
        pytest.fail("the test left a tracekit runtime installed")


class Server:
    """A uvicorn server running ``app`` in a thread; ``url`` is its base URL."""

    def __init__(self, app: Any, loop: str = "asyncio", **options: Any) -> None:
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", loop=loop,
                                lifespan=options.pop("lifespan", "auto"), **options)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    """``serve(app, loop="asyncio"|"uvloop")`` starts a real server; stopped after the test."""
    servers: list[Server] = []

    def start(app: Any, **options: Any) -> Server:
        server = Server(app, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def by_name(spans: list[Any]) -> dict[str, Any]:
    """Spans keyed by name (names must be unique in the recording)."""
    out: dict[str, Any] = {}
    for span in spans:
        assert span.name not in out, f"two spans named {span.name!r}"
        out[span.name] = span
    return out


@pytest.fixture
def otel_globals() -> Iterator[None]:
    """Reset OpenTelemetry's set-once global tracer provider around a test (as OTel's own
    test_base does), and uninstall whatever tracekit runtime the test configured."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    def reset() -> None:
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None

    reset()
    before = current.active_runtime
    yield
    runtime = current.active_runtime
    if runtime is not before:
        tracing.install(before)
        if runtime is not None:
            runtime.shutdown()
    provider = trace._TRACER_PROVIDER
    if provider is not None and hasattr(provider, "shutdown"):
        provider.shutdown()
    reset()


def settled(rec: Any, servers: int, timeout: float = 10.0) -> list[Any]:
    """The recording's spans once ``servers`` SERVER spans are in it.

    A client has its response before the server has finished the request's bookkeeping
    (the span is queued right after the app returns), so tests wait for it.
    """
    deadline = time.monotonic() + timeout
    while True:
        spans = rec.spans
        if sum(s.kind.name == "SERVER" for s in spans) >= servers or time.monotonic() > deadline:
            return spans
        time.sleep(0.01)
