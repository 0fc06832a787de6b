"""How concentrated the selector routing is: one head, or a layer of them.

Method, per analysed checkpoint (the steps where exact patching runs):

* **Shares.** From exact head patching (``plateauscope.analysis.patch``, target ``heads``: one head's
  ``hook_z`` from the clean run into the corrupted run, all positions), each head's effect in
  logits, ``raw - corrupt`` times the sign of the clean-corrupt gap (positive = towards the
  clean answer). Negative effects count as 0. A head's *share* is its positive effect over the
  sum of all heads' positive effects; its *layer share*, over the sum within its layer. Also:
  the top head, its shares, and the fewest heads (largest first) that hold 80% of the sum.
  With no positive effect anywhere (the plateau, where the model ignores z) every share is 0.
* **Ablation of sets** (``plateauscope.analysis.ablate``, mean ablation by default: each ablated head's
  ``hook_z`` replaced by its mean over the eval sequences, per position): for every layer,
  each head alone, the whole layer, and the layer but each head. Metric: candidate loss
  (``plateauscope.training.metrics``); a set the model needs returns the loss to log K
  (``plateauscope.analysis.ablate.near_log_k``: within 0.25 log K). Read out for the chosen head: alone,
  its layer, its layer but it, and each other head of its layer alone.
* **Where the routing reads z.** Exact patching of each head's output at one position
  (``heads_by_pos``) at the z positions and at the last ``<SEP>`` (the position that predicts
  the first target token), from the task (``Task.cue_positions``, ``Task.pred_pos``). Normalised like
  ``plateauscope.analysis.patch`` (1 = restores the clean answer); raw effects in logits too.

* **Chosen sets** (:func:`ablate_chosen_sets`, the same ablation): the heads that hold 80% of the
  effect (*cover*) ablated together; every other head of their layers ablated, keeping only them;
  and every other head of their layers ablated, keeping only the *necessary* heads (each of which,
  ablated alone, returns the candidate loss to log K).

Verdict (:func:`verdict`), from patching share *and* ablation, in this order:

* ``none``: before the drop (step < tau, or no tau), or no head has a positive effect;
* ``single head``: the top head holds at least :data:`SINGLE_HEAD_SHARE` of its layer's positive
  effect, and ablating it alone returns the candidate loss to log K;
* ``conjunctive``: at least two heads each return it to log K when ablated alone: each is needed,
  none is enough (the heads listed are those);
* ``redundant``: no single head's ablation returns it to log K, but ablating the cover set does:
  any of them will do;
* ``unresolved``: none of the above (one necessary head without the share, or a cover set whose
  ablation does not return the loss to log K); the evidence says which.

"Returns to log K" is :func:`reaches_log_k`: the loss is at least log K - 0.25 log K. An ablation
that overshoots log K (mean ablation of a head the rest of the model was tuned around often does:
the candidates are then ranked *wrongly*, not just equally) has removed what z gives the answer and
more, so it counts; ``near_log_k`` (within 0.25 log K either side, ``plateauscope.analysis.ablate``) is reported
beside it. **Sufficiency** of the verdict's heads: keep only them and ablate every other head of
their layers; they suffice when the candidate loss stays within :data:`SUFFICIENT_TOL` log K of
its unablated value.
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
    ablation_metrics,
    build_evalset,
    n_scored_groups,
    near_log_k,
)
from plateauscope.analysis.inputs import PromptPairs
from plateauscope.analysis.patch import PatchSpec, patch, patch_sweep
from plateauscope.backend import Model
from plateauscope.tasks.base import Task

SINGLE_HEAD_SHARE = 0.6
"""The top head's minimum share of its layer's positive patching effect for a ``single head`` verdict."""
COVER = 0.8
"""The share of the summed positive effect the listed heads must hold (``n_for_80``)."""
VERDICTS: tuple[str, ...] = ("single head", "conjunctive", "redundant", "unresolved", "none")
SUFFICIENT_TOL = 0.1
"""Kept heads suffice when the candidate loss with every other head of their layers ablated is at
most this many log K above its unablated value."""
RECORD_VERSION = 2
"""Version of a circuit record's fields (2: with ``sets``); part of its cache key, so that older
records are recomputed rather than read without them."""


def reaches_log_k(candidate_loss: float, log_k: float, tol: float = MARGINAL_TOL) -> bool:
    """Whether an ablated model's candidate loss is back up to log K (at least ``(1 - tol) log K``)."""
    return float(candidate_loss) >= (1.0 - tol) * log_k


