"""Throughput under a real server: uvicorn serving bench/overhead.py's app, saturated by wrk.

Each variant runs in its own uvicorn process (1 worker, 127.0.0.1, uvicorn's defaults: uvloop
and httptools where installed, access log off), driven by ``wrk -t1 -c32`` (32 connections,
one wrk thread: the machine may have two cores) with ``POST /chat``. Variants, interleaved
in every round:

- bare:     the app, stages undecorated;
- otel:     OpenTelemetryMiddleware (opentelemetry-instrumentation-asgi, default options) with
            an SDK TracerProvider + BatchSpanProcessor (SDK defaults);
- tracekit: TracekitMiddleware + @tracekit.stage on the four stages, 100 % sampled, set up
            as an application does: ``tracekit.configure(exporter=...)`` (tracekit's batch
            processor: the SDK's BatchSpanProcessor with SDK defaults, bounded shutdown);
- tracekit-sdkprovider: the same, its spans to a provider set up exactly as otel's
            (``configure(tracer_provider=...)``);
- tracekit-unbuilt, tracekit-inline, ...: that, with one of bench/overhead.py's diagnostic
            changes (``tracekit-unbuilt``: finished requests dropped, never built: the
            request path alone).

Every traced variant exports the same way (``--exporter``): ``otlp`` (default), OTLP/HTTP
protobuf (opentelemetry-exporter-otlp-proto-http's exporter, given by ``configure`` the
batches encoded by tracekit._export.otlp_encoding: the same bytes as the SDK's encoder
makes) to a sink this script runs on 127.0.0.1 that reads each request's body and answers
200; ``jsonl``, tracekit's OTLP JSON Lines exporter to a file under a temporary directory;
``drop``, an exporter that drops (no serialization: building and handing over spans alone).

Per variant and round: the server starts, a warm-up (``--warmup`` s of wrk) runs, then the
measured window (``--duration`` s). The server reports, over the window, the CPU of each of
its threads (``pthread_getcpuclockid``; per request served), the spans exported, and
tracekit's backlog at the end (requests not yet built into spans, work deferred past the
window: it should be small next to the window's requests). Figures: requests/s per round,
the median over rounds, and each variant's ratio to bare within each round, median.

``NAME@before`` variants (with ``--before DIR``) are served by another checkout's tracekit
(this checkout's app and server code): before/after comparisons within the same rounds.

Run: .venv/bin/python bench/throughput.py [--rounds 3] [--duration 10] [--exporter otlp]
     [--variants bare,otel,tracekit] [--before DIR] [--json out.json]
Needs wrk (Debian: ``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

HERE = os.path.dirname(os.path.abspath(__file__))
WRK_SCRIPT = 'wrk.method = "POST"\nwrk.body = "{}"\nwrk.headers["Content-Type"] = "application/json"\n'


# --- the server (a child process: ``throughput.py --serve VARIANT``) ------------------------
class Counter(SpanExporter):
    """Counts what an exporter exported (wraps it)."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.spans = 0

    def export(self, spans: Any) -> SpanExportResult:
        result = self.exporter.export(spans)
        self.spans += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _exporter(kind: str, sink_port: int, path: str) -> Any:
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink_port}/v1/traces")
    if kind == "jsonl":
        from tracekit.exporters.jsonl import JsonLinesSpanExporter

        return JsonLinesSpanExporter(path + ".sdk")
    import overhead

    return overhead.DroppingExporter()


