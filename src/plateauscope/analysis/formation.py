"""The routing head and when it forms: t_form, tau and the lead fraction.

The routing head (documented and tested): at the final analysed checkpoint, score every head by
``attention to the cue (first target position) x max(exact patching effect, 0)``, where the
patching effect is the normalised head-output patch (clean into corrupted, all positions; 1 =
restores the clean answer). The head with the highest score routes the cue: it both looks at the
cue and carries what the answer needs from it (for the selector task, the cue is z).

t_form: the first analysed step, at or after the plateau start, at which the head's attention to
the cue has risen halfway from its plateau-start value to its final value. Its bracket is
(previous analysed step, t_form]: the checkpoint spacing.

t_form by three rules, side by side (:func:`t_form_rules`), each with its lead fraction:

* ``attention``: the rule above (the chosen head's attention to the cue halfway up);
* ``patch_share``: the same halfway rule on the chosen head's share of the summed positive
  head-patching effect (``plateauscope.analysis.circuit``), at the exact-patching steps. On the plateau that
  sum is ~0 and a share of it is noise (any head can hold "100%" of nothing), so a share counts
  as 0 where the summed positive effect is below :data:`SHARE_MIN_EFFECT` of its value at the
  last step (:func:`gated_shares`);
* ``cue_effect``: the first evaluation step at which the task's cue effect (``metrics.jsonl``;
  the selector task's delta_z) exceeds a noise threshold. The cue effect is a shuffled-cue
  comparison (the progress measure with the cue replaced by another one minus with the true cue),
  ~0 while the model ignores the cue; so its spread over the first ``n_baseline`` evaluations
  from the plateau start (where the cue is ignored by definition of the plateau) is the noise of
  that shuffled baseline. Threshold = baseline mean + ``n_sigma`` standard deviations, and at
  least ``floor`` x the plateau height (log K for the selector task), so that a flat baseline
  with zero spread does not make any rounding-level rise count. Detection starts after the
  baseline window; the bracket is (previous evaluation, t_form].

Smoothing is an explicit option (``smooth``, default 1 = none): a centred moving mean over that
many points (shrinking at the ends), applied to every series before its rule, and recorded with
the result.

tau comes from ``metrics.jsonl`` (``plateauscope.runs.metrics.compute_tau``), bracketed by the previous
evaluation step. The lead fraction is ``(tau - t_form) / tau`` (the paper: about 0.5); its
bracket is the range it takes over both brackets. Positive: the head forms before the drop.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pick_routing_head(to_z_first: list[list[float]], patch_normalised: list[list[float | None]]) -> tuple[tuple[int, int], list[list[float]]]:
    """The (layer, head) with the highest attention to the cue x positive patching effect, and all scores."""
    attn = np.asarray(to_z_first, dtype=float)
    effect = np.nan_to_num(np.asarray(patch_normalised, dtype=float), nan=0.0).clip(min=0.0)
    scores = attn * effect
    if not np.any(scores > 0):  # no head restores anything yet: fall back to attention alone
        scores = attn
    layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return (int(layer), int(head)), scores.tolist()


def formation_step(steps: list[int], values: list[float], start_step: int = 0) -> dict[str, Any]:
    """First step >= start_step where ``values`` reaches halfway from its value there to its final value."""
    pairs = [(s, v) for s, v in zip(steps, values) if s >= start_step]
    if len(pairs) < 2:
        return {"t_form": None, "t_form_bracket": None, "start_value": None, "final_value": None}
    start_value, final_value = pairs[0][1], pairs[-1][1]
    out = {"start_value": start_value, "final_value": final_value, "t_form": None, "t_form_bracket": None}
    if final_value <= start_value:
        return out
    half = start_value + 0.5 * (final_value - start_value)
    for (prev, _), (s, v) in zip(pairs, pairs[1:]):
        if v >= half:
            return {**out, "t_form": s, "t_form_bracket": [prev, s]}
    return out


def rule_follower(attention: list[dict[str, Any]], rule: str, start_step: int = 0
                  ) -> tuple[tuple[int, int], dict[str, Any]]:
    """The head that follows a task's named attention ``rule`` most at the last of the ``attention``
    records (the first such head on a tie), and when it formed (:func:`formation_step` on its series)."""
    final = attention[-1]["rules"][rule]
    n_heads = len(final[0])
    best = max(range(len(final) * n_heads), key=lambda i: final[i // n_heads][i % n_heads])
    layer, head = best // n_heads, best % n_heads
    values = [r["rules"][rule][layer][head] for r in attention]
    return (layer, head), formation_step([r["step"] for r in attention], values, start_step)


def lead_fraction(tau: int | None, tau_lo: int | None, t_form: int | None, t_lo: int | None) -> dict[str, Any]:
    """(tau - t_form) / tau with its bracket over tau in (tau_lo, tau] and t_form in (t_lo, t_form]."""
    if tau is None or t_form is None or tau <= 0:
        return {"lead_fraction": None, "lead_bracket": None}
    lead = (tau - t_form) / tau
    tau_lo = max(tau_lo if tau_lo is not None else tau, 1)
    t_lo = t_lo if t_lo is not None else t_form
    return {"lead_fraction": lead, "lead_bracket": [(tau_lo - t_form) / tau_lo, (tau - t_lo) / tau]}


RULES: tuple[str, ...] = ("attention", "patch_share", "cue_effect")
"""The t_form rules, in the order they are reported."""
SHARE_MIN_EFFECT = 0.05
"""A head's patching share counts only where the summed positive effect is at least this fraction of the final one."""
NOISE_BASELINE_EVALS = 5
"""Evaluations from the plateau start whose cue effect sets the noise baseline."""
NOISE_SIGMAS = 3.0
"""Standard deviations of the baseline above its mean that the cue effect must exceed."""
NOISE_FLOOR = 0.02
"""The threshold is at least this fraction of the plateau height (log K for the selector task)."""


