"""``tracekit demo``: a gateway with the seeds' problems under load, its diagnosis, the top fix
applied and measured against its projection.

1. starts the simulated model server (one sequence at a time: ``--serial``) and the demo
   gateway (:mod:`tracekit.demo.gateway`, every problem left in) as subprocesses on free
   loopback ports, the gateway's traces and the model server's ``llm_request`` spans (joined
   to the gateway's model calls by ``traceparent``) to ``OUT/before.jsonl`` (and OTLP with
   ``--otlp``);
2. drives a bounded, closed-loop workload: ``--requests`` chat requests, ``--concurrency`` at a
   time, short, medium and long prompts, a quarter of them streamed (the same list each run);
3. stops both (the gateway flushes its traces as it stops), prints the analyzer's text report,
   writes ``OUT/report.html`` and ``OUT/report.json``;
4. takes the report's first finding (the largest impact) that has a switch, turns that
   switch on (:data:`SWITCHES`), runs the same load again into ``OUT/after.jsonl`` and prints
   ``tracekit compare``'s measured change next to the finding's projection, or says plainly
   that it has none (``OUT/compare.json``).

Every process it starts is stopped in a ``finally`` (Ctrl-C and SIGTERM included): SIGINT,
then SIGKILL to the process group after a grace period (the gateway's process pool included).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.errors import ConfigurationError

#: The model server's simulated timings: ~115 ms a call at 32 tokens, so that the
#: one-sequence server, busy most of the time, is the largest problem by far (at ~100 ms the
#: loop's problems took back about what batching saved, one run in six; at ~130 ms the
#: server was so near saturation that its replayed queue, very sensitive there, fell short).
PREFILL_MS = 20.0
DECODE_MS = 3.0
#: The batching fix: continuous batching of up to 16 sequences, each sequence in the batch
#: adding 5% to a decode step (16 running: a step 1.75x as long as one sequence's).
MAX_NUM_SEQS = 16
BATCH_COST = 0.05
#: (rule, stage) of a finding -> the switch that fixes it: a gateway ``--fix`` name, or
#: ``batching`` (the model server with continuous batching, not ``--serial``).
SWITCHES: dict[tuple[str, str | None], str] = {
    ("cpu-on-loop", "tokenize"): "tokenize",
    ("cpu-on-loop", "guardrail"): "guardrail",
    ("sequential-independent", "guardrail"): "overlap",
    ("sequential-independent", "model"): "overlap",
    ("cpu-on-loop", "serialize"): "serialize",
    ("serialized-model-calls", "model"): "batching",
}
#: What each switch does, for the terminal.
SWITCH_WORDS = {
    "tokenize": "the tokenizer's encode_batch in a worker thread",
    "guardrail": "the guardrail in a process pool",
    "overlap": "the model call started beside the guardrail",
    "serialize": "orjson instead of json.dumps",
    "batching": f"a model server with continuous batching (--max-num-seqs {MAX_NUM_SEQS} "
                f"--batch-cost {BATCH_COST}, not --serial)",  # fmt: skip
}
#: (words in the prompt, share of requests): a question, a page of context, a long document.
#: The long ones set each seeded stage's p95 CPU, which ``cpu-on-loop`` needs at 10 ms or more:
#: at 10,000 words (~16,000 tokens) the reply's JSON took 11.1-20.0 ms at p95 over 18 runs on
#: this 2-core host, too near that line for a faster one; at 16,000 (~25,500 tokens) 18.4-23.4
#: ms over 6, and the tokenizer 22.7-27.0 (``bench/demo_projection.py``).
PROMPT_SIZES = ((60, 0.4), (1500, 0.4), (16000, 0.2))
#: Each client's pause between an answer and its next request (a user reading the answer;
#: constant; the analyzer's replay reads such clients as open arrivals, their pause being
#: longer than its closed-loop gap). Without it the clients keep the one-sequence model server
#: busy without a break, no call is ever seen alone, and the serialized-model-calls rule has no
#: uncontended call to compare with (8 clients, 0.8 s: the server busy ~90% of the time, 7.5
#: requests/s x ~117 ms of prefill and decode each, ``tracekit analyze DIR/before.jsonl``).
THINK_S = 0.8
STARTUP_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ChatRequest:
    """One request of the workload."""

    words: int
    max_tokens: int
    stream: bool

    def body(self, vocabulary: list[str], seed: int) -> dict[str, Any]:
        rng = random.Random(seed)
        text = " ".join(rng.choice(vocabulary) for _ in range(self.words))
        return {"model": "sim-1", "messages": [{"role": "user", "content": text}],
                "max_tokens": self.max_tokens, "stream": self.stream}  # fmt: skip


def workload(requests: int, seed: int = 0) -> list[ChatRequest]:
    """The demo's requests: prompt sizes per :data:`PROMPT_SIZES`, 16-48 tokens out, every
    fourth streamed; the same list for the same arguments.

    Why a quarter, not more: a streamed call's model stage ends when the gateway has passed its
    last chunk on, later than the model server moved on to the next call while the loop is busy;
    the ``serialized-model-calls`` rule reads calls that end before an earlier one as a server
    that is not one-at-a-time, and gives up past 10% of them (a third streamed: 12% measured)."""
    rng = random.Random(seed)
    sizes = [words for words, _ in PROMPT_SIZES]
    weights = [share for _, share in PROMPT_SIZES]
    return [
        ChatRequest(rng.choices(sizes, weights)[0], rng.choice((16, 32, 48)), i % 4 == 0)
        for i in range(requests)
    ]


@dataclass
class Services:
    """The processes the demo started, stopped by :meth:`stop_all` whatever happens."""

    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(
        self, name: str, args: list[str], env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        with open(log, "ab") as err:
            # A session of its own: Ctrl-C reaches the demo, which stops it (and the process
            # pool it may start) in order, after the gateway has flushed its traces.
            # In the output folder: `python -m` puts its cwd first on sys.path, and a folder named
            # tracekit where the user stands (a clone's parent) was imported instead of tracekit.
            process = subprocess.Popen([sys.executable, *args], env=env, stdin=subprocess.DEVNULL,
                                       stdout=err, stderr=err, start_new_session=True,
                                       cwd=log.parent)  # fmt: skip
        self.processes.append((name, process))
        return process

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            # uvicorn shuts down cleanly (traces flushed) on SIGTERM as on SIGINT, and a process
            # started by one that ignores SIGINT ignores it too.
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything it left in its group
        self.processes = [(n, p) for n, p in self.processes if p is not process]

    def stop_all(self) -> None:
        for _, process in list(reversed(self.processes)):  # the gateway before the model server
            self.stop(process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(name: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``port`` accepts a connection: a TCP connect, no HTTP request (a readiness
    request would be traced, and show up as a route)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise ConfigurationError(f"the {name} exited at start-up: {' | '.join(tail)} (log: {log})")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise ConfigurationError(
        f"the {name} did not listen on port {port} in {STARTUP_TIMEOUT_S:.0f} s (log: {log})"
    )


class Progress:
    """A progress bar on a terminal; elsewhere a line every 5 s (never silent for long)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.done = self.failed = 0
        self.started = time.monotonic()
        self.tty = sys.stdout.isatty()
        self._last = 0.0

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.2 if self.tty else 5.0):
            return
        self._last = now
        elapsed = now - self.started
        failed = f", {self.failed} failed" if self.failed else ""
        if self.tty:
            filled = int(30 * self.done / max(1, self.total))
            bar = "#" * filled + "." * (30 - filled)
            end = "\n" if final else ""
            print(f"\r  {self.label} [{bar}] {self.done}/{self.total}{failed}  {elapsed:4.1f} s",
                  end=end, flush=True)  # fmt: skip
        elif final or self.done:
            print(f"  {self.label}: {self.done}/{self.total} answered{failed}, {elapsed:.1f} s", flush=True)


