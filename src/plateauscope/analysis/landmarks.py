"""Where the expensive analyses run: the landmarks of a series, found from its cheap pass.

The adaptive analysis (``plateauscope.analysis.analyze``, the default) runs a *cheap pass* at every
chosen checkpoint, a fixed few forwards and backwards each: attention to the cue, attribution
patching of the heads and the residual stream, edge attribution and a few attention patterns. On
the plateau these carry almost no signal (the clean-corrupted gap is under 0.01 logits), so the
*expensive* analyses (exact patching, the circuit's set ablations, head ablation, exact edge
patching and the faithful circuit search) run only at the steps this module picks from the cheap
records:

* always: the plateau's start and middle (``Run.plateau_stretch``: the longest in-band stretch), tau and the last step;
  t_form by each rule, each from a cheap stand-in: the attention rule on the routing head
  (chosen as :func:`plateauscope.analysis.formation.pick_routing_head` chooses it, with attribution
  in place of exact patching), the patch-share rule on that head's share of the positive head
  attribution, the cue-effect rule on ``metrics.jsonl`` (already exact); and the t_form of the head
  that follows each of the task's named attention rules;
* then, while fewer than ``budget`` steps are picked: the step before each of those t_forms (its
  bracket) and the evaluation before tau, in that order;
* then, while fewer than ``budget`` steps are picked, the steps where the cheap signals change
  fastest: the sum over the routing head's attention, its attribution share, the summed positive
  attribution and the progress measure of each one's change since the previous analysed step, as a
  fraction of that signal's range.

No finding reads the bracket steps' expensive records (t_form by patch share is bisected with exact
patching afterwards, ``plateauscope.analysis.analyze``), so the default budget,
:data:`DEFAULT_BUDGET`, leaves them out on a series with one t_form per rule.

Each landmark snaps to the nearest analysed step (:func:`nearest`). The result maps each step to the
reasons it was picked, which ``routing.json`` keeps. (The summary also reads head ablation at tau/2:
``plateauscope.analysis.analyze`` runs that one analysis there, not the whole expensive pass.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from plateauscope.analysis import formation
from plateauscope.runs.files import RunError

DEFAULT_BUDGET = 7
"""Steps of the expensive pass by default: the landmarks that are always picked, on the selector task."""


def nearest(steps: Sequence[int], target: float | int) -> int:
    """The step of ``steps`` nearest ``target`` (the earlier on a tie); a one-line RunError without steps."""
    if not steps:
        raise RunError("the run has no checkpoints")
    return min(steps, key=lambda s: (abs(s - target), s))


def attribution_shares(record: dict[str, Any], layer: int, head: int) -> tuple[float, float]:
    """A head's share of the summed positive normalised head attribution, and that sum (an
    attribution record's ``heads``; a share counts as 0 where the sum is 0)."""
    norm = np.nan_to_num(np.asarray(record["heads"]["normalised"], dtype=float), nan=0.0).clip(min=0.0)
    total = float(norm.sum())
    return (float(norm[layer, head] / total) if total > 0 else 0.0), total


def cheap_signals(attention: list[dict[str, Any]], attribution: list[dict[str, Any]]
                  ) -> tuple[list[int], dict[str, list[float]]]:
    """The steps both cheap caches hold, and the cheap series of the routing head chosen from them:
    attention to the cue, attribution share (gated as the patch-share rule gates it) and the summed
    positive attribution."""
    by_step = {r["step"]: r for r in attribution}
    attn = [r for r in attention if r["step"] in by_step]
    if not attn:
        raise ValueError("the cheap pass has no step with both attention and attribution records")
    (layer, head), _ = formation.pick_routing_head(attn[-1]["to_z_first"], by_step[attn[-1]["step"]]["heads"]["normalised"])
    steps = [r["step"] for r in attn]
    shares, totals = zip(*(attribution_shares(by_step[s], layer, head) for s in steps))
    return steps, {
        "attention": [r["to_z_first"][layer][head] for r in attn],
        "share": formation.gated_shares(list(shares), list(totals)),
        "total": list(totals)}


