"""What tracekit's spans carry of a request's data (issue 11, item 8; docs/attributes.md, Privacy).

Signatures in the query string are redacted as the OpenTelemetry HTTP conventions ask, the
query can be redacted further or left out, and exception messages (which often quote the
prompt) are cut short or left out, in the status, the exception event and its stack trace.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit
from tracekit import semconv as sc
from tracekit._core.current import current_ledger
from tracekit.errors import ConfigurationError

from ...core.asgi import call, http_scope

PROMPT = "Summarise this medical record: " + "patient data " * 400 + "END-OF-PROMPT"


@tracekit.stage("guardrail")
def guardrail(text: str) -> None:
    if text:
        raise ValueError(f"rejected prompt: {text}")


@tracekit.stage("model")
def model() -> None:
    led = current_ledger.get()
    assert led is not None
    led.set_attribute("gen_ai.request.model", "m" * 100_000)  # what an integration does


async def ok(request: Request) -> JSONResponse:
    model()
    return JSONResponse({"ok": True})


async def fails(request: Request) -> JSONResponse:
    guardrail(PROMPT)
    return JSONResponse({})


async def chained(request: Request) -> JSONResponse:
    try:
        raise KeyError(f"lookup of {PROMPT}")
    except KeyError as exc:
        raise RuntimeError(f"model call failed for {PROMPT}") from exc


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


async def broken(request: Request) -> JSONResponse:
    raise BrokenStr()


APP = tracekit.TracekitMiddleware(Starlette(routes=[
    Route("/ok", ok), Route("/fails", fails), Route("/chained", chained), Route("/broken", broken),
]))  # fmt: skip


def spans_of(path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
             **scope_items: Any) -> dict[str, Any]:  # fmt: skip
    """The spans of one request, by name (the server span under "server")."""
    scope = http_scope(path, headers=headers)
    scope.update(scope_items, query_string=query)
    with tracekit.record() as rec:
        try:
            asyncio.run(call(APP, scope))
        except Exception:
            pass  # the app's exception reaches the server: a 500
        spans = rec.spans
    return {("server" if s.kind.name == "SERVER" else s.name): s for s in spans}


SIGNED = (b"q=hello&sig=s1&Signature=s2&AWSAccessKeyId=AKIA1&X-Amz-Signature=s3"
          b"&X-Amz-Credential=c1&X-Amz-Security-Token=t1&X-Goog-Signature=s4&SIG=kept&sig=")  # fmt: skip


def test_query_signatures_are_redacted_by_default(otel_globals: None) -> None:
    tracekit.configure(exporter="none")
    query = spans_of("/ok", SIGNED)["server"].attributes[sc.URL_QUERY]
    assert query == ("q=hello&sig=REDACTED&Signature=REDACTED&AWSAccessKeyId=REDACTED"
                     "&X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED"
                     "&X-Amz-Security-Token=REDACTED&X-Goog-Signature=REDACTED&SIG=kept&sig=")  # fmt: skip
    # a key the client percent-encoded is the same key
    encoded = spans_of("/ok", b"X%2DAmz%2DSignature=s5&a=1")["server"].attributes[sc.URL_QUERY]
    assert encoded == "X%2DAmz%2DSignature=REDACTED&a=1"


def test_more_keys_every_value_or_no_query(otel_globals: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tracekit.configure(exporter="none", redact_query=["api_key", "token"])
    query = spans_of("/ok", b"api_key=k&token=t&sig=s&q=x")["server"].attributes[sc.URL_QUERY]
    assert query == "api_key=REDACTED&token=REDACTED&sig=REDACTED&q=x"
    monkeypatch.setenv("TRACEKIT_REDACT_QUERY", " email , *")
    tracekit.configure(exporter="none")
    assert spans_of("/ok", b"q=x&n=2&flag")["server"].attributes[sc.URL_QUERY] == "q=REDACTED&n=REDACTED&flag"
    monkeypatch.setenv("TRACEKIT_RECORD_QUERY", "false")
    tracekit.configure(exporter="none")
    assert sc.URL_QUERY not in spans_of("/ok", b"q=x")["server"].attributes
    tracekit.configure(exporter="none", record_query=True)  # the argument beats the environment
    assert sc.URL_QUERY in spans_of("/ok", b"q=x")["server"].attributes


def test_values_read_from_the_request_are_clipped(otel_globals: None) -> None:
    tracekit.configure(exporter="none")
    long = b"x" * 100_000
    headers = [(b"host", long), (b"user-agent", long)]
    attrs = spans_of("/" + long.decode(), b"q=" + long, headers, server=None)["server"].attributes
    for key in (sc.URL_PATH, sc.URL_QUERY, sc.USER_AGENT_ORIGINAL, sc.SERVER_ADDRESS):
        assert 2000 < len(attrs[key]) <= 2049, key
    assert len(spans_of("/ok")["model"].attributes[sc.GEN_AI_REQUEST_MODEL]) == 2049


def _recorded_text(span: Any) -> str:
    parts = [span.status.description or ""]
    for event in span.events:
        parts.extend(str(value) for value in event.attributes.values())
    return "\n".join(parts)


def test_exception_messages_are_cut_short_by_default(otel_globals: None) -> None:
    tracekit.configure(exporter="none")
    spans = spans_of("/fails")
    server, stage = spans["server"], spans["guardrail"]
    for span in (server, stage):
        assert span.status.description.startswith("ValueError: rejected prompt: Summarise")
        assert len(span.status.description) <= len("ValueError: ") + 257
        assert "END-OF-PROMPT" not in _recorded_text(span)
    (event,) = [e for e in server.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert len(event.attributes["exception.message"]) == 257  # 256 characters and "…"
    stack = event.attributes["exception.stacktrace"]
    assert "in guardrail" in stack and stack.rstrip().endswith("…")
    assert len(stack) <= 8192


def test_exception_messages_can_be_left_out(otel_globals: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_EXCEPTION_MESSAGE_LIMIT", "0")
    tracekit.configure(exporter="none")
    for path, kind in (("/fails", "ValueError"), ("/chained", "RuntimeError")):
        server = spans_of(path)["server"]
        text = _recorded_text(server)
        assert "Summarise" not in text and "patient" not in text
        assert server.status.description == kind
        (event,) = [e for e in server.events if e.name == "exception"]
        assert "exception.message" not in event.attributes
        assert event.attributes["exception.stacktrace"].rstrip().endswith(kind)
    stack = event.attributes["exception.stacktrace"]
    assert "KeyError\n\nThe above exception was the direct cause" in stack  # the chain, typed


def test_an_exception_without_a_message_still_gives_its_spans(otel_globals: None) -> None:
    tracekit.configure(exporter="none")
    server = spans_of("/broken")["server"]
    assert server.status.description.endswith("BrokenStr: <str() failed>")


def test_privacy_options_are_checked(otel_globals: None, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with pytest.raises(ConfigurationError, match="list of query keys, not a string"):
        tracekit.configure(exporter="none", redact_query="sig")
    with pytest.raises(ConfigurationError, match="exception_message_limit must be an integer >= 0"):
        tracekit.configure(exporter="none", exception_message_limit=-1)
    with pytest.raises(ConfigurationError, match="record_query must be true or false"):
        tracekit.configure(exporter="none", record_query="no")  # type: ignore[arg-type]
    monkeypatch.setenv("TRACEKIT_EXCEPTION_MESSAGE_LIMIT", "short")
    tracekit.configure(exporter="none")
    assert "TRACEKIT_EXCEPTION_MESSAGE_LIMIT='short' is not an integer >= 0; using 256" in caplog.text
