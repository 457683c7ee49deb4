"""The self-contained HTML report: structure, numbers, escaping, no network, headless Chromium."""

from __future__ import annotations

import copy
import heapq
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tracekit.errors import ConfigurationError
from tracekit.render.html import render_html

# --- report builders ---------------------------------------------------------------------

CHAT = "POST /v1/chat/completions"
#: Loop work of one chat request, in order: (stage, kind, ms on the loop), then the model wait
#: (off the loop) before the rest. Tokenize is the CPU hog that the finding is about.
BEFORE_MODEL = [
    ("request", "request", 1.5),
    ("tokenize", "tokenize", 14.0),
    ("guardrail", "guardrail", 3.0),
]
AFTER_MODEL = [("serialize", "serialize", 4.0), ("request", "request", 1.0)]


def _simulate_loop(n: int, gap_ms: float, model_ms: float) -> list[dict[str, Any]]:
    """One event loop serving ``n`` requests: slices never overlap, and waits are real."""
    lanes: list[dict[str, Any]] = [
        {
            "trace_id": f"{i + 1:032x}",
            "route": CHAT,
            "start_ms": i * gap_ms,
            "end_ms": 0.0,
            "slices": [],
            "loop_waits": [],
        }
        for i in range(n)
    ]
    ready: list[tuple[float, int, int]] = [(i * gap_ms, i, 0) for i in range(n)]  # (t, lane, step)
    steps = [*BEFORE_MODEL, None, *AFTER_MODEL]  # None: the model call, off the loop
    free = 0.0
    while ready:
        t, i, step = heapq.heappop(ready)
        lane = lanes[i]
        work = steps[step]
        if work is None:
            heapq.heappush(ready, (t + model_ms + (i % 5) * 9.0, i, step + 1))
            continue
        stage, kind, ms = work
        start = max(t, free)
        if start - t >= 1.0:
            lane["loop_waits"].append({"stage": stage, "start_ms": t, "end_ms": start})
        free = start + ms
        lane["slices"].append({"stage": stage, "kind": kind, "start_ms": start, "end_ms": free})
        if step + 1 < len(steps):
            heapq.heappush(ready, (free, i, step + 1))
        else:
            lane["end_ms"] = free
    return lanes


def _pct(p50: float, p95: float) -> dict[str, float]:
    return {"p50": p50, "p95": p95}


def _stage(
    name: str,
    wall: dict[str, float],
    cpu: dict[str, float],
    wait: dict[str, float],
    loop_wait: dict[str, float],
    block: float,
    at: str | None = None,
) -> dict[str, Any]:
    """A stage row of a chat route with 40 requests, all on the loop; kind = name."""
    return {
        "stage": name,
        "kind": name,
        "count": 40,
        "wall_ms": wall,
        "cpu_ms": cpu,
        "wait_ms": wait,
        "loop_wait_ms": loop_wait,
        "on_loop": True,
        "max_block_ms": block,
        "blocked_at": at,
        "function": f"app.{name}",
    }