def gated_shares(shares: list[float | None], totals: list[float], min_frac: float = SHARE_MIN_EFFECT
                 ) -> list[float | None]:
    """``shares`` with 0 where ``totals`` (summed positive effect) is below ``min_frac`` of its last value."""
    if not totals:
        return []
    floor = min_frac * totals[-1]
    return [0.0 if t < floor or t <= 0 else s for s, t in zip(shares, totals)]


def smooth_series(values: list[float | None], window: int = 1) -> list[float | None]:
    """Centred moving mean over ``window`` points (ends: the points that exist; None skipped)."""
    if window < 1:
        raise ValueError(f"the smoothing window must be at least 1, got {window}")
    if window == 1:
        return list(values)
    arr = np.array([np.nan if v is None else v for v in values], dtype=float)
    half = window // 2
    out: list[float | None] = []
    for i in range(len(arr)):
        w = arr[max(0, i - half): i + half + 1]
        w = w[~np.isnan(w)]
        out.append(float(w.mean()) if len(w) else None)
    return out


def noise_threshold_step(steps: list[int], values: list[float | None], start_step: int, height: float,
                         n_baseline: int = NOISE_BASELINE_EVALS, n_sigma: float = NOISE_SIGMAS,
                         floor: float = NOISE_FLOOR) -> dict[str, Any]:
    """First step after the baseline window (``n_baseline`` points from ``start_step``) whose value
    exceeds mean + ``n_sigma`` std of the window (at least ``floor`` x ``height``); module docstring."""
    pairs = [(s, v) for s, v in zip(steps, values) if s >= start_step and v is not None]
    out: dict[str, Any] = {"t_form": None, "t_form_bracket": None, "threshold": None, "baseline_mean": None,
                           "baseline_std": None, "baseline_steps": None}
    if len(pairs) <= n_baseline or n_baseline < 2:
        return out
    base = np.array([v for _, v in pairs[:n_baseline]])
    mean, std = float(base.mean()), float(base.std(ddof=1))
    threshold = max(mean + n_sigma * std, floor * height)
    out.update(threshold=threshold, baseline_mean=mean, baseline_std=std,
               baseline_steps=[pairs[0][0], pairs[n_baseline - 1][0]])
    rest = pairs[n_baseline - 1:]
    for (prev, _), (s, v) in zip(rest, rest[1:]):
        if v > threshold:
            return {**out, "t_form": s, "t_form_bracket": [prev, s]}
    return out


def t_form_rules(tau: int | None, tau_lo: int | None, plateau_start: int, height: float,
                 attention: tuple[list[int], list[float]], share: tuple[list[int], list[float | None]],
                 cue_effect: tuple[list[int], list[float | None]], smooth: int = 1) -> dict[str, Any]:
    """t_form, its bracket and the lead fraction by each rule of :data:`RULES`; each series is
    ``(steps, values)``; ``smooth`` is recorded with the result."""
    out: dict[str, Any] = {}
    for name, (steps, values) in (("attention", attention), ("patch_share", share)):
        vals = [0.0 if v is None else v for v in smooth_series(values, smooth)]
        form = formation_step(steps, vals, plateau_start)
        t_lo = form["t_form_bracket"][0] if form["t_form_bracket"] else None
        out[name] = {**form, **lead_fraction(tau, tau_lo, form["t_form"], t_lo)}
    steps, values = cue_effect
    form = noise_threshold_step(steps, smooth_series(values, smooth), plateau_start, height)
    t_lo = form["t_form_bracket"][0] if form["t_form_bracket"] else None
    out["cue_effect"] = {**form, **lead_fraction(tau, tau_lo, form["t_form"], t_lo),
                         "n_baseline": NOISE_BASELINE_EVALS, "n_sigma": NOISE_SIGMAS, "floor_height": NOISE_FLOOR}
    return {"rules": out, "smoothing": {"window": smooth, "kind": "centred moving mean"}}
