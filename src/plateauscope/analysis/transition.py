"""The phase change as Olsson et al. (2022) read it: where the in-context loss gap rises, in three parts.

The gap is measured per probe sequence at every analysed checkpoint; its curve is the mean over the sequences. Its
levels are ``low``, the least value before the curve's peak, and ``high``, the peak. Then (:func:`transition`):

* **onset**: where the gap leaves its noise, by the project's one change-point rule
  (:func:`plateauscope.analysis.changepoint.change_point`, rising) with the band read from the checkpoints before
  the curve first reaches 10% of its rise: a baseline that ends where the rise begins, so it does not depend on how
  many checkpoints come after the change. Its step is where the curve crosses the top of the band, linear between
  the change point and the checkpoint before it (as the other parts' crossings are);
* **phase change**: the half-rise, where the curve first reaches ``low + (high - low) / 2`` (linear between the
  checkpoints on either side), with the steepest rise beside it (the pair of consecutive checkpoints with the
  largest slope, up to the peak);
* **end**: where the curve first reaches 90% of its rise.

Each has a 95% interval: the percentile bootstrap over the probe's sequences (:data:`N_BOOTSTRAP` resamples, the
same resamples at every checkpoint), widened to the checkpoints on either side of the point (between two
checkpoints the curve is not observed, so no interval is narrower than the checkpoints' spacing there). A rise no
larger than :data:`SIGNIFICANT_RISE` standard errors of a checkpoint's mean is no transition; one whose curve ends
below its half-rise level is read, with a note that it does not hold (:func:`fall_back_note`).

:func:`co_occurrence` reads the named heads' scores the same way: their half-rise, and its lag behind the gap's
half-rise with its interval (the same resamples), and whether it lies between the gap's onset and end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from jaxtyping import Float

from plateauscope.analysis.changepoint import ChangePointRule, change_point
from plateauscope.analysis.head_naming import LEVEL, percentile_interval

N_BOOTSTRAP = 200
"""Resamples of the probe's sequences for the landmarks' intervals."""
HALF, END, START = 0.5, 0.9, 0.1
"""Fractions of the rise: the phase change, the end, and where the onset's baseline stops."""
SIGNIFICANT_RISE = 8.0
"""A rise (``high - low``) must exceed this many standard errors of a checkpoint's mean to be a transition."""


@dataclass
class Landmark:
    """One part of the transition."""

    step: float
    """The step (a crossing is interpolated between checkpoints)."""
    bracket: list[int]
    """The checkpoints on either side: ``(before, at or after]``."""
    interval: list[float] | None
    """95% percentile bootstrap over the probe's sequences, widened to ``bracket``; None with one sequence."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


@dataclass
class Transition:
    """The three parts of a rise (module docstring)."""

    signal: str
    low: float
    high: float
    onset: Landmark | None
    phase_change: Landmark | None
    steepest_rise: Landmark | None
    end: Landmark | None
    baseline: list[int] | None
    """``[first, last]`` step of the onset's band, or None where too few checkpoints come before the rise."""
    onset_band: dict[str, Any] | None
    """The onset's change point (``ChangePoint.to_dict``: band, bracket), or None."""
    n_sequences: int
    notes: list[str] = field(default_factory=list)
    """Why a part is missing, in one line each."""
    method: str = (f"levels: the least value before the peak and the peak; phase change: first reaching half the rise "
                   f"(linear between checkpoints), steepest rise beside it; end: {END:.0%} of the rise; onset: the "
                   f"change-point rule with its band from the checkpoints before {START:.0%} of the rise; intervals: "
                   f"{LEVEL:.0%} percentile bootstrap over the probe's sequences ({N_BOOTSTRAP} resamples), widened to "
                   "the checkpoints on either side")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


def crossing(steps: list[int], curve: Float[np.ndarray, " S"], level: float, start: int, stop: int
             ) -> tuple[float | int, list[int]] | None:
    """The first point in ``(start, stop]`` (indices) where ``curve`` reaches ``level``, linear between checkpoints,
    and its bracket; None if it does not."""
    for i in range(start + 1, stop + 1):
        if curve[i] >= level:
            a, b = curve[i - 1], curve[i]
            t = 1.0 if b == a else float(np.clip((level - a) / (b - a), 0.0, 1.0))
            return steps[i - 1] + t * (steps[i] - steps[i - 1]), [steps[i - 1], steps[i]]
    return None


