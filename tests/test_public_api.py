"""The public surface (DESIGN §3) and the import boundary (no SDK or framework on import)."""

from __future__ import annotations

import subprocess
import sys

import tracekit


def test_all_is_sorted_and_exactly_the_design_api() -> None:
    assert tracekit.__all__ == sorted(tracekit.__all__)
    assert set(tracekit.__all__) == {
        "TracekitMiddleware", "analyze", "compare", "configure", "record", "stage",
    }
    for name in tracekit.__all__:
        assert getattr(tracekit, name).__doc__, f"tracekit.{name} has no docstring"


def test_import_loads_no_sdk_and_no_framework() -> None:
    code = (
        "import sys, tracekit, tracekit.semconv, tracekit.errors;"
        "heavy = ('opentelemetry.sdk', 'starlette', 'fastapi', 'tokenizers', 'pyinstrument',"
        " 'torch', 'uvicorn', 'httpx');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {h.split('.')[0] for h in heavy}"
        " and any(m == h or m.startswith(h + '.') for h in heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

