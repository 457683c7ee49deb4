"""The statistics of ``tracekit compare`` (tracekit.analysis.stats.confidence), on data whose
answer is known: a shift of known size, no change, tiny samples, textbook values."""

from __future__ import annotations

import random

import pytest

from tracekit._percentile import percentile
from tracekit.analysis.stats.confidence import (
    MIN_BINS,
    Change,
    _bootstrap,
    bin_rates,
    inflation,
    mean_change,
    quantile_change,
    rate_change,
    t_quantile,
)


def lognormal(n: int, seed: int, shift: float = 0.0) -> list[float]:
    rng = random.Random(seed)
    return [100 * rng.lognormvariate(0, 0.5) + shift for _ in range(n)]


def q_change(before: list[float], after: list[float], q: float, **kw: object) -> Change:
    options: dict[str, object] = {"confidence": 0.95, "draws": 2000, "rng": random.Random(7)}
    options.update(kw)
    return quantile_change(before, after, q, **options)  # type: ignore[arg-type]


def test_a_known_shift_is_detected_and_its_interval_covers_it() -> None:
    before, after = lognormal(2000, seed=1), lognormal(2000, seed=2, shift=40.0)
    for q in (0.5, 0.95):
        c = q_change(before, after, q)
        assert c.significant is True
        assert c.low is not None and c.high is not None
        assert c.low < 40.0 < c.high  # the true difference of the percentiles is the shift
        assert c.low > 0
        assert c.rel_low is not None and c.rel_low > 0
    assert c.n == (2000, 2000)


def test_no_change_gives_an_interval_around_zero() -> None:
    before, after = lognormal(1500, seed=3), lognormal(1500, seed=4)
    for q in (0.5, 0.95, 0.99):
        c = q_change(before, after, q)
        assert c.low is not None and c.high is not None
        assert c.low < 0 < c.high
        assert c.significant is False


def test_percentile_intervals_cover_the_truth_about_as_often_as_they_claim() -> None:
    # 200 experiments with a true p50 difference of 10: a 90% interval should cover it in
    # about 180; a wrong method (too narrow: ~100; too wide: ~200) would not.
    covered = 0
    for i in range(200):
        before, after = lognormal(150, seed=1000 + i), lognormal(150, seed=5000 + i, shift=10.0)
        c = q_change(before, after, 0.5, confidence=0.90, draws=300, rng=random.Random(i))
        assert c.low is not None and c.high is not None
        covered += c.low <= 10.0 <= c.high
    assert 168 <= covered <= 196, covered


def test_order_statistic_draws_match_the_resampling_bootstrap() -> None:
    values = sorted(lognormal(120, seed=9))
    rng = random.Random(3)
    resampled = [percentile(rng.choices(values, k=len(values)), 0.9) for _ in range(6000)]
    direct = _bootstrap(values, 0.9, 6000, random.Random(4))
    for tail in (0.05, 0.5, 0.95):
        a, b = percentile(resampled, tail), percentile(direct, tail)
        assert abs(a - b) <= 0.03 * a, (tail, a, b)


def test_small_samples_get_points_without_an_interval() -> None:
    before, after = lognormal(60, seed=5), lognormal(60, seed=6)
    p99 = q_change(before, after, 0.99)
    assert p99.before == percentile(before, 0.99) and p99.after == percentile(after, 0.99)
    assert p99.low is None and p99.significant is None
    assert p99.note == "a p99 interval needs 500 values a side"
    assert q_change(before, after, 0.5).low is not None  # 10 a side is enough for p50
    empty = q_change([], after, 0.5)
    assert empty.before is None and empty.delta is None and empty.relative is None
    few = mean_change([1.0, 2.0], [3.0, 4.0, 5.0], confidence=0.95)
    assert few.delta == pytest.approx(2.5) and few.low is None and few.note


def test_welch_interval_matches_the_textbook_value() -> None:
    # Means 3 and 5, variances 2.5 each: se = 1, Welch df = 8, t(0.975, 8) = 2.306. In an
    # order whose neighbours are not alike (a rising run would read as dependent).
    c = mean_change([3.0, 1.0, 5.0, 2.0, 4.0], [5.0, 3.0, 7.0, 4.0, 6.0], confidence=0.95)
    assert c.delta == pytest.approx(2.0)
    assert c.low == pytest.approx(2.0 - 2.306, abs=2e-3)
    assert c.high == pytest.approx(2.0 + 2.306, abs=2e-3)
    assert c.significant is False
    # Relative change by the delta method: ratio 5/3, se sqrt(0.5/9 + (5/3)^2 * 0.5/9).
    se = (0.5 / 9 + (5 / 3) ** 2 * 0.5 / 9) ** 0.5
    assert c.rel_low == pytest.approx(5 / 3 - 1 - 2.306 * se, abs=2e-3)


