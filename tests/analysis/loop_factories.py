"""Spans for the loop-view tests: ``tracekit.loop`` windows and tracekit request spans, built
as the recorder exports them (attribute names from :mod:`tracekit.semconv`), so that they go
through the whole pipeline: assembly, aggregation, the report and the rules."""

from __future__ import annotations

import itertools
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import Span

BASE_NS = 1_800_000_000_000_000_000
_ids = itertools.count(1)


def at(ms: float) -> int:
    """Absolute ns of an offset in ms from :data:`BASE_NS`."""
    return BASE_NS + round(ms * 1e6)


def loop_span(
    start_ms: float,
    *,
    wall_ms: float = 1000.0,
    service: str = "gateway",
    thread: str = "MainThread",
    requests: float = 0.0,
    gc_cpu: float = 0.0,
    tracekit_cpu: float = 0.0,
    background: float = 0.0,
    gc_ms: float = 0.0,
    gc_counts: tuple[int, int, int] = (0, 0, 0),
    gc_max: tuple[float, int] | None = None,
    gc_max_cpu: float | None = None,
    lag: tuple[float, float, float] | None = None,
    probes: int = 0,
    inflight: int = 0,
    tasks: int | None = None,
    runqueue: float | None = None,
    background_tasks: dict[str, float] | None = None,
    pid: int | None = None,
) -> Span:
    """One window: CPU split in ms; the total and the busy ratio follow from it."""
    cpu = requests + gc_cpu + tracekit_cpu + background
    attrs: dict[str, Any] = {
        semconv.LOOP_THREAD: thread,
        semconv.LOOP_BUSY_RATIO: min(1.0, cpu / wall_ms),
        semconv.LOOP_CPU_MS: cpu,
        semconv.LOOP_REQUESTS_CPU_MS: requests,
        semconv.LOOP_GC_CPU_MS: gc_cpu,
        semconv.LOOP_TRACEKIT_CPU_MS: tracekit_cpu,
        semconv.LOOP_BACKGROUND_CPU_MS: background,
        semconv.LOOP_GC_MS: gc_ms,
        semconv.LOOP_GC_COUNTS: list(gc_counts),
        semconv.LOOP_INFLIGHT: inflight,
        semconv.LOOP_PROBES: probes,
    }
    if gc_max is not None:
        attrs[semconv.LOOP_GC_MAX_MS], attrs[semconv.LOOP_GC_MAX_GENERATION] = gc_max
    if gc_max_cpu is not None:
        attrs[semconv.LOOP_GC_MAX_CPU_MS] = gc_max_cpu
    if lag is not None:
        attrs[semconv.LOOP_LAG_P50_MS], attrs[semconv.LOOP_LAG_P95_MS], attrs[semconv.LOOP_LAG_MAX_MS] = lag
    if tasks is not None:
        attrs[semconv.LOOP_TASKS] = tasks
    if runqueue is not None:
        attrs[semconv.LOOP_RUNQUEUE_MS] = runqueue
    if pid is not None:
        attrs[semconv.LOOP_PID] = pid
    if background_tasks is not None:
        attrs[semconv.LOOP_BACKGROUND_TASKS] = list(background_tasks)
        attrs[semconv.LOOP_BACKGROUND_TASKS_CPU_MS] = list(background_tasks.values())
    n = next(_ids)
    return Span(f"{n:032x}", f"{n:016x}", None, semconv.LOOP_SPAN, "internal", at(start_ms),
                at(start_ms + wall_ms), service, attrs)  # fmt: skip


def request_spans(
    start_ms: float,
    wall_ms: float,
    stages: list[tuple[str, float, float]],
    *,
    route: str = "/v1/chat",
    service: str = "gateway",
    own_cpu: float = 0.0,
    loop_wait: float = 0.0,
    gc_ms: float = 0.0,
    queue_wait: float = 0.0,
    model_wait: float = 0.0,
) -> list[Span]:
    """A SERVER span and one stage span per ``(name, cpu_ms, gc_ms)``, laid end to end from
    the request's start (each stage 1 ms longer than its CPU and GC); stage CPU is on the
    loop, in 1 ms slices (not recorded: slices under 1 ms are not)."""
    n = next(_ids)
    trace = f"{n:032x}"
    root = f"{n:016x}"
    spans = []
    t = start_ms
    cpu = own_cpu
    for i, (name, stage_cpu, stage_gc) in enumerate(stages):
        wall = stage_cpu + stage_gc + 1.0
        attrs: dict[str, Any] = {
            semconv.STAGE: name, semconv.WALL_MS: wall, semconv.CPU_MS: stage_cpu,
            semconv.WAIT_MS: 1.0, semconv.LOOP_WAIT_MS: 0.0, semconv.MAX_BLOCK_MS: 0.9 + stage_gc,
            semconv.ON_LOOP: True, semconv.CODE_FUNCTION: name, semconv.CODE_NAMESPACE: "app",
        }  # fmt: skip
        if stage_gc:
            attrs[semconv.GC_MS] = stage_gc
        spans.append(Span(trace, f"{n:012x}{i + 1:04x}", root, name, "internal", at(t),
                          at(t + wall), service, attrs))  # fmt: skip
        t += wall
        cpu += stage_cpu
    method, path = "POST", route
    attrs = {
        semconv.HTTP_REQUEST_METHOD: method, semconv.HTTP_ROUTE: path,
        semconv.HTTP_RESPONSE_STATUS_CODE: 200, semconv.WALL_MS: wall_ms, semconv.CPU_MS: cpu,
        semconv.LOOP_WAIT_MS: loop_wait, semconv.MODEL_WAIT_MS: model_wait,
        semconv.IO_WAIT_MS: 0.0, semconv.ON_LOOP: True,
    }  # fmt: skip
    if gc_ms:
        attrs[semconv.GC_MS] = gc_ms
    if queue_wait:
        attrs[semconv.QUEUE_WAIT_MS] = queue_wait
    spans.append(Span(trace, root, None, f"{method} {path}", "server", at(start_ms),
                      at(start_ms + wall_ms), service, attrs))  # fmt: skip
    return spans
