"""Servers the benches start: a free loopback port, a Python process of their own, readiness
by a TCP connect (no request: nothing traced), and a stop by PID that lets uvicorn shut down
cleanly (tracekit exports what it holds) before it kills."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python ARGS`` in the repository root; its stderr kept for the error a failed start gives."""
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Until something listens on ``port``; SystemExit with its stderr if the process ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode()[-800:] if process.stderr else ""
            raise SystemExit(f"a server exited early: {err}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"port {port} not ready in {timeout_s:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    # SIGTERM: uvicorn shuts down cleanly and tracekit exports what it holds (SIGINT is ignored
    # by a server started from a script run in the background).
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stderr is not None:
        process.stderr.close()
