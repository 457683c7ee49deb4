"""The report for a terminal: ``render_text(report) -> str``.

Adapts to where it is printed (STYLE §16): the width from the terminal (or given), ANSI colour
only when the stream is a TTY and ``NO_COLOR`` is unset (``FORCE_COLOR`` or ``color=True``
forces it on), and box-drawing/arrows only when the stream's encoding can encode them. Every
choice can be overridden by an argument. Reads ``report.to_dict()`` (or the dict itself), so
a report loaded from JSON renders the same.

Trace text cannot drive the terminal: every string of the report (keys included) passes
through :func:`escape_controls` before it is laid out, so control characters (C0, DEL, C1
such as U+009B CSI), bidirectional overrides and line separators from a span name, a route,
an attribute or a loaded JSON report are shown as visible escapes (``\\x1b``, ``\\u202e``),
never sent. The only control characters in the output are the renderer's own: newlines and,
when colour is on, its SGR colour codes.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
import textwrap
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from tracekit.analysis.rules.findings import SEVERITIES
from tracekit.analysis.stats.loop_windows import HOST_SHORT_SHARE

_MIN_WIDTH = 40
_BAR = 24


@dataclass(frozen=True)
class Palette:
    """ANSI codes for each role; all empty when colour is off."""

    bold: str = ""
    dim: str = ""
    red: str = ""
    yellow: str = ""
    green: str = ""
    cyan: str = ""
    reset: str = ""


COLOR = Palette("\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[36m", "\x1b[0m")
PLAIN = Palette()


@dataclass(frozen=True)
class Glyphs:
    """The characters used for bars, arrows and separators."""

    full: str
    empty: str
    arrow: str
    le: str
    dot: str


UNICODE = Glyphs("█", "░", "→", "≤", "·")
ASCII = Glyphs("#", ".", "->", "<=", "-")


#: What a terminal could act on: C0 controls, DEL and C1 controls (U+009B is CSI, U+0085 NEL),
#: the Unicode bidi controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069: "Trojan
#: Source" reordering), the line and paragraph separators, and lone surrogates.
_OTHERS = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_IN_CODE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")  # keeps \t and \n
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
#: Containers deeper than this are not rendered, so not escaped either (dropped).
_MAX_DEPTH = 12


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}")


def escape_controls(text: str, *, code: bool = False) -> str:
    """``text`` with every character a terminal could act on shown as a visible escape.

    Args:
        text: trace text (a span name, a route, an error message...).
        code: keep newlines and tabs (a multi-line code block the renderer lays out itself).

    Returns:
        The text: ESC becomes ``\\x1b``, U+009B ``\\u009b``, U+202E ``\\u202e``, a newline
        ``\\n`` (unless ``code``); everything else, backslashes included, is unchanged.
    """
    pattern = _UNSAFE_IN_CODE if code else _UNSAFE
    return pattern.sub(_escape, text) if pattern.search(text) else text


def _escaped(value: Any, depth: int = 0, *, code: bool = False) -> Any:
    # The report as the renderer lays it out: every string (keys too) escaped. Only a fix's
    # "code" keeps its newlines and tabs; the renderer places each of its lines.
    if isinstance(value, str):
        return escape_controls(value, code=code)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {
            escape_controls(str(k)): _escaped(v, depth + 1, code=k == "code")
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_escaped(v, depth + 1) for v in value]
    return escape_controls(str(value))


def use_color(stream: TextIO) -> bool:
    """Whether to colour ``stream``: a TTY and ``NO_COLOR`` unset, or ``FORCE_COLOR`` set."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def use_unicode(stream: TextIO) -> bool:
    """Whether ``stream``'s encoding can encode the unicode glyphs."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "".join(vars(UNICODE).values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def render_text(
    report: Any,
    *,
    width: int | None = None,
    color: bool | None = None,
    unicode: bool | None = None,
    stream: TextIO | None = None,
) -> str:
    """Render a report as text.

    Args:
        report: a ``Report`` or its ``to_dict()``.
        width: columns; ``None``: the terminal's (80 when unknown); at least 40 is used.
        color: ANSI colour; ``None``: decided by :func:`use_color` for ``stream``.
        unicode: unicode glyphs; ``None``: decided by :func:`use_unicode` for ``stream``.
        stream: the stream the text is for (default ``sys.stdout``), for the decisions above.

    Returns:
        The text, ending with a newline.
    """
    out = stream if stream is not None else sys.stdout
    data: Mapping[str, Any] = _escaped(report.to_dict() if hasattr(report, "to_dict") else report)
    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    r = _Renderer(
        width=max(width, _MIN_WIDTH),
        p=COLOR if (use_color(out) if color is None else color) else PLAIN,
        g=UNICODE if (use_unicode(out) if unicode is None else unicode) else ASCII,
    )
    return r.render(data)


#: A route with no stages whose requests take under this share of all requests' time is
#: listed in one line, not as a section: a readiness probe or a docs page has nothing on its
#: request path to fix, and fixing it could save under 1% of the service's request time.
MINOR_SHARE = 0.01


def minor_routes(routes: list[Mapping[str, Any]]) -> set[int]:
    """The ``id()`` of each route listed in one line rather than as a section.

    Args:
        routes: the report's routes.

    Returns:
        Routes without stages or errors whose requests x p50 latency is under
        :data:`MINOR_SHARE` of the sum over all routes (never every route: with nothing else,
        they are shown).
    """
    def time(r: Mapping[str, Any]) -> float:
        p50: Any = (r.get("latency_ms") or {}).get("p50")
        return _int(r.get("requests")) * (float(p50) if _is_number(p50) else 0.0)

    total = sum(time(r) for r in routes)
    # A route with errors always gets its section: its errors would go unsaid in one line.
    minor = {
        id(r)
        for r in routes
        if not r.get("stages") and not _int(r.get("errors")) and time(r) < MINOR_SHARE * total
    }
    return minor if len(minor) < len(routes) else set()


def fmt_ms(value: Any) -> str:
    """A duration in ms with 3 significant digits (``-`` when unknown)."""
    if not _is_number(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


class _Renderer:
    def __init__(self, *, width: int, p: Palette, g: Glyphs) -> None:
        self.width = width
        self.p = p
        self.g = g
        self.lines: list[str] = []

    def render(self, d: Mapping[str, Any]) -> str:
        self._header(d)
        routes = [r for r in d.get("routes") or [] if isinstance(r, Mapping)]
        minor = minor_routes(routes)
        for route in routes:
            if id(route) not in minor:
                self._route(route)
        self._minor_routes([r for r in routes if id(r) in minor])
        self._loop(d.get("loop"), {str(r.get("route")) for r in routes if id(r) in minor})
        self._findings(d.get("findings") or [], bool(d.get("requests")))
        return "\n".join(line.rstrip() for line in self.lines) + "\n"

    # --- primitives ---------------------------------------------------------------------------
    def _add(self, text: str = "") -> None:
        self.lines.append(text)

    def _wrap(self, text: str, indent: int, tone: str = "", hang: int = 0) -> None:
        # Wrapped on the plain text, so that colour codes never count as columns.
        pad = " " * indent
        lines = textwrap.wrap(
            text, self.width - indent, subsequent_indent=" " * hang, break_on_hyphens=False
        )
        end = self.p.reset if tone else ""
        self.lines.extend(f"{pad}{tone}{line}{end}" for line in lines or [""])

    def _name(self, text: str, indent: int, tone: str = "") -> None:
        # A name or a location, whole: wrapped at the width (a long path breaks anywhere,
        # continued under it), never cut.
        self._wrap(" ".join(text.split()), indent, tone, hang=2)

    def _code(self, line: str) -> None:
        # Nothing of the fix is cut, and what is printed still runs when pasted: a comment
        # wider than the width continues as a comment (aligned with it, or 4 columns in after
        # code); a statement breaks only inside its brackets, after a "(" or a ",", and
        # continues 4 columns in (Python joins lines there); one that cannot stays whole.
        line = "".join(c if c.isprintable() else " " for c in line.expandtabs(4)).rstrip()
        limit = self.width - 6
        indent = len(line) - len(line.lstrip())
        comment = line.find("#")  # a comment (or a "#" in a string: then one more is harmless)
        if len(line) <= limit:
            parts = [line]
        elif comment == indent:
            parts = textwrap.wrap(line, limit, subsequent_indent=" " * indent + "# ",
                                  break_on_hyphens=False)  # fmt: skip
        elif 0 <= comment < limit and len(line[:comment].rstrip()) < limit:
            parts = textwrap.wrap(line, limit, subsequent_indent=" " * (indent + 4) + "# ",
                                  break_on_hyphens=False)  # fmt: skip
            if len(parts[0]) <= comment:  # the break fell inside the code
                parts = _statement(line, limit, indent)
        else:
            parts = _statement(line, limit, indent)
        for part in parts:
            self._add(f"      {self.p.cyan}{part}{self.p.reset}")

    def _cut(self, text: str, limit: int) -> str:
        text = " ".join(text.split())  # trace text may hold newlines and tabs
        if len(text) <= limit:
            return text
        return text[: max(limit - 1, 1)] + ("…" if self.g is UNICODE else "~")

    # --- sections -----------------------------------------------------------------------------
    def _header(self, d: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        source = self._cut(str(d.get("source", "")), self.width - 18)
        self._add(f"{p.bold}tracekit report{p.reset} {g.dot} {source}")
        services = ", ".join(str(s) for s in d.get("services") or []) or "unknown"
        kind = "tracekit-instrumented" if d.get("instrumented") else "plain OpenTelemetry"
        spans, requests = _int(d.get("spans")), _int(d.get("requests"))
        self._wrap(
            f"{_count(spans, 'span')} {g.dot} {_count(requests, 'request')} {g.dot} "
            f"services: {services} {g.dot} {kind}",
            0,
        )
        slo = d.get("slo")
        if isinstance(slo, Mapping):
            parts = [
                f"{key.removesuffix('_ms')} {g.le} {fmt_ms(value)} ms"
                for key, value in slo.items()
                if value is not None
            ]
            self._wrap(f"SLO: {', '.join(parts)}", 0)
        validation = d.get("validation")
        if isinstance(validation, Mapping):
            self._validation(validation)

    def _validation(self, v: Mapping[str, Any]) -> None:
        if v.get("ok"):
            text = (
                "Replay model: validated against the recording (p50 error "
                f"{_pct(v.get('p50_error'))}, p95 error {_pct(v.get('p95_error'))})"
            )
            model = v.get("model")
            tolerance: Any = model.get("tolerance") if isinstance(model, Mapping) else None
            errors: list[Any] = [e for e in (v.get("p50_error"), v.get("p95_error")) if _is_number(e)]
            if _is_number(tolerance) and any(abs(e) > tolerance for e in errors):
                text += (f"; an error over ±{tolerance:.0%} is inside the measured percentile's "
                         "95% interval (latencies in groups, a percentile between them)")
            self._wrap(text, 0, self.p.green)
        else:
            reason = v.get("reason") or "unknown reason"
            self._wrap(f"Replay model: not validated, so no replayed projections (the queueing "
                       f"model's, which replays nothing, still stand): {reason}", 0, self.p.dim)
        model = v.get("model")
        if isinstance(model, Mapping):
            self._wrap(f"assumed: {model_words(model)}", 2, self.p.dim, hang=2)

    def _route(self, r: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        self._add()
        self._name(str(r.get("route")), 0, p.bold + p.cyan)
        errors = _int(r.get("errors"))
        err = f"{p.red}{_count(errors, 'error')}{p.reset}" if errors else "0 errors"
        self._add(
            f"  {_count(_int(r.get('requests')), 'request')} {g.dot} {err} {g.dot} "
            f"{_rps(r.get('throughput_rps'))}"
        )
        lat = r.get("latency_ms") or {}
        cells = "  ".join(f"{k} {fmt_ms(lat.get(k))}" for k in ("p50", "p90", "p95", "p99", "max"))
        self._wrap(f"latency ms    {cells}", 2, hang=14)
        self._breakdown(r.get("breakdown_ms") or {})
        self._model_split(r.get("model_wait_split_ms"))
        self._after_response(r.get("after_response_cpu_ms"))
        self._streaming(r.get("streaming"))
        goodput = r.get("goodput")
        if isinstance(goodput, Mapping):
            self._wrap(
                f"goodput       {_rps(goodput.get('rps'))} "
                f"({_pct(goodput.get('fraction'))} of requests meet the SLO)",
                2,
                hang=14,
            )
        self._stages(r.get("stages") or [])

    def _breakdown(self, b: Mapping[str, Any]) -> None:
        values = {k: v for k, v in b.items() if _is_number(v)}
        if not values:
            self._wrap("breakdown     no tracekit attributes: wall time only", 2, self.p.dim)
            return
        self._add("  breakdown     mean ms per request")
        top = max(max(values.values()), 1e-9)
        bar = max(0, min(_BAR, self.width - 34))
        for key, value in values.items():
            filled = max(0, min(bar, round(bar * value / top)))
            drawn = self.g.full * filled + self.g.empty * (bar - filled)
            self._add(f"    {key.replace('_', ' '):<13} {drawn} {fmt_ms(value):>8}")

    def _model_split(self, split: Any) -> None:
        # The model wait of calls the model server's own span joined (vLLM's llm_request).
        if not isinstance(split, Mapping):
            return
        cells = f" {self.g.dot} ".join(
            f"{key} {fmt_ms(split.get(key))}" for key in ("network", "queue", "prefill", "decode")
        )
        self._wrap(
            f"model wait    {cells} ms per request, from the model server's spans "
            f"({_count(_int(split.get('requests')), 'request')})",
            2,
            hang=14,
        )

    def _after_response(self, after: Any) -> None:
        # CPU the requests' work used once their responses were sent (not in the latency).
        if not isinstance(after, Mapping):
            return
        on, off = after.get("cpu_on_loop"), after.get("cpu_off_loop")
        text = f"after response {fmt_ms(on)} ms CPU per request on the loop"
        if isinstance(off, (int, float)) and off > 0:
            text += f", {fmt_ms(off)} off it"
        self._wrap(text + " (background tasks, spend logging: not in the latency, holds the loop)",
                   2, hang=14)  # fmt: skip

    def _streaming(self, s: Any) -> None:
        if not isinstance(s, Mapping):
            return
        labels = {"ttft_ms": "TTFT ms", "itl_ms": "ITL ms", "tpot_ms": "TPOT ms"}
        for key, label in labels.items():
            q = s.get(key) or {}
            if any(v is not None for v in q.values()):
                cells = "  ".join(f"{k} {fmt_ms(v)}" for k, v in q.items())
                self._wrap(f"{label:<13} {cells}", 2, hang=14)
        self._wrap("(ITL: each request's own p95 inter-chunk gap)", 16, self.p.dim)

    def _stages(self, stages: list[Mapping[str, Any]]) -> None:
        if not stages:
            return
        # Optional columns are dropped from the right until the table fits the width.
        # The kind column fits the longest kind ("unspecified" from a foreign span), up to
        # _KIND_MAX: only a kind longer than any the readers make is cut.
        kind_w = min(_KIND_MAX, max(9, *(len(str(s.get("kind"))) for s in stages)))
        columns = [c for c in _STAGE_COLUMNS]
        while columns and 15 + kind_w + sum(w + 1 for _, w, _ in columns) > self.width:
            columns.pop()
        name_w = max(8, min(28, self.width - 7 - kind_w - sum(w + 1 for _, w, _ in columns)))
        head = f"    {'stage':<{name_w}} {'kind':<{kind_w}}" + "".join(f" {h:>{w}}" for h, w, _ in columns)
        self._add("  stages")
        self._add(self.p.dim + head + self.p.reset)
        for stage in stages:
            cells = "".join(f" {get(stage):>{w}}" for _, w, get in columns)
            name = str(stage.get("stage"))
            if len(name) > name_w:
                # A name wider than its column gets lines of its own, whole (wrapped at the
                # width): names sharing a prefix (fastapi.endpoint, fastapi.serialization)
                # stay apart, and no column is dropped for them.
                self._name(name, 4)
                name = ""
            self._add(f"    {name:<{name_w}} {self._cut(str(stage.get('kind')), kind_w):<{kind_w}}{cells}")
            if stage.get("function"):
                self._name(str(stage["function"]), 6, self.p.dim)
            if stage.get("blocked_at"):
                self._name(f"blocked at {stage['blocked_at']}", 6, self.p.dim)

    def _minor_routes(self, minor: list[Mapping[str, Any]]) -> None:
        if not minor:
            return
        g = self.g
        listed = ", ".join(
            f"{r.get('route')} ({_count(_int(r.get('requests')), 'request')}, p50 "
            f"{fmt_ms((r.get('latency_ms') or {}).get('p50'))} ms)"
            for r in minor
        )
        self._add()
        self._wrap(
            f"Also seen {g.dot} no stages, under {MINOR_SHARE:.0%} of the request time "
            f"(probes, docs): {listed}",
            0, self.p.dim, hang=2,
        )  # fmt: skip

    def _loop(self, loop: Any, minor: set[str] | None = None) -> None:
        # The loop view: per event loop, busy share, its CPU split, GC and lag; each route's
        # share of its loop's CPU. Absent (null) for traces without tracekit.loop windows.
        if not isinstance(loop, Mapping):
            return
        p, g = self.p, self.g
        for one in loop.get("loops") or []:
            if not isinstance(one, Mapping):
                continue
            self._add()
            n = _int(one.get("processes")) or 1
            self._wrap(
                f"{p.bold}event loop {one.get('service') or '?'}/{one.get('thread')}{p.reset} "
                f"{g.dot} {_count(_int(one.get('windows')), 'window')} "
                f"({_int(one.get('window_s')):,} s{' of loop time, all processes' if n > 1 else ''}) "
                f"{g.dot} {_count(n, 'process')}", 0)
            busy = one.get("busy") or {}
            self._wrap("busy          " + "  ".join(
                f"{k} {_pct0(busy.get(k))}" for k in ("p50", "p95", "max")), 2, hang=14)
            rows = [r for r in one.get("by_process") or [] if isinstance(r, Mapping)]
            if rows:  # the windows above pool the processes: a hot one hides among them
                self._wrap("by process    " + f" {g.dot} ".join(
                    f"pid {_int(r.get('pid'))} busy {_pct0(r.get('busy_mean'))} "
                    f"({_count(_int(r.get('windows')), 'window')})" for r in rows), 2, hang=14)
            waited = one.get("cpu_wait")
            if isinstance(waited, Mapping) and _is_number(waited.get("share")):
                short = ""
                if waited["share"] >= HOST_SHORT_SHARE:
                    short = (": the host is short of CPU, and this time is inside the steps' "
                             "and waits' wall time (not the application's doing)")
                self._wrap(f"waited for a CPU {fmt_ms(waited.get('ms'))} ms "
                           f"({_pct(waited.get('share'))} of the time){short}", 2, hang=14)
            cpu = one.get("cpu_ms") or {}
            share = one.get("cpu_share") or {}
            parts = f" {g.dot} ".join(f"{k} {_pct0(share.get(k))}" for k in
                                      ("requests", "gc", "tracekit", "background"))
            self._wrap(f"loop CPU      {fmt_ms(cpu.get('total'))} ms: {parts}", 2, hang=14)
            named_tasks = [t for t in one.get("background_tasks") or [] if isinstance(t, Mapping)]
            if named_tasks:
                named = ", ".join(f"{t.get('task')} {fmt_ms(t.get('cpu_ms'))} ms" for t in named_tasks)
                self._wrap(f"background    tasks of no request: {named}", 2, hang=14)
            gc = one.get("gc") or {}
            counts = [_int(c) for c in gc.get("counts") or []]
            longest = ""
            if _is_number(gc.get("max_ms")):
                longest = (f", longest {fmt_ms(gc.get('max_ms'))} ms (generation "
                           f"{_int(gc.get('max_generation'))})")
            self._wrap(
                f"GC            {_count(sum(counts), 'collection')} "
                f"({'/'.join(map(str, counts))} by generation), {fmt_ms(gc.get('pause_ms'))} ms "
                f"paused ({_pct(gc.get('share'))}){longest}", 2, hang=14)
            lag = one.get("lag_ms")
            if isinstance(lag, Mapping):
                self._wrap("lag ms        " + "  ".join(
                    f"{k} {fmt_ms(lag.get(k))}" for k in ("p50", "p95", "max")), 2, hang=14)
            tasks, inflight = (one.get(k) for k in ("tasks_max", "inflight_max"))
            # Both are snapshots, not maxima over time (the request counts above are those).
            self._wrap(f"most tasks {_int(tasks) if _is_number(tasks) else '-'} (counted once a "
                       f"window) {g.dot} most requests in flight at a window's end "
                       f"{_int(inflight) if _is_number(inflight) else '-'}", 2, hang=4)  # fmt: skip
            for route in loop.get("routes") or []:
                if isinstance(route, Mapping) and route.get("service") == one.get("service") \
                        and str(route.get("route")) not in (minor or ()):  # fmt: skip
                    self._wrap(f"{self._cut(str(route.get('route')), self.width // 2)}: "
                               f"{_pct0(route.get('loop_cpu_share'))} of the loop's CPU "
                               f"({fmt_ms(route.get('cpu_on_loop_ms'))} ms)", 2, hang=4)

    def _findings(self, findings: list[Mapping[str, Any]], any_requests: bool) -> None:
        p = self.p
        self._add()
        if not findings:
            if any_requests:
                self._wrap("No findings: nothing on the request path stands out.", 0, p.green)
            else:
                self._add("No requests found.")
            return
        self._add(f"{p.bold}Findings ({len(findings)}){p.reset}")
        for f in findings:
            self._finding(f)

    def _finding(self, f: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        severity = str(f.get("severity", "low"))
        tone = {"high": p.red, "medium": p.yellow}.get(severity, p.dim)
        where = [str(f.get("route") or "")]
        if f.get("stage"):
            where.append(f"{g.dot} {f['stage']}")
        if f.get("function"):
            where.append(f"({f['function']})")
        label = self._cut(severity.upper() if severity in SEVERITIES else severity, 8)
        rule = self._cut(str(f.get("rule")), self.width - 3 - len(label))
        self._add()
        self._add(f"  {tone}{p.bold}{label}{p.reset} {p.bold}{rule}{p.reset}")
        self._wrap(" ".join(where), 4)
        if f.get("severity_reason"):
            self._wrap(f"{label}: {f['severity_reason']}", 4, tone, hang=2)
        self._wrap(str(f.get("evidence") or ""), 4)
        if _is_number(f.get("impact_ms")):
            self._add(f"    impact: {fmt_ms(f['impact_ms'])} ms per request")
        fix = f.get("fix")
        if isinstance(fix, Mapping):
            self._wrap(f"fix: {fix.get('title', '')}", 4, hang=5)
            for line in str(fix.get("code") or "").splitlines():
                self._code(line)
        self._projection(f)

    def _projection(self, f: Mapping[str, Any]) -> None:
        g = self.g
        proj = f.get("projection")
        if not isinstance(proj, Mapping):
            note = f.get("projection_note")
            if note:
                self._wrap(f"no projection: {note}", 4, self.p.dim, hang=2)
            return
        parts = []
        spread = proj.get("range")
        spread = spread if isinstance(spread, Mapping) else {}
        for key, label, unit in _PROJECTED:
            pair = proj.get(key)
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                part = f"{label} {fmt_ms(pair[0])} {g.arrow} {fmt_ms(pair[1])}"
                bounds = spread.get(key)
                if isinstance(bounds, (list, tuple)) and len(bounds) == 2:
                    low, high = sorted(bounds) if all(map(_is_number, bounds)) else bounds
                    part += f" ({fmt_ms(low)} to {fmt_ms(high)})"
                parts.append(part + unit)
        self._wrap(f"projected: {f' {g.dot} '.join(parts)}", 4, self.p.green, hang=2)


def _statement(line: str, limit: int, indent: int) -> list[str]:
    """A code line in pieces of at most ``limit`` columns that still run when pasted, the
    pieces after the first 4 columns in. Python's tokens say where it may break: inside
    brackets after an opening one or a comma (Python joins those lines), elsewhere between
    tokens with a backslash; never in a string or a comment. A piece with no such place stays
    whole; a line that is not Python (a stray character) wraps as text."""
    inside: list[int] = []  # break columns: a newline is enough
    outside: list[int] = []  # ... a backslash is needed
    depth = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            kind, text, end = token.type, token.string, token.end[1]
            if kind == tokenize.ERRORTOKEN:
                return textwrap.wrap(line, limit, subsequent_indent=" " * (indent + 4),
                                     break_on_hyphens=False)  # fmt: skip
            if kind == tokenize.COMMENT:
                break
            if kind == tokenize.OP and text in "([{":
                depth += 1
                inside.append(end)
            elif kind == tokenize.OP and text in ")]}":
                depth -= 1
            elif kind == tokenize.OP and text == "," and depth > 0:
                inside.append(end)
            if depth == 0 and kind in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP):
                outside.append(end)
    except (tokenize.TokenError, SyntaxError):  # brackets open at the end: the breaks so far
        pass
    hang = " " * (indent + 4)
    parts, start, prefix = [], 0, ""
    while len(prefix) + len(line) - start > limit:
        fit = [b for b in inside if start < b and len(prefix) + b - start <= limit]
        joint = ""
        if not fit:  # a backslash and the space before it take two columns
            fit = [b for b in outside if start < b < len(line) and len(prefix) + b - start + 2 <= limit]
            joint = " \\"
        if not fit:
            break
        parts.append(prefix + line[start : fit[-1]].rstrip() + joint)
        start, prefix = fit[-1], hang
        while start < len(line) and line[start] == " ":
            start += 1
    parts.append(prefix + line[start:])
    return parts


def model_words(model: Mapping[str, Any]) -> str:
    """The replay's model statement (``validation.model``, ``projection.model``) in words."""
    if model.get("arrivals") == "closed":
        arrivals = f"a closed loop of {_int(model.get('clients'))} clients"
    else:
        arrivals = f"open arrivals at {_rps(model.get('rate_rps'))}"
    flight = model.get("in_flight")
    if isinstance(flight, Mapping):
        counted = f"mean {fmt_ms(flight.get('mean'))}, at most {_int(flight.get('max'))}"
        if model.get("arrivals_read_by") == "in flight":
            arrivals += f" (read from the requests in flight: {counted})"
        elif model.get("arrivals_read_by") == "think time":
            think = fmt_ms(model.get("think_ms"))
            arrivals += f" (read from their {think} ms think time; in flight: {counted})"
        else:
            arrivals += f" (requests in flight: {counted})"
    sources = {"trace": "from the trace", "--cores": "--cores"}
    source = sources.get(str(model.get("cores_source")), "this machine's: the trace does not say")
    parts = [arrivals, f"{_int(model.get('cores'))} cores ({source})"]
    if _is_number(model.get("host_others")) and _is_number(model.get("loop_cpu_share")):
        parts.append(
            f"{model['host_others']:.1f} other runnable threads on the host (read from the "
            f"loop's wait for a CPU: {1 - model['loop_cpu_share']:.0%} of its ready time)"
        )
    if model.get("host_short") is True:
        parts.append(
            "the host short of CPU: CPU a fix moves off the loop may win none from it (the "
            "range reaches that case)"
        )
    if _is_number(model.get("thread_pool_size")):
        parts.append(f"thread pool {_int(model['thread_pool_size'])}")
    return ", ".join(parts)