def realistic_report() -> dict[str, Any]:
    """A gateway under concurrent load: findings, routes, streaming, goodput, slowest, timeline."""
    lanes = _simulate_loop(40, 12.0, 180.0)
    duration = max(lane["end_ms"] for lane in lanes)
    return {
        "schema": "tracekit.report/1",
        "source": "traces.jsonl",
        "requests": 57,
        "spans": 289,
        "services": ["gateway", "model-server"],
        "instrumented": True,
        "slo": {"ttft_ms": 500.0, "itl_ms": 50.0, "e2e_ms": 5000.0},
        "validation": {"ok": True, "p50_error": 0.04, "p95_error": 0.09, "reason": None},
        "routes": [
            {
                "route": CHAT,
                "requests": 40,
                "errors": 1,
                "throughput_rps": 38.7,
                "latency_ms": {
                    "p50": 412.5,
                    "p90": 598.0,
                    "p95": 655.25,
                    "p99": 720.0,
                    "max": 731.0,
                },
                "breakdown_ms": {
                    "cpu_on_loop": 23.5,
                    "cpu_off_loop": 0.0,
                    "model_wait": 198.0,
                    "io_wait": 6.5,
                    "loop_wait": 171.25,
                },
                "streaming": {
                    "ttft_ms": {"p50": 233.0, "p90": 301.0, "p95": 322.0, "p99": 350.0},
                    "itl_ms": {"p50": 18.5, "p90": 24.0, "p95": 31.0, "p99": 44.0},
                    "tpot_ms": {"p50": 19.0, "p90": 22.0, "p95": 25.0, "p99": 30.0},
                },
                "goodput": {"rps": 36.1, "fraction": 0.933},
                "stages": [
                    _stage(
                        "tokenize",
                        _pct(14.2, 15.9),
                        _pct(14.0, 15.6),
                        _pct(0, 0),
                        _pct(88.0, 160.0),
                        15.6,
                        "app.py:42 in tokenize",
                    ),
                    _stage(
                        "guardrail",
                        _pct(3.1, 3.6),
                        _pct(3.0, 3.5),
                        _pct(0, 0),
                        _pct(40.0, 90.0),
                        3.5,
                    ),
                    _stage(
                        "model",
                        _pct(201.0, 236.0),
                        _pct(0.4, 0.6),
                        _pct(198.0, 232.0),
                        _pct(2.0, 9.0),
                        0.6,
                    ),
                    _stage(
                        "serialize",
                        _pct(4.1, 4.6),
                        _pct(4.0, 4.5),
                        _pct(0, 0),
                        _pct(30.0, 70.0),
                        4.5,
                    ),
                ],
            },
            {
                "route": "GET /healthz",
                "requests": 17,
                "errors": 0,
                "throughput_rps": 16.4,
                "latency_ms": {"p50": 0.81, "p90": 1.2, "p95": 1.4, "p99": 2.0, "max": 2.2},
                "breakdown_ms": {
                    "cpu_on_loop": 0.3,
                    "cpu_off_loop": 0.0,
                    "model_wait": 0.0,
                    "io_wait": 0.0,
                    "loop_wait": 0.5,
                },
                "streaming": None,
                "goodput": {"rps": 16.4, "fraction": 1.0},
                "stages": [],
            },
        ],
        "findings": [
            {
                "rule": "cpu-on-loop",
                "route": CHAT,
                "stage": "tokenize",
                "function": "app.tokenize",
                "severity": "high",
                "impact_ms": 168.0,
                "evidence": (
                    "tokenize ran 14.0 ms of CPU on the event loop per request (p95 15.6 ms); "
                    "other requests waited 171 ms per request for the loop."
                ),
                "fix": {
                    "title": "Run the GIL-free batch encoder in a worker thread",
                    "code": "ids = await asyncio.to_thread(tokenizer.encode_batch, [text])",
                },
                "projection": {
                    "p50_ms": [412.5, 236.0],
                    "p95_ms": [655.25, 262.0],
                    "throughput_rps": [38.7, 61.5],
                },
                "projection_note": None,
            },
            {
                "rule": "sequential-independent",
                "route": CHAT,
                "stage": "guardrail",
                "function": "app.guardrail",
                "severity": "low",
                "impact_ms": 3.0,
                "evidence": "guardrail (3.1 ms) ends before the model starts; they share no data",
                "fix": {
                    "title": "Start the model call speculatively",
                    "code": "async with asyncio.TaskGroup() as tg:\n    tg.create_task(guard(x))",
                },
                "projection": None,
                "projection_note": "replay error 31% > 15% on this trace",
            },
        ],
        "slowest": {
            "trace_id": lanes[-1]["trace_id"],
            "route": CHAT,
            "wall_ms": 731.0,
            "spans": [
                {
                    "name": CHAT,
                    "kind": "server",
                    "depth": 0,
                    "start_ms": 0.0,
                    "wall_ms": 731.0,
                    "cpu_ms": 2.5,
                    "wait_ms": 10.0,
                    "loop_wait_ms": 20.0,
                    "on_loop": True,
                },
                {
                    "name": "tokenize",
                    "kind": "tokenize",
                    "depth": 1,
                    "start_ms": 1.5,
                    "wall_ms": 260.0,
                    "cpu_ms": 14.0,
                    "wait_ms": 0.0,
                    "loop_wait_ms": 246.0,
                    "on_loop": True,
                },
                {
                    "name": "guardrail",
                    "kind": "guardrail",
                    "depth": 1,
                    "start_ms": 262.0,
                    "wall_ms": 120.0,
                    "cpu_ms": 3.0,
                    "wait_ms": 0.0,
                    "loop_wait_ms": 117.0,
                    "on_loop": True,
                },
                {
                    "name": "model",
                    "kind": "model",
                    "depth": 1,
                    "start_ms": 382.0,
                    "wall_ms": 230.0,
                    "cpu_ms": 0.5,
                    "wait_ms": 225.0,
                    "loop_wait_ms": 4.5,
                    "on_loop": True,
                },
                {
                    "name": "serialize",
                    "kind": "serialize",
                    "depth": 1,
                    "start_ms": 612.0,
                    "wall_ms": 100.0,
                    "cpu_ms": 4.0,
                    "wait_ms": 0.0,
                    "loop_wait_ms": 96.0,
                    "on_loop": True,
                },
            ],
        },
        "timeline": {
            "start_ns": 1_700_000_000_000_000_000,
            "duration_ms": duration,
            "lanes": lanes,
        },
    }


