"""The report's loop view as HTML: one table row per event loop (busy share, CPU split, GC,
lag, tasks) and each route's share of its loop's CPU. Nothing when the report has no loop
section (traces without ``tracekit.loop`` windows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracekit.analysis.stats.loop_windows import HOST_SHORT_SHARE
from tracekit.render.html.util import (
    clip,
    esc,
    fmt_int,
    fmt_ms,
    fmt_pct,
    items,
    mapping,
    profile_details,
)


def loop_section(loop: object) -> str:
    """The ``loop`` section, or ``""`` when there is none.

    Args:
        loop: the report's ``loop`` value (a mapping, or null).
    """
    if not isinstance(loop, Mapping):
        return ""
    head = ("<tr><th>loop</th><th>windows</th><th>processes</th><th>busy p50</th><th>p95</th>"
            "<th>requests</th><th>GC</th><th>tracekit</th><th>background</th>"
            "<th>GC collections (0/1/2)</th><th>longest pause</th><th>lag p50</th><th>p95</th>"
            "<th>max</th><th>tasks</th></tr>")  # fmt: skip
    rows = [_row(one) for one in items(loop.get("loops"))]
    profiles = "".join(_profile(one) for one in items(loop.get("loops")))
    tasks = "".join(_tasks(one) + _cpu_wait(one) + _by_process(one) for one in items(loop.get("loops")))
    routes = "".join(
        f'<li><span class="route">{esc(clip(r.get("route"), 200))}</span>: '
        f"{fmt_pct(r.get('loop_cpu_share'))} of {esc(clip(r.get('service'), 80))}'s loop CPU "
        f"({fmt_ms(r.get('cpu_on_loop_ms'))} ms)</li>"
        for r in items(loop.get("routes"))
    )
    return (
        '<section id="loop"><h2>Event loop</h2><p class="note">Per event loop, over its '
        "windows (about a second each): how busy it was, what its CPU ran (traced requests, "
        "garbage collection, tracekit, and background work no request owns), GC pauses and "
        "the lag of work made ready (ms).</p>"
        f'<div class="tablewrap"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        f"</table></div>{f'<ul>{routes}</ul>' if routes else ''}{tasks}{profiles}</section>"
    )


def _cpu_wait(one: Mapping[str, Any]) -> str:
    # The loop thread's wait for a CPU (run-queue delay), as the text report says it.
    waited = mapping(one.get("cpu_wait"))
    share = waited.get("share")
    if not isinstance(share, (int, float)) or isinstance(share, bool):
        return ""
    short = (": the host is short of CPU, and this time is inside the steps' and waits' wall "
             "time (not the application's doing)" if share >= HOST_SHORT_SHARE else "")  # fmt: skip
    return _note(one, f"waited for a CPU {fmt_ms(waited.get('ms'))} ms ({fmt_pct(share)} of the "
                      f"time){short}")  # fmt: skip


def _by_process(one: Mapping[str, Any]) -> str:
    # Worker processes share a loop's row: each one's busy share, as the text report says it.
    shares = " · ".join(
        f"pid {esc(str(p.get('pid')))} busy {fmt_pct(p.get('busy_mean'))} "
        f"({fmt_int(p.get('windows'))} windows)"
        for p in items(one.get("by_process"))
    )
    return _note(one, f"by process: {shares}") if shares else ""


def _tasks(one: Mapping[str, Any]) -> str:
    # The background tasks (of no request) that took the most of the loop's CPU, by coroutine.
    named = ", ".join(
        f'<span class="route">{esc(clip(t.get("task"), 200))}</span> {fmt_ms(t.get("cpu_ms"))} ms'
        for t in items(one.get("background_tasks"))
    )
    return _note(one, f"background tasks of no request, by CPU: {named}") if named else ""


def _note(one: Mapping[str, Any], html: str) -> str:
    # A line about one loop, named as its table row names it.
    return (f'<p class="note">{esc(clip(one.get("service"), 80))} / '
            f"{esc(clip(one.get('thread'), 80))}: {html}</p>")  # fmt: skip


def _row(one: Mapping[str, Any]) -> str:
    busy = mapping(one.get("busy"))
    share = mapping(one.get("cpu_share"))
    gc = mapping(one.get("gc"))
    lag = mapping(one.get("lag_ms"))
    counts = "/".join(fmt_int(c) for c in gc.get("counts") or [])
    pause = "–"
    if gc.get("max_ms") is not None:
        pause = f"{fmt_ms(gc.get('max_ms'))} (gen {fmt_int(gc.get('max_generation'))})"
    cells = [
        f'<td class="route">{esc(clip(one.get("service"), 80))} / {esc(clip(one.get("thread"), 80))}</td>',
        f"<td>{fmt_int(one.get('windows'))}</td><td>{fmt_int(one.get('processes'))}</td>",
        f"<td>{fmt_pct(busy.get('p50'))}</td><td>{fmt_pct(busy.get('p95'))}</td>",
        *(f"<td>{fmt_pct(share.get(k))}</td>" for k in ("requests", "gc", "tracekit", "background")),
        f"<td>{esc(counts)}</td><td>{esc(pause)}</td>",
        *(f"<td>{fmt_ms(lag.get(k))}</td>" for k in ("p50", "p95", "max")),
        f"<td>{fmt_int(one.get('tasks_max'))}</td>",
    ]
    return f"<tr>{''.join(cells)}</tr>"


def _profile(one: Mapping[str, Any]) -> str:
    # The loop's largest pyinstrument window profile (tracekit.integrations.pyinstrument).
    profile = mapping(one.get("profile"))
    title = (f"{esc(clip(one.get('service'), 80))} / {esc(clip(one.get('thread'), 80))}: the loop "
             f"thread's call tree (pyinstrument, {fmt_ms(profile.get('sampled_ms'))} ms sampled; "
             f"{esc(clip(profile.get('reason'), 200))})")  # fmt: skip
    return profile_details(title, profile)
