"""Intervals over seeds have the coverage they state: simulated sweeps with a known truth."""

from __future__ import annotations

import numpy as np
import pytest

from plateauscope.analysis.intervals import (
    Interval,
    mean_interval,
    median_interval,
    ratio_interval,
    slope_interval,
)

SWEEPS = 2000


def _coverage(make, truth: float) -> float:
    hits = [make(np.random.default_rng(i)).contains(truth) for i in range(SWEEPS)]
    return float(np.mean(hits))


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_95_percent_interval_of_a_mean_covers_93_to_97_percent(n):
    covered = _coverage(lambda rng: mean_interval(rng.normal(1500.0, 200.0, n)), 1500.0)
    assert 0.93 <= covered <= 0.97, covered


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_95_percent_interval_of_a_ratio_covers_93_to_97_percent(n):
    """Run lengths over seeds, log-normal with different spreads: the ratio of geometric means is 2."""
    def sweep(rng):
        slow = np.exp(rng.normal(np.log(2 * 700.0), 0.25, n))
        fast = np.exp(rng.normal(np.log(700.0), 0.10, n))
        return ratio_interval(slow, fast)
    covered = _coverage(sweep, 2.0)
    assert 0.93 <= covered <= 0.97, covered
    assert sweep(np.random.default_rng(0)).label == f"95% welch log-ratio t interval (n = {n})"


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_median_interval_covers_what_it_states(n):
    """Skewed data (exponential, median log 2): the order-statistic interval's stated coverage holds,
    and it is at least 95% once n allows it."""
    stated = median_interval(np.arange(n, dtype=float)).coverage
    covered = _coverage(lambda rng: median_interval(rng.exponential(1.0, n)), float(np.log(2)))
    four_sd = 4 * np.sqrt(stated * (1 - stated) / SWEEPS)  # of the simulated coverage, about 0.01-0.04
    assert abs(covered - stated) <= four_sd, (covered, stated)
    assert stated == pytest.approx({3: 0.75, 5: 0.9375, 10: 1 - 2 * 11 / 1024}[n])
    assert median_interval(np.arange(n, dtype=float)).label.startswith({3: "75% ", 5: "93.75% ", 10: "97.85% "}[n])


def test_the_slope_interval_covers_93_to_97_percent():
    """tau = c D^1.2 with log-normal noise, 3 seeds at each of 3 data set sizes."""
    log_d = np.log(np.repeat([1000.0, 2000.0, 4000.0], 3))
    covered = _coverage(lambda rng: slope_interval(log_d, 1.2 * log_d + rng.normal(0, 0.1, len(log_d))), 1.2)
    assert 0.93 <= covered <= 0.97, covered


def test_two_seeds_give_a_range_labelled_as_such_never_a_95_percent_interval():
    assert mean_interval([7900.0, 8350.0]) == Interval(7900.0, 8350.0, "range", None, 2)
    ratio = ratio_interval([7900.0 * 32, 8350.0 * 32], [700.0 * 256, 750.0 * 256])
    assert ratio.coverage is None and ratio.label == "range of 2 seeds"
    assert (ratio.low, ratio.high) == pytest.approx((7900 * 32 / (750 * 256), 8350 * 32 / (700 * 256)))
    assert median_interval([1.0, 2.0]).label == "range of 2 seeds"
    assert "95%" not in ratio.label and mean_interval([1.0]) is None and ratio_interval([1.0, 2.0], [3.0]) is None
    # and with two seeds a stated interval would cover far less than it says: the range of 2 covers half
    covered = _coverage(lambda rng: mean_interval(rng.normal(0.0, 1.0, 2)), 0.0)
    assert 0.45 <= covered <= 0.55


def test_a_censored_value_opens_the_end_it_enters():
    both = ratio_interval([4000.0, 5500.0, 4800.0], [1200.0, 1250.0, 1230.0], numerator_censored=[False, True, False])
    assert both.high_open and not both.low_open and both.text().startswith("[") and ", >= " in both.text()
    assert both.contains(1000.0) and not both.contains(1.0)
    reference = ratio_interval([4000.0, 4100.0, 3900.0], [1200.0, 1250.0, 1230.0], denominator_censored=[True] * 3)
    assert reference.low_open and reference.text().startswith("[<= ")
    assert mean_interval([3750.0, 5500.0], censored=[True, True]).text("{:,.0f}") == "[3,750, >= 5,500]"
