"""How concentrated the cue's routing is: one head, several, or any of several.

Method, per analysed checkpoint (the steps where exact patching runs):

* **Shares.** From exact head patching (``plateauscope.analysis.patch``, target ``heads``: one head's
  ``hook_z`` from the clean run into the corrupted run, all positions), each head's effect in
  logits, ``raw - corrupt`` times the sign of the clean-corrupt gap (positive = towards the
  clean answer). Negative effects count as 0. A head's *share* is its positive effect over the
  sum of all heads' positive effects; its *layer share*, over the sum within its layer. Also:
  the top head, its shares, and the fewest heads (largest first) that hold 80% of the sum
  (the *cover* set). With no positive effect anywhere (the plateau) every share is 0.
* **Ablation of sets** (``plateauscope.analysis.ablate``), by default ``cue_mean``: each ablated
  head's ``hook_z`` replaced by its mean over the examples that differ only in the cue (the
  selector task: the K selectors of one B), per position. That removes what the head says about
  the cue and nothing else, so it measures the cue's route, not damage. (``mean`` ablation, over
  every example, also removes what the head says about B, and can break a model that needs the
  head for something else; it is reported as *damage* (``plateauscope.analysis.summary``) and is
  the fallback for a task without candidates.) For every layer: each head alone, the whole layer,
  and the layer but each head. Metric: the task's progress measure (the candidate loss), with a
  t interval over the ablation's eval groups (:data:`GROUP_LEVEL`).
* **Where the routing reads the cue.** Exact patching of each head's output at one position
  (``heads_by_pos``) at the cue positions and at the prediction position, from the task
  (``Task.cue_positions``, ``Task.pred_pos``). Normalised like ``plateauscope.analysis.patch``
  (1 = restores the clean answer); raw effects in logits too.
* **Chosen sets** (:func:`ablate_chosen_sets`, the same ablation): the cover set ablated together;
  the cover set but each of its heads (that head kept alone); every other head of their layers
  ablated, keeping only the cover set; and the same keeping only the *necessary* heads.

A set **loses the cue** when its ablated progress measure is back at the plateau height: its
interval over the eval groups lies within ``MARGINAL_TOL`` (0.25) x height of the height
(:func:`loses_cue`). Overshooting the height is not losing the cue, it is damage, and never
decides a verdict. A head is *necessary* when its ablation alone loses the cue. Heads *suffice*
when the progress measure with the others ablated stays within :data:`SUFFICIENT_TOL` x height
of its unablated value (the interval's high end).

Verdict (:func:`verdict`), in this order:

* ``none``: before the drop (step < tau, or no tau), or no head has a positive effect;
* ``single head``: the top head holds at least :data:`SINGLE_HEAD_SHARE` of its layer's positive
  effect, and it is necessary;
* ``conjunctive``: at least two heads are necessary: each is needed, none is enough;
* ``redundant``: no head is necessary, the cover set ablated together loses the cue, and each of
  its heads alone suffices (the cover set but it ablated): any of them will do;
* ``unresolved``: none of the above; the evidence says which part failed.

**Sufficiency** of the verdict's heads: keep only them and ablate every other head of their layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from plateauscope.analysis.ablate import (
    MARGINAL_TOL,
    HeadAblation,
    ablation_metrics_by_group,
    build_evalset,
    n_scored_groups,
    near_height,
)
from plateauscope.analysis.inputs import PromptPairs
from plateauscope.analysis.intervals import mean_interval
from plateauscope.analysis.patch import PatchSpec, patch, patch_sweep
from plateauscope.model.backend import Model
from plateauscope.model.heads import head_label
from plateauscope.tasks.base import Task

SINGLE_HEAD_SHARE = 0.6
"""The top head's minimum share of its layer's positive patching effect for a ``single head`` verdict."""
COVER = 0.8
"""The share of the summed positive effect the listed heads must hold (``n_for_80``)."""
VERDICTS: tuple[str, ...] = ("single head", "conjunctive", "redundant", "unresolved", "none")
SUFFICIENT_TOL = 0.1
"""Kept heads suffice when the progress measure with the other heads ablated is at most this many
times the height above its unablated value."""
GROUP_LEVEL = 0.95
"""Coverage of the t interval of an ablated progress measure over the ablation's eval groups."""
DEFAULT_KIND = "cue_mean"
"""The circuit's ablation (``plateauscope.analysis.ablate.KINDS``); ``mean`` for a task without candidates."""
RECORD_VERSION = 3
"""Version of a circuit record's fields (2: with ``sets``; 3: intervals over the eval groups and
the cover set but each head); part of its cache key, so that older records are recomputed rather
than read without them."""


