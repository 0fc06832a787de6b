"""The transition's three parts on simulated loss gaps with a known curve: a logistic rise measured per sequence
with noise, at dense and at sparse checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from plateauscope.analysis.transition import co_occurrence, rise_points, transition


def logistic(steps: np.ndarray, mid: float, width: float, height: float = 4.0) -> np.ndarray:
    return height / (1 + np.exp(-(steps - mid) / width))


def per_sequence(steps: np.ndarray, curve: np.ndarray, n: int = 128, sd: float = 0.5, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return curve[:, None] + rng.normal(0, sd, (len(steps), n))


def test_the_half_rise_is_where_the_curve_is_halfway_and_its_interval_covers_it():
    steps = np.arange(0, 1001, 20)
    found = []
    for seed in range(20):
        t = transition(steps.tolist(), per_sequence(steps, logistic(steps, 510, 25), seed=seed), n_boot=100,
                       seed=seed)
        lo, hi = t.phase_change.interval
        found.append(lo <= 510 <= hi)
        assert abs(t.phase_change.step - 510) <= 20
        assert t.onset.step < t.phase_change.step < t.end.step
        assert 510 + 25 * np.log(9) - 20 <= t.end.step <= 510 + 25 * np.log(9) + 20  # 90% of the rise
        assert abs(t.steepest_rise.step - 510) <= 30  # the steepest pair of checkpoints, one either side at most
    assert sum(found) >= 18


def test_sparse_checkpoints_give_an_interval_that_overlaps_the_dense_one():
    dense = np.arange(0, 1001, 10)
    sparse = dense[::5]
    gap = per_sequence(dense, logistic(dense, 505, 20))
    a = transition(dense.tolist(), gap, n_boot=100).phase_change.interval
    b = transition(sparse.tolist(), gap[::5], n_boot=100).phase_change.interval
    assert max(a[0], b[0]) <= min(a[1], b[1])


def test_noise_alone_is_no_transition():
    steps = np.arange(0, 500, 10)
    t = transition(steps.tolist(), per_sequence(steps, np.zeros(len(steps))), n_boot=50)
    assert t.phase_change is None and t.onset is None and "no transition" in t.notes[0]


def test_too_few_checkpoints_before_the_rise_give_no_onset_but_a_phase_change():
    steps = np.arange(0, 1001, 100)
    t = transition(steps.tolist(), per_sequence(steps, logistic(steps, 250, 30), sd=0.2), n_boot=50)
    assert t.onset is None and t.phase_change is not None and "no onset" in t.notes[0]


def test_heads_that_rise_with_the_gap_co_occur_and_heads_that_rise_later_do_not():
    steps = np.arange(0, 1001, 20)
    gap = per_sequence(steps, logistic(steps, 500, 20))
    t = transition(steps.tolist(), gap, n_boot=100)
    heads = per_sequence(steps, logistic(steps, 510, 20, height=0.9), sd=0.1, seed=1)
    together = co_occurrence(steps.tolist(), gap, heads, "induction", ["L1H0"], t, n_boot=100)
    assert together.same_window and together.lag == pytest.approx(10, abs=15)
    assert together.lag_interval[0] <= together.lag <= together.lag_interval[1]
    late = per_sequence(steps, logistic(steps, 800, 20, height=0.9), sd=0.1, seed=2)
    apart = co_occurrence(steps.tolist(), gap, late, "induction", ["L1H0"], t, n_boot=100)
    assert not apart.same_window and apart.lag_interval[0] > 200


def test_a_rise_that_falls_back_says_so_and_one_that_holds_does_not():
    """A logistic rise to 4 that then falls to -1 (a transient bump): the phase change is read, with a note that the
    rise does not hold, naming the last value; the same rise held to the end has no such note."""
    steps = np.arange(0, 1001, 20)
    bump = logistic(steps, 400, 20) - logistic(steps, 700, 20, height=5.0)
    t = transition(steps.tolist(), per_sequence(steps, bump, sd=0.1), n_boot=50)
    assert t.phase_change is not None and abs(t.phase_change.step - 400) <= 20
    note = [n for n in t.notes if n.startswith("the rise does not hold")]
    assert len(note) == 1 and "at the last checkpoint, step 1000" in note[0] and "falls to -1" in note[0], t.notes
    held = transition(steps.tolist(), per_sequence(steps, logistic(steps, 400, 20), sd=0.1), n_boot=50)
    assert not any(n.startswith("the rise does not hold") for n in held.notes)


def test_a_falling_curve_has_no_rise():
    steps = list(range(10))
    assert rise_points(steps, np.linspace(1, 0, 10)) is None
