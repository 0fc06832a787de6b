"""One change-point rule for every signal of a run, and which signal moved first.

The toolkit reads "when does it happen" with several rules, one per signal: t_form by attention
halfway up, by patching share halfway up, by the cue effect over mean + 3 sd
(``plateauscope.analysis.formation``), the LLC's half-change step (``plateauscope.analysis.llc``) and
its 3-sd departure (``plateauscope.dynamics.llc``). With different rules, who moves first is partly
decided by the rules. This module has one rule, :class:`ChangePointRule`, applied with the same
parameters to every signal, so that an order of signals is an order of the signals.

**The rule** (:func:`change_point`). A signal is a series of ``(step, value)`` at its own
checkpoints (evaluations, analysed steps, LLC steps):

1. missing values (None, NaN) are left out; the series is smoothed by a centred moving mean of
   ``smooth`` points (``plateauscope.analysis.formation.smooth_series``; 1 = none);
2. the *noise band* is read from the values in the *baseline window* (the first half of the
   plateau, :func:`baseline_window`): its centre is their median, its half-width ``n_sd`` robust
   standard deviations (1.4826 x the median absolute deviation from the median, the normal
   distribution's sd), and at least ``floor`` x the signal's range (max - min from the start on),
   so that a perfectly flat plateau does not make a zero-width band that any rounding leaves;
3. the change point is the first checkpoint, from the start (the plateau start) on, that begins
   ``k`` consecutive checkpoints all beyond the band on the same side: above it (``rise``) or
   below it (``fall``). Its bracket is (the checkpoint before it, it]: the signal's resolution.

A series that never leaves its band for ``k`` checkpoints in a row (a flat one, pure noise, a
change within the noise) has no change point (None). The baseline window may hold the start of a
change (a head that begins forming in the plateau's first half): the median and the MAD shrug off
a minority of moved values, and the search starts at the plateau start, not after the window.

What the step means: where the signal has *left its own noise*. A step change is found at its
step; a gradual one (a ramp, a sigmoid) where it has crossed ``n_sd`` noise sd (or ``floor`` of its
range), so of two signals with the same shape the noisier one is read later. The defaults are
chosen and their errors measured on simulated series with a known truth
(``tests/test_changepoint.py``): steps, ramps and sigmoids, rising and falling, at four noise levels.

**A run's signals** (:func:`run_signals`), by role, so that seeds line up (a role's head can differ
from seed to seed; the head is recorded with it, :func:`signal_heads`):

* ``metrics.jsonl``: ``loss`` (the training objective on the evaluation groups), the task's progress
  measure (``Run.progress.key``, e.g. ``candidate_loss``), its cue effect (``cue_effect_key``, e.g.
  ``delta_z``) and every ``kl_<name>`` field (the KL to each of the task's reference predictors);
* the analysis cache (``plateauscope analyze``; absent: left out), a few heads and summed / maximal
  forms rather than every head: ``attention:routing`` (the routing head of ``routing.json``: its
  attention to the cue), ``attention:top`` (the head with the highest attention to the cue at the
  last analysed step, when it is not the routing head), ``attention:max`` (the largest attention to
  the cue over heads, per step), ``attention[<rule>]:top`` for each of the task's named attention
  rules (the head that follows the rule most at the end, e.g. induction's previous-token head);
  ``attribution_share:routing`` (the routing head's share of the summed positive normalised head
  attribution, gated like the patch-share rule, ``plateauscope.analysis.landmarks.attribution_shares``)
  and ``attribution_total`` (that sum), at every analysed step; ``patch_share:routing`` (the same share
  from exact patching, at the exact steps only: often too few for a band); ``edge_circuit_mass``
  (the final faithful edge circuit's share of the summed |attribution| over every edge, at every
  analysed step) and ``edge_circuit_effect`` (the summed attribution of those edges, logits);
* ``llc.json``: ``llc``; ``head_llc.json`` (the per-head LLC): ``head_llc:routing``, ``head_llc:top``
  (the head with the largest change from its first to its last value, when not the routing head)
  and ``head_llc:sum`` (over heads).

:func:`moved_first` reads the plateau span and tau (``summary.json``), applies the rule to every
signal from the plateau start with the band of the plateau's first half, and writes
``RUN/analysis/moved_first.json`` (:data:`plateauscope.analysis.results.MOVED_FIRST_FILE`): each
signal's change point, its fraction of tau, the order, and, labelled as such, the t_form of the
existing rules (``routing.json``) and the LLC's half-change step (``llc.json``), each its own rule.

    plateauscope moved_first --run checkpoints/demo
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from plateauscope.analysis.circuit import head_effects, head_shares
from plateauscope.analysis.formation import gated_shares, smooth_series
from plateauscope.analysis.landmarks import attribution_shares
from plateauscope.analysis.results import (
    HEAD_LLC_SUMMARY_FILE,
    LLC_SUMMARY_FILE,
    MOVED_FIRST_FILE,
    analysis_dir,
    na,
    read_routing_summary,
    write_json_result,
)
from plateauscope.training.metrics import compute_tau
from plateauscope.training.run import METRICS_FILE, Run, RunError, read_json

MAD_TO_SD = 1.4826
"""The median absolute deviation times this estimates the standard deviation of normal noise."""
DIRECTIONS = ("either", "rise", "fall")
"""What :attr:`ChangePointRule.direction` may ask for."""


@dataclass(frozen=True)
class ChangePointRule:
    """The one change-point rule (module docstring); the same parameters serve every signal."""

    n_sd: float = 3.0
    """Half-width of the noise band in robust standard deviations (1.4826 x MAD) of the baseline values."""
    k: int = 3
    """Consecutive checkpoints that must all lie beyond the band, on one side; the first of them is the change point."""
    smooth: int = 1
    """Centred moving mean over this many checkpoints before the rule (1 = none)."""
    floor: float = 0.05
    """The band's half-width is at least this fraction of the signal's range (max - min from the start on)."""
    min_baseline: int = 4
    """Fewest checkpoints in the baseline window for a band; fewer is an error (the signal is not read)."""
    direction: str = "either"
    """``either`` (the first departure, up or down), ``rise`` or ``fall`` (only departures that way count)."""

    def validate(self) -> None:
        """Raise ValueError (one line) on parameters the rule cannot use."""
        if not (math.isfinite(self.n_sd) and self.n_sd > 0):
            raise ValueError(f"change-point n_sd must be a positive number, got {self.n_sd}")
        for name, least in (("k", 1), ("smooth", 1), ("min_baseline", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"change-point {name} must be at least {least}, got {getattr(self, name)}")
        if not (math.isfinite(self.floor) and 0 <= self.floor < 1):
            raise ValueError(f"change-point floor must be in [0, 1), got {self.floor}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"change-point direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (stored with every result)."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """The rule in one line, with its parameters."""
        smooth = "no smoothing" if self.smooth == 1 else f"a centred {self.smooth}-point moving mean"
        way = {"either": "on one side", "rise": "above", "fall": "below"}[self.direction]
        return (f"first of {self.k} consecutive checkpoints beyond the band ({way}): median of the plateau's first half "
                f"+- max({self.n_sd:g} robust sd, {self.floor:g} x the signal's range); {smooth}")


@dataclass(frozen=True)
class ChangePoint:
    """Where one signal left its noise band."""

    step: int
    """The first of the ``k`` consecutive checkpoints beyond the band."""
    bracket: tuple[int, int]
    """(the checkpoint before ``step``, ``step``]: where the change happened, at the signal's resolution."""
    value: float
    """The (smoothed) value at ``step``."""
    direction: str
    """``rise`` (above the band) or ``fall`` (below it)."""
    center: float
    """The band's centre: the median of the baseline values."""
    half_width: float
    """The band's half-width: ``max(n_sd x robust_sd, floor x range)``."""
    robust_sd: float
    """1.4826 x the median absolute deviation of the baseline values."""
    n_baseline: int
    """Checkpoints in the baseline window."""

    @property
    def band(self) -> tuple[float, float]:
        """``(low, high)``: the values that count as noise."""
        return self.center - self.half_width, self.center + self.half_width

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, with the band."""
        return {**dataclasses.asdict(self), "bracket": list(self.bracket), "band": list(self.band)}


def robust_sd(values: Float[np.ndarray, " n"]) -> float:
    """1.4826 x the median absolute deviation from the median: the sd of normal noise, robust to outliers."""
    return float(MAD_TO_SD * np.median(np.abs(values - np.median(values))))


def baseline_window(plateau_span: Sequence[int] | None) -> tuple[int, int] | None:
    """The first half of the plateau span, ``(start, midpoint)``: where the noise band is read
    (the same window as ``plateauscope.dynamics.llc.plateau_window``)."""
    return (int(plateau_span[0]), (int(plateau_span[0]) + int(plateau_span[1])) // 2) if plateau_span else None


def _clean_series(steps: Sequence[int], values: Sequence[float | None]) -> tuple[list[int], list[float]]:
    """The points with a finite value, checked: as many steps as values, steps strictly increasing."""
    if len(steps) != len(values):
        raise ValueError(f"a signal needs one value per step, got {len(steps)} steps and {len(values)} values")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError("a signal's steps must be strictly increasing")
    kept = [(int(s), float(v)) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def change_point(steps: Sequence[int], values: Sequence[float | None], baseline: tuple[int, int],
                 start: int | None = None, rule: ChangePointRule = ChangePointRule()) -> ChangePoint | None:
    """The first step at or after ``start`` (default: the baseline's first step) that begins
    ``rule.k`` consecutive checkpoints beyond the noise band of the ``baseline`` window
    (``(first, last)`` step, inclusive), or None if the signal never leaves it (module docstring).

    Raises ValueError (one line) on bad input: mismatched lengths, steps not increasing, a window
    that ends before it starts, fewer than ``rule.min_baseline`` finite values in it."""
    rule.validate()
    lo, hi = baseline
    if hi < lo:
        raise ValueError(f"the baseline window ends before it starts: {lo}..{hi}")
    steps, values = _clean_series(steps, values)
    smoothed = np.array(smooth_series(values, rule.smooth), dtype=float)
    arr_steps = np.array(steps, dtype=np.int64)
    base = smoothed[(arr_steps >= lo) & (arr_steps <= hi)]
    if len(base) < rule.min_baseline:
        raise ValueError(f"{len(base)} checkpoint(s) in the baseline window {lo}..{hi}; "
                         f"the band needs at least {rule.min_baseline}")
    first = lo if start is None else start
    searched = arr_steps >= first
    if not searched.any():
        return None
    center, sd = float(np.median(base)), robust_sd(base)
    after = smoothed[searched]
    half = max(rule.n_sd * sd, rule.floor * float(after.max() - after.min()))
    above, below = after > center + half, after < center - half
    sides = {"either": (("rise", above), ("fall", below)), "rise": (("rise", above),),
             "fall": (("fall", below),)}[rule.direction]
    offset = int(np.argmax(searched))
    for i in range(len(after) - rule.k + 1):
        for name, beyond in sides:
            if beyond[i: i + rule.k].all():
                j = offset + i
                return ChangePoint(step=steps[j], bracket=(steps[j - 1] if j > 0 else steps[j], steps[j]),
                                   value=float(smoothed[j]), direction=name, center=center, half_width=half,
                                   robust_sd=sd, n_baseline=len(base))
    return None