def loses_cue(value: float | None, interval: list[float] | None, height: float, tol: float = MARGINAL_TOL) -> bool:
    """Whether an ablated model is back at the plateau height: its progress measure's interval over
    the eval groups (or the value itself, without one) lies within ``tol * height`` of ``height``.
    Above that band is damage, not a lost cue."""
    if value is None:
        return False
    low, high = interval if interval is not None else (value, value)
    return (1.0 - tol) * height <= low and high <= (1.0 + tol) * height


def stays(value: float | None, interval: list[float] | None, base: float, height: float,
          tol: float = SUFFICIENT_TOL) -> bool:
    """Whether an ablated model keeps what the unablated one does: the progress measure (its
    interval's high end) at most ``tol * height`` above ``base``."""
    if value is None:
        return False
    high = interval[1] if interval is not None else value
    return high <= base + tol * height



def head_effects(heads_patch: dict[str, Any]) -> np.ndarray:
    """Each head's effect in logits towards the clean answer, ``[layer, head]``, from a cached
    ``PatchResult.to_dict()`` of target ``heads`` (None -> 0)."""
    raw = np.asarray(heads_patch["raw"], dtype=float)
    gap = heads_patch["clean_metric"] - heads_patch["corrupt_metric"]
    return np.nan_to_num((raw - heads_patch["corrupt_metric"]) * (1.0 if gap >= 0 else -1.0), nan=0.0)


def head_shares(effect: np.ndarray | list, cover: float = COVER) -> dict[str, Any]:
    """Shares of the summed positive effect, overall and within each layer; the top head; heads for ``cover``."""
    pos = np.clip(np.asarray(effect, dtype=float), 0.0, None)
    total = pos.sum()
    share = pos / total if total > 0 else np.zeros_like(pos)
    layer_tot = pos.sum(1, keepdims=True)
    layer_share = np.divide(pos, layer_tot, out=np.zeros_like(pos), where=layer_tot > 0)
    order = np.argsort(-pos, axis=None, kind="stable")
    n_heads = pos.shape[1]
    cum = np.cumsum(share.flatten()[order])
    n_cover = int(np.searchsorted(cum, cover - 1e-9) + 1) if total > 0 else 0
    top = divmod(int(order[0]), n_heads)
    return {"share": share.tolist(), "layer_share": layer_share.tolist(), "total_positive": float(total),
            "top": list(top), "top_share": float(share[top]), "top_layer_share": float(layer_share[top]),
            "n_for_80": n_cover, "heads_for_80": [list(divmod(int(i), n_heads)) for i in order[:n_cover]]}


def set_masks(n_layers: int, n_heads: int) -> Bool[Tensor, "C n_layers n_heads"]:
    """Masks, in order: none (unablated); each head alone (layer-major); each whole layer; each
    layer but one head (layer-major)."""
    eye = torch.eye(n_layers * n_heads, dtype=torch.bool).view(-1, n_layers, n_heads)
    layer = torch.zeros(n_layers, n_layers, n_heads, dtype=torch.bool)
    layer[torch.arange(n_layers), torch.arange(n_layers)] = True
    but = layer.repeat_interleave(n_heads, 0) & ~eye
    return torch.cat([torch.zeros(1, n_layers, n_heads, dtype=torch.bool), eye, layer, but])


def ablate_sets(model: Model, task: Task, kind: str = DEFAULT_KIND, n_groups: int = 8,
                seed: int = 0) -> dict[str, Any]:
    """Progress measure (``candidate_loss``) and cue effect with each head alone, each layer, each
    layer but one head ablated; ``*_interval``: the progress measure's t interval over the eval
    groups (None for a task without candidates)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    evalset = build_evalset(task, n_groups, seed)
    metrics, by_group = ablation_metrics_by_group(model, task, evalset, set_masks(L, H), kind)
    intervals = group_intervals(by_group, len(metrics))
    base, rest, rest_iv = metrics[0], metrics[1:], intervals[1:]
    alone, layer, but = rest[: L * H], rest[L * H: L * H + L], rest[L * H + L:]
    alone_iv, layer_iv, but_iv = rest_iv[: L * H], rest_iv[L * H: L * H + L], rest_iv[L * H + L:]

    def grid(ms: list, key: str | None = None) -> list[list]:
        return [[ms[la * H + h][key] if key else ms[la * H + h] for h in range(H)] for la in range(L)]

    return {"kind": kind, "n_groups": n_scored_groups(task, evalset), "base": base, "base_interval": intervals[0],
            "alone": grid(alone, "candidate_loss"), "layer": [m["candidate_loss"] for m in layer],
            "layer_but": grid(but, "candidate_loss"), "alone_delta_z": grid(alone, "delta_z"),
            "layer_delta_z": [m["delta_z"] for m in layer], "layer_but_delta_z": grid(but, "delta_z"),
            "alone_interval": grid(alone_iv), "layer_interval": layer_iv, "layer_but_interval": grid(but_iv)}


def group_intervals(by_group: Tensor | None, n: int) -> list[list[float] | None]:
    """Each row's t interval of the mean over the eval groups, ``[low, high]`` (None without groups)."""
    if by_group is None:
        return [None] * n
    out = []
    for row in by_group.tolist():
        iv = mean_interval(row, level=GROUP_LEVEL)
        out.append([iv.low, iv.high] if iv is not None else None)
    return out


