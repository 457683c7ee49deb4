"""Every script in examples/ is started here, as its docstring says to run it, against real
servers on loopback; and the demo gateway's switches each do what they claim."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
#: The examples this module starts; a new one fails test_every_example_is_started until added.
STARTED = {"model_server.py", "demo_gateway.py", "gateway.py", "gateway_under_load.py"}
ROUTE = "POST /v1/chat/completions"


def test_every_example_is_started() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == STARTED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited at start-up"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def spans(path: Path) -> Iterator[dict]:
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                yield from scope["spans"]


def chat(url: str, words: int, stream: bool) -> dict:
    from tracekit.demo.gateway import vocabulary

    vocab = vocabulary()
    text = " ".join(vocab[i % len(vocab)] for i in range(words))
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "stream": stream}
    with httpx.Client(base_url=url, timeout=60) as client:
        if not stream:
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
            return response.json()  # type: ignore[no-any-return]
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        return {"chunks": [json.loads(e[6:]) for e in events[:-1]]}


def run_demo_gateway(tmp_path: Path, fixes: list[str]) -> tuple[Path, list[dict]]:
    """The demo's gateway and model server, each started as its example says; one long
    non-streamed request, one streamed; returns the traces and the replies."""
    traces = tmp_path / "traces.jsonl"
    env = {**os.environ, "OTEL_TRACES_EXPORTER": f"jsonl:{traces}"}
    model_port, gateway_port = free_port(), free_port()
    model = start(["examples/model_server.py", "--port", str(model_port), "--serial"], env)
    args = ["examples/demo_gateway.py", "--port", str(gateway_port),
            "--model-url", f"http://127.0.0.1:{model_port}"]  # fmt: skip
    gateway = start(args + [a for f in fixes for a in ("--fix", f)], env)
    try:
        wait_listening(model_port, model)
        wait_listening(gateway_port, gateway)
        url = f"http://127.0.0.1:{gateway_port}"
        replies = [chat(url, 8000, stream=False), chat(url, 200, stream=True)]
    finally:
        stop(gateway)
        stop(model)
    return traces, replies


def stage_spans(traces: Path) -> dict[str, dict[str, dict]]:
    """trace id -> stage name -> its span."""
    out: dict[str, dict[str, dict]] = {}
    for span in spans(traces):
        if span["name"] in ("tokenize", "guardrail", "model", "serialize"):
            out.setdefault(span["traceId"], {})[span["name"]] = span
    return out


def attribute(span: dict, key: str) -> object:
    for a in span["attributes"]:
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def test_demo_gateway_switches(tmp_path: Path) -> None:
    import tracekit

    slow, slow_replies = run_demo_gateway(tmp_path / "slow", [])
    fixed, fixed_replies = run_demo_gateway(tmp_path / "fixed",
                                            ["tokenize", "guardrail", "overlap", "serialize"])  # fmt: skip
    # The same answers either way (orjson writes the same JSON values as json.dumps).
    for a, b in zip(slow_replies, fixed_replies, strict=True):
        a.pop("created", None), b.pop("created", None)
        assert a == b
    assert slow_replies[0]["usage"]["prompt_tokens"] == len(slow_replies[0]["prompt_token_ids"])

    before = {s["stage"]: s for s in tracekit.analyze(str(slow)).to_dict()["routes"][0]["stages"]}
    after = {s["stage"]: s for s in tracekit.analyze(str(fixed)).to_dict()["routes"][0]["stages"]}
    assert before["tokenize"]["on_loop"] and not after["tokenize"]["on_loop"]
    # The guardrail's CPU left the event loop for a process pool (tracekit still counts it,
    # as cpu_off_loop: its on-loop share is the hand-off).
    guard = {name: [s for s in spans(t) if s["name"] == "guardrail"] for name, t in
             (("before", slow), ("after", fixed))}  # fmt: skip
    assert all(attribute(s, "tracekit.cpu_off_loop_ms") is None for s in guard["before"])
    for s in guard["after"]:
        off, cpu = attribute(s, "tracekit.cpu_off_loop_ms"), attribute(s, "tracekit.cpu_ms")
        assert isinstance(off, float) and isinstance(cpu, float) and off > 0.75 * cpu
    assert after["serialize"]["cpu_ms"]["p95"] < 0.5 * before["serialize"]["cpu_ms"]["p95"]
    # Overlap: each request's model call started before its guardrail ended (after only).
    for traces, overlapped in ((slow, False), (fixed, True)):
        for stages in stage_spans(traces).values():
            model, guard = stages["model"], stages["guardrail"]
            assert (int(model["startTimeUnixNano"]) < int(guard["endTimeUnixNano"])) is overlapped


def test_gateway_under_load_example(tmp_path: Path) -> None:
    """examples/gateway_under_load.py runs examples/gateway.py and examples/model_server.py."""
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "examples/gateway_under_load.py", "--requests", "12",
                             "--concurrency", "4", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["requests"] == 12
    # The readiness probe is a TCP connect: no route but the chat one.
    assert [r["route"] for r in report["routes"]] == [ROUTE]
