"""The selector-routing head and its timing: t_form, tau and the lead fraction.

Rule for the selector head (documented and tested): at the final analysed checkpoint, score
every head by ``attention-to-z (first target position) x max(exact patching effect, 0)``, where
the patching effect is the normalised head-output patch (clean into corrupted, all positions;
1 = restores the clean answer). The head with the highest score routes the selector: it both
looks at z and carries what the answer needs from it.

t_form: the first analysed step, at or after the plateau start, at which the head's
attention-to-z has risen halfway from its plateau-start value to its final value. Its bracket is
(previous analysed step, t_form]: the checkpoint spacing.

tau comes from ``metrics.jsonl`` (``training.metrics.compute_tau``), bracketed by the previous
evaluation step. The lead fraction is ``(tau - t_form) / tau`` (the paper: about 0.5); its
bracket is the range it takes over both brackets. Positive: the head forms before the drop.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pick_selector_head(to_z_first: list[list[float]], patch_normalised: list[list[float | None]]) -> tuple[tuple[int, int], list[list[float]]]:
    """The (layer, head) with the highest attention-to-z x positive patching effect, and all scores."""
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


def lead_fraction(tau: int | None, tau_lo: int | None, t_form: int | None, t_lo: int | None) -> dict[str, Any]:
    """(tau - t_form) / tau with its bracket over tau in (tau_lo, tau] and t_form in (t_lo, t_form]."""
    if tau is None or t_form is None or tau <= 0:
        return {"lead_fraction": None, "lead_bracket": None}
    lead = (tau - t_form) / tau
    tau_lo = max(tau_lo if tau_lo is not None else tau, 1)
    t_lo = t_lo if t_lo is not None else t_form
    return {"lead_fraction": lead, "lead_bracket": [(tau_lo - t_form) / tau_lo, (tau - t_lo) / tau]}