def each_head_ablation(sets: dict[str, Any]) -> HeadAblation:
    """The one-head-at-a-time ablation (``plateauscope.analysis.ablate.ablate_each_head``) contained in an
    :func:`ablate_sets` record: the same masks, eval set and metric."""
    return HeadAblation.from_metrics(sets["kind"], sets["n_groups"], sets["base"], sets["alone"], sets["alone_delta_z"])


def head_set_mask(heads: list[tuple[int, int]], n_layers: int, n_heads: int,
                  keep: bool = False) -> Bool[Tensor, "n_layers n_heads"]:
    """The ablation mask of ``heads`` (``keep``: of every other head of their layers instead)."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    if keep:
        layers = sorted({layer for layer, _ in heads})
        kept = mask.clone()
        mask[:] = False
        mask[layers] = True
        mask &= ~kept
    return mask


def necessary_heads(ablation: dict[str, Any], height: float) -> list[tuple[int, int]]:
    """The heads whose ablation alone loses the cue (:func:`loses_cue`), from an :func:`ablate_sets` record."""
    intervals = ablation.get("alone_interval")
    return [(layer, head) for layer, row in enumerate(ablation["alone"]) for head, loss in enumerate(row)
            if loses_cue(loss, intervals[layer][head] if intervals else None, height)]


def ablate_chosen_sets(model: Model, task: Task, shares: dict[str, Any], ablation: dict[str, Any],
                       kind: str = DEFAULT_KIND, n_groups: int = 8, seed: int = 0) -> dict[str, Any]:
    """Progress measure (and interval over the eval groups) with the cover set (the heads holding
    80% of the effect) ablated, with the cover set but each of its heads ablated, with only the
    cover set kept in its layers, and with only the necessary heads kept in theirs (an empty mask:
    the unablated value)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    cover = [(int(la), int(h)) for la, h in shares["heads_for_80"]]
    necessary = necessary_heads(ablation, task.progress.height)
    masks = {"cover_ablated": head_set_mask(cover, L, H), "cover_kept": head_set_mask(cover, L, H, keep=True),
             "necessary_kept": head_set_mask(necessary, L, H, keep=True),
             **({f"cover_but {head_label(*x)}": head_set_mask([c for c in cover if c != x], L, H) for x in cover}
                if len(cover) > 1 else {})}
    named = {name: m for name, m in masks.items() if m.any()}
    base = (ablation["base"]["candidate_loss"], ablation.get("base_interval"))
    found: dict[str, tuple[float, list[float] | None]] = {}
    if named:
        metrics, by_group = ablation_metrics_by_group(model, task, build_evalset(task, n_groups, seed),
                                                      torch.stack(list(named.values())), kind)
        found = {name: (m["candidate_loss"], iv)
                 for name, m, iv in zip(named, metrics, group_intervals(by_group, len(metrics)))}

    def entry(name: str) -> dict[str, Any]:
        value, interval = found.get(name, base)
        return {"ablated": value, "interval": interval}

    return {"cover": {"heads": [head_label(*x) for x in cover],
                      "ablated": found.get("cover_ablated", (None,))[0] if cover else None,
                      "ablated_interval": found.get("cover_ablated", (None, None))[1] if cover else None,
                      "kept": found.get("cover_kept", base)[0], "kept_interval": found.get("cover_kept", base)[1],
                      "each_alone": {head_label(*x): entry(f"cover_but {head_label(*x)}") for x in cover}
                      if len(cover) > 1 else {}},
            "necessary": {"heads": [head_label(*x) for x in necessary], "kept": found.get("necessary_kept", base)[0],
                          "kept_interval": found.get("necessary_kept", base)[1]}}


