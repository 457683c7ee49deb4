"""Streaming percentiles in bounded memory.

:class:`Quantiles` keeps every value exactly while there are at most ``EXACT_LIMIT`` of them
(:func:`tracekit._percentile.percentile`: linear interpolation between the closest ranks, like
numpy's default), then switches to a logarithmic histogram (the DDSketch mapping): a value
``v > 0`` goes to bucket ``ceil(log(v) / log(gamma))`` with ``gamma = (1 + a) / (1 - a)``, and
a bucket reports ``2 * gamma**i / (gamma + 1)``, which is within a relative error ``a`` = 1%
of every value in the bucket. Walking the buckets in order finds the one holding the value of
rank ``floor(q * (n - 1))`` (counting from 0), the lower of the two values the exact
percentile interpolates between, so a percentile from the histogram is within 1% of that
value, clamped to the exact minimum and maximum. Memory: at most ``EXACT_LIMIT`` floats, then
one counter per occupied bucket (about 115 buckets per decade of values).

The histogram of a set of values does not depend on their order, so structures filled apart
(by the parallel reader's workers) :meth:`~Quantiles.merge` into exactly the structure one
pass would have built: the same exact values or the same buckets, hence the same percentiles.
Only the running total (the mean, which the report does not use) can differ in its last bits.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Sequence
from itertools import repeat
from operator import mul

from tracekit._percentile import percentile

#: Values kept exactly before switching to the histogram.
EXACT_LIMIT = 2048
#: Relative error of the histogram.
RELATIVE_ERROR = 0.01
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)
_INV_LOG_GAMMA = 1 / _LOG_GAMMA
_log = math.log
_ceil = math.ceil
# Values at or below this (in the caller's unit, ms: one femtosecond) count as zero.
_ZERO = 1e-12


class Quantiles:
    """Percentiles of a stream of non-negative numbers (see the module docstring for the method).

    Cost: ``add`` is O(1) amortised; ``quantile`` sorts the exact values or the occupied
    buckets, O(n log n) for at most ``EXACT_LIMIT`` items.
    """

    __slots__ = ("_buckets", "_exact", "_max", "_min", "_n", "_sorted", "_total", "_zeros")

    def __init__(self) -> None:
        self._exact: array[float] | None = array("d")
        self._buckets: dict[int, int] = {}
        self._zeros = 0
        self._sorted = True
        # Histogram phase only; while exact, these are computed from the values on demand.
        self._n = 0
        self._total = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add(self, value: float) -> None:
        """Record one value.

        Args:
            value: a finite number; negative values are clamped to zero.
        """
        if value < 0:
            value = 0.0
        exact = self._exact
        if exact is not None:
            # Hot path: one append; min/max/sum are derived when asked or when switching.
            exact.append(value)
            self._sorted = False
            if len(exact) > EXACT_LIMIT:
                self._switch(exact)
            return
        self._n += 1
        self._total += value
        if value < self._min:
            self._min = value
        if value > self._max:
            self._max = value
        if value <= _ZERO:
            self._zeros += 1
            return
        index = _ceil(_log(value) * _INV_LOG_GAMMA)  # _bucket, inlined: the hot path
        buckets = self._buckets
        buckets[index] = buckets.get(index, 0) + 1

    def _switch(self, exact: array[float]) -> None:
        self._exact = None
        self._n = 0
        self._total = 0.0
        self._bin(exact)

    def extend(self, values: Sequence[float]) -> None:
        """Record many values at once: the same result as :meth:`add` for each, in C loops.

        Args:
            values: finite numbers; negative values are clamped to zero.

        Cost: O(len(values)), a few C-level passes (a third of a Python loop of ``add``).
        """
        if not values:
            return
        if min(values) < 0:
            values = [v if v >= 0 else 0.0 for v in values]
        exact = self._exact
        if exact is not None:
            exact.extend(values)
            self._sorted = False
            if len(exact) > EXACT_LIMIT:
                self._switch(exact)
            return
        self._bin(values)

    def _bin(self, values: Sequence[float]) -> None:
        # The histogram phase of add() for many values, with the same arithmetic.
        if not values:
            return
        self._n += len(values)
        self._total += math.fsum(values)
        low = min(values)
        high = max(values)
        if low < self._min:
            self._min = low
        if high > self._max:
            self._max = high
        if low <= _ZERO:
            positive = [v for v in values if v > _ZERO]
            self._zeros += len(values) - len(positive)
            values = positive
        counts = Counter(map(_ceil, map(mul, map(_log, values), repeat(_INV_LOG_GAMMA))))
        buckets = self._buckets
        for index, count in counts.items():
            buckets[index] = buckets.get(index, 0) + count

    def merge(self, other: Quantiles) -> None:
        """Add the values recorded by ``other`` (left unchanged) to this structure.

        The result is what recording both streams into one structure gives: exact values
        while there are at most ``EXACT_LIMIT`` of them, else the union of the histograms.

        Cost: O(EXACT_LIMIT + occupied buckets).
        """
        if other._exact is not None:
            self.extend(other._exact)
            return
        if self._exact is not None:
            self._switch(self._exact)
        self._n += other._n
        self._total += other._total
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)
        self._zeros += other._zeros
        buckets = self._buckets
        for index, count in other._buckets.items():
            buckets[index] = buckets.get(index, 0) + count

    @property
    def count(self) -> int:
        """How many values were recorded."""
        return len(self._exact) if self._exact is not None else self._n

    @property
    def min(self) -> float | None:
        """The smallest value (exact), or ``None`` when empty."""
        if self._exact is not None:
            return min(self._exact) if self._exact else None
        return self._min

    @property
    def max(self) -> float | None:
        """The largest value (exact), or ``None`` when empty."""
        if self._exact is not None:
            return max(self._exact) if self._exact else None
        return self._max

    @property
    def total(self) -> float:
        """The sum of the values."""
        return math.fsum(self._exact) if self._exact is not None else self._total

    @property
    def exact(self) -> bool:
        """Whether percentiles are still computed from every value."""
        return self._exact is not None

    @property
    def mean(self) -> float | None:
        """The arithmetic mean (always exact), or ``None`` when empty."""
        count = self.count
        return self.total / count if count else None

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile.

        Args:
            q: between 0 and 1 (0.95 for p95).

        Returns:
            The percentile, or ``None`` when no value was recorded.
        """
        exact = self._exact
        if not self.count:
            return None
        if exact is not None:
            if not self._sorted:  # sorted once: percentile() then sorts in one linear pass
                self._exact = exact = array("d", sorted(exact))
                self._sorted = True
            return percentile(exact, q)
        rank = q * (self._n - 1)
        seen = self._zeros
        if rank < seen:
            return self._min
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if rank < seen:
                estimate = 2 * _GAMMA**index / (_GAMMA + 1)
                return min(max(estimate, self._min), self._max)
        return self._max

    def summary(self, keys: tuple[str, ...] = ("p50", "p95")) -> dict[str, float | None]:
        """Named percentiles, for the report.

        Args:
            keys: names like ``"p50"``, ``"p99"`` and ``"max"``.

        Returns:
            ``{key: value in the recorded unit or None}``.
        """
        out: dict[str, float | None] = {}
        for key in keys:
            if key == "max":
                out[key] = self.max
            else:
                out[key] = self.quantile(float(key[1:]) / 100)
        return out
