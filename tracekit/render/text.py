"""The report for a terminal: ``render_text(report) -> str``.

Adapts to where it is printed (STYLE §16): the width from the terminal (or given), ANSI colour
only when the stream is a TTY and ``NO_COLOR`` is unset (``FORCE_COLOR`` or ``color=True``
forces it on), and box-drawing/arrows only when the stream's encoding can encode them. Every
choice can be overridden by an argument. Reads ``report.to_dict()`` (or the dict itself), so
a report loaded from JSON renders the same.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

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


def use_color(stream: TextIO) -> bool:
    """Whether to colour output to ``stream``: a TTY, ``NO_COLOR`` unset (or ``FORCE_COLOR`` set)."""
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
    data: Mapping[str, Any] = report.to_dict() if hasattr(report, "to_dict") else report
    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    r = _Renderer(
        width=max(width, _MIN_WIDTH),
        p=COLOR if (use_color(out) if color is None else color) else PLAIN,
        g=UNICODE if (use_unicode(out) if unicode is None else unicode) else ASCII,
    )
    return r.render(data)


def fmt_ms(value: Any) -> str:
    """A duration in ms with 3 significant digits (``-`` when unknown)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _rps(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:,.1f} req/s"


class _Renderer:
    def __init__(self, *, width: int, p: Palette, g: Glyphs) -> None:
        self.width = width
        self.p = p
        self.g = g
        self.lines: list[str] = []

    def render(self, d: Mapping[str, Any]) -> str:
        self._header(d)
        for route in d.get("routes") or []:
            self._route(route)
        self._findings(d.get("findings") or [], bool(d.get("requests")))
        return "\n".join(line.rstrip() for line in self.lines) + "\n"

    # --- pieces -----------------------------------------------------------------------------
    def _add(self, text: str = "") -> None:
        self.lines.append(text)

    def _wrap(self, text: str, indent: int) -> None:
        pad = " " * indent
        wrapped = textwrap.wrap(text, self.width - indent) or [""]
        self.lines.extend(pad + line for line in wrapped)

    def _cut(self, text: str, limit: int) -> str:
        if len(text) <= limit:
            return text
        return text[: max(limit - 1, 1)] + ("…" if self.g is UNICODE else "~")

    def _header(self, d: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        self._add(
            f"{p.bold}tracekit report{p.reset} {g.dot} {self._cut(str(d.get('source', '')), self.width - 20)}"
        )
        services = ", ".join(d.get("services") or []) or "unknown"
        kind = "tracekit-instrumented" if d.get("instrumented") else "plain OpenTelemetry"
        self._wrap(
            f"{d.get('spans', 0):,} spans {g.dot} {d.get('requests', 0):,} requests {g.dot} "
            f"services: {services} {g.dot} {kind}",
            0,
        )
        slo = d.get("slo")
        if slo:
            parts = [
                f"{key.removesuffix('_ms')} {g.le} {fmt_ms(value)} ms"
                for key, value in slo.items()
                if value is not None
            ]
            self._add(f"SLO: {', '.join(parts)}")
        validation = d.get("validation")
        if validation:
            self._validation(validation)

    def _validation(self, v: Mapping[str, Any]) -> None:
        p = self.p
        if v.get("ok"):
            self._add(
                f"Replay model: {p.green}validated{p.reset} against the recording "
                f"(p50 error {_pct(v.get('p50_error'))}, p95 error {_pct(v.get('p95_error'))})"
            )
        else:
            self._wrap(
                f"Replay model: not validated, no projections: {v.get('reason') or 'unknown'}", 0
            )

    def _route(self, r: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        self._add()
        self._add(f"{p.bold}{p.cyan}{self._cut(str(r.get('route')), self.width)}{p.reset}")
        errors = r.get("errors") or 0
        err = f"{p.red}{errors:,} errors{p.reset}" if errors else "0 errors"
        self._add(
            f"  {r.get('requests', 0):,} requests {g.dot} {err} {g.dot} {_rps(r.get('throughput_rps'))}"
        )
        lat = r.get("latency_ms") or {}
        self._add(
            "  latency ms    "
            + "  ".join(f"{k} {fmt_ms(lat.get(k))}" for k in ("p50", "p90", "p95", "p99", "max"))
        )
        self._breakdown(r.get("breakdown_ms") or {})
        self._streaming(r.get("streaming"))
        goodput = r.get("goodput")
        if goodput:
            self._add(
                f"  goodput       {_rps(goodput.get('rps'))} "
                f"({_pct(goodput.get('fraction'))} of requests meet the SLO)"
            )
        self._stages(r.get("stages") or [])

    def _breakdown(self, b: Mapping[str, Any]) -> None:
        values = {k: v for k, v in b.items() if isinstance(v, (int, float))}
        if not values:
            self._add(
                f"  breakdown     {self.p.dim}no tracekit attributes: wall time only{self.p.reset}"
            )
            return
        self._add("  breakdown     mean ms per request")
        top = max(max(values.values()), 1e-9)
        bar = min(_BAR, self.width - 34)
        for key, value in values.items():
            filled = round(bar * value / top)
            label = key.replace("_", " ")
            self._add(
                f"    {label:<13} {self.g.full * filled}{self.g.empty * (bar - filled)} {fmt_ms(value):>8}"
            )

    def _streaming(self, s: Mapping[str, Any] | None) -> None:
        if not s:
            return
        names = {"ttft_ms": "TTFT", "itl_ms": "ITL (per-request p95)", "tpot_ms": "TPOT"}
        for key, label in names.items():
            q = s.get(key) or {}
            if any(v is not None for v in q.values()):
                cells = "  ".join(f"{k} {fmt_ms(v)}" for k, v in q.items())
                self._add(
                    f"  {label + ' ms':<13} {cells}"
                    if len(label) < 11
                    else f"  {label} ms  {cells}"
                )

    def _stages(self, stages: list[Mapping[str, Any]]) -> None:
        if not stages:
            return
        wide = self.width >= 100
        name_w = max(8, min(28, self.width - (86 if wide else 58)))
        head = f"    {'stage':<{name_w}} {'kind':<9} {'count':>6} {'wall p50/p95':>14} {'cpu p50/p95':>14}"
        if wide:
            head += f" {'wait p50':>9} {'loopw p50':>9} {'loop':>4} {'max blk':>8}"
        self._add("  stages")
        self._add(self.p.dim + head + self.p.reset)
        for s in stages:
            self._stage(s, name_w, wide)

    def _stage(self, s: Mapping[str, Any], name_w: int, wide: bool) -> None:
        wall, cpu = s.get("wall_ms") or {}, s.get("cpu_ms") or {}
        on_loop = {True: "yes", False: "no"}.get(s.get("on_loop"), "-")  # type: ignore[arg-type]
        line = (
            f"    {self._cut(str(s.get('stage')), name_w):<{name_w}} {self._cut(str(s.get('kind')), 9):<9} "
            f"{s.get('count', 0):>6,} {_pair(wall):>14} {_pair(cpu):>14}"
        )
        if wide:
            line += (
                f" {fmt_ms((s.get('wait_ms') or {}).get('p50')):>9}"
                f" {fmt_ms((s.get('loop_wait_ms') or {}).get('p50')):>9} {on_loop:>4}"
                f" {fmt_ms(s.get('max_block_ms')):>8}"
            )
        self._add(line)
        where = [
            str(x)
            for x in (s.get("function"), s.get("blocked_at") and f"blocked at {s['blocked_at']}")
            if x
        ]
        if where:
            self._add(
                f"{self.p.dim}      {self._cut(' '.join(where), self.width - 6)}{self.p.reset}"
            )

    def _findings(self, findings: list[Mapping[str, Any]], any_requests: bool) -> None:
        p = self.p
        self._add()
        if not findings:
            text = (
                "No findings: nothing on the request path stands out."
                if any_requests
                else "No requests found."
            )
            self._add(f"{p.green}{text}{p.reset}" if any_requests else text)
            return
        self._add(f"{p.bold}Findings ({len(findings)}){p.reset}")
        for f in findings:
            self._finding(f)

    def _finding(self, f: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        severity = str(f.get("severity", "low"))
        tone = {"high": p.red, "medium": p.yellow}.get(severity, p.dim)
        where = " ".join(
            x
            for x in (
                str(f.get("route") or ""),
                f.get("stage") and f"{g.dot} {f['stage']}",
                f.get("function") and f"({f['function']})",
            )
            if x
        )
        self._add()
        self._wrap(
            f"{tone}{severity.upper()}{p.reset} {p.bold}{f.get('rule')}{p.reset} {g.dot} {where}", 2
        )
        self._wrap(str(f.get("evidence") or ""), 4)
        if isinstance(f.get("impact_ms"), (int, float)):
            self._add(f"    impact: {fmt_ms(f['impact_ms'])} ms per request")
        fix = f.get("fix") or {}
        if fix:
            self._wrap(f"fix: {fix.get('title', '')}", 4)
            for line in str(fix.get("code") or "").splitlines():
                self._add(f"      {p.cyan}{self._cut(line, self.width - 6)}{p.reset}")
        self._projection(f)

    def _projection(self, f: Mapping[str, Any]) -> None:
        g = self.g
        proj = f.get("projection")
        if not proj:
            note = f.get("projection_note")
            if note:
                self._wrap(f"no projection: {note}", 4)
            return
        parts = []
        for key, label, unit in (
            ("p50_ms", "p50", " ms"),
            ("p95_ms", "p95", " ms"),
            ("throughput_rps", "throughput", " req/s"),
        ):
            pair = proj.get(key)
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                parts.append(f"{label} {fmt_ms(pair[0])} {g.arrow} {fmt_ms(pair[1])}{unit}")
        self._wrap(f"projected: {f' {g.dot} '.join(parts)}", 4)


def _pair(q: Mapping[str, Any]) -> str:
    return f"{fmt_ms(q.get('p50'))}/{fmt_ms(q.get('p95'))}"


def _pct(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{100 * value:.1f}%"