def head_label(layer: int, head: int) -> str:
    """``L{layer}H{head}``."""
    return f"L{layer}H{head}"


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


def ablate_sets(model: Model, task: Task, kind: str = "mean", n_groups: int = 8,
                seed: int = 0) -> dict[str, Any]:
    """Candidate loss and delta_z with each head alone, each layer, each layer but one head ablated."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    evalset = build_evalset(task, n_groups, seed)
    metrics = ablation_metrics(model, task, evalset, set_masks(L, H), kind)
    base, rest = metrics[0], metrics[1:]
    alone, layer, but = rest[: L * H], rest[L * H: L * H + L], rest[L * H + L:]

    def grid(ms: list[dict], key: str) -> list[list[float]]:
        return [[ms[la * H + h][key] for h in range(H)] for la in range(L)]

    return {"kind": kind, "n_groups": n_scored_groups(task, evalset), "base": base,
            "alone": grid(alone, "candidate_loss"), "layer": [m["candidate_loss"] for m in layer],
            "layer_but": grid(but, "candidate_loss"), "alone_delta_z": grid(alone, "delta_z"),
            "layer_delta_z": [m["delta_z"] for m in layer], "layer_but_delta_z": grid(but, "delta_z")}


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


def necessary_heads(alone: list[list[float | None]], log_k: float) -> list[tuple[int, int]]:
    """The heads whose ablation alone returns the candidate loss to log K (:func:`reaches_log_k`)."""
    return [(layer, head) for layer, row in enumerate(alone) for head, loss in enumerate(row)
            if loss is not None and reaches_log_k(loss, log_k)]


def ablate_chosen_sets(model: Model, task: Task, shares: dict[str, Any], alone: list[list[float | None]],
                       base: float, kind: str = "mean", n_groups: int = 8, seed: int = 0) -> dict[str, Any]:
    """Candidate loss with the cover set (the heads holding 80% of the effect) ablated, with only it
    kept in its layers, and with only the necessary heads kept in theirs (an empty mask: ``base``)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    cover = [(int(la), int(h)) for la, h in shares["heads_for_80"]]
    necessary = necessary_heads(alone, task.progress.height)
    masks = {"cover_ablated": head_set_mask(cover, L, H), "cover_kept": head_set_mask(cover, L, H, keep=True),
             "necessary_kept": head_set_mask(necessary, L, H, keep=True)}
    named = {name: m for name, m in masks.items() if m.any()}
    losses = {}
    if named:
        metrics = ablation_metrics(model, task, build_evalset(task, n_groups, seed), torch.stack(list(named.values())),
                                   kind)
        losses = {name: m["candidate_loss"] for name, m in zip(named, metrics)}
    return {"cover": {"heads": [head_label(*x) for x in cover],
                      "ablated": losses.get("cover_ablated") if cover else None,
                      "kept": losses.get("cover_kept", base)},
            "necessary": {"heads": [head_label(*x) for x in necessary], "kept": losses.get("necessary_kept", base)}}


def read_positions(task: Task, pairs: PromptPairs) -> list[int] | None:
    """The cue positions seen from the prediction position, and the prediction position itself
    (the selector task: z and the last ``<SEP>``); None when the cue moves between prompts (induction)."""
    task.require("cue", "the circuit's read positions")
    cue = task.cue_positions(pairs.clean, pairs.pred_pos)
    if not (cue == cue[0]).all() or (cue < 0).any():
        return None
    return sorted({*cue[0].tolist(), pairs.pred_pos})


def reads_z(model: Model, pairs: PromptPairs, positions: list[int]) -> dict[str, Any]:
    """Exact patching of each head's output at each of ``positions`` only: ``[layer, position, head]``."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_pos, P = pairs.corrupt.shape[1], len(positions)
    m = torch.zeros(L, P, H, L, n_pos, H, dtype=torch.bool)
    lx, px, hx = torch.meshgrid(torch.arange(L), torch.arange(P), torch.arange(H), indexing="ij")
    m[lx, px, hx, lx, torch.tensor(positions)[px], hx] = True
    spec = PatchSpec("heads_by_pos", "z", ("layer", "pos", "head"), (L, P, H), m.reshape(L * P * H, L, n_pos, H))
    res = patch_sweep(model, pairs, spec)
    return {"positions": positions, **res.to_dict()}


def circuit_record(model: Model, task: Task, pairs: PromptPairs, kind: str = "mean", n_groups: int = 8,
                   seed: int = 0, heads_patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """One checkpoint's circuit record: shares (from ``heads_patch`` or a fresh patch), set ablations, the
    chosen sets' ablations, reads-z."""
    if heads_patch is None:
        heads_patch = patch(model, pairs, "heads").to_dict()
    positions = read_positions(task, pairs)
    names = task.position_labels(pairs.corrupt.shape[1])
    shares = head_shares(head_effects(heads_patch))
    ablation = ablate_sets(model, task, kind, n_groups, seed)
    sets = ablate_chosen_sets(model, task, shares, ablation["alone"], ablation["base"]["candidate_loss"], kind,
                              n_groups, seed)
    return {"shares": shares, "ablation": ablation, "sets": sets,
            "reads_z": None if positions is None else
            {**reads_z(model, pairs, positions), "labels": [names[p] for p in positions]}}


