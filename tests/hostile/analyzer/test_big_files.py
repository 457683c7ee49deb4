"""Large and hostile trace files: single documents, garbage, and running out of memory.

A trace file that is one JSON document used to be parsed whole into dicts (~12 times the
file in memory); garbage was read twice and copied before it was refused; and a failed
allocation inside orjson read as "not valid JSON". Peak memory is measured in a child
process (``ru_maxrss`` around the read), memory limits are real ones (``RLIMIT_AS``).
"""

from __future__ import annotations

import base64
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import ROOT, gen_traces
from tracekit.analysis import readers

MB = 1_000_000

# A child process: reads ``path`` (after a warm-up read of ``warm``) and prints how far its
# peak memory grew meanwhile (VmHWM: ru_maxrss would carry over the parent's peak), and how
# many spans it read, or the error.
PEAK = """
import re, sys
from tracekit.analysis.readers import read_spans
from tracekit.errors import TracekitError
def peak():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
warm, path = sys.argv[1:]
list(read_spans(warm))
before = peak()
try:
    outcome = str(sum(1 for _ in read_spans(path)))
except TracekitError as exc:
    outcome = str(exc)
print((peak() - before) * 1024)
print(outcome)
"""

# A child process under a real memory limit: its address space as it stands after a warm-up
# (every module imported), plus HEADROOM bytes; then the command line on ``path``.
LIMITED = """
import contextlib, io, re, resource, sys
from tracekit.cli import main
warm, path, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
with contextlib.redirect_stdout(io.StringIO()):
    main(["analyze", warm, "--format", "json"])
status = open("/proc/self/status").read()
size = int(re.search(r"VmSize:\\s+(\\d+) kB", status).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["analyze", path, "--format", "json"])
sys.exit(code)
"""


def child(script: str, *args: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)  # fmt: skip


LINUX = pytest.mark.skipif(sys.platform != "linux", reason="/proc and RLIMIT_AS: Linux")