_PROJECTED = (("p50_ms", "p50", " ms"), ("p95_ms", "p95", " ms"), ("throughput_rps", "rps", ""))


def _q(key: str, q: str) -> Any:
    def get(stage: Mapping[str, Any]) -> str:
        values = stage.get(key)
        return fmt_ms(values.get(q) if isinstance(values, Mapping) else None)

    return get


def _pair(key: str) -> Any:
    def get(stage: Mapping[str, Any]) -> str:
        v = stage.get(key)
        v = v if isinstance(v, Mapping) else {}
        return f"{fmt_ms(v.get('p50'))}/{fmt_ms(v.get('p95'))}"

    return get


def _on_loop(stage: Mapping[str, Any]) -> str:
    value = stage.get("on_loop")
    return "yes" if value is True else "no" if value is False else "-"


#: The widest kind column of the stage table (the readers' longest kind is 11 characters).
_KIND_MAX = 16
#: Stage table columns after name and kind: (header, width, cell), most important first.
_STAGE_COLUMNS = (
    ("count", 6, lambda s: f"{_int(s.get('count')):,}"),
    ("wall p50/p95", 14, _pair("wall_ms")),
    ("cpu p50/p95", 14, _pair("cpu_ms")),
    ("wait p50", 8, _q("wait_ms", "p50")),
    ("loopw p50", 9, _q("loop_wait_ms", "p50")),
    ("loop", 4, _on_loop),
    ("max blk", 8, lambda s: fmt_ms(s.get("max_block_ms"))),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _int(value: Any) -> int:
    return int(value) if _is_number(value) else 0


def _count(n: int, noun: str) -> str:
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def _rps(value: Any) -> str:
    if not _is_number(value):
        return "- req/s"
    return f"{value:,.1f} req/s" if value >= 1 else f"{value:.3g} req/s"


def _pct(value: Any) -> str:
    return "-" if not _is_number(value) else f"{100 * value:.1f}%"


def _pct0(value: Any) -> str:
    return "-" if not _is_number(value) else f"{100 * value:.0f}%"