def rise_points(steps: list[int], curve: Float[np.ndarray, " S"]) -> dict[str, Any] | None:
    """The levels and the crossings of one curve (module docstring), or None without a rise."""
    peak = int(np.nanargmax(curve))
    low_at = int(np.nanargmin(curve[: peak + 1]))
    low, high = float(curve[low_at]), float(curve[peak])
    if peak == low_at or high <= low:
        return None
    rise = high - low
    slopes = np.diff(curve[low_at: peak + 1]) / np.diff(steps[low_at: peak + 1])
    steep = low_at + int(np.argmax(slopes))
    return {"low": low, "high": high,
            "start": crossing(steps, curve, low + START * rise, low_at, peak),
            "half": crossing(steps, curve, low + HALF * rise, low_at, peak),
            "end": crossing(steps, curve, low + END * rise, low_at, peak),
            "steepest": ((steps[steep] + steps[steep + 1]) / 2, [steps[steep], steps[steep + 1]])}


def onset_point(steps: list[int], curve: Float[np.ndarray, " S"], start: tuple[float | int, list[int]] | None,
                rule: ChangePointRule) -> tuple[Any, list[int] | None, str | None]:
    """The onset's change point, its baseline ``[first, last]`` and a note where there is none."""
    if start is None:
        return None, None, "the curve does not rise"
    before = [s for s in steps if s < start[1][1]]
    if len(before) < rule.min_baseline:
        return None, None, (f"{len(before)} checkpoint(s) before the rise begins (at least {rule.min_baseline} read a "
                            "noise band): no onset")
    rising = ChangePointRule(**{**rule.to_dict(), "direction": "rise"})
    found = change_point(steps, curve.tolist(), (before[0], before[-1]), rule=rising)
    if found is None:
        return None, [before[0], before[-1]], "the curve never leaves the band of the checkpoints before its rise"
    return found, [before[0], before[-1]], None


def onset_crossing(steps: list[int], curve: Float[np.ndarray, " S"], found: Any) -> tuple[float, list[int]]:
    """Where the curve crosses the top of the onset's band, linear within the change point's bracket (the change
    point is the first checkpoint past the band; the gap left it between that checkpoint and the one before)."""
    i = steps.index(found.step)
    if i == 0:
        return float(steps[0]), [steps[0], steps[0]]
    point = crossing(steps, curve, found.band[1], i - 1, i)
    return point if point is not None else (float(found.step), [steps[i - 1], steps[i]])


def _landmark(point: tuple[float | int, list[int]] | None, draws: list[float | int], n_sequences: int) -> Landmark | None:
    """A landmark from its point and its bootstrap draws (the interval widened to the bracket)."""
    if point is None:
        return None
    step, bracket = point
    interval = None
    if n_sequences > 1 and draws:
        lo, hi = percentile_interval(np.array(draws, dtype=float))
        interval = [float(min(lo, bracket[0])), float(max(hi, bracket[1]))]
    return Landmark(float(step), [int(b) for b in bracket], interval)