async def drive(url: str, requests: list[ChatRequest], concurrency: int, label: str,
                think_s: float = THINK_S, deadline_s: float = 120.0) -> int:  # fmt: skip
    """Send ``requests`` with ``concurrency`` clients, each sending its next request
    ``think_s`` after the last is answered (a streamed one read to its end). Returns how many
    failed."""
    import httpx

    from tracekit.demo.gateway import vocabulary

    words = vocabulary()
    bodies = [r.body(words, seed=i) for i, r in enumerate(requests)]
    progress = Progress(len(bodies), label)
    pending = iter(range(len(bodies)))
    stop_at = time.monotonic() + deadline_s

    async def client_loop(client: httpx.AsyncClient, k: int) -> None:
        await asyncio.sleep(think_s * k / concurrency)  # clients start spread over one pause
        for i in pending:
            if time.monotonic() > stop_at:
                return
            body = bodies[i]
            try:
                if body["stream"]:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for _ in r.aiter_raw():
                            pass
                        ok = r.status_code == 200
                else:
                    ok = (await client.post("/v1/chat/completions", json=body)).status_code == 200
            except httpx.HTTPError:
                ok = False
            progress.done += ok
            progress.failed += not ok
            progress.update()
            await asyncio.sleep(think_s)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(1)
            progress.update()

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tick = asyncio.create_task(ticker())
        try:
            await asyncio.gather(*(client_loop(client, k) for k in range(concurrency)))
        finally:
            tick.cancel()
    progress.update(final=True)
    return progress.failed