def peak(warm: Path, path: Path) -> tuple[int, str]:
    """How much a read of ``path`` grew the peak memory of a fresh process, and its outcome
    (the span count, or the error)."""
    done = child(PEAK, warm, path)
    assert done.returncode == 0, done.stderr
    grew, outcome = done.stdout.splitlines()
    return int(grew), outcome


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same ~8 MB of spans as JSON Lines and as one document; a tiny file to warm up."""
    folder = tmp_path_factory.mktemp("big")
    lines = folder / "spans.jsonl"
    gen_traces().write_jsonl(lines, 7_000, rate=40.0, seed=5)
    resource_spans = [rs for line in lines.open("rb") for rs in orjson.loads(line)["resourceSpans"]]
    document = folder / "spans.json"
    document.write_bytes(orjson.dumps({"resourceSpans": resource_spans}))
    warm = folder / "warm.jsonl"
    gen_traces().write_jsonl(warm, 600, batch_size=100)
    return {"lines": lines, "document": document, "warm": warm}


# --- a single document ----------------------------------------------------------------------
@LINUX
def test_a_single_document_costs_about_its_size(files: dict[str, Path]) -> None:
    size = files["document"].stat().st_size
    grew, outcome = peak(files["warm"], files["document"])
    assert outcome == str(sum(1 for _ in readers.read_spans(files["lines"])))
    # Parsed whole into dicts it took 12 times its size (98 MB for these 8 MB, measured).
    assert grew < 2.5 * size, f"{grew / MB:.0f} MB for a {size / MB:.0f} MB document"


def test_a_single_document_gives_the_spans_of_its_json_lines(files: dict[str, Path]) -> None:
    from_document = readers.read_spans(files["document"])
    assert list(from_document) == list(readers.read_spans(files["lines"]))
    assert from_document.stats.format == "otlp-json"


@LINUX
def test_a_document_still_being_written_is_refused_cheaply(
    files: dict[str, Path], tmp_path: Path
) -> None:
    data = files["document"].read_bytes()[:-1000]
    cut = tmp_path / "cut.json"
    cut.write_bytes(data)
    grew, outcome = peak(files["warm"], cut)
    assert outcome == f"{cut}: truncated JSON (ends after {len(data)} bytes)"
    assert grew < 1.6 * len(data), f"{grew / MB:.1f} MB"  # parsed whole: 12 times its size


# --- garbage --------------------------------------------------------------------------------
def garbage(kind: str, size: int) -> bytes:
    noise = random.Random(1).randbytes(size * 3 // 4)
    if kind == "binary":
        return noise
    if kind == "text lines":
        return base64.encodebytes(noise)  # 76 characters a line
    return b'{"resourceSpans": [' + base64.b64encode(noise)  # one line, a JSON start


@LINUX
@pytest.mark.parametrize(
    ("kind", "message", "most"),
    [
        ("binary", r": line 1: not valid JSON \(invalid UTF-8 at byte \d+ of the line\)", 0.1),
        ("text lines", r": line 1: not valid JSON \(.* at column \d+\)", 0.1),
        ("one line", r": not valid JSON \(expected ',' or '\]' at line 1 column 21\)", 1.6),
    ],
)
def test_garbage_is_refused_cheaply(
    files: dict[str, Path], tmp_path: Path, kind: str, message: str, most: float
) -> None:
    # Refused after its first line when that is wrong; else held once, and refused at the
    # first error without building anything (it took 2 to 4 times the file before).
    path = tmp_path / "garbage"
    path.write_bytes(garbage(kind, 8 * MB))
    grew, outcome = peak(files["warm"], path)
    assert outcome.startswith(str(path)) and re.search(message, outcome)
    assert grew < most * path.stat().st_size, f"{grew / MB:.1f} MB"


# --- out of memory --------------------------------------------------------------------------
@LINUX
@pytest.mark.parametrize(
    ("make", "headroom"),
    [
        ("document", 4 * MB),  # held whole, it cannot fit
        ("long first line", 30 * MB),  # fits as bytes; orjson's dicts of it do not
    ],
)
def test_running_out_of_memory_is_reported_as_such(
    files: dict[str, Path], tmp_path: Path, make: str, headroom: int
) -> None:
    path = files["document"]
    if make == "long first line":  # orjson's own allocation fails first, or the dicts do
        path = tmp_path / "long.jsonl"
        path.write_bytes(files["document"].read_bytes() + b"\n" + b'{"resourceSpans": []}\n')
    done = child(LIMITED, files["warm"], path, headroom)
    assert done.returncode == 2, done.stderr
    mb = f"{path.stat().st_size / MB:,.0f} MB"
    assert done.stderr == (
        f"tracekit: error: out of memory reading {path} ({mb}): a single JSON document is "
        "held in memory whole; JSON Lines is read in bounded memory\n"
    )


@LINUX
def test_orjson_out_of_memory_is_a_memory_error() -> None:
    # orjson says "Not enough memory" with a JSONDecodeError: the readers must not take it
    # for bad input. (Its parser's buffers for these 22 MB need far more than 3 times that;
    # with less than about the input's size to spare, orjson 3.13 crashes instead.)
    script = (
        "import re, resource\n"
        "from tracekit.analysis.readers.common import loads\n"
        "data = b'[' + b'{\"a\": \"xxxxxxxxxxxx\"},' * 1_000_000 + b'{}]'\n"
        "status = open('/proc/self/status').read()\n"
        "size = int(re.search(r'VmSize:\\s+(\\d+) kB', status).group(1)) * 1024\n"
        "spare = 3 * len(data)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + spare, resource.RLIM_INFINITY))\n"
        "try:\n    loads(data)\nexcept MemoryError:\n    print('MemoryError')\n"
    )
    done = child(script)
    assert done.stdout == "MemoryError\n", done.stderr