def resamples(n_sequences: int, n_boot: int = N_BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """``[n_boot, N]`` row indices: the same resamples serve the gap and the heads' scores."""
    return np.random.default_rng(seed).integers(0, n_sequences, size=(n_boot, n_sequences))


def transition(steps: list[int], per_sequence: Float[np.ndarray, "S N"], signal: str = "in_context_loss_gap",
               rule: ChangePointRule = ChangePointRule(), n_boot: int = N_BOOTSTRAP, seed: int = 0) -> Transition:
    """The onset, phase change (with the steepest rise) and end of a rising signal measured per sequence at each
    checkpoint (module docstring)."""
    values = np.asarray(per_sequence, dtype=float)
    n = values.shape[1]
    curve = np.nanmean(values, axis=1)
    found = rise_points(steps, curve)
    empty = Transition(signal, float(np.nanmin(curve)), float(np.nanmax(curve)), None, None, None, None, None, None, n)
    if found is None:
        return Transition(**{**asdict(empty), "notes": ["the curve does not rise"]})
    if n > 1:
        error = np.nanmedian(np.nanstd(values, axis=1, ddof=1) / np.sqrt(n))
        if found["high"] - found["low"] <= SIGNIFICANT_RISE * error:
            return Transition(**{**asdict(empty), "notes": [
                f"the rise ({found['high'] - found['low']:.3g}) is within {SIGNIFICANT_RISE:g} standard errors of a "
                f"checkpoint's mean ({error:.3g}): no transition"]})
    onset, baseline, note = onset_point(steps, curve, found["start"], rule)
    draws: dict[str, list[float]] = {"onset": [], "half": [], "end": [], "steepest": []}
    for rows in (resamples(n, n_boot, seed) if n > 1 else []):
        replicate = np.nanmean(values[:, rows], axis=1)
        points = rise_points(steps, replicate)
        if points is None:
            continue
        for key in ("half", "end", "steepest"):
            if points[key] is not None:
                draws[key].append(points[key][0])
        change = onset_point(steps, replicate, points["start"], rule)[0]
        if change is not None:
            draws["onset"].append(onset_crossing(steps, replicate, change)[0])
    onset_landmark = None
    if onset is not None:
        onset_landmark = _landmark(onset_crossing(steps, curve, onset), draws["onset"], n)
    return Transition(signal, found["low"], found["high"], onset_landmark, _landmark(found["half"], draws["half"], n),
                      _landmark(found["steepest"], draws["steepest"], n), _landmark(found["end"], draws["end"], n),
                      baseline, onset.to_dict() if onset is not None else None, n,
                      [note for note in (note, fall_back_note(steps, curve, found)) if note])


def fall_back_note(steps: list[int], curve: Float[np.ndarray, " S"], found: dict[str, Any]) -> str | None:
    """A note where the rise does not hold: the curve's last value lies below its half-rise level (a peak that
    falls back is no lasting change), else None."""
    known = np.flatnonzero(~np.isnan(curve))
    last, half = float(curve[known[-1]]), found["low"] + HALF * (found["high"] - found["low"])
    if last >= half:
        return None
    return (f"the rise does not hold: after its peak ({found['high']:.3g} at step {steps[int(np.nanargmax(curve))]}) "
            f"the curve falls to {last:.3g} at the last checkpoint, step {steps[known[-1]]}, below its half-rise "
            f"level ({half:.3g})")


@dataclass
class CoOccurrence:
    """Whether the named heads' scores rise in the loss gap's window (Olsson et al.'s co-occurrence)."""

    score: str
    """The detection pattern whose score is read (``induction``)."""
    heads: list[str]
    """The named heads, whose per-sequence scores are averaged."""
    half_rise: Landmark | None
    """Where their mean score first reaches half its rise."""
    lag: float | None
    """Their half-rise minus the gap's (steps; negative: the heads rise first)."""
    lag_interval: list[float] | None
    """95% percentile bootstrap of ``lag`` over the probe's sequences (the same resamples)."""
    same_window: bool | None
    """Whether their half-rise lies between the gap's onset (its first checkpoint where it has none) and end."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


def co_occurrence(steps: list[int], gap: Float[np.ndarray, "S N"], scores: Float[np.ndarray, "S N"], score: str,
                  heads: list[str], gap_transition: Transition, n_boot: int = N_BOOTSTRAP, seed: int = 0
                  ) -> CoOccurrence:
    """The named heads' half-rise beside the gap's (module docstring); ``scores``: their mean score per sequence."""
    gap, scores = np.asarray(gap, dtype=float), np.asarray(scores, dtype=float)
    n = scores.shape[1]
    found = rise_points(steps, np.nanmean(scores, axis=1))
    gap_half = gap_transition.phase_change
    if found is None or found["half"] is None:
        return CoOccurrence(score, heads, None, None, None, None)
    head_draws, lag_draws = [], []
    for rows in (resamples(n, n_boot, seed) if n > 1 else []):
        head_points = rise_points(steps, np.nanmean(scores[:, rows], axis=1))
        gap_points = rise_points(steps, np.nanmean(gap[:, rows], axis=1))
        if head_points is None or head_points["half"] is None:
            continue
        head_draws.append(head_points["half"][0])
        if gap_points is not None and gap_points["half"] is not None:
            lag_draws.append(head_points["half"][0] - gap_points["half"][0])
    half = _landmark(found["half"], head_draws, n)
    if gap_half is None:
        return CoOccurrence(score, heads, half, None, None, None)
    lag = half.step - gap_half.step
    lag_interval = [float(v) for v in percentile_interval(np.array(lag_draws))] if len(lag_draws) > 1 else None
    start = gap_transition.onset.step if gap_transition.onset is not None else steps[0]
    stop = gap_transition.end.step if gap_transition.end is not None else steps[-1]
    return CoOccurrence(score, heads, half, lag, lag_interval, bool(start <= half.step <= stop))