def serve(variant: str, port: int, exporter_kind: str, sink_port: int, path: str,
          http: str, loop: str) -> None:
    import overhead
    import uvicorn
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import tracekit
    from tracekit._core import current

    if variant != "tracekit":  # (tracekit: configure() sets the global provider)
        otel_trace.set_tracer_provider(TracerProvider())  # a global SDK provider, as an app has
    counter: Any = Counter(_exporter(exporter_kind, sink_port, path))
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(counter))  # type: ignore[arg-type]
    app: Any
    if variant == "bare":
        app = overhead.make_app(False)
    elif variant == "otel":
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        app = OpenTelemetryMiddleware(overhead.make_app(False), tracer_provider=provider)
    elif variant == "tracekit":  # as configured by an application: tracekit's own processor
        if exporter_kind == "otlp":
            os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{sink_port}/v1/traces"
            tracekit.configure(exporter="otlp-http")
        elif exporter_kind == "jsonl":
            tracekit.configure(exporter=f"jsonl:{path}")
        else:
            tracekit.configure(exporter=counter)
        runtime = current.active_runtime
        assert runtime is not None
        counter = runtime.processor._counting  # what tracekit's batch processor exported
        app = tracekit.TracekitMiddleware(overhead.make_app(True))
    elif variant == "tracekit-sdkprovider":  # its spans to the same provider setup as otel's
        tracekit.configure(tracer_provider=provider)
        app = tracekit.TracekitMiddleware(overhead.make_app(True))
    elif variant.startswith("tracekit-"):  # bench/overhead.py's diagnostic changes (its _alter)
        tracekit.configure(tracer_provider=provider)
        assert current.active_runtime is not None
        overhead._alter(current.active_runtime, variant.removeprefix("tracekit-"))
        app = tracekit.TracekitMiddleware(overhead.make_app(True))
    else:
        raise SystemExit(f"unknown variant {variant}")
    served = 0
    marks: dict[str, Any] = {}

    def snapshot() -> dict[str, Any]:
        threads: dict[str, float] = {}
        for thread in threading.enumerate():
            if thread.ident is None:
                continue
            try:
                seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:
                continue
            name = "sdk-export" if thread.name.startswith("OtelBatch") else thread.name.split(" ")[0]
            threads[name] = threads.get(name, 0.0) + seconds
        runtime = current.active_runtime
        spans = counter.spans if isinstance(counter, Counter) else counter.exported
        return {"served": served, "spans": spans, "process_cpu": time.process_time(),
                "threads": threads, "wall": time.perf_counter(),
                "backlog": len(runtime._queue) if runtime is not None else 0,
                "dropped": runtime.dropped if runtime is not None else 0}  # fmt: skip

    async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal served
        if scope["type"] == "http" and scope["path"].startswith("/_mark/"):
            mark = scope["path"][len("/_mark/"):]
            marks[mark] = snapshot()
            body = json.dumps(marks).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            served += 1
        await app(scope, receive, send)

    uvicorn.run(outer, host="127.0.0.1", port=port, workers=1, log_level="warning",
                access_log=False, lifespan="off", http=http, loop=loop)  # fmt: skip


# --- the OTLP sink (a thread of the driving process) ---------------------------------------
class Sink:
    """An HTTP/1.1 endpoint on 127.0.0.1 that reads each request's body and answers 200."""

    def __init__(self) -> None:
        self.bytes = 0
        self.posts = 0
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._run, daemon=True, name="sink").start()

    def _run(self) -> None:
        async def main() -> None:
            server = await asyncio.start_server(self._client, sock=self.sock)
            async with server:
                await server.serve_forever()

        self.loop.run_until_complete(main())

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length:\s*(\d+)", head)
                length = int(match.group(1)) if match else 0
                await reader.readexactly(length)
                self.bytes += length
                self.posts += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                             b"Content-Length: 0\r\n\r\n")  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


# --- the driver ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def _wrk(port: int, seconds: float, connections: int, script: str) -> float:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "-s", script,
                          f"http://127.0.0.1:{port}/chat"],
                         capture_output=True, text=True, timeout=seconds + 30, check=True).stdout  # fmt: skip
    match = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if match is None or "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk: unexpected output\n{out}")
    return float(match.group(1))


