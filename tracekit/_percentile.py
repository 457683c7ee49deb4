"""tracekit's one percentile definition, shared by the request span's attributes (inter-token
latency) and the analyzer (route and stage statistics, rules, replay)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile by linear interpolation between the closest ranks (numpy's default).

    Args:
        values: at least one number, in any order (sorted input costs one linear pass).
        q: between 0 and 1 (0.95 for p95).

    Returns:
        The percentile.
    """
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
