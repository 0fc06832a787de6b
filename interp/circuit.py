"""How concentrated the selector routing is: one head, or a layer of them.

Method, per analysed checkpoint (the steps where exact patching runs):

* **Shares.** From exact head patching (``interp.patch``, target ``heads``: one head's
  ``hook_z`` from the clean run into the corrupted run, all positions), each head's effect in
  logits, ``raw - corrupt`` times the sign of the clean-corrupt gap (positive = towards the
  clean answer). Negative effects count as 0. A head's *share* is its positive effect over the
  sum of all heads' positive effects; its *layer share*, over the sum within its layer. Also:
  the top head, its shares, and the fewest heads (largest first) that hold 80% of the sum.
  With no positive effect anywhere (the plateau, where the model ignores z) every share is 0.
* **Ablation of sets** (``interp.ablate``, mean ablation by default: each ablated head's
  ``hook_z`` replaced by its mean over the eval sequences, per position): for every layer,
  each head alone, the whole layer, and the layer but each head. Metric: candidate loss
  (``training.metrics``); a set the model needs returns the loss to log K
  (``interp.ablate.near_log_k``: within 0.25 log K). Read out for the chosen head: alone,
  its layer, its layer but it, and each other head of its layer alone.
* **Where the routing reads z.** Exact patching of each head's output at one position
  (``heads_by_pos``) at the z positions and at the last ``<SEP>`` (the position that predicts
  the first target token), from the task (``Task.cue_positions``, ``Task.pred_pos``). Normalised like
  ``interp.patch`` (1 = restores the clean answer); raw effects in logits too.

Verdict (:func:`verdict`): ``none`` before the drop (step < tau, or no tau); ``single head``
when the top head holds at least :data:`SINGLE_HEAD_SHARE` of its layer's positive effect *and*
ablating it alone returns the candidate loss to log K; otherwise ``distributed``, listing the
heads that hold 80% of the effect. "Returns to log K" is :func:`reaches_log_k`: the loss is at
least log K - 0.25 log K. An ablation that overshoots log K (mean ablation of a head the rest of
the model was tuned around often does: the candidates are then ranked *wrongly*, not just
equally) has removed what z gives the answer and more, so it counts; ``near_log_k`` (within
0.25 log K either side, ``interp.ablate``) is reported beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from interp.ablate import MARGINAL_TOL, HeadAblation, ablation_metrics, build_evalset, n_scored_groups, near_log_k
from interp.inputs import PromptPairs
from interp.patch import PatchSpec, patch, patch_sweep
from training.backend import Model
from training.tasks.base import Task

SINGLE_HEAD_SHARE = 0.6
"""The top head's minimum share of its layer's positive patching effect for a ``single head`` verdict."""
COVER = 0.8
"""The share of the summed positive effect the listed heads must hold (``n_for_80``)."""
VERDICTS: tuple[str, ...] = ("single head", "distributed", "none")


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
    """The one-head-at-a-time ablation (``interp.ablate.ablate_each_head``) contained in an
    :func:`ablate_sets` record: the same masks, eval set and metric."""
    return HeadAblation.from_metrics(sets["kind"], sets["n_groups"], sets["base"], sets["alone"], sets["alone_delta_z"])


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
    """One checkpoint's circuit record: shares (from ``heads_patch`` or a fresh patch), set ablations, reads-z."""
    if heads_patch is None:
        heads_patch = patch(model, pairs, "heads").to_dict()
    positions = read_positions(task, pairs)
    names = task.position_labels(pairs.corrupt.shape[1])
    return {"shares": head_shares(head_effects(heads_patch)), "ablation": ablate_sets(model, task, kind, n_groups, seed),
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
    """``single head`` / ``distributed`` / ``none`` (module docstring), with the heads and the evidence."""
    sh = record["shares"]
    top = sh["top"]
    alone = record["ablation"]["alone"][top[0]][top[1]]
    back = reaches_log_k(alone, log_k) if alone is not None else False
    evidence = {"top": head_label(*top), "top_share": sh["top_share"], "top_layer_share": sh["top_layer_share"],
                "top_alone_candidate_loss": alone, "top_alone_reaches_log_k": back,
                "top_alone_near_log_k": near_log_k(alone, log_k) if alone is not None else False}
    if not after_drop or sh["total_positive"] <= 0:
        return {"verdict": "none", "heads": [], **evidence}
    if sh["top_layer_share"] >= SINGLE_HEAD_SHARE and back:
        return {"verdict": "single head", "heads": [head_label(*top)], **evidence}
    return {"verdict": "distributed", "heads": [head_label(*x) for x in sh["heads_for_80"]], **evidence}


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
            "positive head-patching effect and ablating it alone returns the candidate loss to log K; "
            "none before tau", "chosen": chosen_ablation(last, head, log_k),
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


def format_circuit(c: dict[str, Any] | None, log_k: float, head: tuple[int, int] | list[int] | None = None,
                   label: str = "candidate loss", height_label: str = "log K") -> list[str]:
    """The circuit summary as text lines (``python -m interp.analyze``), in the words of the task's
    progress measure (``label`` against ``height_label``, the value ``log_k``)."""
    if not c:
        return ["circuit         n/a (no exact-patching steps)"]
    ch = c["chosen"]

    def cl(e: dict[str, Any]) -> str:
        return "n/a" if e["candidate_loss"] is None else (
            f"{e['candidate_loss']:.3f}{f' (>= {height_label})' if e['reaches_log_k'] else ''}")

    others = ", ".join(f"{k} {cl(v)}" for k, v in ch["others"].items())
    n80 = c["shares"]["n_for_80"]
    return [f"circuit verdict {c['verdict']}" + (f": {', '.join(c['heads'])}" if c["heads"] else "")
            + f"  (step {c['step']}; top head {c['top']} holds {c['top_share']:.0%} of all heads' effect, "
              f"{c['top_layer_share']:.0%} of its layer's; {n80} head{'' if n80 == 1 else 's'} hold{'s' if n80 == 1 else ''} 80%)",
            f"{ch['kind']} ablation  base {cl(ch['base'])}; chosen alone {cl(ch['alone'])}, its layer {cl(ch['layer'])}, "
            f"layer but it {cl(ch['layer_but'])}; others alone: {others}  ({label}; {height_label} = {log_k:.3f})"] + (
        [f"reads the cue   {head_label(*head)} output patched at one position (normalised): {reads_z_text(c, head)}"]
        if head is not None else [])
