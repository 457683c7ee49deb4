"""Helpers several test modules share: where the real trace files are, the trace generator."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[1]


def shared_data() -> Path:
    """The shared data folder: $TRACEKIT_SHARED_DATA, else ../shared/data beside the clone."""
    env = os.environ.get("TRACEKIT_SHARED_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


REAL = shared_data() / "real-traces"
HOTROD = REAL / "otlp-hotrod-n-plus-one-serial.json"
needs_real = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"real trace files not found at {REAL} (set TRACEKIT_SHARED_DATA)"
)


def gen_traces() -> ModuleType:
    """bench/gen_traces.py, the simulated gateway (also the benchmark's input)."""
    name = "tracekit_bench_gen_traces"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "gen_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 in a thread; yields the base URL, stops on exit."""
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