def uninstrumented_report() -> dict[str, Any]:
    """A plain OpenTelemetry trace (HotROD-like): no breakdown, no stages data, no timeline."""
    spans = [
        {
            "name": "HTTP GET /dispatch",
            "kind": "server",
            "depth": 0,
            "start_ms": 0.0,
            "wall_ms": 690.0,
            "cpu_ms": None,
            "wait_ms": None,
            "loop_wait_ms": None,
            "on_loop": None,
        }
    ]
    spans += [
        {
            "name": "HTTP GET",
            "kind": "client",
            "depth": 1,
            "start_ms": 20.0 + 60.0 * i,
            "wall_ms": 55.0,
            "cpu_ms": None,
            "wait_ms": None,
            "loop_wait_ms": None,
            "on_loop": None,
        }
        for i in range(11)
    ]
    nulls = dict.fromkeys(("cpu_on_loop", "cpu_off_loop", "model_wait", "io_wait", "loop_wait"))
    return {
        "schema": "tracekit.report/1",
        "source": "hotrod.json",
        "requests": 1,
        "spans": 52,
        "services": ["frontend", "driver", "redis"],
        "instrumented": False,
        "slo": None,
        "validation": None,
        "routes": [
            {
                "route": "HTTP GET /dispatch",
                "requests": 1,
                "errors": 0,
                "throughput_rps": None,
                "latency_ms": {
                    "p50": 690.0,
                    "p90": 690.0,
                    "p95": 690.0,
                    "p99": 690.0,
                    "max": 690.0,
                },
                "breakdown_ms": nulls,
                "streaming": None,
                "goodput": None,
                "stages": [],
            }
        ],
        "findings": [
            {
                "rule": "sequential-independent",
                "route": "HTTP GET /dispatch",
                "stage": "HTTP GET",
                "function": None,
                "severity": "high",
                "impact_ms": 550.0,
                "evidence": "11 sibling HTTP GET calls never overlap.",
                "fix": {"title": "Fetch concurrently", "code": "await asyncio.gather(*calls)"},
                "projection": None,
                "projection_note": "no loop data in this trace",
            }
        ],
        "slowest": {
            "trace_id": "f" * 32,
            "route": "HTTP GET /dispatch",
            "wall_ms": 690.0,
            "spans": spans,
        },
        "timeline": None,
    }


# --- a small DOM reader --------------------------------------------------------------------


