"""The terminal renderer: width, colour, unicode, and every part of a finding."""

from __future__ import annotations

import io
from typing import Any

import pytest

from tracekit.render.text import render_text, use_color, use_unicode

ROUTE = "POST /v1/chat/completions"


def report_dict(**overrides: Any) -> dict[str, Any]:
    stage = {
        "stage": "tokenize-with-a-rather-long-stage-name", "kind": "tokenize", "count": 1200,
        "wall_ms": {"p50": 12.0, "p95": 30.5}, "cpu_ms": {"p50": 11.9, "p95": 30.1},
        "wait_ms": {"p50": 0.0, "p95": 0.1}, "loop_wait_ms": {"p50": 2.0, "p95": 9.0},
        "on_loop": True, "max_block_ms": 88.0, "blocked_at": "app/tok.py:42 in encode",
        "function": "app.tok.encode",
    }  # fmt: skip
    route = {
        "route": ROUTE, "requests": 1200, "errors": 3, "throughput_rps": 39.5,
        "latency_ms": {"p50": 812.3, "p90": 1000.0, "p95": 1200.0, "p99": 1500.0, "max": 2100.0},
        "breakdown_ms": {"cpu_on_loop": 14.0, "cpu_off_loop": 0.0, "model_wait": 700.0,
                         "io_wait": 25.0, "loop_wait": 60.0},
        "streaming": {"ttft_ms": {"p50": 150.0, "p90": 200.0, "p95": 250.0, "p99": 400.0},
                      "itl_ms": {"p50": 20.0, "p90": 30.0, "p95": 35.0, "p99": 50.0},
                      "tpot_ms": {"p50": 12.0, "p90": 14.0, "p95": 15.0, "p99": 18.0}},
        "goodput": {"rps": 30.1, "fraction": 0.762},
        "stages": [stage],
    }  # fmt: skip
    finding = {
        "rule": "cpu-on-loop", "route": ROUTE, "stage": "tokenize", "function": "app.tok.encode",
        "severity": "high", "impact_ms": 55.5,
        "evidence": "tokenize ran 11.9 ms of CPU on the event loop per request (p50), delaying "
                    "every other request: 60 ms of loop wait per request.",
        "fix": {"title": "Run the GIL-free batch encoder in a worker thread",
                "code": "async def tokenize(text):\n"
                        "    ids = await asyncio.to_thread(tokenizer.encode_batch, [text])"},
        "projection": {"p50_ms": [812.3, 640.0], "p95_ms": [1200.0, 800.0],
                       "throughput_rps": [39.5, 52.0],
                       "range": {"p50_ms": [655.0, 610.0], "p95_ms": [760.0, 850.0],
                                 "throughput_rps": [49.0, 55.0]}},
        "projection_note": None,
        "severity_reason": "projected p50 -21% (-172 ms, range -25 to -19%)",
    }  # fmt: skip
    d = {
        "schema": "tracekit.report/1", "source": "/var/log/traces/gateway-2026-12-02.jsonl",
        "requests": 1200, "spans": 6000, "services": ["gateway"], "instrumented": True,
        "slo": {"ttft_ms": 500.0, "itl_ms": 50.0, "e2e_ms": 5000.0, "tpot_ms": None},
        "validation": {"ok": True, "p50_error": 0.04, "p95_error": -0.09, "reason": None},
        "routes": [route], "findings": [finding], "slowest": None, "timeline": None,
    }  # fmt: skip
    d.update(overrides)
    return d


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_every_line_fits_the_width(width: int) -> None:
    text = render_text(report_dict(), width=width, color=False, unicode=True)
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert too_long == []


def test_shows_routes_breakdown_stages_and_the_whole_finding() -> None:
    text = render_text(report_dict(), width=120, color=False, unicode=True)
    for piece in (
        ROUTE, "1,200 requests", "3 errors", "39.5 req/s", "p50 812", "model wait", "TTFT ms",
        "goodput", "76.2%", "tokenize-with-a-rather-long", "app.tok.encode",
        "blocked at app/tok.py:42 in encode", "HIGH", "cpu-on-loop", "60 ms of loop wait",
        "impact: 55.5 ms", "      async def tokenize(text):",
        "          ids = await asyncio.to_thread(tokenizer.encode_batch, [text])",
        "p50 812 → 640 (610 to 655) ms", "rps 39.5 → 52.0 (49.0 to 55.0)", "validated", "ttft ≤ 500 ms",
        "HIGH: projected p50 -21% (-172 ms, range -25 to -19%)",
    ):  # fmt: skip
        assert piece in text, piece


