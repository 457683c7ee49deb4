"""Small helpers for the HTML renderer: escaping, tolerant reads of the report dict, formatting.

Every value that comes from a trace goes through :func:`esc` before it reaches the page; the
report dict may be hand-written or come from an older/partial analyzer run, so every read is
tolerant (:func:`num`, :func:`mapping`, :func:`items`) and a wrong type reads as "unknown".
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tracekit import semconv

#: Stage kinds that have their own colour (CSS class ``k-<kind>``); anything else is "other".
#: "request" is the request's own code outside any stage; server/client/internal are the span
#: kinds of uninstrumented (plain OpenTelemetry) traces.
COLOURED_KINDS = (*semconv.STAGE_KINDS, "request", "server", "client", "internal")

#: The breakdown components (DESIGN §4), in drawing order, with their legend labels.
COMPONENTS = (
    ("cpu_on_loop", "CPU on loop"),
    ("cpu_off_loop", "CPU off loop"),
    ("model_wait", "model wait"),
    ("io_wait", "I/O wait"),
    ("loop_wait", "loop wait"),
)


def esc(value: object) -> str:
    """Escape any value for HTML text or a double- or single-quoted attribute.

    Args:
        value: anything; ``None`` becomes the empty string, other values ``str()``.

    Returns:
        The escaped string (``& < > " '`` replaced).
    """
    if value is None:
        return ""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def clip(value: object, limit: int = 160) -> str:
    """Shorten a (not yet escaped) label to ``limit`` characters with an ellipsis.

    Attribute values can be huge (prompts); labels stay readable and the page stays small.

    Args:
        value: the label; ``None`` is "".
        limit: the most characters kept.

    Returns:
        The possibly shortened, *unescaped* string.
    """
    text = "" if value is None else (value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def num(value: object) -> float | None:
    """Read a finite number; booleans, strings, NaN and infinities read as ``None``.

    Args:
        value: a value from the report dict.

    Returns:
        The float, or ``None`` when it is not a usable number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def mapping(value: object) -> Mapping[str, Any]:
    """Read a dict; anything else (``None``, a list) reads as an empty one.

    Args:
        value: a value from the report dict.

    Returns:
        ``value`` when it is a mapping, else ``{}``.
    """
    return value if isinstance(value, Mapping) else {}


def items(value: object) -> list[Mapping[str, Any]]:
    """Read a list of dicts, dropping entries that are not dicts.

    Args:
        value: a value from the report dict.

    Returns:
        The mappings in ``value`` when it is a list/tuple, else ``[]``.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return []
    return [entry for entry in value if isinstance(entry, Mapping)]


def kind_class(kind: object) -> str:
    """The CSS class for a stage kind; unknown kinds (trace data) fall back to ``k-other``.

    Args:
        kind: the kind string from the report.

    Returns:
        A class name from a fixed set, never trace text.
    """
    return f"k-{kind}" if kind in COLOURED_KINDS else f"k-{semconv.KIND_OTHER}"


def fmt_ms(value: object, unit: bool = False) -> str:
    """Format milliseconds with precision that suits the magnitude ("–" when unknown).

    Args:
        value: milliseconds, or anything else for "unknown".
        unit: append " ms" (or format seconds as " s" from 10 s up).

    Returns:
        The formatted text (plain ASCII digits; safe to embed unescaped).
    """
    ms = num(value)
    if ms is None:
        return "–"
    if unit and abs(ms) >= 10_000:
        return f"{ms / 1000:.1f} s"
    text = f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.1f}" if abs(ms) >= 10 else f"{ms:.2f}"
    return f"{text} ms" if unit else text


def fmt_rps(value: object) -> str:
    """Format requests per second ("–" when unknown)."""
    rps = num(value)
    if rps is None:
        return "–"
    return f"{rps:.0f}" if abs(rps) >= 100 else f"{rps:.1f}" if abs(rps) >= 10 else f"{rps:.2f}"


def fmt_pct(fraction: object, digits: int = 0) -> str:
    """Format a fraction (0.42) as a percentage ("42%"; "–" when unknown)."""
    value = num(fraction)
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def fmt_int(value: object) -> str:
    """Format a count with thousands separators ("–" when unknown)."""
    count = num(value)
    return "–" if count is None else f"{round(count):,}"


def nice_ticks(span: float, target: int = 8) -> list[float]:
    """Tick positions 0, step, 2·step, … ≤ ``span`` with a 1/2/5·10^k step.

    Args:
        span: the axis length (> 0).
        target: roughly how many ticks.

    Returns:
        The tick values, starting at 0.
    """
    if span <= 0:
        return [0.0]
    raw = span / target
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if raw <= m * magnitude)
    count = int(span / step + 1e-9)
    return [round(i * step, 9) for i in range(count + 1)]


def fmt_tick(ms: float, step: float) -> str:
    """Format an axis tick in ms, or in s when the step is a second or more."""
    if step >= 1000:
        return f"{ms / 1000:g} s"
    return f"{ms:g} ms" if ms else "0"


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals, sorted (used for the loop's busy time).

    Args:
        intervals: ``(start, end)`` pairs, any order, possibly overlapping.

    Returns:
        Disjoint sorted intervals covering the same points.
    """
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def profile_details(title: str, profile: Mapping[str, Any]) -> str:
    """A collapsible pyinstrument profile (``{hot, tree}``: tracekit.integrations.pyinstrument),
    or ``""`` when it has no tree.

    Args:
        title: the summary line, already HTML.
        profile: the report's ``profile`` object of a stage or a loop.
    """
    tree = profile.get("tree")
    if not isinstance(tree, str) or not tree:
        return ""
    return (
        f'<details class="profile"><summary>{title}</summary>'
        "<p>Hottest functions (self time):</p>"
        f"<pre><code>{esc(clip(profile.get('hot'), 2000))}</code></pre><p>Call tree:</p>"
        f"<pre><code>{esc(clip(tree, 4000))}</code></pre></details>"
    )
