"""Confidence intervals for the change of a statistic between two runs (``tracekit compare``).

BEFORE and AFTER are independent samples of requests. Each statistic gets an interval for the
difference ``after - before`` and for the relative change ``after / before - 1``:

- **Percentiles** (latency p50/p95/p99, TTFT, ITL): the percentile bootstrap. A resample of
  ``n`` values drawn with replacement from the sorted values ``x[0..n-1]`` takes index
  ``floor(n * U)`` for a uniform ``U``; the map is monotone, so the resample's ``k``-th smallest
  value is ``x[floor(n * U_(k))]``, where ``U_(k)``, the ``k``-th smallest of ``n`` uniforms, is
  ``Beta(k, n - k + 1)``. So each resample's percentile is drawn directly, in O(1), with the
  exact distribution the resample-and-sort bootstrap gives (linear interpolation between two
  ranks, like :func:`tracekit._percentile.percentile`, draws the next order statistic too:
  ``U_(k+1) = U_(k) + (1 - U_(k)) * Beta(1, n - k)``). Draws of the two sides are independent;
  the interval is the central ``confidence`` share of the ``after - before`` draws. The
  bootstrap is poor for a percentile with few values beyond it, so an interval needs at least
  :data:`MIN_BEYOND` values above the percentile on each side (500 requests for p99).
- **Means** (the breakdown components): Welch's t interval, the difference of means over
  ``sqrt(s_a^2/n_a + s_b^2/n_b)`` with Welch-Satterthwaite degrees of freedom; the relative
  change by the delta method on the ratio of the means. Needs :data:`MIN_MEAN_N` values a side.
- **Throughput**: a run's active window (first request's start to last request's end, as the
  report measures throughput) is cut into equal bins of about a second (at least
  :data:`MIN_BINS`, at most one per request); each bin's completions over its width is one
  rate observation, whose mean is exactly requests / window. Welch's interval of the bin
  rates' means follows, the bins in time order (their dependence read as below).

**Neighbours are not independent.** Requests of one run share the event loop, the host and
the model server: a slow period makes several neighbours slow together, and the bootstrap and
Welch's interval, which take the values as independent, come out too narrow (two runs of the
same code read as "significant"). Each side's values come in time order, and their
dependence is read from them: the variance of a mean of ``n`` correlated values is the
independent one times ``1 + 2 sum_k (1 - k / (L + 1)) rho_k`` (:func:`inflation`: the lag-``k``
autocorrelations ``rho_k`` up to ``L = sqrt(n)``, Bartlett weights, as Newey and West's
long-run variance), never taken below 1. A mean's standard error grows by its square root,
with ``n / inflation`` values for the degrees of freedom; a percentile is a mean of the
indicator ``value <= percentile`` to first order, so its bootstrap draws the order statistic
of ``n / inflation`` uniforms, that indicator's inflation. The first
:data:`DEPENDENCE_SAMPLE` values in time order are enough to read it.

Randomness comes from a ``random.Random`` passed in, so results are reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

from tracekit._percentile import percentile

__all__ = [
    "MIN_BEYOND",
    "MIN_BINS",
    "MIN_MEAN_N",
    "MIN_RATE_REQUESTS",
    "Change",
    "bin_rates",
    "inflation",
    "mean_change",
    "quantile_change",
    "rate_change",
    "t_quantile",
]

#: Values above a percentile each side needs for its bootstrap interval (n * (1 - q) >= this).
MIN_BEYOND = 5
#: Values each side needs for a mean's interval (Welch's degrees of freedom stay >= 4, where
#: :func:`t_quantile` is accurate).
MIN_MEAN_N = 5
#: Fewest bins a throughput window is cut into (more for windows over this many seconds).
MIN_BINS = 10
#: Fewest requests a throughput is computed from: a single request's window is its own
#: duration, and one over it (170 req/s for a 6 ms request) is no rate.
MIN_RATE_REQUESTS = 2
#: Values (the first, in time order) that neighbours' dependence is read from (:func:`inflation`).
DEPENDENCE_SAMPLE = 5_000


@dataclass(frozen=True)
class Change:
    """One statistic measured BEFORE and AFTER, with the interval of its change.

    Attributes:
        before / after: the statistic on each side (``None``: not measurable there).
        n: the values each side had.
        low / high: the interval of ``after - before`` (``None``: no interval, see ``note``).
        rel_low / rel_high: the interval of ``after / before - 1`` (``None`` also when
            ``before`` is 0).
        note: why there is no interval.
    """

    before: float | None
    after: float | None
    n: tuple[int, int]
    low: float | None = None
    high: float | None = None
    rel_low: float | None = None
    rel_high: float | None = None
    note: str | None = None

    @property
    def delta(self) -> float | None:
        """``after - before``."""
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def relative(self) -> float | None:
        """``after / before - 1`` (``None`` when ``before`` is 0 or unknown)."""
        if self.before is None or self.after is None or self.before <= 0:
            return None
        return self.after / self.before - 1

    @property
    def significant(self) -> bool | None:
        """Whether the interval excludes 0 (``None`` without an interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, Any]:
        """The ``tracekit.compare/1`` change object (``docs/analyzer.md``)."""
        return {
            "before": self.before,
            "after": self.after,
            "n": list(self.n),
            "change": self.delta,
            "ci": _pair(self.low, self.high),
            "change_pct": _pct(self.relative),
            "ci_pct": _pair(_pct(self.rel_low), _pct(self.rel_high)),
            "significant": self.significant,
            "note": self.note,
        }


