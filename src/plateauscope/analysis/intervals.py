"""Intervals over seeds whose coverage holds at the seed counts we use, each labelled with its method.

A percentile bootstrap over a handful of seeds does not have the coverage it names: with two seeds
its "95% interval" of a mean is the range of the two, which covers the true mean about half the
time; over three seeds the percentile interval of a median covers about 75%. The intervals here
have a stated coverage at every n, checked on simulated data with a known truth
(``tests/analysis/test_intervals.py``):

* the mean of n >= 3 values: Student's t interval (exact for normal data);
* a ratio of two conditions (n >= 3 each): a t interval on the difference of mean logs, with
  Welch's degrees of freedom, exponentiated. It is an interval for the ratio of *geometric* means
  (exact for log-normal data, which run lengths over seeds are close to), and the point estimate
  that goes with it is that ratio;
* the median of n values: the distribution-free order-statistic interval. It has the coverage of
  the binomial at that n: at n = 3 no interval of the data reaches 95%, so the widest one, the
  range, is given with the coverage it has (75%), stated as such;
* a regression slope (e.g. alpha in tau ~ D^alpha): the least-squares t interval, n - 2 degrees
  of freedom;
* two seeds: the range of the two, labelled "range of 2 seeds", with no coverage claimed.

A censored value (a run that stopped before tau: its last step is a lower bound) makes the ends it
enters lower bounds too: such an end prints open, ``>= x``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats

Values = Iterable[float | int | np.number]
"""Numbers over seeds (None and non-finite entries are left out)."""

LEVEL = 0.95
"""The coverage asked for when n allows it."""
MIN_SEEDS_FOR_A_CLAIM = 3
"""A reading of reproduced, refuted or holds in part needs at least this many seeds per point."""


@dataclass(frozen=True)
class Interval:
    """``[low, high]`` with the method that made it and the coverage it has at its sample size."""

    low: float
    high: float
    method: str
    """``t``, ``welch log-ratio t``, ``order statistics``, ``least-squares t`` or ``range``."""
    coverage: float | None
    """The probability that the interval holds the true value (None for a range: none is claimed)."""
    n: int
    """Values behind it (the smaller group's for a ratio)."""
    low_open: bool = False
    """The low end comes from a censored value: the true end may be lower."""
    high_open: bool = False
    """The high end comes from a censored value: the true end may be higher."""

    def __iter__(self):
        yield self.low
        yield self.high

    @property
    def label(self) -> str:
        """What the interval is, e.g. ``95% t interval`` or ``range of 2 seeds``."""
        if self.coverage is None:
            return f"range of {self.n} seeds"
        return f"{_percent(self.coverage)} {self.method} interval (n = {self.n})"

    def text(self, fmt: str = "{:.2f}") -> str:
        """``[low, high]``, with an open end written ``>= x`` (or ``<= x``)."""
        lo = ("<= " if self.low_open else "") + fmt.format(self.low)
        hi = (">= " if self.high_open else "") + fmt.format(self.high)
        return f"[{lo}, {hi}]"

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies inside, counting an open end as unbounded on its side."""
        return (self.low_open or self.low <= x) and (self.high_open or x <= self.high)

    def to_dict(self) -> dict:
        """Plain JSON types, with the label."""
        return {"low": self.low, "high": self.high, "method": self.method, "coverage": self.coverage, "n": self.n,
                "low_open": self.low_open, "high_open": self.high_open, "label": self.label}


def _percent(p: float) -> str:
    return f"{100 * p:.2f}".rstrip("0").rstrip(".") + "%"


def _clean(values: Values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def mean_interval(values: Values, censored: Iterable[bool] | None = None,
                  level: float = LEVEL) -> Interval | None:
    """The mean's t interval (n >= 3), the range of 2 seeds, or None for fewer."""
    x = _clean(values)
    n = len(x)
    if n < 2:
        return None
    opened = bool(censored is not None and any(censored))
    if n == 2:
        return Interval(float(x.min()), float(x.max()), "range", None, 2, high_open=opened)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return Interval(float(x.mean() - half), float(x.mean() + half), "t", level, n, high_open=opened)


def geometric_mean(values: Values) -> float:
    """``exp(mean(log x))`` of positive values."""
    return float(np.exp(np.log(_clean(values)).mean()))


def geometric_mean_interval(values: Values, censored: Iterable[bool] | None = None,
                            level: float = LEVEL) -> Interval | None:
    """:func:`mean_interval` of the logs, exponentiated: an interval for the geometric mean (the
    range of 2 seeds for two)."""
    logs = np.log(_clean(values))
    inner = mean_interval(logs, censored, level)
    if inner is None:
        return None
    return Interval(float(np.exp(inner.low)), float(np.exp(inner.high)), "t on logs" if inner.coverage else "range",
                    inner.coverage, inner.n, inner.low_open, inner.high_open)


def ratio_interval(numerator: Values, denominator: Values,
                   numerator_censored: Iterable[bool] | None = None,
                   denominator_censored: Iterable[bool] | None = None, level: float = LEVEL) -> Interval | None:
    """An interval for geometric mean(numerator) / geometric mean(denominator) over independent seeds.

    n >= 3 in both: Welch's t on the difference of mean logs. Otherwise, with 2 values at least in
    each, the range of the seed-by-seed ratios (min / max to max / min), claiming no coverage. A
    censored numerator opens the high end (the ratio is a lower bound); a censored denominator opens
    the low end."""
    a, b = np.log(_clean(numerator)), np.log(_clean(denominator))
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return None
    hi_open = bool(numerator_censored is not None and any(numerator_censored))
    lo_open = bool(denominator_censored is not None and any(denominator_censored))
    if min(na, nb) < MIN_SEEDS_FOR_A_CLAIM:
        return Interval(float(np.exp(a.min() - b.max())), float(np.exp(a.max() - b.min())), "range", None,
                        min(na, nb), lo_open, hi_open)
    va, vb = a.var(ddof=1) / na, b.var(ddof=1) / nb
    diff, se = a.mean() - b.mean(), math.sqrt(va + vb)
    if se == 0:
        return Interval(float(np.exp(diff)), float(np.exp(diff)), "welch log-ratio t", level, min(na, nb),
                        lo_open, hi_open)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return Interval(float(np.exp(diff - half)), float(np.exp(diff + half)), "welch log-ratio t", level,
                    min(na, nb), lo_open, hi_open)


def median_interval(values: Values, level: float = LEVEL) -> Interval | None:
    """The order-statistic interval of the median: ``[x_(j), x_(n+1-j)]`` with the largest j whose
    coverage, ``1 - 2 P(Binomial(n, 1/2) < j)``, is at least ``level``; when even the range falls
    short (n <= 5), the range with the coverage it has. The range of 2 seeds for n = 2."""
    x = np.sort(_clean(values))
    n = len(x)
    if n < 2:
        return None
    if n == 2:
        return Interval(float(x[0]), float(x[1]), "range", None, 2)
    coverage = [1 - 2 * stats.binom.cdf(j - 1, n, 0.5) for j in range(1, n // 2 + 1)]
    j = max((j for j, c in zip(range(1, n // 2 + 1), coverage) if c >= level), default=1)
    return Interval(float(x[j - 1]), float(x[n - j]), "order statistics", float(coverage[j - 1]), n)


def slope_interval(x: Values, y: Values, level: float = LEVEL) -> Interval | None:
    """The least-squares slope's t interval (n - 2 degrees of freedom); None with fewer than 3 points
    or a single x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    se = math.sqrt((residual ** 2).sum() / (n - 2) / ((x - x.mean()) ** 2).sum())
    half = stats.t.ppf(0.5 + level / 2, n - 2) * se
    return Interval(float(slope - half), float(slope + half), "least-squares t", level, n)


def enough_seeds(*counts: int) -> bool:
    """Whether every point has the seeds a claim needs (:data:`MIN_SEEDS_FOR_A_CLAIM`)."""
    return all(c >= MIN_SEEDS_FOR_A_CLAIM for c in counts)
