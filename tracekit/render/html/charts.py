"""Server-side charts for the HTML report: route breakdown, projection bars, the waterfall.

All charts are inline SVG (or plain HTML bars) computed here, so they render with scripts off.
Every label from the trace is escaped with :func:`esc`; colours come from fixed CSS classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracekit.render.html.util import (
    COMPONENTS,
    clip,
    esc,
    fmt_ms,
    fmt_pct,
    fmt_rps,
    fmt_tick,
    items,
    kind_class,
    mapping,
    nice_ticks,
    num,
)

_LABEL_W = 280  # px for route / span names left of the bars
_BAR_W = 620
_VALUE_W = 220
_ROW_H = 26

#: The hatch pattern of loop-wait blocks, defined once per page (see :func:`hatch_defs`) and
#: referenced by every chart as ``url(#tk-hatch)`` through the ``lw`` CSS class.
_HATCH_DEFS = (
    '<defs><pattern id="tk-hatch" width="5" height="5" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="5"/></pattern></defs>'
)


def hatch_defs() -> str:
    """The ``<defs>`` with the ``tk-hatch`` pattern used by loop-wait blocks (once per page)."""
    return (
        '<svg width="0" height="0" style="position:absolute" aria-hidden="true">'
        f"{_HATCH_DEFS}</svg>"
    )


def legend(entries: list[tuple[str, str]]) -> str:
    """An HTML legend: ``(swatch class, label)`` pairs; labels are fixed strings, not trace data."""
    spans = "".join(f'<span><i class="sw {cls}"></i>{esc(text)}</span>' for cls, text in entries)
    return f'<div class="legend">{spans}</div>'


def breakdown_chart(routes: list[Mapping[str, Any]]) -> str:
    """Stacked horizontal bars of each route's mean per-request breakdown.

    Args:
        routes: the report's ``routes[]``; routes whose components are all unknown are listed
            as "no breakdown" instead of drawn.

    Returns:
        An HTML fragment: legend plus one SVG, or a note when no route has a breakdown.
    """
    rows = [(r, _components(r)) for r in routes]
    drawn = [(r, c) for r, c in rows if c]
    if not drawn:
        return (
            '<p class="empty">No route carries tracekit attributes, so there is no breakdown.</p>'
        )
    scale = max(sum(v for _, v in comps) for _, comps in drawn) or 1.0
    height = _ROW_H * len(drawn) + 8
    width = _LABEL_W + _BAR_W + _VALUE_W
    body = "".join(_breakdown_row(i, r, c, scale) for i, (r, c) in enumerate(drawn))
    missing = [r for r, c in rows if not c]
    note = ""
    if missing:
        names = ", ".join(esc(clip(r.get("route"), 80)) for r in missing)
        note = f'<p class="note">No breakdown (uninstrumented): {names}.</p>'
    entries = [(f"c-{key}" if key != "loop_wait" else "hatch", label) for key, label in COMPONENTS]
    return (
        legend(entries)
        + f'<div class="chart"><svg class="breakdown" width="{width}" height="{height}" '
        f'role="img" aria-label="per-route latency breakdown">{body}</svg></div>'
        + '<p class="note">Mean milliseconds per request. Bars are scaled to the largest route.</p>'
        + note
    )


def _components(route: Mapping[str, Any]) -> list[tuple[str, float]]:
    breakdown = mapping(route.get("breakdown_ms"))
    values = [(key, num(breakdown.get(key))) for key, _ in COMPONENTS]
    known = [(key, max(0.0, v)) for key, v in values if v is not None]
    return known


def _breakdown_row(
    index: int, route: Mapping[str, Any], comps: list[tuple[str, float]], scale: float
) -> str:
    y = index * _ROW_H + 4
    name = clip(route.get("route"), 40)
    out = [f'<text x="0" y="{y + 15}"><title>{esc(route.get("route"))}</title>{esc(name)}</text>']
    total = sum(v for _, v in comps)
    x = float(_LABEL_W)
    labels = dict(COMPONENTS)
    for key, value in comps:
        w = value / scale * _BAR_W
        if w <= 0:
            continue
        cls = "lw" if key == "loop_wait" else f"c-{key}"
        share = fmt_pct(value / total if total else None)
        tip = f"{clip(route.get('route'), 120)} · {labels[key]}: {fmt_ms(value, True)} ({share})"
        out.append(
            f'<rect class="{cls}" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_ROW_H - 8}">'
            f"<title>{esc(tip)}</title></rect>"
        )
        if w >= 44 and key != "loop_wait":
            out.append(f'<text class="in" x="{x + 4:.1f}" y="{y + 13}">{fmt_ms(value)}</text>')
        x += w
    p50 = num(mapping(route.get("latency_ms")).get("p50"))
    tail = f"{fmt_ms(total, True)} mean" + (
        f" · p50 {fmt_ms(p50, True)}" if p50 is not None else ""
    )
    out.append(f'<text class="dim" x="{x + 8:.1f}" y="{y + 14}">{esc(tail)}</text>')
    return "".join(out)


# --- projection bars ---------------------------------------------------------------------

_PROJ_ROWS = (
    ("p50_ms", "p50 latency", True),
    ("p95_ms", "p95 latency", True),
    ("throughput_rps", "throughput", False),
)


def projection_bars(projection: Mapping[str, Any]) -> str:
    """Before/after bars for a finding's projection (p50, p95, throughput).

    Args:
        projection: ``{"p50_ms": [before, after], "p95_ms": [...], "throughput_rps": [...],
            "range": {"p50_ms": [low, high], ...}}``; rows whose pair is not two numbers are
            skipped; the after's range is shown where it is two numbers.

    Returns:
        An HTML fragment, or "" when no row is usable.
    """
    rows = []
    ranges = projection.get("range")
    ranges = ranges if isinstance(ranges, Mapping) else {}
    for key, label, lower_is_better in _PROJ_ROWS:
        pair = projection.get(key)
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            continue
        before, after = num(pair[0]), num(pair[1])
        if before is None or after is None:
            continue
        rows.append(
            _proj_row(label, before, after, lower_is_better, key != "throughput_rps", _span(ranges.get(key)))
        )
    if not rows:
        return ""
    return '<div class="proj" aria-label="projected effect of the fix">' + "".join(rows) + "</div>"


def _proj_row(label: str, before: float, after: float, lower_better: bool, is_ms: bool,
              span: tuple[float, float] | None) -> str:  # fmt: skip
    top = max(abs(before), abs(after)) or 1.0

    def fmt(value: float) -> str:
        return fmt_ms(value, True) if is_ms else f"{fmt_rps(value)} req/s"

    change = ""
    if before:
        delta = (after - before) / abs(before)
        better = delta < 0 if lower_better else delta > 0
        cls = "gain" if better else "loss" if delta else "muted"
        change = f' <span class="{cls}">({delta * 100:+.0f}%)</span>'
    return (
        f'<div class="lbl">{label}</div><div class="bars">'
        f'<div class="bar b" style="width:{abs(before) / top * 100:.1f}%" title="before"></div>'
        f'<div class="bar a" style="width:{abs(after) / top * 100:.1f}%" title="after"></div></div>'
        f'<div class="val">{fmt(before)} → {fmt(after)}{change}{_range(span, is_ms)}</div>'
    )


def _span(bounds: object) -> tuple[float, float] | None:
    # A range read tolerantly: two numbers, in either order.
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        return None
    low, high = num(bounds[0]), num(bounds[1])
    return None if low is None or high is None else (min(low, high), max(low, high))


def _range(span: tuple[float, float] | None, is_ms: bool) -> str:
    # The after's range, in the same units: "(range 610 ms to 655 ms)".
    if span is None:
        return ""
    low, high = (fmt_ms(v, True) if is_ms else f"{fmt_rps(v)} req/s" for v in span)
    return f' <span class="muted">(range {low} to {high})</span>'



# --- slowest request waterfall -------------------------------------------------------------

_WF_LABEL_W = 300
_WF_BAR_W = 760
_WF_ROW_H = 22


def waterfall(slowest: Mapping[str, Any]) -> str:
    """The slowest request's spans as a waterfall, each bar split into cpu/wait/loop wait.

    Args:
        slowest: the report's ``slowest`` dict (``spans[]`` with depth, start_ms, wall_ms and
            the optional components).

    Returns:
        An HTML fragment with one SVG, or a note when there are no spans.
    """
    spans = items(slowest.get("spans"))
    if not spans:
        return '<p class="empty">The slowest request has no spans to draw.</p>'
    ends = [(num(s.get("start_ms")) or 0.0) + (num(s.get("wall_ms")) or 0.0) for s in spans]
    total = max([num(slowest.get("wall_ms")) or 0.0, *ends]) or 1.0
    scale = _WF_BAR_W / total
    width = _WF_LABEL_W + _WF_BAR_W + 90
    height = _WF_ROW_H * len(spans) + 26
    depths = [int(num(s.get("depth")) or 0) for s in spans]
    parents = [i + 1 < len(spans) and depths[i + 1] > d for i, d in enumerate(depths)]
    rows = "".join(_waterfall_row(i, s, scale, parents[i]) for i, s in enumerate(spans))
    return (
        _waterfall_legend(spans)
        + f'<div class="chart"><svg class="waterfall" width="{width}" height="{height}" '
        f'role="img" aria-label="slowest request waterfall">'
        + _axis(total, scale, _WF_LABEL_W, height - 20, 0)
        + rows
        + "</svg></div>"
        + '<p class="note">Each bar is a span at its start offset; its fill shows the share of '
        "CPU, waiting and loop wait in its own time (proportions, not order).</p>"
    )


def _waterfall_legend(spans: list[Mapping[str, Any]]) -> str:
    kinds = dict.fromkeys(kind_class(s.get("kind")) for s in spans)
    entries = [(cls, cls[2:]) for cls in kinds]
    split = any(num(s.get(k)) is not None for s in spans for k in ("cpu_ms", "wait_ms"))
    if split:
        entries += [
            ("wait-sw", "waiting (light)"),
            ("hatch", "loop wait"),
            ("outline", "in child spans / not attributed"),
        ]
    else:
        entries += [("wait-sw", "span with children (no CPU/wait split in this trace)")]
    return legend(entries)


def _waterfall_row(index: int, span: Mapping[str, Any], scale: float, parent: bool) -> str:
    y = index * _WF_ROW_H + 2
    depth = max(0, min(12, int(num(span.get("depth")) or 0)))
    start = max(0.0, num(span.get("start_ms")) or 0.0)
    wall = max(0.0, num(span.get("wall_ms")) or 0.0)
    kind = kind_class(span.get("kind"))
    name = clip(span.get("name"), 40 - depth * 2)
    on_loop = span.get("on_loop")
    where = " · on loop" if on_loop is True else " · off loop" if on_loop is False else ""
    tip = (
        f"{clip(span.get('name'), 200)} ({clip(span.get('kind'), 40)}) · "
        f"{fmt_ms(wall, True)} at +{fmt_ms(start, True)}{where}"
    )
    parts = [
        (c, num(span.get(k)))
        for c, k in (("cpu", "cpu_ms"), ("wait", "wait_ms"), ("lw", "loop_wait_ms"))
    ]
    out = [
        f"<g><title>{esc(tip)}{esc(_parts_text(parts))}</title>",
        f'<text x="{depth * 12}" y="{y + 14}">{esc(name)}</text>',
    ]
    x0, w = _WF_LABEL_W + start * scale, max(1.0, wall * scale)
    out.append(
        f'<rect class="rest" x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{_WF_ROW_H - 8}"/>'
    )
    x = x0
    for cls, value in parts:
        if value is None or value <= 0 or wall <= 0:
            continue
        seg = min(value, wall) * scale
        klass = {"cpu": kind, "wait": f"{kind} wait", "lw": "lw"}[cls]
        out.append(
            f'<rect class="{klass}" x="{x:.1f}" y="{y + 3}" width="{seg:.1f}" '
            f'height="{_WF_ROW_H - 8}"/>'
        )
        x += seg
        if x >= x0 + w:
            break
    if all(v is None for _, v in parts):  # uninstrumented: no split known, fill the whole bar
        fill = f"{kind} wait" if parent else kind  # parents light, so the leaf calls stand out
        out.append(
            f'<rect class="{fill}" x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" '
            f'height="{_WF_ROW_H - 8}"/>'
        )
    out.append(
        f'<text class="dim" x="{x0 + w + 6:.1f}" y="{y + 14}">{fmt_ms(wall, True)}</text></g>'
    )
    return "".join(out)


def _parts_text(parts: list[tuple[str, float | None]]) -> str:
    names = {"cpu": "cpu", "wait": "wait", "lw": "loop wait"}
    known = [f"{names[c]} {fmt_ms(v, True)}" for c, v in parts if v is not None]
    return (" · " + ", ".join(known)) if known else ""


def _axis(total: float, scale: float, x0: float, y: float, top: float) -> str:
    """Grid lines and tick labels for a ms axis starting at ``x0``."""
    ticks = nice_ticks(total)
    step = ticks[1] if len(ticks) > 1 else total
    out = []
    for t in ticks:
        x = x0 + t * scale
        out.append(
            f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y}"/>'
            f'<text class="dim" x="{x + 2:.1f}" y="{y + 13}">{fmt_tick(t, step)}</text>'
        )
    return "".join(out)
