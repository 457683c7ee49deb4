"""A comparison for a terminal: ``render_comparison(comparison) -> str``.

Reads ``comparison.to_dict()`` (``tracekit.compare/1``, or the dict itself) and lays out, per
route, a table of before, after, the change and its confidence interval ("no significant
change" where the interval holds zero), then BEFORE's projected findings with the projected
change next to the measured one and the verdict. Adapts to the terminal as the report does
(:mod:`tracekit.render.text`: width, colour, unicode), and escapes every string that comes
from the traces (routes, sources, stage names) the same way.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, TextIO, TypeGuard

from tracekit.analysis.projection_check import NOT_MADE
from tracekit.render.text import (
    ASCII,
    COLOR,
    PLAIN,
    UNICODE,
    Glyphs,
    Palette,
    escape_controls,
    fmt_ms,
    use_color,
    use_unicode,
)

_MIN_WIDTH = 60
_LABEL = 18  # the row label's column
_VALUE = 9  # before and after
_CHANGE = 23  # the change: "-35.0 (-10.1%)" or "no significant change"
_METRIC_LABELS = {"p50_ms": "p50", "p95_ms": "p95", "throughput_rps": "rps"}


def render_comparison(
    comparison: Any,
    *,
    width: int | None = None,
    color: bool | None = None,
    unicode: bool | None = None,
    stream: TextIO | None = None,
) -> str:
    """Render a comparison as text.

    Args:
        comparison: a ``Comparison`` or its ``to_dict()``.
        width: columns; ``None``: the terminal's (80 when unknown); at least 60 is used.
        color: ANSI colour; ``None``: decided by :func:`~tracekit.render.text.use_color`.
        unicode: unicode glyphs; ``None``: decided by :func:`~tracekit.render.text.use_unicode`.
        stream: the stream the text is for (default ``sys.stdout``), for those decisions.

    Returns:
        The text, ending with a newline.
    """
    out = stream if stream is not None else sys.stdout
    data = comparison.to_dict() if hasattr(comparison, "to_dict") else comparison
    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    r = _Renderer(
        width=max(width, _MIN_WIDTH),
        p=COLOR if (use_color(out) if color is None else color) else PLAIN,
        g=UNICODE if (use_unicode(out) if unicode is None else unicode) else ASCII,
    )
    return r.render(data)


class _Renderer:
    def __init__(self, *, width: int, p: Palette, g: Glyphs) -> None:
        self.width = width
        self.p = p
        self.g = g
        self.lines: list[str] = []
        self.level = "95%"

    def render(self, d: Mapping[str, Any]) -> str:
        self._header(d)
        few = []
        for route in d.get("routes") or []:
            if _too_few(route):
                few.append(route)
            else:
                self._route(route)
        if few:  # a readiness probe, a docs page: a line, not a table of "no interval"
            self._add()
            counts = []
            for r in few:
                before, after = _two(r.get("requests"))
                counts.append(f"{_s(r.get('route'))} ({before}{self.g.arrow}{after})")
            self._wrap(f"Too few requests to compare (under {_FEW} a side, nothing projected): "
                       f"{', '.join(counts)}", 0, self.p.dim, hang=2)  # fmt: skip
        for key, label in (("only_before", "before"), ("only_after", "after")):
            names = d.get(key) or []
            if names:
                self._add()
                self._wrap(f"Only in {label}: {', '.join(_s(n) for n in names)}", 0, hang=2)
        return "\n".join(line.rstrip() for line in self.lines) + "\n"

    def _add(self, text: str = "") -> None:
        self.lines.append(text)

    def _wrap(self, text: str, indent: int, tone: str = "", hang: int = 0) -> None:
        pad = " " * indent
        lines = textwrap.wrap(
            text, self.width - indent, subsequent_indent=" " * hang, break_on_hyphens=False
        )
        end = self.p.reset if tone else ""
        self.lines.extend(f"{pad}{tone}{line}{end}" for line in lines or [""])

    def _header(self, d: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        method = d.get("method") or {}
        confidence = method.get("confidence")
        self.level = f"{100 * confidence:g}%" if _is_number(confidence) else "?"
        self._add(f"{p.bold}tracekit compare{p.reset} {g.dot} {self.level} confidence intervals")
        for key in ("before", "after"):
            side = d.get(key) or {}
            requests = side.get("requests")
            count = f"{requests:,} requests" if _is_number(requests) else "- requests"
            self._wrap(f"{key + ':':<8}{_s(side.get('source'))} {g.dot} {count}", 2, hang=8)
        finding = method.get("finding")
        chosen = (f"--finding {_s(finding)}" if finding else "assumed to be each route's top "
                  "projected finding (if you made another change, name it with --finding "
                  "RULE[:STAGE]; a change no finding proposed has no projection to check)")
        self._wrap(f"the change made (selected): {chosen}", 2, p.dim, hang=4)

    def _route(self, r: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        self._add()
        self._wrap(_s(r.get("route")), 0, p.bold + p.cyan)
        requests, errors = _two(r.get("requests")), _two(r.get("errors"))
        self._add(f"  {requests[0]} {g.arrow} {requests[1]} requests {g.dot} "
                  f"{errors[0]} {g.arrow} {errors[1]} errors")  # fmt: skip
        head = f"  {'':<{_LABEL}}{'before':>{_VALUE}}{'after':>{_VALUE}}  {'change':<{_CHANGE}}"
        self._add(f"{p.dim}{head}{self.level} interval{p.reset}")
        latency = r.get("latency_ms") or {}
        for key in ("p50", "p95", "p99"):
            self._row(f"latency {key} ms", latency.get(key))
        self._row("throughput req/s", r.get("throughput_rps"))
        streaming = r.get("streaming")
        if isinstance(streaming, Mapping):
            for name, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
                for key, change in (streaming.get(name) or {}).items():
                    self._row(f"{label} {_s(key)} ms", change)
            self._wrap("(ITL: each request's own p95 inter-chunk gap)", 4 + _LABEL, p.dim)
        worse = _worse(r)
        if worse:  # whatever the projection's verdict below, a user must see these
            self._wrap(f"significantly worse after: {', '.join(worse)}", 2, p.yellow, hang=4)
        parts = r.get("breakdown_ms")
        if isinstance(parts, Mapping):
            self._add("  breakdown, mean ms per request")
            for key, change in parts.items():
                if not _zero_in_both(change):  # e.g. no GC pauses in either run: not shown
                    self._row(f"  {_s(key).replace('_', ' ')}", change)
            traded = _moved(parts.get("model_wait"), 1) and _moved(parts.get("loop_wait"), -1)
            if traded and r.get("streaming"):
                self._wrap("(model wait rose as loop wait fell: a streamed chunk that arrived "
                           "while the loop was busy is loop wait, and a freer loop waits for the "
                           "model's next chunk instead; the model need not have slowed: the "
                           "report's TPOT is its pace)", 4, p.dim, hang=1)  # fmt: skip
        projections = [c for c in r.get("projections") or [] if isinstance(c, Mapping)]
        if projections:
            self._add("  projected (before's findings, each fix alone) vs measured")
            for check in sorted(projections, key=lambda c: not c.get("selected")):
                self._projection(check)
        else:  # said, not left out: a reader would look for the check
            self._wrap("projected vs measured: nothing to check: before has no projected "
                       "finding on this route (--finding RULE:STAGE names the change made, "
                       "and says why it has no projection)", 2, p.dim, hang=4)  # fmt: skip

    def _row(self, label: str, c: Any) -> None:
        if not isinstance(c, Mapping):
            return
        before, after = fmt_ms(c.get("before")), fmt_ms(c.get("after"))
        ci = c.get("ci")
        if c.get("significant") is False:
            change = "no significant change"
        else:
            change = _signed(c.get("change"))
            if before == fmt_ms(0.0):  # a share of what shows as nothing: "+340353.9%"
                change += " (from ~0)"
            elif _is_number(c.get("change_pct")):
                change += f" ({c['change_pct']:+.1f}%)"
        interval = f"[{_signed(ci[0])}, {_signed(ci[1])}]" if _is_pair(ci) else "no interval"
        self._add(f"  {label:<{_LABEL}}{before:>{_VALUE}}{after:>{_VALUE}}  {change:<{_CHANGE}}{interval}")
        if c.get("note") and not _is_pair(ci):
            self._wrap(f"({_s(c['note'])})", 4 + _LABEL, self.p.dim)

    def _projection(self, c: Mapping[str, Any]) -> None:
        p, g = self.p, self.g
        verdict = str(c.get("verdict"))
        tone = _tone(p, verdict)
        name = _s(c.get("rule")) + (f" {g.dot} {_s(c['stage'])}" if c.get("stage") else "")
        mark = f"{g.arrow} " if c.get("selected") else "  "
        tags = (["selected"] if c.get("selected") else []) + [f"{tone}{_s(verdict)}{p.reset}"]
        tags.append("still found in after" if c.get("still_found") else "not found in after")
        self._add(f"  {mark}{p.bold}{name}{p.reset} {g.dot} " + f" {g.dot} ".join(tags))
        if c.get("projection_note"):
            self._wrap(f"no projection: {_s(c['projection_note'])}; the measured change only", 6,
                       p.dim, hang=2)  # fmt: skip
        if c.get("projected_route"):
            self._wrap(f"projected for {_s(c['projected_route'])}, whose requests waited for this "
                       f"stage: checked against that route's change", 6, p.dim, hang=2)  # fmt: skip
        if c.get("stage"):
            self._row("  stage ms/request", c.get("stage_ms"))
        # The mechanism judged only the change made: another fix's figures are not shown.
        model = c.get("model")
        queueing = isinstance(model, Mapping) and model.get("method") == "queueing"
        for m in c.get("metrics") or []:
            if isinstance(m, Mapping) and m.get("verdict") != NOT_MADE:
                self._metric(m, "queueing model" if queueing else "replayed")

    def _metric(self, m: Mapping[str, Any], how: str) -> None:
        label = _METRIC_LABELS.get(str(m.get("metric")), _s(m.get("metric")))
        expected = m.get("projected_change_pct")
        if _is_pair(expected):
            low, high = expected
            # A range is "low to high" (the arrow is before → after everywhere else).
            projected = f"{low:+.1f}%" if low == high else f"{low:+.1f}% to {high:+.1f}%"
        else:
            projected = "-"
        # The projected change starts from the model's BEFORE (the recording replayed, or the
        # queueing model's measured one), which may not be the measured BEFORE: both are
        # shown, each with its own values, the projection's labelled by its model.
        unit = " req/s" if m.get("metric") == "throughput_rps" else " ms"
        values = m.get("projected")
        if _is_pair(values):
            projected += f" ({how} {fmt_ms(values[0])} {self.g.arrow} {fmt_ms(values[1])}{unit})"
        measured = m.get("measured_change_pct")
        shown = f"{measured:+.1f}%" if _is_number(measured) else "-"
        ci = m.get("measured_ci_pct")
        if _is_pair(ci):
            shown += f" [{ci[0]:+.1f}%, {ci[1]:+.1f}%]"
        values = m.get("measured")
        if _is_pair(values):
            shown += f" ({fmt_ms(values[0])} {self.g.arrow} {fmt_ms(values[1])}{unit})"
        verdict = str(m.get("verdict"))
        said = verdict
        if verdict in ("missed", "wrong direction") and _is_number(m.get("missed_by_pct")):
            said += f" by {m['missed_by_pct']:.1f}%"
            if m.get("short") is not None:
                said += " (short)" if m.get("short") else " (beyond)"
        # Wrapped as plain text, the whole line in the verdict's colour: codes take no columns.
        self._wrap(f"{label:<4} projected {projected}, measured {shown}: {said}", 6,
                   _tone(self.p, verdict), hang=5)  # fmt: skip


#: A route with fewer requests than this on a side and no projection is listed, not tabled
#: (the intervals need 5 requests a side).
_FEW = 5


def _too_few(route: Mapping[str, Any]) -> bool:
    requests = route.get("requests")
    counts = [n for n in requests if _is_number(n)] if isinstance(requests, Sequence) else []
    return len(counts) == 2 and min(counts) < _FEW and not route.get("projections")


def _worse(route: Mapping[str, Any]) -> list[str]:
    """The route's user-facing figures that got significantly worse: latency, TTFT and ITL
    up, throughput down."""
    rows: list[tuple[str, Any, int]] = []
    latency = route.get("latency_ms")
    if isinstance(latency, Mapping):
        rows += [(f"latency {q}", latency.get(q), 1) for q in ("p50", "p95", "p99")]
    rows.append(("throughput", route.get("throughput_rps"), -1))
    streaming = route.get("streaming")
    if isinstance(streaming, Mapping):
        for name, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
            values = streaming.get(name)
            if isinstance(values, Mapping):
                rows += [(f"{label} {_s(key)}", change, 1) for key, change in values.items()]
    out = []
    for label, change, worse_sign in rows:
        if _moved(change, worse_sign):
            pct = change.get("change_pct")
            out.append(f"{label} {pct:+.1f}%" if _is_number(pct) else f"{label} {_signed(change['change'])}")
    return out


def _moved(change: Any, sign: int) -> bool:
    """Whether ``change`` is significant in the direction of ``sign``."""
    return (isinstance(change, Mapping) and change.get("significant") is True
            and _is_number(change.get("change")) and change["change"] * sign > 0)  # fmt: skip


def _zero_in_both(change: Any) -> bool:
    return isinstance(change, Mapping) and change.get("before") == 0 and change.get("after") == 0


def _tone(p: Palette, verdict: str) -> str:
    return {"held": p.green, "inconclusive": p.dim, "missed": p.yellow,
            "wrong direction": p.red}.get(verdict, p.dim)


def _s(value: Any) -> str:
    # Trace text (a route, a source, a stage) cannot drive the terminal; one line.
    return escape_controls(" ".join(str(value).split()))


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _is_pair(value: Any) -> TypeGuard[Sequence[float]]:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_number, value))


def _two(value: Any) -> tuple[str, str]:
    if _is_pair(value):
        return f"{int(value[0]):,}", f"{int(value[1]):,}"
    return "-", "-"


def _signed(value: Any) -> str:
    if not _is_number(value):
        return "-"
    if value == 0:
        return "0"
    text = fmt_ms(value)
    return text if text.startswith("-") else f"+{text}"