@dataclass
class Options:
    """``tracekit demo``'s options (see ``tracekit demo --help``)."""

    out: Path
    requests: int = 120
    concurrency: int = 8
    otlp: bool = False
    keep_running: bool = False
    #: The gateway host's cores for the replay (``tracekit analyze --cores``); ``None``: the
    #: trace's (the gateway records the CPUs it may run on).
    cores: int | None = None


def start_servers(options: Options, services: Services, traces: Path, switch: str | None) -> int:
    """Start the model server and the gateway (``switch`` on), their traces to ``traces``
    (and OTLP with ``--otlp``), and wait until both listen. Returns the gateway's port."""
    exporters = f"jsonl:{traces.resolve()}" + (",otlp" if options.otlp else "")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": exporters, "PYTHONUNBUFFERED": "1"}
    env.pop("TRACEKIT_DEMO_FIXES", None)
    log = options.out / "servers.log"
    model_port, gateway_port = free_port(), free_port()
    # The model server's llm_request spans go to the gateway's file (each process appends
    # whole lines), so the analyzer reads the server's queue time beside the gateway's stages.
    model_args = ["-m", "tracekit.demo.model_server", "--port", str(model_port),
                  "--prefill-ms", str(PREFILL_MS), "--decode-ms", str(DECODE_MS),
                  "--traces-file", str(traces.resolve())]  # fmt: skip
    if options.otlp:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
        model_args += ["--otlp-traces-endpoint", f"{endpoint.rstrip('/')}/v1/traces"]
    if switch == "batching":
        model_args += ["--max-num-seqs", str(MAX_NUM_SEQS), "--batch-cost", str(BATCH_COST)]
    else:
        model_args.append("--serial")
    gateway_args = ["-m", "tracekit.demo.gateway", "--port", str(gateway_port),
                    "--model-url", f"http://127.0.0.1:{model_port}"]  # fmt: skip
    if switch not in (None, "batching"):
        gateway_args += ["--fix", str(switch)]
    model = services.start("model server", model_args, env, log)
    gateway = services.start("gateway", gateway_args, env, log)
    print(f"  model server pid {model.pid} on 127.0.0.1:{model_port}"
          f"{' (one sequence at a time)' if switch != 'batching' else ' (batching)'}; "
          f"gateway pid {gateway.pid} on 127.0.0.1:{gateway_port}", flush=True)  # fmt: skip
    wait_listening("model server", model_port, model, log)
    wait_listening("gateway", gateway_port, gateway, log)
    return gateway_port


