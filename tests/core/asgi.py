"""Calling an ASGI app directly, in-process (no server): for tests that need no sockets."""

from __future__ import annotations

from typing import Any


def http_scope(path: str = "/", method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None,
               root_path: str = "") -> dict[str, Any]:  # fmt: skip
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": root_path,
        "query_string": b"", "headers": headers or [(b"host", b"testserver")],
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
    }  # fmt: skip


async def call(app: Any, scope: dict[str, Any], body: bytes = b"") -> list[dict[str, Any]]:
    """Run one request through ``app``; returns the messages it sent."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent
