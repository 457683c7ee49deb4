"""Do the analyzer's projections hold? Each rule's seeded gateway, its fix applied, measured.

For each case below: a small FastAPI gateway with one seeded defect, served by uvicorn
(1 worker, 127.0.0.1, ``TracekitMiddleware``, traces to a JSON Lines file), calling the
simulated model server (``python -m tracekit.demo.model_server``, its own process), loaded by
a bounded asyncio + httpx load generator in this process:

- closed loop: ``C`` clients, each sending its next request when its last one returned;
- open loop: Poisson arrivals at a fixed rate (below the defective gateway's capacity).

Per case and load: record the defective gateway (BEFORE); ``tracekit analyze BEFORE`` gives
the finding, its fix and its projection; record the gateway with exactly that fix applied
(AFTER); ``tracekit compare BEFORE AFTER --finding RULE:STAGE`` gives the projected change
next to the measured one. The cases (rule: defect → the fix the report proposes):

- ``cpu-on-loop``: a sync ``tokenize`` stage calls HF ``tokenizers``' ``encode`` on the loop
  → ``await asyncio.to_thread(TOKENIZER.encode_batch, [text])`` in an async stage;
- ``blocking-call-on-loop``: a ``lookup`` stage (a coroutine) makes a ~20 ms call with a sync
  ``httpx.Client`` before the (async) model call → the call through ``asyncio.to_thread``
  (what the report proposes for a blocking call it cannot name: httpcore's frames);
- ``serialized-model-calls``: the model server serves one request at a time (``--serial``)
  → a batching server (the same server without ``--serial``);
- ``sequential-independent``: an input guardrail (an awaited moderation call) before the
  model call → the model call started beside it with ``asyncio.create_task``;
- ``gc-pauses``: start-up keeps 300,000 objects and each request leaves 1,000 in a bounded
  cache, so full collections walk the start-up heap (~40 ms) → ``gc.collect(); gc.freeze()``
  at the end of the lifespan start-up.
- ``loop-saturated``: three pure-Python stages of ~3 ms each a request (no one of them
  long enough for ``cpu-on-loop``) and a model server that keeps up, at loads that fill the
  loop (its own loads: closed 8 and 16, open 70/s) → the worker processes the report names
  (``uvicorn --workers N``, both writing the same trace file).

The table: projected p50 / p95 after the fix (with the replay's range), both rescaled to the
measured BEFORE (``measured before × projected after / projected before``: the replay
projects a relative change, DESIGN §4), the measured after, the error
(``projected / measured − 1``), whether the direction was right (``compare``'s verdict; "not
significant" when the signs differ but the measured interval reaches the projection), the
latency the load generator saw (it includes what no span covers: a request waiting in the
listen socket while the loop is held), the two largest changes of the measured breakdown
(where the fix moved the time), and the host's 1-minute load average (the larger at the
start and end of the two runs). Every server is started here and stopped by its PID; every
run is bounded in requests and seconds.

Run: python bench/validate.py [--quick] [--cases a,b] [--loads closed:2,closed:6,open]
     [--requests 240] [--cores N] [--markdown out.md] [--json out.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers import free_port, start, stop, wait_ready
from starlette.requests import Request  # module level: FastAPI resolves the handler's annotation

ROOT = Path(__file__).resolve().parents[1]
ROUTE = "/chat"


@dataclass(frozen=True)
class Case:
    rule: str
    stage: str  # the finding's stage ("": a finding of the whole route, as gc-pauses')
    fix: str  # the fix applied, as the report words it (checked against the finding's code)
    open_rate: float  # Poisson arrivals per second: below the defective gateway's capacity
    model_args: tuple[str, ...] = ("--prefill-ms", "20", "--decode-ms", "2")
    loads: str | None = None  # the case's own --loads default (where 2 clients fill nothing)


CASES = {
    "cpu-on-loop": Case("cpu-on-loop", "tokenize", "asyncio.to_thread", 30),
    "blocking-call-on-loop": Case("blocking-call-on-loop", "lookup", "asyncio.to_thread", 20),
    "serialized-model-calls": Case(
        "serialized-model-calls", "model", "--max-num-seqs", 12, ("--prefill-ms", "10", "--decode-ms", "2")
    ),
    "sequential-independent": Case("sequential-independent", "guardrail", "create_task", 30),
    "gc-pauses": Case("gc-pauses", "", "gc.freeze()", 30),
    # A model server that keeps up (2 ms prefills, which it runs one at a time): the loop fills.
    "loop-saturated": Case("loop-saturated", "", "--workers", 70, ("--prefill-ms", "2", "--decode-ms", "1"),
                           loads="closed:8,closed:16,open"),
}
SLICE_MS = 3.0  # loop-saturated: each of its three stages' CPU a request
HEAP_OBJECTS = 200_000  # gc-pauses: what start-up keeps (a full collection walks it)
KEPT_PER_REQUEST = 2_000  # ... and what each request leaves in a bounded cache
MAX_TOKENS = 8  # the model call: prefill + 8 decodes
TOKENIZE_REPEAT = 1000  # the prompt repeated: ~16 ms of encode here (BPE's word cache warm)
MAX_IN_FLIGHT = 256  # open loop: arrivals beyond this are dropped (counted), not queued


# --- the gateway (runs in its own process: ``--serve``) -------------------------------------


def make_app(case: str, fixed: bool, model_url: str) -> Any:
    """The FastAPI gateway of ``case``: defective, or with the proposed fix (``fixed``)."""
    import httpx
    from fastapi import FastAPI

    import tracekit

    client = httpx.AsyncClient(base_url=model_url, timeout=60,
                               limits=httpx.Limits(max_connections=512))  # fmt: skip
    sync_client = httpx.Client(base_url=model_url, timeout=60)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
    tokenizer = _train_tokenizer() if case == "cpu-on-loop" else None

    @tracekit.stage("tokenize")
    def tokenize(text: str) -> int:  # the defect: encode holds the GIL, on the loop
        assert tokenizer is not None
        return len(tokenizer.encode(text).ids)

    @tracekit.stage("tokenize")
    async def tokenize_off_loop(text: str) -> int:  # the fix, as the report writes it
        assert tokenizer is not None
        [encoding] = await asyncio.to_thread(tokenizer.encode_batch, [text])
        return len(encoding.ids)

    @tracekit.stage("model")
    async def complete() -> str:
        r = await client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"])

    @tracekit.stage("lookup", kind="other")
    async def lookup() -> int:  # e.g. an account lookup with a sync client: the prefill only
        lookup_body = {**body, "max_tokens": 0}
        if fixed:  # the fix, as the report writes it
            r = await asyncio.to_thread(sync_client.post, "/v1/chat/completions", json=lookup_body)
        else:
            r = sync_client.post("/v1/chat/completions", json=lookup_body)  # the defect
        return r.status_code

    @tracekit.stage("parse")
    def parse(text: str) -> int:  # loop-saturated: short CPU steps, none of them long
        return _busy(text)

    @tracekit.stage("policy", kind="guardrail")
    def policy(text: str) -> int:
        return _busy(text)

    @tracekit.stage("render", kind="serialize")
    def render(text: str) -> int:
        return _busy(text)

    @tracekit.stage("guardrail")
    async def moderate() -> bool:  # an input guardrail that asks a moderation model
        r = await client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
        return r.status_code == 200

    heap: list[list[int]] = []
    kept: collections.deque[list[int]] = collections.deque(maxlen=50 * KEPT_PER_REQUEST)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        if case == "gc-pauses":
            heap.extend([i] for i in range(HEAP_OBJECTS))  # e.g. a model's vocabulary
            if fixed:  # the fix, as the report writes it
                gc.collect()
                gc.freeze()
        yield

    app = FastAPI(lifespan=lifespan)

    @app.post(ROUTE)
    async def chat(request: Request) -> dict[str, Any]:
        prompt = (await request.json())["prompt"]
        out: dict[str, Any] = {}
        if case == "cpu-on-loop":
            text = prompt * TOKENIZE_REPEAT
            out["tokens"] = await tokenize_off_loop(text) if fixed else tokenize(text)
        if case == "gc-pauses":  # a per-request cache: survivors that trigger full collections
            kept.extend([i] for i in range(KEPT_PER_REQUEST))
        if case == "blocking-call-on-loop":
            out["lookup"] = await lookup()
        if case == "loop-saturated":  # the fix is more processes, not a change here
            out["parsed"] = parse(prompt)
            out["policy"] = policy(prompt)
            out["reply"] = await complete()
            out["rendered"] = render(prompt)
            return out
        if case == "sequential-independent":
            if fixed:  # start the model call beside the guardrail; cancel it on a rejection
                task = asyncio.create_task(complete())
                try:
                    allowed = await moderate()
                except BaseException:
                    task.cancel()
                    raise
                if not allowed:
                    task.cancel()
                    return {"rejected": True}
                out["reply"] = await task
                return out
            if not await moderate():
                return {"rejected": True}
        out["reply"] = await complete()
        return out

    tracekit.configure(service_name=f"validate-{case}")
    app.add_middleware(tracekit.TracekitMiddleware)
    return app


def _busy(text: str) -> int:
    # ~SLICE_MS of pure-Python CPU, as guardrails and request parsing spend it.
    end = time.thread_time() + SLICE_MS / 1000
    n = 0
    while time.thread_time() < end:
        n += sum(map(ord, text[:64])) & 1
    return n


def served_app() -> Any:
    """The gateway of the case the environment names: what each worker process imports
    (``uvicorn --workers`` needs an import string, not an app)."""
    return make_app(os.environ["VALIDATE_CASE"], os.environ.get("VALIDATE_FIXED") == "1",
                    os.environ["VALIDATE_MODEL_URL"])  # fmt: skip


def _train_tokenizer() -> Any:
    # A real HF tokenizers BPE trained here (nothing downloaded), as examples/gateway.py does.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ("gateway latency token model stream request batch queue guardrail serialize "
             "prompt answer event loop thread python asyncio vllm cuda kernel").split()  # fmt: skip
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(2000)]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


# --- processes ------------------------------------------------------------------------------


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


# --- load -----------------------------------------------------------------------------------


async def _drive(port: int, load: tuple[str, float], requests: int, deadline_s: float) -> dict[str, Any]:
    """Send ``requests`` requests (closed: ``C`` clients; open: Poisson at a rate); the
    counts and the latencies the clients saw (ms, warm-up excluded)."""
    import httpx

    counts: dict[str, Any] = {"sent": 0, "failed": 0, "dropped": 0}
    seen: list[float] = []
    stop_at = time.monotonic() + deadline_s
    payload = {"prompt": "explain the event loop and the gil to a gateway engineer please "}
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits) as client:

        async def one() -> None:
            counts["sent"] += 1
            began = time.perf_counter()
            try:
                r = await client.post(ROUTE, json=payload)
                if r.status_code != 200:
                    counts["failed"] += 1
                seen.append((time.perf_counter() - began) * 1000)
            except httpx.HTTPError:
                counts["failed"] += 1

        for _ in range(2):  # warm-up: first-request imports, connections
            await one()
        seen.clear()
        kind, value = load
        if kind == "open":
            rng = random.Random(1)
            tasks: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            for _ in range(requests):
                next_at += rng.expovariate(value)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                if time.monotonic() > stop_at:
                    break
                if len(tasks) >= MAX_IN_FLIGHT:
                    counts["dropped"] += 1
                    continue
                task = asyncio.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=max(1.0, stop_at - time.monotonic()))
            for task in tasks:
                task.cancel()
            return {**counts, "client_ms": _quantiles(seen)}
        left = [requests]

        async def client_loop() -> None:
            while left[0] > 0 and time.monotonic() < stop_at:
                left[0] -= 1
                await one()

        await asyncio.gather(*(client_loop() for _ in range(int(value))))
    return {**counts, "client_ms": _quantiles(seen)}


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if len(values) < 2:
        return None
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94]}


def record(case: str, fixed: bool, load: tuple[str, float], requests: int, folder: Path,
           workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """Serve ``case`` (fixed or not, by ``workers`` processes) under ``load``; the trace file
    and the run's facts."""
    name = CASES[case]
    tag = f"{case}-{load[0]}{load[1]:g}-{'after' if fixed else 'before'}"
    traces = folder / f"{tag}.jsonl"
    traces.unlink(missing_ok=True)
    model_port, port = free_port(), free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base_env["PYTHONPATH"] = str(ROOT) + os.pathsep + base_env.get("PYTHONPATH", "")
    serial = case == "serialized-model-calls" and not fixed
    model = start(["-m", "tracekit.demo.model_server", "--port", str(model_port), *name.model_args,
                    *(["--serial"] if serial else [])], base_env)  # fmt: skip
    gateway_env = {**base_env, "OTEL_TRACES_EXPORTER": f"jsonl:{traces}"}
    gateway = None
    try:
        gateway = start([__file__, "--serve", case, "--port", str(port), "--workers", str(workers),
                          "--model-port", str(model_port), *(["--fixed"] if fixed else [])],
                         gateway_env)  # fmt: skip
        wait_ready(model_port, model)
        wait_ready(port, gateway)
        load_before = _loadavg()
        began = time.monotonic()
        counts = asyncio.run(_drive(port, load, requests, deadline_s=max(30.0, requests / 2)))
        seconds = time.monotonic() - began
        load_after = _loadavg()
    finally:
        if gateway is not None:
            stop(gateway)
        stop(model)
    if not traces.exists() or traces.stat().st_size == 0:
        raise SystemExit(f"validate: {tag}: the gateway wrote no traces")
    if counts["failed"] > 0.02 * counts["sent"]:
        raise SystemExit(f"validate: {tag}: {counts['failed']} of {counts['sent']} requests failed")
    return {"traces": str(traces), "seconds": seconds, "load": (load_before, load_after), **counts}


# --- analysis (the CLI, as a user runs it) ---------------------------------------------------


CORES: list[str] = []  # ["--cores", N] when given: the gateway host's cores for the replay


def _cli(*args: str) -> dict[str, Any]:
    args = (*args, *CORES)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "tracekit", *args, "--format", "json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"validate: tracekit {args[0]} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _finding(report: dict[str, Any], case: Case) -> dict[str, Any] | None:
    for finding in report.get("findings", []):
        if finding["rule"] == case.rule and finding.get("stage") in (case.stage or None, None):
            return finding  # type: ignore[no-any-return]
    for finding in report.get("findings", []):  # folded into another finding?
        if case.rule in (finding.get("explains") or []):
            return {**finding, "folded_into": finding["rule"]}
    return None


def evaluate(case_name: str, load: tuple[str, float], requests: int, folder: Path) -> dict[str, Any]:
    """One row: BEFORE, the analysis, AFTER with the fix, the comparison."""
    case = CASES[case_name]
    before = record(case_name, False, load, requests, folder)
    report = _cli("analyze", before["traces"], "--route", ROUTE)
    finding = _finding(report, case)
    # More workers: as many as the report names (one when there is no finding to read).
    named = re.search(r"--workers (\d+)", json.dumps((finding or {}).get("fix", {})))
    workers = int(named[1]) if case.fix == "--workers" and named else 1
    after = record(case_name, True, load, requests, folder, workers)
    row: dict[str, Any] = {
        "rule": case.rule, "load": load[0], "value": load[1], "requests": requests,
        "before_run": before, "after_run": after,
        "load_avg": max(*before["load"], *after["load"]),
        "finding": None if finding is None else {
            k: finding.get(k) for k in ("rule", "stage", "severity", "title", "folded_into")},
        "fix_matches": finding is not None and case.fix in json.dumps(finding.get("fix", {})),
        "projection": None if finding is None else finding.get("projection"),
        "note": None if finding is None else finding.get("projection_note"),
    }  # fmt: skip
    if finding is None:
        row["note"] = "no finding"
        return row
    selector = f"{finding['rule']}:{finding['stage']}" if finding.get("stage") else finding["rule"]
    projected = finding.get("projection") is not None
    # Named even without a projection: compare then measures that change alone.
    comparison = _cli("compare", before["traces"], after["traces"], "--route", ROUTE,
                      "--finding", selector)  # fmt: skip
    route = comparison["routes"][0] if comparison["routes"] else None
    if route is None:
        row["note"] = "compare: no common route"
        return row
    row["measured"] = {m: route["latency_ms"][m] for m in ("p50", "p95")}
    row["throughput"] = route["throughput_rps"]
    row["breakdown"] = route.get("breakdown_ms")
    checks = [p for p in route["projections"] if p["selected"]]
    if checks and projected:
        row["check"] = checks[0]
    return row


# --- the table ------------------------------------------------------------------------------


def _metric(row: dict[str, Any], name: str) -> dict[str, Any] | None:
    for m in (row.get("check") or {}).get("metrics", []):
        if m["metric"] == name:
            return m  # type: ignore[no-any-return]
    return None


def errors(row: dict[str, Any]) -> dict[str, float]:
    """Per metric: projected after (rescaled to the measured before) / measured after − 1."""
    out = {}
    for name in ("p50_ms", "p95_ms"):
        m = _metric(row, name)
        if m is None or not m["projected"][0] or not m["measured"][1]:
            continue
        (pb, pa), (mb, ma) = m["projected"], m["measured"]
        out[name] = mb * pa / pb / ma - 1
    return out


def _cell(row: dict[str, Any], name: str) -> tuple[str, str, str]:
    m = _metric(row, name)
    if m is None:
        measured = (row.get("measured") or {}).get(name.removesuffix("_ms"))
        text = "—" if measured is None else f"{measured['before']:.0f} → {measured['after']:.0f}"
        return "—", text, "—"
    (pb, pa), (mb, ma) = m["projected"], m["measured"]
    scale = mb / pb if pb else 1.0
    proj = f"{mb:.0f} → {pa * scale:.0f}"
    if m["range"] is not None:
        lo, hi = sorted(m["range"])
        proj += f" ({lo * scale:.0f}–{hi * scale:.0f})"
    err = errors(row).get(name)
    return proj, f"{mb:.0f} → {ma:.0f}", "—" if err is None else f"{100 * err:+.0f}%"


def direction(row: dict[str, Any]) -> str:
    check = row.get("check")
    if check is None:
        return "—"
    if any(m["verdict"] == "wrong direction" for m in check["metrics"]):
        return "no"
    signs = []
    for name in ("p50_ms", "p95_ms"):
        m = _metric(row, name)
        if m is None or m["measured_change_pct"] is None or m["projected_change_pct"] is None:
            continue
        before, after = m["projected"]
        proj = 100 * (after / before - 1) if before else 0.0
        signs.append((proj > 0) == (m["measured_change_pct"] > 0) or abs(proj) < 1)
    return "yes" if signs and all(signs) else "no (not significant)" if signs else "—"


def _declined(note: str | None) -> str:
    # The replay's decline in short: its errors replaying the trace as recorded.
    if note is None:
        return "no projection"
    errs = re.findall(r"([+-]\d+%);", note)
    if note.startswith("the replay could not reproduce") and len(errs) == 2:
        return f"declined (replayed as recorded: p50 {errs[0]}, p95 {errs[1]})"
    return " ".join(note.split())[:120]


def _moved(row: dict[str, Any]) -> str:
    # The measured breakdown's two largest changes (mean ms per request): where the fix
    # moved the time, to set against what the replay assumed.
    parts = []
    for key, change in (row.get("breakdown") or {}).items():
        if change.get("before") is not None and change.get("after") is not None:
            parts.append((change["after"] - change["before"], key))
    parts.sort(key=lambda p: -abs(p[0]))
    return ", ".join(f"{k.replace('_', ' ')} {d:+.0f}" for d, k in parts[:2]) or "—"


def _client(row: dict[str, Any]) -> str:
    # What the load generator saw, which includes time no span covers (a request waiting in
    # the listen socket while the loop is held).
    b, a = row["before_run"].get("client_ms"), row["after_run"].get("client_ms")
    if not b or not a:
        return "—"
    return f"{b['p50']:.0f} → {a['p50']:.0f} / {b['p95']:.0f} → {a['p95']:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| rule | load | C / rate | requests | projected p50 (range) | measured p50 | error "
        "| projected p95 (range) | measured p95 | error | direction right? | compare "
        "| client-side p50 / p95 | breakdown moved (ms/req) | load avg |"
    )
    lines = [head, "|" + "---|" * 15]
    for row in rows:
        load = f"{row['value']:g}" + (" clients" if row["load"] == "closed" else "/s")
        p50 = _cell(row, "p50_ms")
        p95 = _cell(row, "p95_ms")
        verdict = (row.get("check") or {}).get("verdict") or _declined(row.get("note"))
        if row.get("finding") and row.get("fix_matches") is False:
            verdict += " (the fix applied is not the one the report proposed)"
        lines.append(f"| {row['rule']} | {row['load']} | {load} | {row['requests']} | {p50[0]} "
                     f"| {p50[1]} | {p50[2]} | {p95[0]} | {p95[1]} | {p95[2]} | {direction(row)} "
                     f"| {verdict} | {_client(row)} | {_moved(row)} "
                     f"| {row['load_avg']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    projected = [r for r in rows if r.get("check")]
    errs = [abs(e) for r in projected for e in errors(r).values()]
    wrong = sum(direction(r) == "no" for r in projected)
    median = f"{100 * statistics.median(errs):.0f}%" if errs else "—"
    other_fix = sum(bool(r.get("finding")) and r.get("fix_matches") is False for r in rows)
    return (
        f"projections: {len(projected)} of {len(rows)} cases; median |error| (p50 and p95): "
        f"{median}; wrong direction: {wrong}"
        + (f"; the fix applied is not the report's in {other_fix}" if other_fix else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated rule ids")
    parser.add_argument("--loads", help="closed:C and open[:RATE] (default rate: the case's; "
                        "default loads: closed:2,closed:6,open, loop-saturated's own)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=240, help="per run")
    parser.add_argument("--quick", action="store_true", help="smoke run: one closed load, 40 requests")
    parser.add_argument("--cores", type=int, help="passed to tracekit analyze and compare")
    parser.add_argument("--keep", help="write the traces here (default: a temporary folder)")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--table-from", metavar="JSON", help="print the table of saved rows (--json)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--fixed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        os.environ.update(VALIDATE_CASE=args.serve, VALIDATE_FIXED="1" if args.fixed else "0",
                          VALIDATE_MODEL_URL=f"http://127.0.0.1:{args.model_port}")  # fmt: skip
        uvicorn.run("validate:served_app", factory=True, app_dir=os.path.dirname(__file__),
                    workers=args.workers, host="127.0.0.1", port=args.port, log_level="warning")  # fmt: skip
        return
    if args.table_from:
        rows = json.loads(Path(args.table_from).read_text())
        print(f"{table(rows)}\n\n{summary(rows)}")
        return
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; expected some of {', '.join(CASES)}")
    if args.quick:
        args.loads, args.requests = args.loads or "closed:4", 40
    if args.cores:
        CORES.extend(["--cores", str(args.cores)])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for case in cases:
            for spec in (args.loads or CASES[case].loads or "closed:2,closed:6,open").split(","):
                kind, _, value = spec.partition(":")
                if kind not in ("closed", "open"):
                    parser.error(f"--loads: {spec!r} is not closed:C or open[:RATE]")
                load = (kind, float(value) if value else CASES[case].open_rate)
                row = evaluate(case, load, args.requests, folder)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    text = f"{table(rows)}\n\n{summary(rows)}\n"
    print("\n" + text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
