"""The event-loop timeline: which request's which stage held the loop, when, and who waited.

x is time (ms from ``timeline.start_ns``); the first row is the loop itself (every slice of
every request, so its gaps are idle loop time); below it one lane per request: a thin line for
the request's lifetime, solid blocks for the slices where its code held the loop (coloured by
stage kind), hatched blocks where it was ready but waited for the loop. Every block carries a
``<title>`` (hover text). Drawn entirely here; the page's script only zooms and highlights.

Zooming is done by the script multiplying the ``data-x``/``data-w`` pixel values it finds, so
every time-positioned element carries them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracekit import semconv
from tracekit.render.html.charts import legend
from tracekit.render.html.util import (
    COLOURED_KINDS,
    clip,
    esc,
    fmt_ms,
    fmt_pct,
    fmt_tick,
    items,
    kind_class,
    merge_intervals,
    nice_ticks,
    num,
)

_DATA_W = 870  # px of the time axis at zoom 1
_PAD_R = 36  # room for the last tick label
_LABEL_W = 230
_TOP_ROW = 26  # the "event loop" summary row
_AXIS_H = 22
_MAX_LANES = 400  # a hostile or oversized timeline still gives a bounded page
_MAX_BLOCKS = 400  # per lane and kind of block
_REQUEST = "request"  # the stage name of a request's own code in timeline slices


@dataclass
class _Lane:
    trace_id: str
    route: str
    start: float | None
    end: float | None
    slices: list[tuple[float, float, str, str]] = field(default_factory=list)  # s, e, stage, kind
    waits: list[tuple[float, float, str]] = field(default_factory=list)  # s, e, stage


def loop_timeline(timeline: Mapping[str, Any] | None) -> str:
    """Render the report's ``timeline`` as the ``#loop-timeline`` figure.

    Args:
        timeline: the report's ``timeline`` dict, or ``None`` for a trace without loop data.

    Returns:
        An HTML fragment; without a timeline (or with no lanes), a note saying why.
    """
    lanes_in = items(timeline.get("lanes")) if timeline else []
    if not lanes_in:
        why = (
            "This trace has no event-loop data: it carries no tracekit attributes (plain "
            "OpenTelemetry), so who held the loop is unknown."
            if timeline is None
            else "The timeline window holds no requests."
        )
        return f'<p class="empty" id="loop-timeline-missing">{why}</p>'
    lanes = sorted(
        (_read_lane(x) for x in lanes_in[:_MAX_LANES]),
        key=lambda ln: ln.start if ln.start is not None else 0.0,
    )
    ends = [e for ln in lanes for e in _lane_points(ln)]
    duration = max([num(timeline.get("duration_ms")) or 0.0, *ends]) if timeline else 0.0
    duration = duration or 1.0
    scale = _DATA_W / duration
    lane_h = 18 if len(lanes) <= 36 else max(5, int(650 / len(lanes)))
    parts = [
        _summary(lanes, duration, len(lanes_in)),
        _timeline_legend(lanes),
        '<div class="tl-tools"><span>zoom</span>'
        '<button type="button" data-zoom="out">−</button>'
        '<span id="tl-zoom">1×</span><button type="button" data-zoom="in">+</button>'
        '<button type="button" data-zoom="reset">reset</button>'
        '<span class="muted">hover a block for request, stage and duration</span></div>',
        '<div class="timeline" id="loop-timeline">',
        _labels_svg(lanes, lane_h),
        f'<div class="scroll">{_data_svg(lanes, lane_h, scale, duration)}</div>',
        "</div>",
    ]
    return "".join(parts)


def _read_lane(lane: Mapping[str, Any]) -> _Lane:
    out = _Lane(
        str(lane.get("trace_id") or ""),
        str(lane.get("route") or ""),
        num(lane.get("start_ms")),
        num(lane.get("end_ms")),
    )
    for s in items(lane.get("slices"))[:_MAX_BLOCKS]:
        span = _interval(s)
        if span:
            stage, kind = str(s.get("stage") or ""), str(s.get("kind") or "")
            if stage == _REQUEST and kind in ("", semconv.KIND_OTHER):
                kind = _REQUEST  # the request's own code (handler, framework), not a stage
            out.slices.append((*span, stage, kind))
    # The request's own slice encloses the slices of stages it called synchronously: draw
    # longer slices first so the nested stage stays visible on top.
    out.slices.sort(key=lambda sl: sl[0] - sl[1])
    for w in items(lane.get("loop_waits"))[:_MAX_BLOCKS]:
        span = _interval(w)
        if span:
            out.waits.append((*span, str(w.get("stage") or "")))
    return out


def _interval(block: Mapping[str, Any]) -> tuple[float, float] | None:
    start, end = num(block.get("start_ms")), num(block.get("end_ms"))
    if start is None or end is None:
        return None
    start = max(0.0, start)
    return start, max(start, end)


def _lane_points(lane: _Lane) -> list[float]:
    points = [p for p in (lane.start, lane.end) if p is not None]
    points += [e for _, e, *_ in lane.slices] + [e for _, e, _ in lane.waits]
    return points


def _summary(lanes: list[_Lane], duration: float, total_lanes: int) -> str:
    slices = [(s, e, st, ln) for ln in lanes for s, e, st, _ in ln.slices]
    busy = sum(e - s for s, e in merge_intervals([(s, e) for s, e, _, _ in slices]))
    waited = sum(e - s for ln in lanes for s, e, _ in ln.waits)
    text = (
        f"{len(lanes)} requests over {fmt_ms(duration, True)}; the loop was held by "
        f"request code in steps of 1 ms or more (the ones recorded) for {fmt_ms(busy, True)} "
        f"({fmt_pct(busy / duration)} of this window), "
        f"and requests spent {fmt_ms(waited, True)} in total ready but waiting for it."
    )
    if slices:
        s, e, stage, lane = max(slices, key=lambda x: x[1] - x[0])
        text += (
            f" Longest hold: {fmt_ms(e - s, True)} by stage “{clip(stage, 60)}” of request "
            f"{clip(lane.trace_id, 16)} at +{fmt_ms(s, True)}{_nested(lane, s, e, stage)}."
        )
    if total_lanes > len(lanes):
        text += f" Showing the first {len(lanes)} of {total_lanes} lanes."
    return f'<p class="note">{esc(text)}</p>'


def _nested(lane: _Lane, start: float, end: float, stage: str) -> str:
    """Name the longest other stage slice inside a hold (a sync stage called by the request)."""
    inner = [(e - s, st) for s, e, st, _ in lane.slices if start <= s and e <= end and st != stage]
    if not inner:
        return ""
    ms, name = max(inner)
    return f", {fmt_ms(ms, True)} of it in stage “{clip(name, 60)}”"


def _timeline_legend(lanes: list[_Lane]) -> str:
    present = {k for ln in lanes for *_, k in ln.slices}
    kinds = [k for k in COLOURED_KINDS if k in present]
    if any(k not in COLOURED_KINDS for k in present):
        kinds.append("other")
    names = {_REQUEST: "request code"}
    entries = [(f"k-{k}", f"{names.get(k, k)} held the loop") for k in dict.fromkeys(kinds)]
    entries += [("hatch", "ready, waiting for the loop"), ("life", "request in flight")]
    return legend(entries)


def _labels_svg(lanes: list[_Lane], lane_h: int) -> str:
    height = _TOP_ROW + lane_h * len(lanes) + _AXIS_H
    out = [
        f'<svg class="labels" width="{_LABEL_W}" height="{height}">',
        f'<text x="8" y="{_TOP_ROW - 9}">event loop</text>',
    ]
    show_text = lane_h >= 11
    for i, lane in enumerate(lanes):
        y = _TOP_ROW + i * lane_h
        label = f"{clip(lane.trace_id, 9)} {clip(lane.route, 22)}"
        out.append(
            f'<g data-lane="{i}"><title>request {esc(lane.trace_id)} · '
            f"{esc(clip(lane.route, 200))}</title>"
            f'<rect class="lanebg" x="0" y="{y}" width="{_LABEL_W}" height="{lane_h}"/>'
        )
        if show_text:
            out.append(f'<text class="dim mono" x="8" y="{y + lane_h - 5}">{esc(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _data_svg(lanes: list[_Lane], lane_h: int, scale: float, duration: float) -> str:
    height = _TOP_ROW + lane_h * len(lanes) + _AXIS_H
    out = [
        f'<svg class="tl-data" width="{_DATA_W + _PAD_R}" height="{height}" role="img" '
        f'aria-label="event-loop timeline">',
        _grid(duration, scale, height),
    ]
    out.append(_loop_row(lanes, scale))
    block_h = max(3, lane_h - 4)
    for i, lane in enumerate(lanes):
        out.append(_lane_row(i, lane, _TOP_ROW + i * lane_h, lane_h, block_h, scale))
    out.append("</svg>")
    return "".join(out)


def _grid(duration: float, scale: float, height: int) -> str:
    ticks = nice_ticks(duration)
    step = ticks[1] if len(ticks) > 1 else duration
    out = []
    for t in ticks:
        x = t * scale
        out.append(
            f'<line class="grid" x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - _AXIS_H}" '
            f'data-x="{x:.1f}" data-w="0"/>'
            f'<text class="dim" x="{x + 2:.1f}" y="{height - 7}" data-x="{x + 2:.1f}">'
            f"{fmt_tick(t, step)}</text>"
        )
    return "".join(out)


def _block(cls: str, start: float, end: float, y: float, h: float, scale: float, tip: str) -> str:
    x, w = start * scale, max(1.0, (end - start) * scale)
    return (
        f'<rect class="{cls}" x="{x:.2f}" y="{y:.1f}" width="{w:.2f}" height="{h:.1f}" '
        f'data-x="{x:.2f}" data-w="{w:.2f}"><title>{esc(tip)}</title></rect>'
    )


def _slice_tip(lane: _Lane, stage: str, kind: str, start: float, end: float) -> str:
    return (
        f"request {clip(lane.trace_id, 32)} · {clip(lane.route, 120)} · stage "
        f"{clip(stage, 80)} ({clip(kind, 30)}) held the loop {fmt_ms(end - start, True)} "
        f"at +{fmt_ms(start, True)}"
    )


def _loop_row(lanes: list[_Lane], scale: float) -> str:
    out = ['<g class="loop-row">']
    for lane in lanes:
        for s, e, stage, kind in lane.slices:
            out.append(
                _block(
                    kind_class(kind),
                    s,
                    e,
                    4,
                    _TOP_ROW - 10,
                    scale,
                    _slice_tip(lane, stage, kind, s, e),
                )
            )
    out.append("</g>")
    return "".join(out)


def _lane_row(i: int, lane: _Lane, y: int, lane_h: int, block_h: int, scale: float) -> str:
    full = _DATA_W + _PAD_R
    out = [
        f'<g data-lane="{i}"><rect class="lanebg" x="0" y="{y}" width="{full}" '
        f'height="{lane_h}" data-x="0" data-w="{full}"/>'
    ]
    if lane.start is not None and lane.end is not None:
        x1, w = lane.start * scale, max(0.0, lane.end - lane.start) * scale
        mid = y + lane_h / 2
        out.append(
            f'<line class="life" x1="{x1:.2f}" y1="{mid:.1f}" x2="{x1 + w:.2f}" '
            f'y2="{mid:.1f}" data-x="{x1:.2f}" data-w="{w:.2f}"><title>'
            f"{esc(f'request {clip(lane.trace_id, 32)} · {clip(lane.route, 120)} · ')}"
            f"{fmt_ms(lane.end - lane.start, True)}</title></line>"
        )
    top = y + (lane_h - block_h) / 2
    for s, e, stage in lane.waits:
        tip = (
            f"request {clip(lane.trace_id, 32)} · stage {clip(stage, 80)} was ready but "
            f"waited {fmt_ms(e - s, True)} for the loop at +{fmt_ms(s, True)}"
        )
        out.append(_block("lw", s, e, top, block_h, scale, tip))
    for s, e, stage, kind in lane.slices:
        out.append(
            _block(kind_class(kind), s, e, top, block_h, scale, _slice_tip(lane, stage, kind, s, e))
        )
    out.append("</g>")
    return "".join(out)
