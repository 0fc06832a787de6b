"""The routing-head summary of an analysed series (``routing.json``), and its text.

From the cached analysis records of a run (``plateauscope.analysis.analyze.load_analysis``): the routing head (the
selector head of the selector task: attention to the cue times the head-patching effect at the
end, ``plateauscope.analysis.formation.pick_routing_head``), its attention at the plateau start and the end, t_form
and the lead fraction by each of the three rules (``plateauscope.analysis.formation``), the head ablated at three
moments, the circuit verdict (``plateauscope.analysis.circuit``), the heads that follow the task's other attention
rules (induction's previous-token head) and the agreement of attribution with exact patching.

Two rules keep the summary true on any plateau:

* **The plateau** (:func:`plateau_stretch`, from ``plateauscope.runs.metrics``, the rule ``summary.json``
  and the train command use too): the longest stretch of consecutive evaluations before tau
  that all lie inside the band (the progress measure within 10% of its reference height, the cue
  unused: ``ProgressMeasure.on_plateau``). When fewer than half of the evaluations before tau lie
  inside the band there is no plateau at the reference height, and the measure's range there is
  given instead. Every plateau sentence is made from these counts (``plateauscope.views.phrases``).
* **A named head** (:func:`head_margin`): the routing head, its t_form and lead are stated only when
  the task has a cue and the head's score beats the runner-up's by more than the evaluation noise:
  the 95% percentile bootstrap interval (:data:`N_BOOTSTRAP` resamples of the prompt pairs) of the
  difference of the two heads' scores (attention to the cue x the clipped normalised patching effect,
  on the resampled pairs) excludes 0. Otherwise there is no single head, and the top heads are given
  with their scores. The heads the rule could not tell apart (the top head and its runner-up) are then the
  **routing group** (:func:`routing_group`): its t_form and lead are those of the group's mean attention to
  the cue, and every figure and caption draws and names the group, never one of its heads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from plateauscope.analysis import formation
from plateauscope.analysis.ablate import MARGINAL_TOL, near_height
from plateauscope.analysis.attention import attention_patterns, chance_attention
from plateauscope.analysis.attribution import agreement
from plateauscope.analysis.circuit import circuit_summary, head_effects, head_shares
from plateauscope.analysis.components import PatchResult, patch_spec
from plateauscope.analysis.inputs import last_logit_diff, prompt_pairs
from plateauscope.analysis.patch import patch_sweep
from plateauscope.analysis.results import strict_json
from plateauscope.model.backend import Model
from plateauscope.model.heads import head_label, parse_head_label
from plateauscope.runs.metrics import plateau_stretch
from plateauscope.runs.run import Run, RunError
from plateauscope.tasks.base import ProgressMeasure, PromptPairs


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


N_BOOTSTRAP = 1000
"""Bootstrap resamples of the prompt pairs for the named head's margin over the runner-up."""
MARGIN_LEVEL = 0.95
"""Coverage of the bootstrap interval of the margin."""
MARGIN_RULE = ("a head is named when the 95% bootstrap interval (1000 resamples of the prompt pairs) of its score "
               "minus the runner-up's excludes 0; score = attention to the cue x max(normalised patching effect, 0)")
"""The named-head rule, in the words the output states it."""
TOP_HEADS = 3
"""Heads listed with their scores when no single head is named."""
GROUP_RULE = ("where no single head is named, the heads the margin cannot tell apart (the top head and its "
              "runner-up); t_form: their mean attention to the cue halfway up")
"""What the routing group is, in the words the output states it."""


