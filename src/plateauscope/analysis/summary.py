"""The routing-head summary of an analysed series (``routing.json``), and its text.

From the cached analysis records of a run (``plateauscope.analysis.analyze.load_analysis``): the routing head (the
selector head of the selector task: attention to the cue times the head-patching effect at the
end, ``plateauscope.analysis.formation.pick_routing_head``), its attention at the plateau start and the end, t_form
and the lead fraction by each of the three rules (``plateauscope.analysis.formation``), the head ablated at three
moments, the circuit verdict (``plateauscope.analysis.circuit``), the heads that follow the task's other attention
rules (induction's previous-token head) and the agreement of attribution with exact patching.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from plateauscope.analysis import formation
from plateauscope.analysis.ablate import MARGINAL_TOL, near_height
from plateauscope.analysis.attention import chance_attention
from plateauscope.analysis.attribution import agreement
from plateauscope.analysis.circuit import circuit_summary, head_effects, head_shares
from plateauscope.analysis.components import PatchResult
from plateauscope.analysis.results import strict_json
from plateauscope.model.heads import head_label
from plateauscope.runs.run import Run, RunError


def _previous(values: list[int], x: int) -> int | None:
    before = [v for v in values if v < x]
    return before[-1] if before else None


def release_record(records: list[dict], release: int, key: str) -> dict[str, Any]:
    """The progress measure at the last evaluation before the cue's release at ``release`` and at the
    first one from it: a shock from the release shows as a jump between the two."""
    before = [r for r in records if r["step"] < release and r.get(key) is not None]
    after = [r for r in records if r["step"] >= release and r.get(key) is not None]
    return {"step": release, "key": key,
            "before": {"step": before[-1]["step"], "value": before[-1][key]} if before else None,
            "after": {"step": after[0]["step"], "value": after[0][key]} if after else None}


def summarize(run: Run, cache: dict[str, Any], tau: int | None, records: list[dict],
              smooth: int = 1) -> dict[str, Any]:
    """Selector head, t_form, tau, lead fraction (by each rule), ablation before/mid/after, the circuit
    verdict, exact-vs-attribution agreement."""
    attn, patches, ablations = cache["attention"], cache["patch"], cache["ablation"]
    if not attn or not patches:
        raise RunError(f"{run.path}: nothing analysed yet")
    final_patch = patches[-1]
    final_attn = next(r for r in reversed(attn) if r["step"] == final_patch["step"]) if any(
        r["step"] == final_patch["step"] for r in attn) else attn[-1]
    (layer, head), scores = formation.pick_routing_head(final_attn["to_z_first"], final_patch["heads"]["normalised"])
    progress = run.progress
    cue = progress.cue_effect_key or ""
    steps = [r["step"] for r in attn]
    series = [r["to_z_first"][layer][head] for r in attn]
    summary = run.summary or {}
    plateau_start = (summary.get("plateau_span") or [steps[0]])[0]
    # A run trained with the cue hidden until S: before S the mask forces attention to the cue and the
    # cue's effect to 0, so the t_form rules start at the release, not before it.
    release = run.config.train.hide_cue_until or 0
    rules_start = max(plateau_start, release)
    form = formation.formation_step(steps, series, rules_start)
    eval_steps = [r["step"] for r in records]
    tau_lo = _previous(eval_steps, tau) if tau is not None else None
    t_lo = form["t_form_bracket"][0] if form["t_form_bracket"] else None
    lead = formation.lead_fraction(tau, tau_lo, form["t_form"], t_lo)
    circ = cache.get("circuit") or []
    # the head's share of the summed positive head-patching effect, at every step with exact patching
    # (the circuit records hold the same shares, at their own steps only)
    shares = [head_shares(head_effects(p["heads"])) for p in patches]
    rules = formation.t_form_rules(
        tau, tau_lo, rules_start, progress.height, (steps, series),
        ([p["step"] for p in patches], formation.gated_shares([sh["share"][layer][head] for sh in shares],
                                                             [sh["total_positive"] for sh in shares])),
        ([r["step"] for r in records if r.get(cue) is not None], [r[cue] for r in records if r.get(cue) is not None]),
        smooth)

    def rule_head(name: str) -> dict[str, Any]:
        # the head that follows a named attention rule most at the end, and when it formed
        at, formed = formation.rule_follower(attn, name, rules_start)
        lo = formed["t_form_bracket"][0] if formed["t_form_bracket"] else None
        return {"head": list(at), "label": head_label(*at),
                **formed, **formation.lead_fraction(tau, tau_lo, formed["t_form"], lo)}

    # the task's other attention rules (e.g. induction's previous-token head), when it names any
    rule_heads = {name: rule_head(name) for name in attn[-1].get("rules") or {}}

    def ablation_at(target: int | None) -> dict | None:
        if target is None or not ablations:
            return None
        rec = min(ablations, key=lambda r: abs(r["step"] - target))
        z = rec["zero"]
        # the cache keeps the selector task's field names (candidate_loss, delta_z) for any task
        return {"step": rec["step"], "unablated": z["base"]["candidate_loss"],
                "zero_ablated": z["candidate_loss"][layer][head],
                "mean_ablated": rec["mean"]["candidate_loss"][layer][head],
                "zero_ablated_cue_effect": z["delta_z"][layer][head]}

    height = progress.height
    after = ablation_at(steps[-1])
    attribution_by_step = {r["step"]: r for r in cache["attribution"]}
    agree = []
    for p in patches:
        a = attribution_by_step.get(p["step"])
        if a is not None:
            agree.append({"step": p["step"], **strict_json(agreement(_result(p["heads"]), _result(a["heads"])))})
    chance = chance_attention(run.task())
    return {
        "head": [layer, head],
        "label": head_label(layer, head),
        "chance": chance,
        "above_chance": form["final_value"] is not None and form["final_value"] > chance,
        "rule": "argmax over heads of attention to the cue x max(normalised head patching effect, 0) at the final analysed step",
        "scores": scores,
        "tau": tau,
        "tau_bracket": [tau_lo, tau] if tau is not None else None,
        "height": height,
        "plateau_start": plateau_start,
        "rules_start": rules_start,
        "release": release_record(records, release, progress.key) if release else None,
        **form,
        **lead,
        "ablation": {"plateau_start": ablation_at(plateau_start),
                     "tau_half": ablation_at(tau // 2 if tau else None), "end": after},
        "falls_back_to_marginal": near_height(after["zero_ablated"], height) if after else None,
        "t_form_rules": rules["rules"],
        "smoothing": rules["smoothing"],
        "circuit": with_damage(circuit_summary(circ, (layer, head), height, tau), ablations, height),
        "agreement": agree,
        "analysed_steps": len(steps),
        **({"attention_rules": rule_heads} if rule_heads else {}),
    }


def with_damage(circuit: dict[str, Any] | None, ablations: list[dict], height: float) -> dict[str, Any] | None:
    """The circuit summary with ``damage``: each head mean-ablated alone (over every example, so B's
    information goes too) at the ablation step nearest the circuit's, and the heads that push the
    progress measure past the height's band. It measures what breaks the model, not the cue's route."""
    if circuit is None or not ablations:
        return circuit
    rec = min(ablations, key=lambda r: abs(r["step"] - circuit["step"]))
    values = rec["mean"]["candidate_loss"]  # the cache's name for the progress measure, for any task
    heads = {head_label(la, h): v for la, row in enumerate(values) for h, v in enumerate(row)}
    over = [k for k, v in heads.items() if v is not None and v > (1 + MARGINAL_TOL) * height]
    return {**circuit, "damage": {"kind": "mean", "step": rec["step"], "heads": heads, "past_height": over}}


def _result(d: dict) -> PatchResult:
    """A cached ``PatchResult.to_dict()`` back as a PatchResult (JSON null -> NaN)."""
    def tensor(x: Any) -> torch.Tensor:
        return torch.tensor(np.array(x, dtype=float), dtype=torch.float32)  # None -> nan via dtype=float

    return PatchResult(d["target"], tuple(d["axes"]), tensor(d["raw"]), tensor(d["normalised"]),
                       d["clean_metric"], d["corrupt_metric"], d["method"], d["n_pairs"])