def chosen_ablation(record: dict[str, Any], head: tuple[int, int] | list[int], log_k: float) -> dict[str, Any]:
    """The set ablations around the chosen head: alone, its layer, its layer but it, each other head alone."""
    layer, h = int(head[0]), int(head[1])
    abl = record["ablation"]

    def entry(loss: float | None) -> dict[str, Any]:
        return {"candidate_loss": loss, "near_log_k": near_log_k(loss, log_k) if loss is not None else None,
                "reaches_log_k": reaches_log_k(loss, log_k) if loss is not None else None}

    return {"kind": abl["kind"], "base": entry(abl["base"]["candidate_loss"]),
            "alone": entry(abl["alone"][layer][h]), "layer": entry(abl["layer"][layer]),
            "layer_but": entry(abl["layer_but"][layer][h]),
            "others": {head_label(layer, o): entry(abl["alone"][layer][o])
                       for o in range(len(abl["alone"][layer])) if o != h}}


def verdict(record: dict[str, Any], log_k: float, after_drop: bool) -> dict[str, Any]:
    """``single head`` / ``conjunctive`` / ``redundant`` / ``unresolved`` / ``none`` (module docstring),
    with the heads, the ablation numbers that decided it, and the sufficiency of those heads."""
    sh, abl, sets = record["shares"], record["ablation"], record["sets"]
    top = sh["top"]
    alone = abl["alone"][top[0]][top[1]]
    back = reaches_log_k(alone, log_k) if alone is not None else False
    cover_loss = sets["cover"]["ablated"]
    cover_back = cover_loss is not None and reaches_log_k(cover_loss, log_k)
    necessary = sets["necessary"]["heads"]
    evidence = {"top": head_label(*top), "top_share": sh["top_share"], "top_layer_share": sh["top_layer_share"],
                "top_alone_candidate_loss": alone, "top_alone_reaches_log_k": back,
                "top_alone_near_log_k": near_log_k(alone, log_k) if alone is not None else False,
                "necessary": necessary, "cover": sets["cover"]["heads"], "cover_ablated_candidate_loss": cover_loss,
                "cover_ablated_reaches_log_k": cover_back}
    if not after_drop or sh["total_positive"] <= 0:
        return {"verdict": "none", "heads": [], "sufficiency": None, **evidence}
    if sh["top_layer_share"] >= SINGLE_HEAD_SHARE and back:
        kind, heads, kept = "single head", [head_label(*top)], abl["layer_but"][top[0]][top[1]]
    elif len(necessary) >= 2:
        kind, heads, kept = "conjunctive", necessary, sets["necessary"]["kept"]
    elif not necessary and cover_back:
        kind, heads, kept = "redundant", sets["cover"]["heads"], sets["cover"]["kept"]
    else:
        kind, heads, kept = "unresolved", sets["cover"]["heads"], sets["cover"]["kept"]
    base = abl["base"]["candidate_loss"]
    # Keeping the heads means ablating every other head of their layers: with none left, nothing is tested.
    layers = {int(label[1:].split("H")[0]) for label in heads}
    others = sum(len(abl["alone"][layer]) for layer in layers) - len(heads)
    sufficiency = {"kept": heads, "candidate_loss": kept, "base": base, "others_ablated": others,
                   "sufficient": None if others == 0 else kept is not None and kept <= base + SUFFICIENT_TOL * log_k}
    return {"verdict": kind, "heads": heads, "sufficiency": sufficiency, **evidence}


