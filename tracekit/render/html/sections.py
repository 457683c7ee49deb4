"""The HTML report's sections, each a function from (part of) the report dict to HTML.

Reads are tolerant (missing or null optional keys say "not available" in the page), and every
trace-derived value passes through :func:`esc`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracekit.analysis.rules.findings import SEVERITIES, severity_rank
from tracekit.render.html.charts import breakdown_chart, projection_bars, waterfall
from tracekit.render.html.util import (
    clip,
    esc,
    fmt_int,
    fmt_ms,
    fmt_pct,
    fmt_rps,
    items,
    mapping,
    num,
    profile_details,
)
from tracekit.render.text import model_words

_PCTS = ("p50", "p90", "p95", "p99")


def header(report: Mapping[str, Any]) -> str:
    """Title, navigation and the summary cards (source, requests, services, SLO, validation).

    Args:
        report: the report dict.

    Returns:
        The ``<header>`` HTML.
    """
    services = [s for s in report.get("services") or [] if isinstance(s, str)]
    findings = items(report.get("findings"))
    counts = {sev: sum(1 for f in findings if f.get("severity") == sev) for sev in SEVERITIES}
    found = ", ".join(f"{n} {sev}" for sev, n in counts.items() if n) or "none"
    cards = [
        ("source", esc(clip(report.get("source") or "unknown", 200))),
        ("requests", fmt_int(report.get("requests"))),
        ("spans", fmt_int(report.get("spans"))),
        ("services", esc(clip(", ".join(services), 200)) or "–"),
        ("instrumented", _instrumented(report.get("instrumented"))),
        ("SLO", esc(_slo_text(report.get("slo")))),
        ("replay model", _validation(report.get("validation"))),
        ("findings", esc(f"{len(findings)} ({found})" if findings else "none")),
    ]
    cells = "".join(f"<div><dt>{name}</dt><dd>{value}</dd></div>" for name, value in cards)
    nav = "".join(
        f'<a href="#{anchor}">{label}</a>'
        for anchor, label in (
            ("findings", "Findings"),
            ("routes", "Routes"),
            ("stages", "Stages"),
            ("streaming", "Streaming"),
            ("slowest", "Slowest request"),
            ("timeline", "Event loop"),
        )
    )
    return (
        f'<header><h1>tracekit report</h1><p class="muted">What is slow on the request path, '
        f'and what change fixes it.</p><nav>{nav}</nav><dl class="meta">{cells}</dl></header>'
    )


def _instrumented(value: object) -> str:
    if value is True:
        return '<span class="status-ok">yes (tracekit attributes)</span>'
    if value is False:
        return '<span class="status-warn">no: plain OpenTelemetry</span>'
    return '<span class="status-none">unknown</span>'


def _slo_text(slo: object) -> str:
    limits = mapping(slo)
    parts = [
        f"{label} ≤ {fmt_ms(limits.get(key), True)}"
        for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e"))
        if num(limits.get(key)) is not None
    ]
    return ", ".join(parts) or "none given"


def _validation(value: object) -> str:
    if not isinstance(value, Mapping):
        return '<span class="status-none">not run</span>'
    errors = (
        f"p50 error {fmt_pct(value.get('p50_error'))}, p95 error {fmt_pct(value.get('p95_error'))}"
    )
    if value.get("ok") is True:
        return f'<span class="status-ok">validated</span> <span class="muted">({errors})</span>'
    reason = clip(value.get("reason") or errors, 200)
    return (
        f'<span class="status-warn">not validated</span> <span class="muted">({esc(reason)})</span>'
    )


def findings_section(findings: list[Mapping[str, Any]]) -> str:
    """Findings, most severe first, each with evidence, fix code and projection.

    Args:
        findings: the report's ``findings[]``.

    Returns:
        The section HTML (a "no findings" note when empty).
    """
    if not findings:
        return (
            '<section id="findings"><h2>Findings</h2><p class="empty">No findings: nothing on '
            "the request path matched a rule.</p></section>"
        )
    ordered = sorted(
        findings, key=lambda f: (severity_rank(f.get("severity")), -(num(f.get("impact_ms")) or 0.0))
    )
    return (
        '<section id="findings"><h2>Findings</h2>'
        + "".join(_finding(f) for f in ordered)
        + "</section>"
    )


def _finding(f: Mapping[str, Any]) -> str:
    sev = f.get("severity") if f.get("severity") in SEVERITIES else "low"
    where = [("route", f.get("route")), ("stage", f.get("stage")), ("function", f.get("function"))]
    where_html = " · ".join(f"{name} <code>{esc(clip(v, 200))}</code>" for name, v in where if v)
    impact = num(f.get("impact_ms"))
    impact_html = f'<span class="impact">impact {fmt_ms(impact, True)}</span>' if impact else ""
    fix = mapping(f.get("fix"))
    fix_html = ""
    if fix.get("title") or fix.get("code"):
        fix_html = f'<div class="fix-title">Fix: {esc(fix.get("title") or "")}</div>'
        if fix.get("code"):
            fix_html += f"<pre><code>{esc(fix.get('code'))}</code></pre>"
    projection = f.get("projection")
    proj_html = projection_bars(projection) if isinstance(projection, Mapping) else ""
    if not proj_html:
        note = f.get("projection_note") or "no projection for this finding"
        proj_html = f'<p class="note">No projection: {esc(note)}</p>'
    elif isinstance(projection, Mapping) and isinstance(projection.get("model"), Mapping):
        proj_html += f'<p class="note">Assumed: {esc(model_words(projection["model"]))}</p>'
    reason = f.get("severity_reason")
    reason_html = f'<p class="note">{esc(str(sev).upper())}: {esc(reason)}</p>' if reason else ""
    return (
        f'<article class="card finding"><header><span class="badge sev-{sev}">{sev}</span>'
        f'<span class="rule">{esc(f.get("rule") or "finding")}</span>'
        f'<span class="where">{where_html}</span>{impact_html}</header>'
        f"{reason_html}<p>{esc(f.get('evidence') or '')}</p>{fix_html}{proj_html}</article>"
    )


def routes_section(routes: list[Mapping[str, Any]]) -> str:
    """Per-route requests, errors, throughput, latency percentiles and the breakdown chart.

    Args:
        routes: the report's ``routes[]``.

    Returns:
        The section HTML.
    """
    if not routes:
        return (
            '<section id="routes"><h2>Routes</h2>'
            '<p class="empty">No requests were found.</p></section>'
        )
    head = (
        "<tr><th>route</th><th>requests</th><th>errors</th><th>req/s</th>"
        + "".join(f"<th>{p}</th>" for p in (*_PCTS, "max"))
        + "</tr>"
    )
    rows = []
    for r in routes:
        lat = mapping(r.get("latency_ms"))
        cells = "".join(f"<td>{fmt_ms(lat.get(p))}</td>" for p in (*_PCTS, "max"))
        rows.append(
            f'<tr><td class="route">{esc(clip(r.get("route"), 200))}</td>'
            f"<td>{fmt_int(r.get('requests'))}</td><td>{fmt_int(r.get('errors'))}</td>"
            f"<td>{fmt_rps(r.get('throughput_rps'))}</td>{cells}</tr>"
        )
    return (
        '<section id="routes"><h2>Routes</h2><p class="note">Latency in milliseconds.</p>'
        f'<div class="tablewrap"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        "</table></div><h3>Where the time goes</h3>" + breakdown_chart(routes)
        + _model_split_table(routes) + _after_response_table(routes) + "</section>"
    )


def _after_response_table(routes: list[Mapping[str, Any]]) -> str:
    # CPU the requests' work used after their responses (not in the latency), where any.
    rows = []
    for r in routes:
        after = r.get("after_response_cpu_ms")
        if not isinstance(after, Mapping):
            continue
        rows.append(
            f'<tr><td class="route">{esc(clip(r.get("route"), 200))}</td>'
            f"<td>{fmt_ms(after.get('cpu_on_loop'))}</td><td>{fmt_ms(after.get('cpu_off_loop'))}</td></tr>"
        )
    if not rows:
        return ""
    return (
        "<h3>After the response</h3><p class=\"note\">Mean ms of CPU per request that the "
        "requests' work used once their responses were sent (background tasks, spend logging): "
        "not in the latency above, but it holds the event loop for the requests after it.</p>"
        '<div class="tablewrap"><table><thead><tr><th>route</th><th>on the loop</th>'
        f'<th>off it</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


_SPLIT_KEYS = ("network", "queue", "prefill", "decode")


def _model_split_table(routes: list[Mapping[str, Any]]) -> str:
    # The model wait split by the model server's own spans (vLLM's llm_request), where any.
    rows = []
    for r in routes:
        split = r.get("model_wait_split_ms")
        if not isinstance(split, Mapping):
            continue
        cells = "".join(f"<td>{fmt_ms(split.get(k))}</td>" for k in _SPLIT_KEYS)
        rows.append(
            f'<tr><td class="route">{esc(clip(r.get("route"), 200))}</td>'
            f"<td>{fmt_int(split.get('requests'))}</td>{cells}</tr>"
        )
    if not rows:
        return ""
    head = "<tr><th>route</th><th>requests</th>" + "".join(f"<th>{k}</th>" for k in _SPLIT_KEYS) + "</tr>"
    return (
        "<h3>Model wait, from the model server's spans</h3><p class=\"note\">Mean ms per request "
        "over the requests whose model calls the server's span joined.</p>"
        f'<div class="tablewrap"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        "</table></div>"
    )


def stages_section(routes: list[Mapping[str, Any]]) -> str:
    """One table of stages per route (wall/cpu/wait/loop wait p50 and p95, loop, max block).

    Args:
        routes: the report's ``routes[]``.

    Returns:
        The section HTML.
    """
    tables = [_stage_table(r) for r in routes if items(r.get("stages"))]
    body = "".join(tables) or '<p class="empty">No stages were recorded.</p>'
    return f'<section id="stages"><h2>Stages</h2>{body}</section>'


def _stage_table(route: Mapping[str, Any]) -> str:
    groups = (
        ("wall_ms", "wall"),
        ("cpu_ms", "cpu"),
        ("wait_ms", "wait"),
        ("loop_wait_ms", "loop wait"),
    )
    head = (
        '<tr><th class="l">stage</th><th class="l">kind</th><th>count</th>'
        + "".join(f"<th>{label} p50</th><th>{label} p95</th>" for _, label in groups)
        + '<th>on loop</th><th>max block</th><th class="l">where</th></tr>'
    )
    rows = []
    for s in items(route.get("stages")):
        cells = "".join(
            f"<td>{fmt_ms(mapping(s.get(k)).get('p50'))}</td>"
            f"<td>{fmt_ms(mapping(s.get(k)).get('p95'))}</td>"
            for k, _ in groups
        )
        on_loop = _yes_no(s.get("on_loop"))
        where = "<br>".join(
            f"<code>{esc(clip(v, 120))}</code>"
            for v in (s.get("function"), s.get("blocked_at"))
            if v
        )
        rows.append(
            f'<tr><td class="l">{esc(clip(s.get("stage"), 80))}</td>'
            f'<td class="l">{esc(clip(s.get("kind"), 30))}</td>'
            f"<td>{fmt_int(s.get('count'))}</td>{cells}<td>{on_loop}</td>"
            f'<td>{fmt_ms(s.get("max_block_ms"))}</td><td class="l">{where}</td></tr>'
        )
    return (
        f'<h3>{esc(clip(route.get("route"), 200))}</h3><div class="tablewrap"><table>'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
        + "".join(_profile(s) for s in items(route.get("stages")))
    )


def _profile(stage: Mapping[str, Any]) -> str:
    # A stage's pyinstrument call tree (tracekit.integrations.pyinstrument), when recorded.
    profile = mapping(stage.get("profile"))
    title = (f"{esc(clip(stage.get('stage'), 80))}: call tree (pyinstrument, the profiled call "
             f"that sampled {fmt_ms(profile.get('sampled_ms'))} ms)")  # fmt: skip
    return profile_details(title, profile)


def _yes_no(value: object) -> str:
    return "yes" if value is True else "no" if value is False else "–"


def streaming_section(routes: list[Mapping[str, Any]], slo: object) -> str:
    """TTFT/ITL/TPOT percentiles of streamed routes and goodput against the SLO, when present.

    Args:
        routes: the report's ``routes[]``.
        slo: the report's ``slo`` (for the goodput caption).

    Returns:
        The section HTML (a note when no route streamed and no goodput was computed).
    """
    stream_rows, good_rows = [], []
    for r in routes:
        name = esc(clip(r.get("route"), 200))
        streaming = mapping(r.get("streaming"))
        for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT")):
            pcts = mapping(streaming.get(key))
            if pcts:
                cells = "".join(f"<td>{fmt_ms(pcts.get(p))}</td>" for p in _PCTS)
                stream_rows.append(
                    f'<tr><td class="route">{name}</td><td class="l">{label}</td>{cells}</tr>'
                )
        goodput = mapping(r.get("goodput"))
        if goodput:
            good_rows.append(
                f'<tr><td class="route">{name}</td><td>{fmt_rps(goodput.get("rps"))}</td>'
                f"<td>{fmt_pct(goodput.get('fraction'), 1)}</td></tr>"
            )
    parts = ['<section id="streaming"><h2>Streaming and goodput</h2>']
    if stream_rows:
        head = '<tr><th>route</th><th class="l">metric</th>' + "".join(
            f"<th>{p}</th>" for p in _PCTS
        )
        parts.append(
            '<p class="note">TTFT: request start to first non-empty chunk; ITL: gaps between '
            "chunks; TPOT: (last − first chunk) / (chunks − 1). Milliseconds.</p>"
            f'<div class="tablewrap"><table><thead>{head}</tr></thead>'
            f"<tbody>{''.join(stream_rows)}</tbody></table></div>"
        )
    else:
        parts.append('<p class="empty">No streamed responses were recorded.</p>')
    if good_rows:
        parts.append(
            f'<h3>Goodput</h3><p class="note">Requests meeting every SLO '
            f'({esc(_slo_text(slo))}).</p><div class="tablewrap"><table><thead><tr>'
            "<th>route</th><th>good req/s</th><th>fraction</th></tr></thead>"
            f"<tbody>{''.join(good_rows)}</tbody></table></div>"
        )
    elif mapping(slo):
        parts.append('<p class="note">Goodput was not computed for any route.</p>')
    else:
        parts.append(
            '<p class="note">No SLO given (<code>--slo ttft=500ms,itl=50ms,e2e=5s</code>), '
            "so there is no goodput.</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def slowest_section(slowest: object) -> str:
    """The slowest request as a waterfall.

    Args:
        slowest: the report's ``slowest`` (``None`` when there were no requests).

    Returns:
        The section HTML.
    """
    if not isinstance(slowest, Mapping):
        return (
            '<section id="slowest"><h2>Slowest request</h2><p class="empty">No request to '
            "show.</p></section>"
        )
    caption = (
        f"Trace <code>{esc(clip(slowest.get('trace_id'), 64))}</code> · "
        f"{esc(clip(slowest.get('route'), 200))} · {fmt_ms(slowest.get('wall_ms'), True)}"
    )
    return (
        f'<section id="slowest"><h2>Slowest request</h2><p>{caption}</p>'
        + waterfall(slowest)
        + "</section>"
    )