def run_load(options: Options, services: Services, label: str, traces: Path,
             switch: str | None) -> None:  # fmt: skip
    """Start the servers (``switch`` on), drive the workload, stop both: the traces are in
    ``traces`` when it returns."""
    traces.unlink(missing_ok=True)
    port = start_servers(options, services, traces, switch)
    failed = asyncio.run(drive(f"http://127.0.0.1:{port}", workload(options.requests),
                               options.concurrency, label))  # fmt: skip
    log = options.out / "servers.log"
    if failed:
        print(f"  {failed} requests failed (see {log})", flush=True)
    services.stop_all()  # the gateway first: it flushes its traces as it stops
    if not traces.exists() or traces.stat().st_size == 0:
        raise ConfigurationError(f"the gateway wrote no traces to {traces} (log: {log})")


def top_fix(report: Any) -> tuple[Any, str] | None:
    """The finding whose fix the demo applies: the report's first (the largest impact) that
    the demo has a switch for, projected or not."""
    return next(((f, SWITCHES[(f.rule, f.stage)]) for f in report.findings
                 if (f.rule, f.stage) in SWITCHES), None)  # fmt: skip


def _listens(url: str) -> bool:
    """Whether something accepts a TCP connection at ``url``'s host and port (within 1 s)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "localhost", port), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def run(options: Options) -> int:
    """Run the demo (the module docstring); returns the exit code."""
    from tracekit.analysis.api import analyze
    from tracekit.analysis.compare import compare
    from tracekit.cli import write_output

    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "servers.log").unlink(missing_ok=True)
    before, after = options.out / "before.jsonl", options.out / "after.jsonl"
    services = Services()
    # Ctrl-C and SIGTERM stop it even where the parent left SIGINT ignored (a background job of
    # a script): with SIGINT ignored, both were ignored and the demo ran on.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"tracekit demo: a gateway with five known problems, {options.requests} requests "
              f"{options.concurrency} at a time (short, medium and long prompts; a quarter streamed)",
              flush=True)  # fmt: skip
        if options.otlp:
            endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
            print(f"  traces also go to {endpoint} (OTLP)", flush=True)
            if not _listens(endpoint):
                print(f"  warning: nothing answers at {endpoint}: the traces will not arrive there "
                      f"(they are still written to {options.out})", flush=True)  # fmt: skip
        run_load(options, services, "before", before, None)
        print("analysing the traces ...", flush=True)
        report = analyze(str(before), cores=options.cores)
        text = report.to_text(width=100)
        print("\n" + text, flush=True)
        write_output(str(options.out / "report.html"), report.to_html())
        write_output(str(options.out / "report.json"), report.to_json() + "\n")
        print(f"HTML report: {options.out / 'report.html'}   JSON: {options.out / 'report.json'}   "
              f"traces: {before}", flush=True)  # fmt: skip
        chosen = top_fix(report)
        if chosen is None:
            print("no finding the demo has a switch for: nothing to apply")
            return 0
        finding, switch = chosen
        name = f"{finding.rule}:{finding.stage}"
        note = replay_note(report, finding)
        if note:
            print(note, flush=True)
        print(f"\napplying the fix of {name}: {SWITCH_WORDS[switch]}; the same load again",
              flush=True)  # fmt: skip
        run_load(options, services, "after", after, switch)
        print("comparing the two runs ...", flush=True)
        if not finding.projection:
            print(f"  {name} has no projection (the report says why): the measured change only")
        if finding.projection:
            comparison = compare(str(before), str(after), finding=name, cores=options.cores)
        else:
            # compare checks projected findings only, and would check another one's (the top
            # projected) against this change: the measured change alone, under this name.
            comparison = dataclasses.replace(compare(str(before), str(after), cores=options.cores),
                                             finding=name)  # fmt: skip
            for route in comparison.routes:
                route.projections = []
        print("\n" + comparison.to_text(width=100), flush=True)
        write_output(str(options.out / "compare.json"), comparison.to_json() + "\n")
        print(f"comparison: {options.out / 'compare.json'}   traces: {after}", flush=True)
        print("\n" + "\n".join(outcome(name, finding, comparison.to_dict(), options.concurrency)), flush=True)
        if options.keep_running:
            keep_running(options, services)
        return 0
    finally:
        services.stop_all()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def replay_note(report: Any, finding: Any) -> str | None:
    """Why the report's header says the replay validated while ``finding`` has no projection
    because the replay could not reproduce the route, or ``None`` when they do not disagree.

    They are two replays: the header's replays the recording as it was (every model call
    waits as long as it did); a model-server finding's replays it with the server taking one
    call at a time, the queue made anew, which is the replay its fix is projected from."""
    validation = report.validation or {}
    note = finding.projection_note or ""
    if finding.rule != "serialized-model-calls" or finding.projection:
        return None  # other findings project from the header's replay itself
    if not validation.get("ok") or "could not reproduce" not in note:
        return None
    p50, p95 = validation.get("p50_error"), validation.get("p95_error")
    return textwrap.fill(
        f"note: the header's validation replayed the recording as it was (p50 {p50:+.1%}, "
        f"p95 {p95:+.1%}); the {finding.rule} projection replays it with the model server "
        f"taking one call at a time, which did not reproduce the measured latency (its note "
        f"above), so its fix is measured below without a projection",
        width=100, subsequent_indent="  ",
    )


def outcome(name: str, finding: Any, comparison: dict[str, Any], concurrency: int) -> list[str]:
    """The demo's last lines: the p95 measured before and after the fix, beside the projected
    one (its before is the replay's, not the measurement), and whether it landed in range."""
    routes = comparison.get("routes") or []
    if not routes:
        return [f"{name}: no route measured in both runs"]
    p95 = routes[0]["latency_ms"]["p95"]
    before, after = p95["before"], p95["after"]
    lines = [
        f"the fix of {name}, p95 latency at {concurrency} clients:",
        f"  measured             before {before:7.0f} ms   after {after:7.0f} ms   "
        f"{100 * (after / before - 1):+.1f}%",
    ]
    projection = finding.projection
    if not projection:
        lines.append("  projected            none (the finding's note says why)")
        return lines
    (b, a), (low, high) = projection["p95_ms"], projection["range"]["p95_ms"]
    lines.append(f"  projected (replayed) before {b:7.0f} ms   after {a:7.0f} ms   "
                 f"range {low:.0f}-{high:.0f} ms")  # fmt: skip
    if low <= after <= high:
        where = "inside the projected range"
    else:
        where = f"{'above' if after > high else 'below'} the projected range"
    lines.append(f"  the measured after is {where}")
    lines.append(f"  (the projected before is the recording replayed: {100 * (b / before - 1):+.1f}% "
                 f"from the measured one)")  # fmt: skip
    return lines


def keep_running(options: Options, services: Services) -> None:
    """Leave the gateway (every problem in) and its model server up until Ctrl-C."""
    traces = options.out / "explore.jsonl"
    print("\nstarting the gateway again, every problem in, to explore:", flush=True)
    port = start_servers(options, services, traces, None)
    request = '{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}'
    print(f"the gateway is up at http://127.0.0.1:{port} until Ctrl-C; its traces go to {traces}. "
          f"Try:\n  curl -s http://127.0.0.1:{port}/v1/chat/completions "
          f"-H 'content-type: application/json' -d '{request}'", flush=True)  # fmt: skip
    while all(p.poll() is None for _, p in services.processes):
        time.sleep(0.5)
    raise ConfigurationError(f"a demo server exited on its own (log: {options.out / 'servers.log'})")


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM: stop the servers as Ctrl-C does, through SIGINT's own handler (inside the load,
    # asyncio.run's: it cancels the load and then raises KeyboardInterrupt; raised here, inside
    # a task, the interrupt was left on the task and printed as never retrieved).
    signal.raise_signal(signal.SIGINT)