def _pair(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [low, high]


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def quantile_change(
    before: Sequence[float],
    after: Sequence[float],
    q: float,
    *,
    confidence: float,
    draws: int,
    rng: random.Random,
) -> Change:
    """The change of the ``q``-percentile, with its bootstrap interval (module docstring).

    Args:
        before / after: the values of each side, in time order (may be empty): neighbours'
            dependence widens the interval.
        q: the percentile, between 0 and 1 (0.95 for p95).
        confidence: the interval's coverage, e.g. 0.95.
        draws: bootstrap draws per side.
        rng: the random source.

    Returns:
        The :class:`Change`. Cost: O(n log n) to sort, then O(draws).
    """
    b, a = sorted(before), sorted(after)
    n = (len(b), len(a))
    point_b = percentile(b, q) if b else None
    point_a = percentile(a, q) if a else None
    need = max(MIN_BEYOND, math.ceil(MIN_BEYOND / (1 - q))) if q < 1 else math.inf
    if min(n) < need:
        return Change(point_b, point_a, n,
                      note=f"a p{100 * q:g} interval needs {need:,} values a side")  # fmt: skip
    db = _bootstrap(b, q, draws, rng, len(b) / inflation(_below(before, point_b)))
    da = _bootstrap(a, q, draws, rng, len(a) / inflation(_below(after, point_a)))
    low, high = _central([x - y for x, y in zip(da, db, strict=True)], confidence)
    rel_low = rel_high = None
    if all(y > 0 for y in db):
        rel_low, rel_high = _central([x / y - 1 for x, y in zip(da, db, strict=True)], confidence)
    return Change(point_b, point_a, n, low, high, rel_low, rel_high)


def _below(values: Sequence[float], point: float | None) -> list[float]:
    # The indicator whose mean the percentile `point` is, to first order (module docstring),
    # over the values its dependence is read from.
    if point is None:
        return []
    return [1.0 if v <= point else 0.0 for v in values[:DEPENDENCE_SAMPLE]]


def _bootstrap(values: list[float], q: float, draws: int, rng: random.Random,
               effective: float | None = None) -> list[float]:  # fmt: skip
    # The q-percentile of `draws` bootstrap resamples of the sorted `values`, each drawn from
    # the resample's order statistics directly (module docstring); with `effective` under
    # len(values), the order statistic of that many uniforms, read off the sorted values.
    n = len(values)
    if effective is not None and effective < n:
        m = max(2.0, effective)
        position = q * (m - 1)
        last = n - 1
        out = []
        for _ in range(draws):
            at = rng.betavariate(position + 1, m - position) * last
            i = int(at)
            x = values[i]
            if i < last:
                x += (at - i) * (values[i + 1] - x)
            out.append(x)
        return out
    position = q * (n - 1)
    k = int(position)  # 0-based rank: the (k+1)-th smallest
    frac = position - k
    beta = rng.betavariate
    uniform = rng.random
    inverse = 1 / (n - k - 1) if frac else 0.0
    last = n - 1
    out = []
    for _ in range(draws):
        u = beta(k + 1, n - k)
        x = values[min(int(u * n), last)]
        if frac:
            # Beta(1, m) is 1 - V ** (1/m) for a uniform V: the next of the m uniforms above u.
            u_next = u + (1 - u) * (1 - uniform() ** inverse)
            x += frac * (values[min(int(u_next * n), last)] - x)
        out.append(x)
    return out


def _central(draws: list[float], confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    ordered = sorted(draws)
    return percentile(ordered, tail), percentile(ordered, 1 - tail)


def mean_change(before: Sequence[float], after: Sequence[float], *, confidence: float) -> Change:
    """The change of the mean, with Welch's t interval (module docstring).

    Args:
        before / after: the values of each side, in time order (may be empty): neighbours'
            dependence widens the interval.
        confidence: the interval's coverage.

    Returns:
        The :class:`Change`. Cost: O(n), and O(m^1.5) for the dependence, m = min(n,
        :data:`DEPENDENCE_SAMPLE`).
    """
    n = (len(before), len(after))
    mb = math.fsum(before) / n[0] if n[0] else None
    ma = math.fsum(after) / n[1] if n[1] else None
    if mb is None or ma is None or min(n) < MIN_MEAN_N:
        return Change(mb, ma, n, note=f"an interval needs {MIN_MEAN_N} values a side")
    fb, fa = inflation(before), inflation(after)
    vb = _variance(before, mb) / n[0] * fb  # squared standard errors of the means
    va = _variance(after, ma) / n[1] * fa
    se = math.sqrt(va + vb)
    if se == 0:  # both sides constant: the difference is exact
        rel = ma / mb - 1 if mb > 0 else None
        return Change(mb, ma, n, ma - mb, ma - mb, rel, rel)
    dfb, dfa = max(1.0, n[0] / fb - 1), max(1.0, n[1] / fa - 1)
    df = (va + vb) ** 2 / (va**2 / dfa + vb**2 / dfb)
    t = t_quantile(1 - (1 - confidence) / 2, df)
    rel_low = rel_high = None
    if mb > 0:
        ratio = ma / mb
        se_ratio = math.sqrt(va / mb**2 + ratio**2 * vb / mb**2)  # delta method
        rel_low, rel_high = ratio - 1 - t * se_ratio, ratio - 1 + t * se_ratio
    return Change(mb, ma, n, ma - mb - t * se, ma - mb + t * se, rel_low, rel_high)


def inflation(series: Sequence[float]) -> float:
    """How much the dependence of neighbouring values widens the variance of their mean:
    ``1 + 2 sum_{k=1..L} (1 - k / (L + 1)) rho_k``, ``rho_k`` the lag-``k`` autocorrelation and
    ``L = floor(sqrt(m))`` (Bartlett weights: Newey and West's long-run variance; a bandwidth
    wider than their ``m^(1/3)``, which left more of the halves of one run told apart:
    ``bench/compare_calibration.py``), over the first ``m = min(n, DEPENDENCE_SAMPLE)``
    values; never below 1 (an alternating pattern is not taken to narrow the interval). 1
    for fewer than 3 values or constant ones.

    Args:
        series: the values in time order.
    """
    m = min(len(series), DEPENDENCE_SAMPLE)
    if m < 3:
        return 1.0
    head = series[:m]
    mean = math.fsum(head) / m
    d = [x - mean for x in head]
    total = math.fsum(e * e for e in d)
    if total <= 0:
        return 1.0
    lags = int(math.sqrt(m))
    out = 1.0
    for k in range(1, lags + 1):
        rho = math.fsum(map(float.__mul__, d[:-k], d[k:])) / total
        out += 2 * (1 - k / (lags + 1)) * rho
    return max(1.0, out)


def _variance(values: Sequence[float], mean: float) -> float:
    return math.fsum((x - mean) ** 2 for x in values) / (len(values) - 1)


def bin_rates(ends_ns: Sequence[int], first_ns: int, last_ns: int) -> list[float]:
    """Completions per second in equal bins of the window ``[first_ns, last_ns]``.

    Args:
        ends_ns: each request's end (epoch ns), all within the window.
        first_ns / last_ns: the window: the first request's start, the last one's end.

    Returns:
        One rate per bin: whole seconds of the window, at most one bin per request, at least
        :data:`MIN_BINS`; their mean is ``len(ends_ns)`` over the window. Empty when the
        window is empty or holds fewer than :data:`MIN_RATE_REQUESTS` requests.
    """
    window = last_ns - first_ns
    if window <= 0 or len(ends_ns) < MIN_RATE_REQUESTS:
        return []
    # About a second each, but never more bins than requests: a window stretched by an idle
    # gap (or by hostile timestamps) must not allocate billions of empty bins.
    bins = max(MIN_BINS, min(window // 1_000_000_000, len(ends_ns)))
    width = window / bins
    counts = [0] * bins
    for end in ends_ns:
        counts[min(max(int((end - first_ns) / width), 0), bins - 1)] += 1
    seconds = width / 1e9
    return [c / seconds for c in counts]


def rate_change(
    before: Sequence[float], after: Sequence[float], requests: tuple[int, int], *, confidence: float
) -> Change:
    """The change of throughput from each side's :func:`bin_rates`, with Welch's interval.

    Args:
        before / after: bin rates (requests/s); empty for a side without a window.
        requests: the requests each side had.
        confidence: the interval's coverage.

    Returns:
        The :class:`Change` (``n`` counts requests; the interval's degrees of freedom come
        from the bins).
    """
    change = mean_change(before, after, confidence=confidence)
    if min(requests) < MIN_MEAN_N:
        return Change(change.before, change.after, requests,
                      note=f"an interval needs {MIN_MEAN_N} requests a side")  # fmt: skip
    return replace(change, n=requests)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: the Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5.

    Args:
        p: the probability, e.g. 0.975.
        df: the degrees of freedom (not necessarily whole). For ``df >= 4`` the result is
            within 0.03% of the exact value at ``p = 0.975`` and 0.25% at ``p = 0.995``.

    Returns:
        ``t`` with ``P(T <= t) = p``.
    """
    z = NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    z2 = z * z
    g1 = (z2 + 1) * z / 4
    g2 = ((5 * z2 + 16) * z2 + 3) * z / 96
    g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384
    g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