def test_stage_names_wider_than_their_column_are_shown_whole() -> None:
    # FastAPI's operation spans share a prefix: cut to the column they were all "fastapi…".
    d = report_dict()
    base = d["routes"][0]["stages"][0]
    d["routes"][0]["stages"] = [
        {**base, "stage": name, "kind": kind, "blocked_at": None, "function": None}
        for name, kind in (("fastapi.endpoint", "internal"), ("fastapi.serialization", "serialize"),
                           ("model", "model"))
    ]  # fmt: skip
    lines = render_text(d, width=80, color=False, unicode=True).splitlines()
    first = lines.index("    fastapi.endpoint")
    assert lines[first + 1].split()[:2] == ["internal", "1,200"]
    second = lines.index("    fastapi.serialization")
    assert lines[second + 1].split()[:2] == ["serialize", "1,200"]
    assert any(line.split()[:3] == ["model", "model", "1,200"] for line in lines)
    assert not [line for line in lines if "…" in line and "fastapi" in line]


def test_a_kind_longer_than_the_column_widens_it() -> None:
    # A foreign span's kind ("unspecified") was cut to "unspecif…".
    d = report_dict()
    base = d["routes"][0]["stages"][0]
    d["routes"][0]["stages"] = [{**base, "stage": "db", "kind": "unspecified"},
                                {**base, "stage": "model", "kind": "model"}]  # fmt: skip
    for width in (60, 100):
        lines = render_text(d, width=width, color=False, unicode=True).splitlines()
        assert any(line.split()[:3] == ["db", "unspecified", "1,200"] for line in lines)
        assert any(line.split()[:3] == ["model", "model", "1,200"] for line in lines)
        assert all(len(line) <= width for line in lines)
        assert not [line for line in lines if "unspecif…" in line]


def test_long_names_locations_and_code_wrap_instead_of_being_cut() -> None:
    d = report_dict()
    long_name = "gateway.handlers.chat.completions.streaming_response_assembly_stage"
    where = "app/very/deeply/nested/package/module_with_a_long_name.py:1234 in <genexpr>"
    d["routes"][0]["stages"][0].update(stage=long_name, blocked_at=where)
    d["findings"][0]["fix"]["code"] = "    x = 1  # " + "a comment that is much wider than forty columns " * 2
    for width in (40, 60):
        lines = render_text(d, width=width, color=False, unicode=True).splitlines()
        assert all(len(line) <= width for line in lines) and not any("…" in line for line in lines[1:])
        joined = "".join(line.strip() for line in lines)
        assert long_name in joined and f"blocked at {where}".replace(" ", "") in joined.replace(" ", "")
        code = [line.strip() for line in lines if "forty" in line or "comment" in line]
        assert code[0].startswith("x = 1  #") and all(c.startswith("#") for c in code[1:])


def test_fix_code_wraps_only_where_the_pasted_code_still_runs() -> None:
    # A comment line continues as a comment aligned with it (a new user pasted a gc.freeze()
    # block whose comments had been re-wrapped out of line); a call breaks after a comma
    # inside its brackets; another statement between tokens, with a backslash.
    d = report_dict()
    comment = "    # each worker process has its own event loop and GIL: the load splits 2 ways"
    call = "    result = await loop.run_in_executor(process_pool, tokenize_sync, text, max_tokens)"
    plain = "    x = a_rather_long_name_for_a_value + another_rather_long_name_for_a_value"
    d["findings"][0]["fix"]["code"] = f"async def f():\n{comment}\n{call}\n{plain}\n"
    lines = render_text(d, width=60, color=False, unicode=True).splitlines()
    start = next(i for i, line in enumerate(lines) if "async def f" in line)
    block = lines[start : next(i for i, line in enumerate(lines) if "another_rather" in line) + 1]
    assert block[1].startswith("          # each worker") and block[2].startswith("          # ")
    assert all(len(line) <= 60 for line in block)
    assert any(line.endswith(" \\") for line in block)
    assert "".join(line.strip() for line in block if "# " not in line).count("max_tokens)") == 1
    compile("\n".join(line[6:] for line in block), "<fix>", "exec")  # still Python, pasted