def one_run(variant: str, args: argparse.Namespace, sink: Sink, script: str, tmp: str) -> dict[str, Any]:
    port = _free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", variant, "--port", str(port),
           "--exporter", args.exporter, "--sink-port", str(sink.port),
           "--path", os.path.join(tmp, f"{variant}.jsonl"),
           "--http", args.http, "--loop", args.loop]  # fmt: skip
    env = dict(os.environ)
    if variant.endswith("@before"):  # served by the checkout given as --before
        cmd[cmd.index("--serve") + 1] = variant.removesuffix("@before")
        env["PYTHONPATH"] = args.before
    server = subprocess.Popen(cmd, cwd=HERE, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(port, "/_mark/up")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"server for {variant} did not start") from None
                time.sleep(0.1)
        _wrk(port, args.warmup, args.connections, script)
        _get(port, "/_mark/start")
        rate = _wrk(port, args.duration, args.connections, script)
        marks = _get(port, "/_mark/end")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    start, end = marks["start"], marks["end"]
    served = end["served"] - start["served"]
    threads = {name: (cpu - start["threads"].get(name, 0.0)) / served * 1e6
               for name, cpu in end["threads"].items()}  # fmt: skip
    return {"rps": rate, "served": served,
            "window_s": end["wall"] - start["wall"],
            "process_cpu_us": (end["process_cpu"] - start["process_cpu"]) / served * 1e6,
            "threads_cpu_us": {k: v for k, v in threads.items() if v > 0.05},
            "spans_per_request": (end["spans"] - start["spans"]) / served,
            "backlog_at_end": end["backlog"], "dropped": end["dropped"] - start["dropped"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--exporter", choices=("otlp", "jsonl", "drop"), default="otlp")
    parser.add_argument("--variants", default="bare,otel,tracekit")
    parser.add_argument("--http", choices=("auto", "h11", "httptools"), default="auto",
                        help="uvicorn's HTTP parser (auto: httptools where installed)")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                        help="uvicorn's event loop (auto: uvloop where installed)")
    parser.add_argument("--before", metavar="DIR",
                        help="another checkout (e.g. a git worktree of an earlier commit, built): "
                             "a variant named NAME@before is served by its tracekit")  # fmt: skip
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sink-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        sys.path.insert(0, HERE)
        serve(args.serve, args.port, args.exporter, args.sink_port, args.path, args.http, args.loop)
        return
    names = args.variants.split(",")
    sink = Sink()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write(WRK_SCRIPT)
        for round_ in range(args.rounds):
            for name in names:
                run = one_run(name, args, sink, script, tmp)
                runs[name].append(run)
                cells = ", ".join(f"{t} {us:.0f}" for t, us in
                                  sorted(run["threads_cpu_us"].items(), key=lambda kv: -kv[1]))
                print(f"round {round_ + 1} {name:9s} {run['rps']:7.0f} req/s  CPU µs/request: "
                      f"process {run['process_cpu_us']:.0f} ({cells}); spans/request "
                      f"{run['spans_per_request']:.2f}, backlog {run['backlog_at_end']}, "
                      f"dropped {run['dropped']}", flush=True)  # fmt: skip
                if name.endswith("tracekit") and os.path.exists(os.path.join(tmp, f"{name}.jsonl")):
                    os.remove(os.path.join(tmp, f"{name}.jsonl"))
            loads.append(os.getloadavg()[0])
    results: dict[str, Any] = {"exporter": args.exporter, "rounds": args.rounds,
                               "duration_s": args.duration, "connections": args.connections,
                               "load_average_1min": loads, "runs": runs,
                               "sink": {"posts": sink.posts, "bytes": sink.bytes}}  # fmt: skip
    medians = {name: statistics.median(r["rps"] for r in rs) for name, rs in runs.items()}
    results["rps_median"] = medians
    if "bare" in runs:
        results["ratio_to_bare_per_round_median"] = {
            name: statistics.median(r["rps"] / b["rps"] for r, b in zip(rs, runs["bare"], strict=True))
            for name, rs in runs.items() if name != "bare"}  # fmt: skip
        # CPU per request is steadier than requests/s where other work shares the cores
        results["cpu_ratio_to_bare_per_round_median"] = {
            name: statistics.median(b["process_cpu_us"] / r["process_cpu_us"]
                                    for r, b in zip(rs, runs["bare"], strict=True))
            for name, rs in runs.items() if name != "bare"}  # fmt: skip
    print(json.dumps({k: results[k] for k in ("rps_median", "ratio_to_bare_per_round_median",
                                              "cpu_ratio_to_bare_per_round_median",
                                              "load_average_1min") if k in results}))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