class _Tree(HTMLParser):
    """Collects (tag, attrs, depth-path) for every element, to query ids and descendants."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.elements: list[tuple[str, dict[str, str | None], list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr_map = dict(attrs)
        ids = [a.get("id") or "" for _, a in self.stack]
        self.elements.append((tag, attr_map, ids))
        if tag not in self.VOID:
            self.stack.append((tag, attr_map))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs), [a.get("id") or "" for _, a in self.stack]))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def inside(self, element_id: str, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a, ids in self.elements if t == tag and element_id in ids]

    def ids(self) -> set[str]:
        return {a["id"] for _, a, _ in self.elements if a.get("id")}  # type: ignore[misc]


def parse(page: str) -> _Tree:
    tree = _Tree()
    tree.feed(page)
    return tree


# --- structure and numbers ---------------------------------------------------------------


def test_realistic_report_has_every_section_and_its_numbers() -> None:
    page = render_html(realistic_report())
    tree = parse(page)
    assert {
        "findings",
        "routes",
        "stages",
        "streaming",
        "slowest",
        "timeline",
        "loop-timeline",
    } <= tree.ids()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for text in (
        "412",
        "655",
        "720",
        "38.7",
        "233",
        "18.5",
        "93.3%",
        "36.1",  # route numbers
        "236 ms",
        "262 ms",
        "61.5 req/s",
        "(-43%)",
        "(+59%)",  # projection
        "asyncio.to_thread(tokenizer.encode_batch, [text])",
        "app.py:42 in tokenize",
        "TTFT ≤ 500 ms",
        "validated",
        "p95 error 9%",
        "traces.jsonl",
        "replay error 31% &gt; 15% on this trace",
    ):
        assert text in page, text
    assert page.index("badge sev-high") < page.index("badge sev-low")  # most severe first


def test_work_after_the_response_and_named_background_tasks_are_shown() -> None:
    report = realistic_report()
    report["routes"][0]["after_response_cpu_ms"] = {"cpu_on_loop": 3.37, "cpu_off_loop": 0.5}
    report["loop"] = {
        "loops": [{"service": "gateway", "thread": "MainThread", "windows": 4,
                   "cpu_share": {"requests": 0.5, "gc": 0.0, "tracekit": 0.0, "background": 0.5},
                   "background_tasks": [{"task": "app.cache.refresh", "cpu_ms": 402.4}]}],
        "routes": [],
    }  # fmt: skip
    page = render_html(report)
    assert "<h3>After the response</h3>" in page and "<td>3.37</td><td>0.50</td>" in page
    assert '<span class="route">app.cache.refresh</span> 402 ms' in page
    assert "waited for a CPU" not in page  # not measured (not Linux): nothing is said
    # The loop thread's wait for a CPU, as the text says it (a new user's HTML lacked it).
    report["loop"]["loops"][0]["cpu_wait"] = {"ms": 3067.0, "share": 0.389}
    page = render_html(report)
    assert "waited for a CPU 3067 ms (39% of the time): the host is short of CPU" in page
    report["loop"]["loops"][0]["cpu_wait"] = {"ms": 30.0, "share": 0.02}
    page = render_html(report)
    assert "waited for a CPU 30.0 ms (2% of the time)</p>" in page


def test_a_projection_shows_its_range_its_model_and_why_it_is_rated_so() -> None:
    # As the text report does: the after's range, the replay's assumptions and the severity's
    # reason (a new user's HTML report showed the points alone).
    report = realistic_report()
    finding = report["findings"][0]
    finding["projection"]["range"] = {"p50_ms": [250.0, 221.5], "throughput_rps": [55.0, 66.0]}
    finding["projection"]["model"] = {
        "arrivals": "closed", "clients": 16, "cores": 2, "cores_source": "trace",
        "host_others": 1.27, "loop_cpu_share": 0.851, "thread_pool_size": 6,
    }  # fmt: skip
    finding["severity_reason"] = "projected p50 -43% (-176 ms, range -46 to -39%)"
    page = render_html(report)
    for text in (
        "236 ms <span class=\"gain\">(-43%)</span> <span class=\"muted\">(range 222 ms to 250 ms)</span>",
        "61.5 req/s <span class=\"gain\">(+59%)</span> <span class=\"muted\">(range 55.0 req/s to 66.0 "
        "req/s)</span>",
        "Assumed: a closed loop of 16 clients, 2 cores (from the trace), 1.3 other runnable threads "
        "on the host (read from the loop&#x27;s wait for a CPU: 15% of its ready time), thread pool 6",
        "HIGH: projected p50 -43% (-176 ms, range -46 to -39%)",
    ):
        assert text in page, text
    assert page.count("(range ") == 2  # the p95 row had no range: none is made up


def test_breakdown_chart_draws_each_component_with_a_legend() -> None:
    page = render_html(realistic_report())
    breakdown = page[page.index('<svg class="breakdown"') :]
    breakdown = breakdown[: breakdown.index("</svg>")]
    for cls in ("c-cpu_on_loop", "c-model_wait", "c-io_wait", "lw"):
        assert f'class="{cls}"' in breakdown, cls
    assert 'class="c-cpu_off_loop"' not in breakdown  # zero-width segments are not drawn
    for label in ("CPU on loop", "CPU off loop", "model wait", "I/O wait", "loop wait"):
        assert f"</i>{label}</span>" in page, label


def test_timeline_draws_every_slice_and_wait_server_side() -> None:
    report = realistic_report()
    lanes = report["timeline"]["lanes"]
    n_slices = sum(len(lane["slices"]) for lane in lanes)
    n_waits = sum(len(lane["loop_waits"]) for lane in lanes)
    assert n_waits > 0  # the simulated loop is contended
    tree = parse(render_html(report))
    rects = tree.inside("loop-timeline", "rect")
    held = [r for r in rects if (r.get("class") or "").startswith("k-")]
    waits = [r for r in rects if r.get("class") == "lw"]
    assert len(held) == 2 * n_slices  # each slice in its lane and in the loop row
    assert len(waits) == n_waits
    assert {r.get("class") for r in held} == {
        "k-request",
        "k-tokenize",
        "k-guardrail",
        "k-serialize",
    }


def test_timeline_block_positions_follow_time() -> None:
    report = realistic_report()
    lane = {
        "trace_id": "a" * 32,
        "route": CHAT,
        "start_ms": 0.0,
        "end_ms": 100.0,
        "slices": [{"stage": "tokenize", "kind": "tokenize", "start_ms": 25.0, "end_ms": 50.0}],
        "loop_waits": [{"stage": "tokenize", "start_ms": 0.0, "end_ms": 25.0}],
    }
    report["timeline"] = {"start_ns": 0, "duration_ms": 100.0, "lanes": [lane]}
    tree = parse(render_html(report))
    rects = tree.inside("loop-timeline", "rect")
    slice_rects = [r for r in rects if r.get("class") == "k-tokenize"]
    wait = next(r for r in rects if r.get("class") == "lw")
    # the grid's 100 ms tick gives the pixel scale (the axis spans exactly 0..100 ms here)
    ticks = [
        float(ln["x1"] or 0)
        for ln in tree.inside("loop-timeline", "line")
        if ln.get("class") == "grid"
    ]
    px_per_ms = max(ticks) / 100.0
    assert px_per_ms > 5
    assert len(slice_rects) == 2  # lane and loop row
    for r in slice_rects:
        assert float(r["x"] or 0) == pytest.approx(25 * px_per_ms, abs=0.01)
        assert float(r["width"] or 0) == pytest.approx(25 * px_per_ms, abs=0.01)
    assert float(wait["x"] or -1) == pytest.approx(0.0)
    assert float(wait["width"] or 0) == pytest.approx(25 * px_per_ms, abs=0.01)


def test_request_slices_enclosing_a_stage_are_drawn_under_it() -> None:
    # As the analyzer emits them: the request's own step (stage "request", kind "other")
    # encloses the sync stage it called.
    report = realistic_report()
    lane = {
        "trace_id": "b" * 32,
        "route": CHAT,
        "start_ms": 0.0,
        "end_ms": 40.0,
        "slices": [
            {"stage": "request", "kind": "other", "start_ms": 1.0, "end_ms": 10.0},
            {"stage": "tokenize", "kind": "tokenize", "start_ms": 1.5, "end_ms": 9.5},
        ],
        "loop_waits": [],
    }
    report["timeline"] = {"start_ns": 0, "duration_ms": 40.0, "lanes": [lane]}
    page = render_html(report)
    classes = [r.get("class") for r in parse(page).inside("loop-timeline", "rect")]
    held = [c for c in classes if c in ("k-request", "k-tokenize", "k-other")]
    assert held == ["k-request", "k-tokenize"] * 2  # loop row, then the lane; outer first
    assert "request code held the loop" in page
    assert "Longest hold: 9.00 ms by stage “request”" in page
    assert "8.00 ms of it in stage “tokenize”" in page


def test_waterfall_splits_bars_into_components() -> None:
    page = render_html(realistic_report())
    wf = page[page.index('<svg class="waterfall"') :]
    wf = wf[: wf.index("</svg>")]
    assert wf.count("<g>") == 5
    assert 'class="k-tokenize"' in wf and 'class="lw"' in wf and 'class="k-model wait"' in wf
    assert "cpu 14.0 ms, wait 0.00 ms, loop wait 246 ms" in wf


def test_uninstrumented_report_says_what_is_missing() -> None:
    page = render_html(uninstrumented_report())
    tree = parse(page)
    assert "loop-timeline" not in tree.ids()
    assert "loop-timeline-missing" in tree.ids()
    assert "no event-loop data" in page
    assert "no breakdown" in page.lower()
    assert "no: plain OpenTelemetry" in page and "not run" in page and "none given" in page
    assert page.count('class="k-client"') == 11  # the N+1: bars drawn without a split
    assert page.count('class="k-server wait"') == 1  # the parent is light, its calls solid
    assert "no CPU/wait split in this trace" in page
    assert "await asyncio.gather(*calls)" in page


def test_missing_optional_keys_and_wrong_types_do_not_break() -> None:
    minimal: dict[str, Any] = {"schema": "tracekit.report/1", "requests": 0}
    page = render_html(minimal)
    assert "No requests were found." in page and "No findings" in page
    assert "No request to show." in page
    hostile = realistic_report()
    hostile["routes"][0]["latency_ms"] = {"p50": "fast", "p95": float("nan"), "p99": True}
    hostile["routes"][0]["stages"][0]["wall_ms"] = None
    hostile["findings"][0]["projection"] = {"p50_ms": [1.0], "p95_ms": "x"}
    hostile["timeline"]["lanes"].append({"slices": [{"start_ms": None}], "loop_waits": 3})
    hostile["slowest"]["spans"].append({"name": None, "depth": "deep", "wall_ms": -5})
    hostile["services"] = "gateway"
    page = render_html(hostile)
    assert not re.search(r"\b(?:nan|inf)\b", page, re.IGNORECASE)
    assert "No projection: no projection for this finding" in page


class _HasToDict:
    def to_dict(self) -> dict[str, Any]:
        return uninstrumented_report()


def test_accepts_an_object_with_to_dict() -> None:
    assert render_html(_HasToDict()) == render_html(uninstrumented_report())


@pytest.mark.parametrize("bad", [None, 42, ["routes"], {"schema": "otlp/1"}])
def test_rejects_what_is_not_a_report(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"render_html needs|not a tracekit report"):
        render_html(bad)


# --- escaping and self-containment -------------------------------------------------------

PAYLOADS = [
    "</script><script>alert(1)</script>",
    '"onmouseover=alert(2) x="',
    "<img src=x onerror=alert(3)>",
    "'><svg onload=alert(4)>",
]


def _poison(report: dict[str, Any], payload: str) -> dict[str, Any]:
    report = copy.deepcopy(report)
    report["source"] = payload
    report["services"] = [payload]
    route = report["routes"][0]
    route["route"] = payload
    for s in route["stages"]:
        s["stage"] = s["kind"] = s["function"] = s["blocked_at"] = payload
    for f in report["findings"]:
        f["rule"] = f["route"] = f["stage"] = f["function"] = f["evidence"] = payload
        f["severity"] = payload
        f["fix"] = {"title": payload, "code": payload}
        f["projection_note"] = payload
    report["validation"] = {"ok": False, "reason": payload}
    report["slowest"]["trace_id"] = report["slowest"]["route"] = payload
    for sp in report["slowest"]["spans"]:
        sp["name"] = sp["kind"] = payload
    for lane in report["timeline"]["lanes"]:
        lane["trace_id"] = lane["route"] = payload
        for block in lane["slices"] + lane["loop_waits"]:
            block["stage"] = payload
            block["kind"] = payload
    return report


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_trace_value_is_escaped(payload: str) -> None:
    page = render_html(_poison(realistic_report(), payload))
    assert payload not in page
    for raw in (
        "<script>alert",
        "</script><script>",
        "<img",
        '"onmouseover=',
        "'><svg",
        "<svg onload",
    ):
        assert raw not in page, raw
    assert page.count("<script>") == 2  # the page's own two scripts, nothing injected
    tree = parse(page)
    assert all(not name.startswith("on") for _, attrs, _ in tree.elements for name in attrs)
    assert all(tag != "img" for tag, _, _ in tree.elements)
    # trace text cannot select a colour class: unknown kinds fall back to k-other
    assert 'class="k-other"' in page


def test_page_loads_nothing_from_the_network() -> None:
    for report in (realistic_report(), uninstrumented_report()):
        page = render_html(report)
        assert "http://" not in page and "https://" not in page and "//" not in _attrs(page)
        assert "@import" not in page and "url(http" not in page
        links = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page)
        assert links and all(link.startswith("#") for link in links), links  # in-page only
        assert "default-src 'none'" in page  # the CSP forbids fetches even if an escape slipped


def _attrs(page: str) -> str:
    return " ".join(re.findall(r"""(?:src|href|xlink:href)\s*=\s*"[^"]*\"""", page))


# --- headless Chromium -------------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not on PATH in CI (run scripts/ensure-chromium)")
    pytest.skip("chromium is not on PATH (install Debian's chromium: scripts/ensure-chromium)")


def test_missing_chromium_skips_locally_but_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is not on PATH in CI"):
        _chromium()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="ensure-chromium"):
        _chromium()


def _dump_dom(page_path: Path, tmp_path: Path, fragment: str = "") -> tuple[str, str]:
    profile = tempfile.mkdtemp(dir=tmp_path, prefix="profile-")
    proc = subprocess.run(
        [
            _chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page_path.as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("build", [realistic_report, uninstrumented_report])
def test_chromium_loads_the_page_without_errors(build: Any, tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    page_path.write_text(
        render_html(_poison(build(), PAYLOADS[0]) if build is realistic_report else build()),
        encoding="utf-8",
    )
    dom, stderr = _dump_dom(page_path, tmp_path)
    root = parse(dom).elements[0]
    assert root[0] == "html"
    assert root[1].get("data-errors") == "0", root[1].get("data-error-log")
    assert root[1].get("data-ready") == "1"  # the page's own script ran to the end
    console = [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Content Security" in ln]
    assert not console, console
    if build is realistic_report:
        assert len(parse(dom).inside("loop-timeline", "rect")) > 100
    assert "<script>alert" not in dom


def test_chromium_zoom_rescales_the_timeline(tmp_path: Path) -> None:
    page = render_html(realistic_report())
    page_path = tmp_path / "report.html"
    page_path.write_text(page, encoding="utf-8")
    dom, _ = _dump_dom(page_path, tmp_path, "#zoom=4")
    served, zoomed = parse(page), parse(dom)
    assert zoomed.elements[0][1].get("data-errors") == "0", zoomed.elements[0][1]

    def width(tree: _Tree) -> float:
        svgs = [a for tag, a, _ in tree.elements if tag == "svg" and a.get("class") == "tl-data"]
        return float(svgs[0]["width"] or 0)

    def held(tree: _Tree) -> list[dict[str, str | None]]:
        return [a for a in tree.inside("loop-timeline", "rect") if a.get("class") == "k-tokenize"]

    assert width(zoomed) == pytest.approx(4 * width(served))
    before, after = held(served), held(zoomed)
    assert len(before) == len(after) > 0
    for b, a in zip(before, after, strict=True):
        assert float(a["x"] or 0) == pytest.approx(4 * float(b["x"] or 0), abs=0.05)
        assert float(a["width"] or 0) == pytest.approx(4 * float(b["width"] or 0), abs=0.05)
