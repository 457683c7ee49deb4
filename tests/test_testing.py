"""tracekit.testing.measure_overhead: the CPU tracekit adds per request of a user's app.

Real-clock tests assert what CPU time makes robust on a busy machine: a known amount of CPU
added to tracekit's request path shows up in the figure (wide margins), and the figure is
tracekit's alone (the app's own CPU, however large, is not in it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import tracekit
from tracekit._core import current
from tracekit._export import tracing
from tracekit.errors import ConfigurationError
from tracekit.testing import HTTPRequest, OverheadResult, measure_overhead

CHAT = HTTPRequest("POST", "/chat", json={"text": "the quick brown fox jumps over the lazy dog"})


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    return [len(word) for word in text.split()]


@tracekit.stage("model")
async def model(tokens: list[int]) -> str:
    await asyncio.sleep(0)  # one real suspension, as an awaited upstream call has
    return "reply " * len(tokens)


def gateway(app_cpu_us: int = 0) -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        burn_us(app_cpu_us)  # the app's own work, outside tracekit
        tokens = tokenize((await request.json())["text"])
        return JSONResponse({"text": await model(tokens)})

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/chat", chat, methods=["POST"]), Route("/health", health)])


def burn_us(us: int) -> None:
    end = time.thread_time_ns() + us * 1000
    while time.thread_time_ns() < end:
        pass


def measure(app: object, **options: int) -> OverheadResult:
    return measure_overhead(app, [CHAT], **({"repeat": 100, "rounds": 3} | options))


def test_the_overhead_is_tracekits_cpu_per_request() -> None:
    result = measure(tracekit.TracekitMiddleware(gateway()))
    assert result.spans_per_request == 3.0  # the request and its two stages, every request
    assert result.requests == 100 and result.rounds == 3
    assert 0 < result.cpu_us < result.traced_cpu_us
    assert result.cpu_us == pytest.approx(result.traced_cpu_us - result.bare_cpu_us)
    assert "µs CPU per request" in str(result)


@pytest.fixture
def costlier_submit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """tracekit's request path made 500 µs of CPU costlier (in Runtime.submit)."""
    submit = tracing.Runtime.submit

    def slow_submit(self: tracing.Runtime, request: object) -> None:
        burn_us(500)
        submit(self, request)  # type: ignore[arg-type]

    monkeypatch.setattr(tracing.Runtime, "submit", slow_submit)
    yield 500


def test_cpu_added_to_tracekit_shows_up_and_the_apps_own_does_not(costlier_submit: int) -> None:
    result = measure(tracekit.TracekitMiddleware(gateway(app_cpu_us=2000)))
    assert result.bare_cpu_us > 1800  # the app's own 2 ms are in both variants...
    # ...and only tracekit's CPU is in the difference: the 500 µs added, plus its own (~100 µs).
    assert costlier_submit < result.cpu_us < costlier_submit + 700


def test_a_request_the_app_does_not_serve_is_refused() -> None:
    app = tracekit.TracekitMiddleware(gateway())
    with pytest.raises(ConfigurationError, match="GET /nowhere answered 404: it needs requests the app"):
        measure_overhead(app, [HTTPRequest("GET", "/health"), HTTPRequest("GET", "/nowhere")])


def test_an_app_without_the_middleware_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="no request was traced: is TracekitMiddleware in the app"):
        measure(gateway())


@pytest.mark.parametrize("options", [{"repeat": 0}, {"rounds": True}, {"rounds": 1.5}])
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="must be a whole number >= 1"):
        measure_overhead(gateway(), [CHAT], **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"a list of tracekit\.testing\.HTTPRequest"):
        measure_overhead(gateway(), ["/chat"])  # type: ignore[list-item]


def test_each_round_runs_inside_the_apps_lifespan() -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        events.append("startup")
        yield {"greeting": "hello"}  # the lifespan state: what a gateway's upstream client is
        events.append("shutdown")

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.state.greeting)

    app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/", hello)], lifespan=lifespan))
    measure_overhead(app, [HTTPRequest("GET", "/")], repeat=10, rounds=2)
    assert events == ["startup", "shutdown"] * 4  # two variants a round


def test_an_upstream_client_made_at_import_keeps_working(serve: Callable[..., Any]) -> None:
    # The README's gateway shape: an httpx.AsyncClient made at import, whose connection pool
    # binds to the event loop it first ran on; every round runs on that same loop.
    upstream = serve(Starlette(routes=[Route("/v1", lambda request: PlainTextResponse("ok"))]))
    client = httpx.AsyncClient(base_url=upstream.url)

    @tracekit.stage("model")
    async def ask() -> str:
        return (await client.get("/v1")).text

    async def chat(request: Request) -> PlainTextResponse:
        return PlainTextResponse(await ask())

    app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/chat", chat)]))
    result = measure_overhead(app, [HTTPRequest("GET", "/chat")], repeat=5, rounds=2)
    assert result.spans_per_request == 2  # the request and its model stage, every round


def test_an_app_that_does_not_speak_lifespan_runs_without_it() -> None:
    async def raw(scope: dict[str, object], receive: object, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError("http only")  # a server's "lifespan unsupported"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    result = measure(tracekit.TracekitMiddleware(raw), repeat=10, rounds=1)
    assert result.spans_per_request == 1.0


def test_a_failed_startup_is_refused() -> None:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no upstream configured")
        yield

    app = tracekit.TracekitMiddleware(Starlette(routes=[], lifespan=lifespan))
    with pytest.raises(ConfigurationError, match=r"startup failed: RuntimeError: no upstream configured$"):
        measure(app)


def test_an_async_caller_is_refused() -> None:
    async def inside_a_loop() -> None:
        measure(tracekit.TracekitMiddleware(gateway()))

    with pytest.raises(ConfigurationError, match="call it from a synchronous test"):
        asyncio.run(inside_a_loop())


def test_the_callers_recording_is_set_aside_and_restored() -> None:
    app = tracekit.TracekitMiddleware(gateway())
    with tracekit.record() as rec:
        runtime = current.active_runtime
        measure(app, repeat=10, rounds=1)
        assert current.active_runtime is runtime
        assert rec.spans == []  # the measurement's requests are not the test's

        async def one() -> None:
            from tracekit.testing import drive

            assert await drive(app, [CHAT], 1) == [200]

        asyncio.run(one())
        names = sorted(s.name for s in rec.spans if s.name != "tracekit.loop")
    assert names == ["POST /chat", "model", "tokenize"]


def test_http_request_builds_the_asgi_scope() -> None:
    request = HTTPRequest("post", "/v1/models?limit=5", json={"a": 1}, headers={"X-Key": "k"})
    scope = request.scope()
    assert (scope["method"], scope["path"], scope["query_string"]) == ("POST", "/v1/models", b"limit=5")
    assert (b"x-key", b"k") in scope["headers"] and (b"content-type", b"application/json") in scope["headers"]
    assert json.loads(request.body) == {"a": 1}
    with pytest.raises(ConfigurationError, match="must start with '/'"):
        HTTPRequest("GET", "chat")