def test_constant_sides_give_an_exact_change() -> None:
    c = mean_change([2.0] * 10, [2.0] * 10, confidence=0.95)
    assert (c.low, c.high, c.significant) == (0.0, 0.0, False)
    c = mean_change([0.0] * 10, [1.0] * 10, confidence=0.95)
    assert (c.low, c.high, c.significant, c.rel_low) == (1.0, 1.0, True, None)


@pytest.mark.parametrize(
    ("p", "df", "exact"),
    [(0.975, 4, 2.7764), (0.975, 8, 2.3060), (0.975, 30, 2.0423), (0.95, 5, 2.0150),
     (0.995, 10, 3.1693), (0.975, float("inf"), 1.9600)],
)  # fmt: skip
def test_t_quantile_matches_the_table(p: float, df: float, exact: float) -> None:
    assert t_quantile(p, df) == pytest.approx(exact, rel=5e-4)


def test_bin_rates_average_to_requests_over_the_window() -> None:
    ends = [int(i * 0.37e9) for i in range(1, 100)]
    rates = bin_rates(ends, 0, int(40e9))
    assert len(rates) == 40
    assert sum(rates) / len(rates) == pytest.approx(99 / 40)
    assert len(bin_rates(ends[:3], 0, int(2e9))) == MIN_BINS  # short windows: at least 10 bins
    assert bin_rates([5], 5, 5) == []
    assert bin_rates([6_000_000], 0, 6_000_000) == []  # one request is no rate (was 1 / 6 ms)
    far = bin_rates([0, 2**62], 0, 2**62)  # a window of 146 years: one bin per request, or 10
    assert len(far) == MIN_BINS and sum(far) == pytest.approx(2 / (2**62 / 1e9) * MIN_BINS)


def test_a_doubled_rate_is_detected_and_an_unchanged_one_is_not() -> None:
    def run(rate: float, seed: int) -> tuple[list[float], int]:
        rng, t, ends = random.Random(seed), 0.0, []
        while t < 60:
            t += rng.expovariate(rate)
            ends.append(int(t * 1e9))
        ends = ends[:-1]
        return bin_rates(ends, 0, ends[-1]), len(ends)

    (b, nb), (a, na), (same, ns) = run(10, 1), run(20, 2), run(10, 3)
    doubled = rate_change(b, a, (nb, na), confidence=0.95)
    assert doubled.low is not None and doubled.high is not None
    assert doubled.low < 10 < doubled.high and doubled.low > 0
    assert doubled.n == (nb, na)
    unchanged = rate_change(b, same, (nb, ns), confidence=0.95)
    assert unchanged.significant is False
    few = rate_change(b, a, (3, na), confidence=0.95)
    assert few.low is None and few.note == "an interval needs 5 requests a side"


def test_change_to_dict_is_the_documented_object() -> None:
    d = Change(100.0, 80.0, (10, 12), -30.0, -10.0, -0.3, -0.1).to_dict()
    assert d == {
        "before": 100.0, "after": 80.0, "n": [10, 12], "change": -20.0, "ci": [-30.0, -10.0],
        "change_pct": pytest.approx(-20.0), "ci_pct": [pytest.approx(-30.0), pytest.approx(-10.0)],
        "significant": True, "note": None,
    }  # fmt: skip


def test_dependent_neighbours_widen_the_intervals() -> None:
    # A run with slow periods (AR(1) latencies, neighbours alike) against the same values
    # shuffled: the same points, wider intervals in time order; independent values are not
    # widened (by more than the estimate's own noise).
    rng = random.Random(7)
    level, run = 0.0, []
    for _ in range(2000):
        level = 0.9 * level + rng.gauss(0, 1)
        run.append(100 + 10 * level)
    shuffled = run[:]
    random.Random(8).shuffle(shuffled)
    assert inflation(run) > 5 and inflation(shuffled) < 1.3
    assert inflation([1.0, 2.0] * 50) == 1.0  # alternating: never narrower than independent
    after, after_shuffled = [v + 5 for v in run], [v + 5 for v in shuffled]
    in_time, mixed = q_change(run, after, 0.5), q_change(shuffled, after_shuffled, 0.5)
    assert in_time.delta == mixed.delta
    assert (in_time.high - in_time.low) > 1.5 * (mixed.high - mixed.low)
    means = [mean_change(run, after, confidence=0.95),
             mean_change(shuffled, after_shuffled, confidence=0.95)]  # fmt: skip
    assert (means[0].high - means[0].low) > 1.5 * (means[1].high - means[1].low)
