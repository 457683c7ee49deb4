"""Model calls made with httpx (and so with the OpenAI and Anthropic SDKs) as ``model`` stages.

One line to enable, for one client or for the process::

    from tracekit.integrations import httpx as tracekit_httpx

    client = openai.AsyncOpenAI(http_client=tracekit_httpx.instrument(httpx.AsyncClient()))
    tracekit_httpx.instrument()        # every httpx (and httpx2) client of the process

Each ``POST`` to a model endpoint (``/chat/completions``, ``/completions``, ``/responses``,
``/embeddings``, ``/messages``) becomes a ``model`` stage, timed like any stage (CPU, model
wait, loop wait; docs/attributes.md), whose span is a CLIENT span carrying the OpenTelemetry
GenAI attributes (semantic conventions ``semconv.GENAI_SEMCONV_VERSION``): operation,
provider, requested and response model, token usage, the stream flag. The request carries the
stage's ``traceparent`` (OpenTelemetry's configured propagators), so the model server's own
spans join the trace. Other requests of the client pass untouched.

A streamed reply (``send(stream=True)``) stays open as the stage while the application reads
it: each read of the body is a step of the stage, the time the application holds a chunk is
the stage's ``tracekit.consumer_ms`` (as for async-generator stages), and the server-sent
events are timed as they arrive: the model server's own TTFT (less the gateway's loop waits,
queue waits and CPU before the first chunk) and inter-chunk gaps (``tracekit.upstream.*``),
beside the gateway's own on the request span. Usage comes from the event that carries it
(``stream_options.include_usage``; Anthropic's ``message_start`` and ``message_delta``);
without one, ``gen_ai.usage.output_tokens`` is the count of chunks, flagged
``tracekit.upstream.tokens_counted``.

Nothing the application sees changes: the request body is read as the client already holds it
(never consumed), the reply's bytes pass through as they come. Bookkeeping failures are
logged once and swallowed (:func:`tracekit._core.failsafe.internal_error`).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import sys
from collections.abc import AsyncGenerator, Callable, Generator
from random import randrange
from types import MethodType, ModuleType
from typing import Any, Final, TypeVar, overload

try:
    import httpx
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError("tracekit.integrations.httpx needs httpx: pip install 'tracekit[httpx]'") from error
from opentelemetry import propagate

from tracekit import semconv
from tracekit._core import active_span, clock, stage_timing
from tracekit._core.asgi import MAX_GAPS
from tracekit._core.driver import Stepped
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import Ledger, Site
from tracekit._percentile import percentile
from tracekit.errors import ConfigurationError

__all__ = ["instrument", "uninstrument"]

_MS: Final = 1e6
#: Bodies parsed for their model and usage, at most (a prompt of a few MB still is; past this,
#: the stage goes without the attributes that body would give).
MAX_BODY: Final = 8 << 20

# Model endpoints, by path suffix (first match): the operation, and the API family's provider.
_ENDPOINTS: Final[tuple[tuple[str, str, str], ...]] = (
    ("/chat/completions", semconv.GEN_AI_OPERATION_CHAT, semconv.GEN_AI_PROVIDER_OPENAI),
    ("/completions", semconv.GEN_AI_OPERATION_TEXT_COMPLETION, semconv.GEN_AI_PROVIDER_OPENAI),
    ("/responses", semconv.GEN_AI_OPERATION_CHAT, semconv.GEN_AI_PROVIDER_OPENAI),
    ("/embeddings", semconv.GEN_AI_OPERATION_EMBEDDINGS, semconv.GEN_AI_PROVIDER_OPENAI),
    ("/messages", semconv.GEN_AI_OPERATION_CHAT, semconv.GEN_AI_PROVIDER_ANTHROPIC),
)
# Known hosts name their provider whatever the path (an Azure deployment speaks OpenAI's API).
_HOSTS: Final[tuple[tuple[str, str], ...]] = (
    (".openai.azure.com", semconv.GEN_AI_PROVIDER_AZURE_OPENAI),
    ("api.anthropic.com", semconv.GEN_AI_PROVIDER_ANTHROPIC),
    ("api.openai.com", semconv.GEN_AI_PROVIDER_OPENAI),
)
# An event worth parsing for its usage (the others are only timed: parsing each would cost
# a few µs a chunk), and OpenAI's usage-only last chunk (no choices: not a chunk of text).
_USAGE: Final = re.compile(rb'"usage"\s*:\s*\{')
_NO_CHOICES: Final = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_DONE: Final = b"[DONE]"
# Body modes of a streamed reply: server-sent events, a JSON body, anything else.
_SSE, _JSON, _OTHER = 1, 2, 0


class _Settings:
    """What one ``instrument()`` call asked for: the stage name, the provider, and the sites
    (by stream flag and client type: the shape the stage wraps)."""

    __slots__ = ("name", "provider", "sites")

    def __init__(self, name: str, provider: str | None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("instrument(name=...) needs a non-empty stage name")
        self.name = name
        self.provider = provider
        self.sites = {
            (streamed, sync): Site(name, semconv.KIND_MODEL, None, None, shape, client_call=True)
            for streamed, sync, shape in (
                (False, False, semconv.SHAPE_COROUTINE),
                (True, False, semconv.SHAPE_ASYNC_GENERATOR),
                (False, True, semconv.SHAPE_FUNCTION),
                (True, True, semconv.SHAPE_GENERATOR),
            )
        }


class _Call:
    """One model call: its stage's ledger, and what its request and reply say."""

    __slots__ = ("body", "body_size", "buffer", "chunks", "data", "done", "event", "first",
                 "gap_max", "gaps", "input_tokens", "last", "led", "mode", "output_tokens",
                 "own_before_first", "parsed_first", "response_model", "yielded_at")  # fmt: skip

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.done = False
        self.yielded_at = 0  # the application holds the reply (or a chunk) since then
        self.mode = _OTHER
        self.buffer = b""  # an SSE line not complete yet
        self.data: bytes | None = None  # the data lines of the event being read
        self.event: bytes | None = None  # its event name
        self.body: list[bytes] | None = None  # a streamed JSON body
        self.body_size = 0
        self.parsed_first = False
        self.chunks = self.first = self.last = self.gap_max = 0
        self.own_before_first = 0  # the gateway's own time in the call before its first chunk
        self.gaps: list[int] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.response_model: str | None = None

    # --- timing: each part of the call is a step of the stage ------------------------------
    def _enter(self) -> Any:
        try:
            led = self.led
            if self.yielded_at:  # the application held the reply until now
                led.consumer += clock.wall_ns() - self.yielded_at
                self.yielded_at = 0
            return stage_timing.bind(led)
        except Exception:
            internal_error("httpx step")
            return None

    def _leave(self, tokens: Any) -> None:
        try:
            if tokens is not None:
                stage_timing.unbind(*tokens)
            self.yielded_at = clock.wall_ns()
        except Exception:
            internal_error("httpx step")

    async def run(self, awaitable: Any) -> Any:
        """Await ``awaitable`` (the send, or one read of the body) as steps of the stage."""
        if self.done:
            return await awaitable
        tokens = self._enter()
        try:
            return await Stepped(awaitable, self.led)
        finally:
            self._leave(tokens)

    def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` (a sync client's send, or one read of the body) as a step of the stage."""
        if self.done:
            return fn(*args, **kwargs)
        led = self.led
        tokens = self._enter()
        stepping = False
        try:
            stage_timing.step_in(led)
            stepping = True
        except Exception:
            internal_error("httpx step")
        try:
            return fn(*args, **kwargs)
        finally:
            if stepping:
                try:
                    stage_timing.step_out(led)
                except Exception:
                    internal_error("httpx step")
            self._leave(tokens)

    # --- what the request and the reply say ------------------------------------------------
    def requested(self, request: Any, operation: str, provider: str) -> None:
        """The request's GenAI attributes: from its URL, and its JSON body as the client holds it."""
        led = self.led
        led.set_attribute(semconv.GEN_AI_OPERATION_NAME, operation)
        led.set_attribute(semconv.GEN_AI_PROVIDER_NAME, provider)
        url = request.url
        led.set_attribute(semconv.SERVER_ADDRESS, url.host)
        if url.port is not None:
            led.set_attribute(semconv.SERVER_PORT, url.port)
        try:
            body = request.content  # RequestNotRead for a streamed body: nothing to read then
        except Exception:
            return
        if not isinstance(body, bytes) or not body.startswith(b"{") or len(body) > MAX_BODY:
            return
        fields = json.loads(body.decode())  # str: json skips detecting the encoding of bytes
        if not isinstance(fields, dict):
            return
        model = fields.get("model")
        if isinstance(model, str):
            led.set_attribute(semconv.GEN_AI_REQUEST_MODEL, model)
        led.set_attribute(semconv.GEN_AI_REQUEST_STREAM, fields.get("stream") is True)
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            limit = fields.get(key)
            if type(limit) is int:
                led.set_attribute(semconv.GEN_AI_REQUEST_MAX_TOKENS, limit)
                break

    def responded(self, response: Any, streamed: bool) -> bool:
        """The reply's headers are in (and its body, unless ``streamed``); returns whether to
        time its body as the application reads it."""
        status = response.status_code
        if status >= 400:
            self.led.set_attribute(semconv.ERROR_TYPE, str(status))
        headers = response.headers
        kind = headers.get("content-type", "")
        if "content-encoding" in headers and headers["content-encoding"] not in ("", "identity"):
            kind = ""  # compressed: the bytes as they pass are not the events (a limit)
        if not streamed:
            if "json" in kind:
                self._read(response.content)
            return False
        self.mode = _SSE if "text/event-stream" in kind else _JSON if "json" in kind else _OTHER
        return True

    def received(self, chunk: bytes) -> None:
        """A chunk of the reply's body arrived (as the application reads it)."""
        try:
            if self.mode == _SSE:  # arrived when the read returned
                self._events(chunk, self.yielded_at or clock.wall_ns())
            elif self.mode == _JSON and chunk:
                self.body_size += len(chunk)
                if self.body_size > MAX_BODY:
                    self.mode, self.body = _OTHER, None
                elif self.body is None:
                    self.body = [chunk]
                else:
                    self.body.append(chunk)
        except Exception:
            self.mode = _OTHER
            internal_error("httpx reply")

    def _events(self, chunk: bytes, now: int) -> None:
        """Server-sent events, line by line; an event ends at a blank line."""
        lines = (self.buffer + chunk if self.buffer else chunk).split(b"\n")
        self.buffer = lines.pop()  # a line not complete yet (b"" when the chunk ended one)
        data, name = self.data, self.event
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data is not None:
                    self._event(data, name, now)
                data = name = None
            elif line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                data = value if data is None else data + b"\n" + value
            elif line[:6] == b"event:":
                name = line[6:].strip()
        self.data, self.event = data, name
        if len(self.buffer) > MAX_BODY:  # not events after all: stop looking
            self.mode, self.buffer = _OTHER, b""

    def _event(self, data: bytes, name: bytes | None, now: int) -> None:
        if data == _DONE:
            return
        if not self.parsed_first or _USAGE.search(data):
            self.parsed_first = True
            self._read(data)
        # A chunk of the reply's text: OpenAI's events (no name) but the usage-only last one;
        # named events (Anthropic's, OpenAI's Responses API) when they carry a delta of content.
        if name is None:
            if _NO_CHOICES.search(data):
                return
        elif not name.endswith(b"delta") or name == b"message_delta":
            return
        led = self.led
        if self.chunks:
            gap = now - self.last
            gaps = self.gaps
            if len(gaps) < MAX_GAPS:
                gaps.append(gap)
            else:  # a bounded uniform sample, as for the request's own gaps
                slot = randrange(self.chunks)
                if slot < MAX_GAPS:
                    gaps[slot] = gap
            if gap > self.gap_max:
                self.gap_max = gap
        else:
            self.first = led.first_item = now  # gen_ai.response.time_to_first_chunk
            # The gateway's part of it: the loop's, the queues', its own CPU so far. Under a
            # saturated loop that was 90% of it (a new user's run: 273 ms against the model
            # server's own 26 ms).
            self.own_before_first = led.loop_wait + led.queued + led.cpu_on
        self.last = now
        self.chunks += 1

    def _read(self, body: bytes) -> None:
        """Model and usage from one JSON document: a reply, or an event of a stream."""
        if len(body) > MAX_BODY:
            return
        fields = json.loads(body.decode())
        if not isinstance(fields, dict):
            return
        # Anthropic's message_start and OpenAI's Responses API events nest the reply.
        for reply in (fields, fields.get("message"), fields.get("response")):
            if not isinstance(reply, dict):
                continue
            model = reply.get("model")
            if isinstance(model, str) and self.response_model is None:
                self.response_model = model
            usage = reply.get("usage")
            if isinstance(usage, dict):
                tokens = usage.get("input_tokens", usage.get("prompt_tokens"))
                if type(tokens) is int:
                    self.input_tokens = tokens
                tokens = usage.get("output_tokens", usage.get("completion_tokens"))
                if type(tokens) is int:
                    self.output_tokens = tokens

    # --- the end -----------------------------------------------------------------------------
    def finish(self, error: BaseException | None, end: int = 0) -> None:
        """Close the stage (once): the reply's attributes, then the ledger."""
        if self.done:
            return
        self.done = True
        led = self.led
        try:
            if self.yielded_at and not end:  # the application held the reply until now
                led.consumer += clock.wall_ns() - self.yielded_at
            if self.body is not None:
                self._read(b"".join(self.body))
            self._attributes(led)
        except Exception:
            internal_error("httpx reply")
        stage_timing.close_ledger(led, error, end)

    def _attributes(self, led: Ledger) -> None:
        if self.response_model is not None:
            led.set_attribute(semconv.GEN_AI_RESPONSE_MODEL, self.response_model)
        if self.input_tokens is not None:
            led.set_attribute(semconv.GEN_AI_USAGE_INPUT_TOKENS, self.input_tokens)
        if self.output_tokens is not None:
            led.set_attribute(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, self.output_tokens)
        elif self.chunks:
            led.set_attribute(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, self.chunks)
            led.set_attribute(semconv.UPSTREAM_TOKENS_COUNTED, True)
        if not self.chunks:
            return
        led.set_attribute(semconv.UPSTREAM_CHUNKS, self.chunks)
        model_ttft = max(0, self.first - led.start - self.own_before_first)
        led.set_attribute(semconv.UPSTREAM_TTFT_MS, model_ttft / _MS)
        gaps = self.gaps
        if gaps:
            ordered = sorted(gaps)
            led.set_attribute(semconv.UPSTREAM_ITL_P50_MS, percentile(ordered, 0.50) / _MS)
            led.set_attribute(semconv.UPSTREAM_ITL_P95_MS, percentile(ordered, 0.95) / _MS)
            led.set_attribute(semconv.UPSTREAM_ITL_MAX_MS, max(ordered[-1], self.gap_max) / _MS)
            led.set_attribute(semconv.UPSTREAM_TPOT_MS, (self.last - self.first) / (self.chunks - 1) / _MS)


def _begin(request: Any, settings: _Settings, streamed: bool, sync: bool) -> _Call | None:
    """A model call's stage, opened, with ``traceparent`` in its request; None when the request
    is not a model call or nothing records (then only the trace context propagates)."""
    led = None
    try:
        if request.method != "POST":
            return None
        path = request.url.path.rstrip("/")
        endpoint = next((e for e in _ENDPOINTS if path.endswith(e[0])), None)
        if endpoint is None:
            return None
        led = stage_timing.open_ledger(settings.sites[streamed, sync], bind=False)
        if led is None:  # not sampled (the decision propagates) or not recording
            propagate.inject(request.headers)
            return None
        call = _Call(led)
        tokens = stage_timing.bind(led)
        try:
            # The stage's own context, not whatever span is current: FastAPI's native
            # telemetry keeps its fastapi.endpoint span current around the endpoint, and its
            # id would reach the model server instead of the stage's.
            context = active_span.request_context(led.request) if led.request is not None else None
            propagate.inject(request.headers, context=context)
        finally:
            stage_timing.unbind(*tokens)
        host = request.url.host
        provider = settings.provider or next(
            (name for suffix, name in _HOSTS if host.endswith(suffix)), endpoint[2]
        )
        try:
            call.requested(request, endpoint[1], provider)
        except Exception:
            internal_error("httpx request")
        return call
    except Exception:
        internal_error("httpx request")
        if led is not None:
            stage_timing.close_ledger(led, None)
        return None


# --- the wrapped send, and the reply's body stream ------------------------------------------
class _Flavour:
    """httpx, or httpx2 (OpenAI's SDK 3 uses it by default): the same API in another module.
    Its body streams must be instances of that module's stream classes."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.clients = (module.AsyncClient, module.Client)
        self.async_stream: type[_AsyncBody] = type("AsyncBody", (_AsyncBody, module.AsyncByteStream), {})
        self.sync_stream: type[_SyncBody] = type("SyncBody", (_SyncBody, module.SyncByteStream), {})


class _AsyncBody:
    """A streamed reply's body: each read a step of the stage, every chunk passed on as is."""

    def __init__(self, inner: Any, call: _Call) -> None:
        self._inner = inner
        self._call = call
        self._chunks: _AsyncChunks | None = None

    def __aiter__(self) -> _AsyncChunks:
        chunks = self._chunks = _AsyncChunks(self._inner.__aiter__(), self._call)
        return chunks

    async def aclose(self) -> None:
        try:
            if self._chunks is not None:
                await self._chunks.aclose()
            await self._inner.aclose()
        finally:
            self._call.finish(None)


class _AsyncChunks:
    """The iteration of an :class:`_AsyncBody` (an iterator, not an async generator: one
    frame less a chunk)."""

    __slots__ = ("_call", "_chunks")

    def __init__(self, chunks: Any, call: _Call) -> None:
        self._chunks = chunks
        self._call = call

    def __aiter__(self) -> _AsyncChunks:
        return self

    async def __anext__(self) -> bytes:
        call = self._call
        try:
            chunk: bytes = await call.run(self._chunks.__anext__())
        except StopAsyncIteration:
            call.finish(None)
            raise
        except BaseException as exc:
            call.finish(exc)
            raise
        call.received(chunk)
        return chunk

    async def aclose(self) -> None:
        """As httpx does with its own stream's iterator when a read is left half-way."""
        if isinstance(self._chunks, AsyncGenerator):
            await self._chunks.aclose()


class _SyncBody:
    """:class:`_AsyncBody` for a sync client."""

    def __init__(self, inner: Any, call: _Call) -> None:
        self._inner = inner
        self._call = call
        self._chunks: _SyncChunks | None = None

    def __iter__(self) -> _SyncChunks:
        chunks = self._chunks = _SyncChunks(iter(self._inner), self._call)
        return chunks

    def close(self) -> None:
        try:
            if self._chunks is not None:
                self._chunks.close()
            self._inner.close()
        finally:
            self._call.finish(None)


class _SyncChunks:
    """The iteration of a :class:`_SyncBody`."""

    __slots__ = ("_call", "_chunks")

    def __init__(self, chunks: Any, call: _Call) -> None:
        self._chunks = chunks
        self._call = call

    def __iter__(self) -> _SyncChunks:
        return self

    def __next__(self) -> bytes:
        call = self._call
        try:
            chunk: bytes = call.run_sync(next, self._chunks)
        except StopIteration:
            call.finish(None)
            raise
        except BaseException as exc:
            call.finish(exc)
            raise
        call.received(chunk)
        return chunk

    def close(self) -> None:
        if isinstance(self._chunks, Generator):
            self._chunks.close()


def _replied(call: _Call, response: Any, streamed: bool, flavour: _Flavour, sync: bool,
             end: int) -> None:  # fmt: skip
    """After the send returned: a reply read whole ends the stage; a streamed one's body is
    wrapped so that its reads are timed."""
    try:
        if call.responded(response, streamed):
            body = (flavour.sync_stream if sync else flavour.async_stream)(response.stream, call)
            response.stream = body
            return
    except Exception:
        internal_error("httpx reply")
    call.finish(None, end)


def _async_send(original: Callable[..., Any], settings: _Settings, flavour: _Flavour) -> Any:
    @functools.wraps(original)
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        streamed = bool(kwargs.get("stream", False))
        call = _begin(request, settings, streamed, False)
        if call is None:
            return await original(self, request, *args, **kwargs)
        try:
            response = await call.run(original(self, request, *args, **kwargs))
        except BaseException as exc:
            call.finish(exc)
            raise
        _replied(call, response, streamed, flavour, False, 0 if streamed else clock.wall_ns())
        return response

    send._tracekit_original = original  # type: ignore[attr-defined]
    return send


def _sync_send(original: Callable[..., Any], settings: _Settings, flavour: _Flavour) -> Any:
    @functools.wraps(original)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        streamed = bool(kwargs.get("stream", False))
        call = _begin(request, settings, streamed, True)
        if call is None:
            return original(self, request, *args, **kwargs)
        try:
            response = call.run_sync(original, self, request, *args, **kwargs)
        except BaseException as exc:
            call.finish(exc)
            raise
        _replied(call, response, streamed, flavour, True, 0 if streamed else clock.wall_ns())
        return response

    send._tracekit_original = original  # type: ignore[attr-defined]
    return send


# --- enabling and disabling ------------------------------------------------------------------
_flavours: dict[str, _Flavour] = {}


def _flavour(name: str) -> _Flavour | None:
    """httpx's or httpx2's flavour; None when that module is not installed."""
    if name not in _flavours:
        try:
            module = httpx if name == "httpx" else importlib.import_module(name)
        except ImportError:
            return None
        _flavours[name] = _Flavour(module)
    return _flavours[name]


def _unwrapped(fn: Any) -> Any:
    return getattr(fn, "_tracekit_original", fn)


C = TypeVar("C")


@overload
def instrument(client: None = None, *, name: str = "model", provider: str | None = None) -> None: ...
@overload
def instrument(client: C, *, name: str = "model", provider: str | None = None) -> C: ...


def instrument(client: Any = None, *, name: str = "model", provider: str | None = None) -> Any:
    """Time model calls as ``model`` stages with GenAI attributes, and propagate the trace.

    Args:
        client: an ``httpx.AsyncClient`` or ``httpx.Client`` (``httpx2``'s too) to instrument;
            omitted: every client of the process (the ``send`` of the client classes of httpx,
            and of httpx2 where it is installed), until :func:`uninstrument`.
        name: the stage name (``model``; give two model clients two names to tell them apart).
        provider: ``gen_ai.provider.name`` (default: from the host, else the API's family:
            ``openai`` for OpenAI's paths, ``anthropic`` for ``/messages``).

    Returns:
        ``client`` (so ``http_client=instrument(httpx.AsyncClient())`` is one line), or None.

    Raises:
        TypeError: ``client`` is not an httpx client.
    """
    settings = _Settings(name, provider)
    if client is None:
        for module_name in ("httpx", "httpx2"):
            flavour = _flavour(module_name)
            if flavour is not None:
                async_client, sync_client = flavour.clients
                async_client.send = _async_send(_unwrapped(async_client.send), settings, flavour)
                sync_client.send = _sync_send(_unwrapped(sync_client.send), settings, flavour)
        return None
    for module_name in ("httpx", "httpx2"):
        if module_name not in sys.modules:
            continue
        flavour = _flavour(module_name)
        if flavour is None:
            continue
        async_client, sync_client = flavour.clients
        if isinstance(client, async_client):
            wrap = _async_send
        elif isinstance(client, sync_client):
            wrap = _sync_send
        else:
            continue
        # The class's own send, even while the process-wide switch is on: one stage a call.
        send = wrap(_unwrapped(type(client).send), settings, flavour)
        client.send = MethodType(send, client)
        return client
    raise TypeError(f"instrument() takes an httpx Client or AsyncClient, got {type(client).__name__}")


def uninstrument(client: Any = None) -> None:
    """Undo :func:`instrument` for ``client``, or the process-wide switch (omitted)."""
    if client is not None:
        send = vars(client).get("send")
        if send is not None and hasattr(getattr(send, "__func__", None), "_tracekit_original"):
            del client.send
        return
    for flavour in _flavours.values():
        for cls in flavour.clients:
            cls.send = _unwrapped(cls.send)