def test_routes_without_stages_and_next_to_no_time_are_listed_in_one_line() -> None:
    d = report_dict()
    probe = {"route": "GET /docs", "requests": 1, "errors": 0, "throughput_rps": 500.0,
             "latency_ms": {"p50": 2.0, "p95": 2.0}, "breakdown_ms": {"cpu_on_loop": 0.0},
             "stages": []}  # fmt: skip
    d["routes"].append(probe)
    text = render_text(d, width=100, color=False, unicode=True)
    assert "\nGET /docs\n" not in text and "no stages" in text and "GET /docs (1 request" in text
    # Alone, or busy enough to matter, it is a route like any other.
    alone = render_text(report_dict(routes=[probe]), width=100, color=False, unicode=True)
    assert "\nGET /docs\n" in alone
    busy = {**probe, "requests": 100_000}
    text = render_text(report_dict(routes=[d["routes"][0], busy]), width=100, color=False)
    assert "\nGET /docs\n" in text


def test_the_severity_reason_and_the_range_wrap_whole() -> None:
    # Why the finding is rated as it is, and the range of each projected figure: wrapped at
    # every width, never cut.
    d = report_dict()
    d["findings"][0]["severity_reason"] = "measured 38 ms per request, 38% of the route's p50 (no projection)"
    for width in (40, 60):
        lines = render_text(d, width=width, color=False, unicode=True).splitlines()
        assert all(len(line) <= width for line in lines)
        joined = " ".join(" ".join(lines).split())
        assert "HIGH: measured 38 ms per request, 38% of the route's p50 (no projection)" in joined
        assert "p95 1,200 → 800 (760 to 850) ms" in joined
    ascii_text = render_text(d, width=80, color=False, unicode=False)
    assert "p50 812 -> 640 (610 to 655) ms" in ascii_text
    # A report without the reason (an older one) renders as before.
    del d["findings"][0]["severity_reason"]
    assert "HIGH:" not in render_text(d, width=80, color=False)


def test_the_replay_states_its_model() -> None:
    d = report_dict()
    d["validation"]["model"] = {
        "method": "replay", "arrivals": "closed", "clients": 3, "arrivals_read_by": "in flight",
        "in_flight": {"mean": 2.38, "max": 3, "dispersion": 0.16}, "cores": 2,
        "cores_source": "trace", "thread_pool_size": 6,
    }  # fmt: skip
    said = " ".join(render_text(d, width=60, color=False).split())
    assert ("assumed: a closed loop of 3 clients (read from the requests in flight: mean 2.38, at "
            "most 3), 2 cores (from the trace), thread pool 6") in said  # fmt: skip
    d["validation"]["model"].update(clients=8, arrivals_read_by="think time", think_ms=802.5)
    said = " ".join(render_text(d, width=60, color=False).split())
    assert "a closed loop of 8 clients (read from their 802 ms think time; in flight: mean 2.38" in said
    d["validation"]["model"].update(host_others=2.07, loop_cpu_share=0.717)
    said = " ".join(render_text(d, width=60, color=False).split())
    assert ("2 cores (from the trace), 2.1 other runnable threads on the host (read from the "
            "loop's wait for a CPU: 28% of its ready time), thread pool 6") in said  # fmt: skip
    d["validation"]["model"].update(host_short=True)
    said = " ".join(render_text(d, width=60, color=False).split())
    assert ("28% of its ready time), the host short of CPU: CPU a fix moves off the loop may win "
            "none from it (the range reaches that case), thread pool 6") in said  # fmt: skip
    d["validation"]["model"] = {"arrivals": "open", "rate_rps": 30.2, "cores": 8,
                                "cores_source": "this machine"}  # fmt: skip
    said = " ".join(render_text(d, width=60, color=False).split())
    assert "assumed: open arrivals at 30.2 req/s, 8 cores (this machine's: the trace does not say)" in said


def test_small_routes_share_a_line_unless_they_failed() -> None:
    # A probe route without stages, a sliver of the request time: one line at the end.
    probe = {"route": "GET /healthz", "requests": 3, "errors": 0, "latency_ms": {"p50": 1.0}}
    d = report_dict()
    d["routes"].append(probe)
    said = " ".join(render_text(d, width=100, color=False).split())
    assert "Also seen · no stages, under 1% of the request time (probes, docs): GET /healthz (3" in said
    # With an error (a new user's Jaeger trace: a 500 on GET /api/v1/pods), it gets its own
    # section, and the error is said.
    probe["errors"] = 1
    said = " ".join(render_text(d, width=100, color=False).split())
    assert "Also seen" not in said and "GET /healthz" in said and "1 error" in said