def read_positions(task: Task, pairs: PromptPairs) -> list[int] | None:
    """The cue positions seen from the prediction position, and the prediction position itself
    (the selector task: z and the last ``<SEP>``); None when the cue moves between prompts (induction)."""
    task.require("cue", "the circuit's read positions")
    cue = task.cue_positions(pairs.clean, pairs.pred_pos)
    if not (cue == cue[0]).all() or (cue < 0).any():
        return None
    return sorted({*cue[0].tolist(), pairs.pred_pos})


def reads_cue(model: Model, pairs: PromptPairs, positions: list[int]) -> dict[str, Any]:
    """Exact patching of each head's output at each of ``positions`` only: ``[layer, position, head]``."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_pos, P = pairs.corrupt.shape[1], len(positions)
    m = torch.zeros(L, P, H, L, n_pos, H, dtype=torch.bool)
    lx, px, hx = torch.meshgrid(torch.arange(L), torch.arange(P), torch.arange(H), indexing="ij")
    m[lx, px, hx, lx, torch.tensor(positions)[px], hx] = True
    spec = PatchSpec("heads_by_pos", "z", ("layer", "pos", "head"), (L, P, H), m.reshape(L * P * H, L, n_pos, H))
    res = patch_sweep(model, pairs, spec)
    return {"positions": positions, **res.to_dict()}


def circuit_record(model: Model, task: Task, pairs: PromptPairs, kind: str = DEFAULT_KIND, n_groups: int = 8,
                   seed: int = 0, heads_patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """One checkpoint's circuit record: shares (from ``heads_patch`` or a fresh patch), set ablations, the
    chosen sets' ablations, where the heads read the cue. ``cue_mean`` falls back to ``mean`` for a
    task without candidates (the record's ``ablation.kind`` says which ran)."""
    if heads_patch is None:
        heads_patch = patch(model, pairs, "heads").to_dict()
    if kind == "cue_mean" and "candidates" not in task.capabilities:
        kind = "mean"
    positions = read_positions(task, pairs)
    names = task.position_labels(pairs.corrupt.shape[1])
    shares = head_shares(head_effects(heads_patch))
    ablation = ablate_sets(model, task, kind, n_groups, seed)
    sets = ablate_chosen_sets(model, task, shares, ablation, kind, n_groups, seed)
    return {"shares": shares, "ablation": ablation, "sets": sets,
            "reads_z": None if positions is None else  # the cache's name for it (older caches still load)
            {**reads_cue(model, pairs, positions), "labels": [names[p] for p in positions]}}


def chosen_ablation(record: dict[str, Any], head: tuple[int, int] | list[int], height: float) -> dict[str, Any]:
    """The set ablations around the chosen head: alone, its layer, its layer but it, each other head alone."""
    layer, h = int(head[0]), int(head[1])
    abl = record["ablation"]
    alone_iv, layer_iv, but_iv = (abl.get(k) for k in ("alone_interval", "layer_interval", "layer_but_interval"))

    def entry(loss: float | None, interval: list[float] | None) -> dict[str, Any]:
        return {"progress": loss, "interval": interval,
                "near_height": near_height(loss, height) if loss is not None else None,
                "loses_cue": loses_cue(loss, interval, height)}

    return {"kind": abl["kind"], "base": entry(abl["base"]["candidate_loss"], abl.get("base_interval")),
            "alone": entry(abl["alone"][layer][h], alone_iv[layer][h] if alone_iv else None),
            "layer": entry(abl["layer"][layer], layer_iv[layer] if layer_iv else None),
            "layer_but": entry(abl["layer_but"][layer][h], but_iv[layer][h] if but_iv else None),
            "others": {head_label(layer, o): entry(abl["alone"][layer][o], alone_iv[layer][o] if alone_iv else None)
                       for o in range(len(abl["alone"][layer])) if o != h}}


def verdict(record: dict[str, Any], height: float, after_drop: bool) -> dict[str, Any]:
    """``single head`` / ``conjunctive`` / ``redundant`` / ``unresolved`` / ``none`` (module docstring),
    with the heads, the ablation numbers that decided it, and the sufficiency of those heads."""
    sh, abl, sets = record["shares"], record["ablation"], record["sets"]
    top = sh["top"]
    base = abl["base"]["candidate_loss"]
    alone = abl["alone"][top[0]][top[1]]
    alone_iv = abl["alone_interval"][top[0]][top[1]] if abl.get("alone_interval") else None
    top_necessary = loses_cue(alone, alone_iv, height)
    cover = sets["cover"]
    cover_loses = loses_cue(cover["ablated"], cover.get("ablated_interval"), height)
    # redundant: each head of the cover set suffices alone (the rest of the set ablated)
    each_alone = {label: stays(e["ablated"], e["interval"], base, height)
                  for label, e in (cover.get("each_alone") or {}).items()}
    necessary = sets["necessary"]["heads"]
    evidence = {"top": head_label(*top), "top_share": sh["top_share"], "top_layer_share": sh["top_layer_share"],
                "kind": abl["kind"], "top_alone_progress": alone, "top_alone_interval": alone_iv,
                "top_alone_loses_cue": top_necessary,
                "top_alone_damage": alone is not None and alone > (1.0 + MARGINAL_TOL) * height,
                "necessary": necessary, "cover": cover["heads"], "cover_ablated_progress": cover["ablated"],
                "cover_ablated_interval": cover.get("ablated_interval"), "cover_ablated_loses_cue": cover_loses,
                "cover_each_alone_suffices": each_alone}
    if not after_drop or sh["total_positive"] <= 0:
        return {"verdict": "none", "heads": [], "sufficiency": None, **evidence}
    if sh["top_layer_share"] >= SINGLE_HEAD_SHARE and top_necessary:
        but_iv = abl.get("layer_but_interval")
        kind, heads = "single head", [head_label(*top)]
        kept = (abl["layer_but"][top[0]][top[1]], but_iv[top[0]][top[1]] if but_iv else None)
    elif len(necessary) >= 2:
        kind, heads, kept = "conjunctive", necessary, (sets["necessary"]["kept"], sets["necessary"].get("kept_interval"))
    elif not necessary and cover_loses and each_alone and all(each_alone.values()):
        kind, heads, kept = "redundant", cover["heads"], (cover["kept"], cover.get("kept_interval"))
    else:
        kind, heads, kept = "unresolved", cover["heads"], (cover["kept"], cover.get("kept_interval"))
    # Keeping the heads means ablating every other head of their layers: with none left, nothing is tested.
    layers = {int(label[1:].split("H")[0]) for label in heads}
    others = sum(len(abl["alone"][layer]) for layer in layers) - len(heads)
    sufficiency = {"kept": heads, "progress": kept[0], "interval": kept[1], "base": base, "others_ablated": others,
                   "sufficient": None if others == 0 else stays(kept[0], kept[1], base, height)}
    return {"verdict": kind, "heads": heads, "sufficiency": sufficiency, **evidence}


RULE = (f"single head: the top head holds >= {SINGLE_HEAD_SHARE:.0%} of its layer's positive head-patching effect "
        "and ablating it alone loses the cue (the progress measure back within 25% of its plateau height over "
        "the eval groups); conjunctive: at least two heads each lose the cue when ablated alone; redundant: none "
        "alone does, the heads holding 80% of the effect together do, and each of them alone keeps the unablated "
        "value; unresolved: none of these; none before tau. Overshooting the height is damage and decides nothing.")
"""The verdict's rule, as ``routing.json`` states it."""


def circuit_summary(records: list[dict[str, Any]], head: tuple[int, int] | list[int], height: float,
                    tau: int | None) -> dict[str, Any] | None:
    """Per-step verdicts and the chosen head's shares; the final verdict is that of the last record."""
    if not records:
        return None
    layer, h = int(head[0]), int(head[1])
    steps = []
    for r in records:
        v = verdict(r, height, tau is not None and r["step"] >= tau)
        steps.append({"step": r["step"], "verdict": v["verdict"], "heads": v["heads"], "top": v["top"],
                      "top_layer_share": v["top_layer_share"],
                      "chosen_share": r["shares"]["share"][layer][h],
                      "chosen_layer_share": r["shares"]["layer_share"][layer][h],
                      "n_for_80": r["shares"]["n_for_80"]})
    last = records[-1]
    final = verdict(last, height, tau is not None and last["step"] >= tau)
    rz = last["reads_z"] or {}
    return {**final, "step": last["step"], "rule": RULE,
            "chosen": chosen_ablation(last, head, height),
            "shares": last["shares"], "reads_cue": {"positions": rz["positions"], "labels": rz.get("labels"),
                                                  "normalised": rz["normalised"],
                                                  "raw": rz["raw"], "corrupt_metric": rz["corrupt_metric"]}
            if rz else None,
            "series": steps}