def fastest_change(steps: list[int], series: list[list[float | None]]) -> list[int]:
    """Steps (from the second on) ordered by the summed change of ``series`` since the step before,
    each series scaled by its range (a flat one adds nothing); ties go to the earlier step."""
    if len(steps) < 2:
        return []
    score = np.zeros(len(steps) - 1)
    for values in series:
        v = np.array([np.nan if x is None else x for x in values], dtype=float)
        span = np.nanmax(v) - np.nanmin(v) if np.isfinite(v).any() else 0.0
        if span > 0:
            score += np.nan_to_num(np.abs(np.diff(v)) / span)
    order = sorted(range(len(score)), key=lambda i: (-score[i], i))
    return [steps[i + 1] for i in order if score[i] > 0]


def landmark_steps(steps: list[int], attention: list[dict[str, Any]], attribution: list[dict[str, Any]],
                   records: list[dict[str, Any]], progress_key: str, cue_key: str | None, height: float,
                   tau: int | None, tau_lo: int | None, plateau_stretch: list[int] | None, rules_start: int,
                   budget: int = DEFAULT_BUDGET) -> dict[int, list[str]]:
    """The analysed steps (of ``steps``) the expensive analyses run at, each with why (module docstring).
    ``records``: ``metrics.jsonl``; ``progress_key`` / ``cue_key``: the task's progress measure and cue
    effect there; ``rules_start``: where the t_form rules start (the plateau start, or a hidden
    cue's release)."""
    if not steps:
        return {}
    picked: dict[int, list[str]] = {}

    def add(target: int | None, why: str) -> None:
        if target is not None:
            picked.setdefault(nearest(steps, int(target)), []).append(why)

    start = plateau_stretch[0] if plateau_stretch else steps[0]
    add(start, "plateau start")
    if plateau_stretch:
        add((plateau_stretch[0] + plateau_stretch[1]) // 2, "plateau middle")
    add(tau, "tau")
    add(steps[-1], "last step")
    brackets: list[tuple[int | None, str]] = []  # picked after the landmarks, within the budget

    cheap_steps, cheap = cheap_signals(attention, attribution)
    eval_steps = [r["step"] for r in records if r.get(cue_key) is not None] if cue_key else []
    rules = formation.t_form_rules(
        tau, tau_lo, rules_start, height, (cheap_steps, cheap["attention"]), (cheap_steps, cheap["share"]),
        (eval_steps, [r[cue_key] for r in records if r.get(cue_key) is not None] if cue_key else []))["rules"]
    for name, rule in rules.items():
        if rule["t_form"] is not None:
            add(rule["t_form"], f"t_form by {name} (cheap)")
            brackets.append((rule["t_form_bracket"][0], f"before t_form by {name} (cheap)"))
    for name in attention[-1].get("rules") or {}:
        _, form = formation.rule_follower(attention, name, rules_start)
        if form["t_form"] is not None:
            add(form["t_form"], f"t_form of the {name} head")
            brackets.append((form["t_form_bracket"][0], f"before t_form of the {name} head"))
    for target, why in [*brackets, (tau_lo, "evaluation before tau")]:
        if target is not None and (len(picked) < budget or nearest(steps, int(target)) in picked):
            add(target, why)

    measured = [(r["step"], r[progress_key]) for r in records if r.get(progress_key) is not None]
    progress = (np.interp(cheap_steps, *zip(*measured)).tolist() if measured else [])
    for step in fastest_change(cheap_steps, [cheap["attention"], cheap["share"], cheap["total"], progress]):
        if len(picked) >= budget:
            break
        picked.setdefault(step, ["fast change"])
    return {s: picked[s] for s in sorted(picked)}