@torch.no_grad()
def per_pair_patch(model: Model, pairs: PromptPairs, head: tuple[int, int]
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """The clean, corrupted and head-patched logit difference of every pair (head ``head``'s output
    patched from the clean run at every position: :func:`plateauscope.analysis.patch.patch_sweep`)."""
    spec = patch_spec(model, "heads", pairs.corrupt.shape[1])
    index = head[0] * model.cfg.n_heads + head[1]
    one = dataclasses.replace(spec, shape=(1,), masks=spec.masks[index: index + 1])
    calls: list[Tensor] = []

    def metric(last: Tensor, pairs_: PromptPairs) -> Tensor:
        value = last_logit_diff(last, pairs_, reduce=False).double().cpu()
        calls.append(value)
        return value

    patch_sweep(model, pairs, one, metric=metric)
    clean, corrupt = calls[0], calls[1]
    return clean, corrupt, calls[2] if len(calls) > 2 else corrupt  # a no-op patch runs no forward


def head_margin(model: Model, task: Any, pairs: PromptPairs, first: tuple[int, int], second: tuple[int, int],
                n_boot: int = N_BOOTSTRAP, level: float = MARGIN_LEVEL, seed: int = 0) -> dict[str, Any]:
    """The score of ``first`` minus that of ``second`` (module docstring) on the pairs, and its percentile
    bootstrap interval over resamples of the pairs; ``clear`` when the interval excludes 0."""
    tokens = task.pair_sequences(pairs)  # the clean examples, whichever split they come from
    patterns = attention_patterns(model, tokens, task.input_len)  # [N, L, H, q, k]
    keys = task.cue_positions(tokens, task.pred_pos)
    rows = patterns[:, :, :, task.pred_pos, :]
    attention = (rows.gather(-1, keys.clamp(min=0)[:, None, None].expand(*rows.shape[:3], keys.shape[-1]))
                 * (keys >= 0)[:, None, None]).sum(-1).double()  # [N, L, H]
    clean, corrupt, patched = {}, {}, {}
    for h in (first, second):
        clean[h], corrupt[h], patched[h] = per_pair_patch(model, pairs, h)
    gap = clean[first] - corrupt[first]

    def score(h: tuple[int, int], idx: Tensor) -> Tensor:  # [B] over resamples
        g = gap[idx].mean(-1)
        effect = (patched[h][idx].mean(-1) - corrupt[h][idx].mean(-1)) / torch.where(g.abs() < 1e-6, torch.nan, g)
        return attention[:, h[0], h[1]][idx].mean(-1) * torch.nan_to_num(effect, nan=0.0).clamp(min=0.0)

    n = len(gap)
    everything = torch.arange(n)[None]
    idx = torch.randint(0, n, (n_boot, n), generator=torch.Generator().manual_seed(seed))
    diffs = (score(first, idx) - score(second, idx)).numpy()
    low, high = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return {"heads": [head_label(*first), head_label(*second)],
            "difference": float(score(first, everything) - score(second, everything)),
            "interval": [float(low), float(high)], "level": level, "n_pairs": n, "n_boot": n_boot,
            "clear": bool(low > 0 or high < 0), "rule": MARGIN_RULE}


@dataclass(frozen=True)
class StatedRouting:
    """The routing a summary states (:func:`stated_routing`): what every figure, legend and caption draws
    and names as the routing."""

    heads: tuple[tuple[int, int], ...]
    """The heads drawn highlighted: the named routing head alone, or the routing group's heads."""
    labels: tuple[str, ...]
    """Their labels (``L0H2``), in the same order."""
    t_form: int | None
    """The routing's t_form: the named head's attention to the cue halfway up, or the group's mean attention's."""
    lead_fraction: float | None
    """(tau - t_form) / tau, of the same t_form."""

    @property
    def is_group(self) -> bool:
        """Whether no single head is named and a group is drawn."""
        return len(self.heads) > 1


def stated_routing(s: dict[str, Any]) -> StatedRouting | None:
    """The routing that figures draw, from a routing summary (``routing.json``): the routing head where the
    rule names one (a summary written before the rule: its head); where no single head is named, the routing
    group (the heads the rule lists, :func:`routing_group`) with the t_form of their mean attention; None
    where neither exists (no head is drawn as the routing, and no t_form)."""
    if s.get("named_head", True) and s.get("head") is not None:
        head = (int(s["head"][0]), int(s["head"][1]))
        return StatedRouting((head,), (s.get("label") or head_label(*head),), s.get("t_form"), s.get("lead_fraction"))
    group = s.get("routing_group")
    if not s.get("named_head", True) and group and group.get("heads"):
        return StatedRouting(tuple((int(la), int(h)) for la, h in group["heads"]), tuple(group["labels"]),
                             group.get("t_form"), group.get("lead_fraction"))
    return None


def routing_group(attention: list[dict[str, Any]], heads: list[tuple[int, int]], rules_start: int,
                  tau: int | None, tau_lo: int | None, field: str = "to_z_first") -> dict[str, Any]:
    """The routing group where no single head is named: ``heads`` (those the named-head rule lists), and when
    their mean attention to the cue (``field`` of the attention records) forms, by the attention rule
    (:func:`plateauscope.analysis.formation.formation_step` from ``rules_start``), with its lead over tau.

    The record: ``heads`` (``[layer, head]`` each), ``labels``, ``rule`` (what the group is), and
    ``t_form``, ``t_form_bracket``, ``start_value``, ``final_value`` (of the mean), ``lead_fraction`` and
    ``lead_bracket``."""
    steps = [r["step"] for r in attention]
    mean = [float(np.mean(np.asarray([r[field][layer][head] for layer, head in heads], dtype=float)))
            for r in attention]  # a missing value (JSON null) makes that step's mean NaN
    form = formation.formation_step(steps, mean, rules_start)
    t_lo = form["t_form_bracket"][0] if form["t_form_bracket"] else None
    return {"heads": [list(h) for h in heads], "labels": [head_label(*h) for h in heads], "rule": GROUP_RULE,
            **form, **formation.lead_fraction(tau, tau_lo, form["t_form"], t_lo)}


def top_heads(scores: list[list[float]], n: int = TOP_HEADS) -> list[dict[str, Any]]:
    """The ``n`` heads with the highest score, best first: ``{"head": label, "score": value}``."""
    grid = np.asarray(scores, dtype=float)
    order = np.argsort(-np.nan_to_num(grid.ravel(), nan=-np.inf), kind="stable")[:n]
    return [{"head": head_label(*divmod(int(i), grid.shape[1])), "score": float(grid.ravel()[i])} for i in order]


def summarize(run: Run, cache: dict[str, Any], tau: int | None, records: list[dict],
              smooth: int = 1, pairs: PromptPairs | None = None, margin: bool = True) -> dict[str, Any]:
    """Selector head, t_form, tau, lead fraction (by each rule), ablation before/mid/after, the circuit
    verdict, exact-vs-attribution agreement; the plateau by counts (:func:`plateau_stretch`), and whether
    the routing head is named (``named_head``, :func:`head_margin` on ``pairs``, default the task's 256
    seeded pairs; ``margin=False`` skips it, the head then unnamed)."""
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
    plateau_start = (run.plateau_stretch() or [steps[0]])[0]
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
    task = run.task()
    chance = chance_attention(task)
    ranked = top_heads(scores, TOP_HEADS + 1)
    margin_record = None
    if margin and "cue" in task.capabilities and "pairs" in task.capabilities and len(ranked) > 1:
        second = parse_head_label(ranked[1]["head"] if ranked[0]["head"] == head_label(layer, head)
                                  else ranked[0]["head"], run.config.model.n_layers, run.config.model.n_heads)
        margin_record = head_margin(run.model(final_patch["step"]), task,
                                    pairs or prompt_pairs(task), (layer, head), second)
    group = None
    if margin_record is not None and not margin_record["clear"]:
        group = routing_group(attn, [(layer, head), second], rules_start, tau, tau_lo)
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
        "plateau_counts": plateau_stretch(records, progress, tau),
        "named_head": bool(margin_record and margin_record["clear"]),
        "margin": margin_record,
        "routing_group": group,
        "top_heads": ranked[:TOP_HEADS],
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