def circuit_summary(records: list[dict[str, Any]], head: tuple[int, int] | list[int], log_k: float,
                    tau: int | None) -> dict[str, Any] | None:
    """Per-step verdicts and the chosen head's shares; the final verdict is that of the last record."""
    if not records:
        return None
    layer, h = int(head[0]), int(head[1])
    steps = []
    for r in records:
        v = verdict(r, log_k, tau is not None and r["step"] >= tau)
        steps.append({"step": r["step"], "verdict": v["verdict"], "heads": v["heads"], "top": v["top"],
                      "top_layer_share": v["top_layer_share"],
                      "chosen_share": r["shares"]["share"][layer][h],
                      "chosen_layer_share": r["shares"]["layer_share"][layer][h],
                      "n_for_80": r["shares"]["n_for_80"]})
    last = records[-1]
    final = verdict(last, log_k, tau is not None and last["step"] >= tau)
    rz = last["reads_z"] or {}
    return {**final, "step": last["step"], "rule": f"single head: top head >= {SINGLE_HEAD_SHARE:.0%} of its layer's "
            "positive head-patching effect and ablating it alone returns the candidate loss to log K; conjunctive: "
            "at least two heads each return it to log K when ablated alone; redundant: none alone does, the heads "
            "holding 80% of the effect together do; unresolved: none of these; none before tau",
            "chosen": chosen_ablation(last, head, log_k),
            "shares": last["shares"], "reads_z": {"positions": rz["positions"], "labels": rz.get("labels"),
                                                  "normalised": rz["normalised"],
                                                  "raw": rz["raw"], "corrupt_metric": rz["corrupt_metric"]}
            if rz else None,
            "series": steps}


def reads_z_text(c: dict[str, Any], head: tuple[int, int] | list[int]) -> str:
    """The head's normalised patching effect at the z positions and the last ``<SEP>``, as text
    (n/a when the task's cue moves between prompts)."""
    rz = c["reads_z"]
    if rz is None:
        return "n/a (the cue moves between prompts)"
    layer, h = int(head[0]), int(head[1])
    labels = rz.get("labels") or [str(p) for p in rz["positions"]]
    vals = [row[h] for row in rz["normalised"][layer]]
    return ", ".join(f"{lab} {'n/a' if v is None else f'{v:+.2f}'}" for lab, v in zip(labels, vals))


def na_float(value: float | None) -> str:
    """``value`` to 3 decimals, or n/a."""
    return "n/a" if value is None else f"{value:.3f}"


def format_circuit(c: dict[str, Any] | None, log_k: float, head: tuple[int, int] | list[int] | None = None,
                   label: str = "candidate loss", height_label: str = "log K") -> list[str]:
    """The circuit summary as text lines (``plateauscope analyze``), in the words of the task's
    progress measure (``label`` against ``height_label``, the value ``log_k``)."""
    if not c:
        return ["circuit         n/a (no exact-patching steps)"]
    ch = c["chosen"]

    back = f" (back at {height_label}: >= {1 - MARGINAL_TOL:.2g} {height_label})"

    def cl(e: dict[str, Any]) -> str:
        return "n/a" if e["candidate_loss"] is None else f"{e['candidate_loss']:.3f}{back if e['reaches_log_k'] else ''}"

    others = ", ".join(f"{k} {cl(v)}" for k, v in ch["others"].items())
    n80 = c["shares"]["n_for_80"]
    suff = c.get("sufficiency")
    kept = ([f"sufficiency     keeping only {', '.join(suff['kept'])} in {'its' if len(suff['kept']) == 1 else 'their'} "
             f"layer{'' if len(suff['kept']) == 1 else 's'}: {label} {na_float(suff['candidate_loss'])} against "
             f"{na_float(suff['base'])} unablated: "
             + {True: "sufficient", False: "not sufficient", None: "not tested (no other head in their layers)"}[
                 suff["sufficient"]]]
            if suff else [])
    return [f"circuit verdict {c['verdict']}" + (f": {', '.join(c['heads'])}" if c["heads"] else "")
            + f"  (step {c['step']}; top head {c['top']} holds {c['top_share']:.0%} of all heads' effect, "
              f"{c['top_layer_share']:.0%} of its layer's; {n80} head{'' if n80 == 1 else 's'} hold{'s' if n80 == 1 else ''} 80%)",
            f"{ch['kind']} ablation  base {cl(ch['base'])}; chosen alone {cl(ch['alone'])}, its layer {cl(ch['layer'])}, "
            f"layer but it {cl(ch['layer_but'])}; others alone: {others}  ({label}; {height_label} = {log_k:.3f})",
            f"necessary       heads whose ablation alone returns it to {height_label}: "
            f"{', '.join(c['necessary']) or 'none'}; the 80% heads ablated together: "
            f"{na_float(c['cover_ablated_candidate_loss'])}"] + kept + (
        [f"reads the cue   {head_label(*head)} output patched at one position (normalised): {reads_z_text(c, head)}"]
        if head is not None else [])