def test_a_missing_projection_says_why() -> None:
    d = report_dict()
    d["findings"][0].update(projection=None, projection_note="the replay could not reproduce it")
    d["validation"] = {"ok": False, "p50_error": 0.3, "p95_error": 0.5, "reason": "p50 off by 30%"}
    text = render_text(d, width=100, color=False)
    said = " ".join(text.split())
    assert "no projection: the replay could not reproduce it" in said
    # The queueing model's projections (loop-saturated's workers) need no replay: they stand.
    assert ("not validated, so no replayed projections (the queueing model's, which replays "
            "nothing, still stand): p50 off by 30%") in said
    assert "projected:" not in text


def test_no_findings_and_no_requests() -> None:
    assert "No findings" in render_text(report_dict(findings=[]), width=80, color=False)
    empty = report_dict(findings=[], routes=[], requests=0, spans=0, validation=None)
    assert "No requests found." in render_text(empty, width=80, color=False)


def test_colour_only_when_asked() -> None:
    assert "\x1b[" not in render_text(report_dict(), width=100, color=False)
    assert "\x1b[31m" in render_text(report_dict(), width=100, color=True)


def test_ascii_glyphs_when_unicode_is_off() -> None:
    text = render_text(report_dict(), width=100, color=False, unicode=False)
    assert text.isascii() and "812 -> 640" in text and "<= 500 ms" in text


class FakeStream(io.StringIO):
    def __init__(self, tty: bool, encoding: str) -> None:
        super().__init__()
        self._tty = tty
        self._encoding = encoding

    def isatty(self) -> bool:
        return self._tty

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def test_colour_follows_the_tty_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert use_color(FakeStream(True, "utf-8")) and not use_color(FakeStream(False, "utf-8"))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(FakeStream(True, "utf-8"))
    tty = FakeStream(True, "utf-8")
    assert "\x1b[" not in render_text(report_dict(), width=100, stream=tty)
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(FakeStream(False, "utf-8"))


def test_unicode_follows_the_stream_encoding() -> None:
    assert use_unicode(FakeStream(False, "utf-8"))
    assert not use_unicode(FakeStream(False, "ascii"))
    text = render_text(report_dict(), width=100, color=False, stream=FakeStream(False, "ascii"))
    assert text.isascii()


def test_hostile_text_is_flattened_and_renders_from_a_report_object() -> None:
    d = report_dict()
    d["routes"][0]["route"] = "GET /a\nFAKE LINE\tx"
    d["routes"][0]["stages"][0]["stage"] = "x" * 10_000
    text = render_text(d, width=80, color=False)
    assert "FAKE LINE" in text and "\nFAKE LINE" not in text
    assert max(len(line) for line in text.splitlines()) <= 80

    class Wrapper:
        def to_dict(self) -> dict[str, Any]:
            return report_dict()

    assert ROUTE in render_text(Wrapper(), width=80, color=False)


def test_counts_of_processes_and_a_route_without_a_rate() -> None:
    loops = [{"service": "gateway", "thread": "MainThread", "windows": 4, "window_s": 4, "processes": n}
             for n in (2, 1)]  # fmt: skip
    route = dict(report_dict()["routes"][0], requests=1, throughput_rps=None, goodput=None)
    text = render_text(report_dict(routes=[route], loop={"loops": loops}), width=100, color=False,
                       unicode=True)  # fmt: skip
    assert "2 processes" in text and "1 process\n" in text and "processs" not in text
    assert "1 request · 3 errors · - req/s" in text  # unknown, as every unknown figure


def test_a_validation_error_over_the_tolerance_says_why_it_still_validated() -> None:
    # Accepted inside the measured percentile's 95% interval: latencies in two groups.
    d = report_dict()
    d["validation"].update(p50_error=-0.229, p95_error=0.016, model={"tolerance": 0.15})
    said = " ".join(render_text(d, width=80, color=False).split())
    assert ("Replay model: validated against the recording (p50 error -22.9%, p95 error 1.6%); "
            "an error over ±15% is inside the measured percentile's 95% interval") in said
    d["validation"].update(p50_error=0.04)
    assert "95% interval" not in render_text(d, width=80, color=False)
