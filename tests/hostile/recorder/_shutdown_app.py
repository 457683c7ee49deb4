"""The gateway ``test_shutdown.py`` runs under uvicorn in a subprocess, exporting OTLP/HTTP to
wherever ``OTEL_EXPORTER_OTLP_ENDPOINT`` points (a dead port, a black hole, a collector)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tracekit

tracekit.configure(service_name="shutdown-test", exporter="otlp")


@tracekit.stage("tokenize")
def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


async def chat(request: Request) -> JSONResponse:
    return JSONResponse({"tokens": len(tokenize("hello"))})


app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/chat", chat)]))
