"""A real Arize Phoenix on loopback for the end-to-end tests (../shared/REAL-BACKENDS.md: a
fresh database, every phone-home switched off), stopped by its PID and its files removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx

from ..loop.proxy import free_port

READY_S = 120  # Phoenix starts in 18-28 s on 2 cores


@contextlib.contextmanager
def running_phoenix(executable: str) -> Iterator[str]:
    """Start ``executable serve``; yields its URL once ``/healthz`` answers."""
    port, grpc_port = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="phoenix-")
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_WORKING_DIR": workdir,
           "PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
           "PHOENIX_DISABLE_AGENT_ASSISTANT": "true", "PHOENIX_ENABLE_MCP_SERVER": "false",
           "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true", "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
           "PHOENIX_AGENTS_DISABLE_BASH": "true"}  # fmt: skip
    process = subprocess.Popen([executable, "serve"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            assert process.poll() is None, "phoenix exited"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"phoenix not ready after {READY_S} s"
            time.sleep(0.5)
        yield url
    finally:
        # Killed, not stopped gracefully (6 s of shutdown): its database is thrown away.
        process.kill()
        process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
