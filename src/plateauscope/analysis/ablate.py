"""Head ablation: which heads the model needs to use the task's cue.

Method: replace one head's output (``hook_z`` of its layer, ``[batch, pos, head, d_head]``,
i.e. the head's contribution before ``W_O``) on every position, and score the eval set again:

* ``zero`` ablation sets it to 0;
* ``mean`` ablation sets it to its mean over the evaluation examples (the true sequences of the
  eval groups, under the unablated model), separately at each position;
* ``cue_mean`` ablation sets it to its mean over the examples of the same group: those that share
  everything but the cue (the selector task: one B, each of the K selectors z), separately at each
  position. It removes what the head's output says about the cue and keeps everything else it
  carries (B), so it measures the cue's route, not damage: a head that carries only B is left
  exactly as it was. It needs a task with candidates (groups of K cues).

The heads are ablated one at a time (:func:`ablate_each_head`) or as a given set at once
(:func:`ablate_heads`). All ablated copies are scored in shared, vectorised forward passes: the
candidate sequences are repeated once per ablation and a per-row mask says which heads each
row ablates.

Metric: candidate loss and delta_z exactly as ``plateauscope.runs.metrics`` defines them (the same
``EvalSet``, ``target_logprobs`` and ``candidate_metrics``). Sign: ``d_candidate_loss`` =
ablated minus unablated; positive means the head helped pick the right candidate. A head the
model needs to read z pushes the candidate loss back up to log K when ablated (the model falls
back to the marginal: :func:`falls_back_to_marginal`), and ``d_delta_z`` goes negative.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.prefix import activations
from plateauscope.model.backend import (
    Model,
    hooks_added,
    is_causal_lm,
    replayed_from,
    runs_from_layer,
    shares_prefixes,
)
from plateauscope.model.scoring import shared_prefix_logprobs
from plateauscope.tasks.base import Task

KINDS: tuple[str, ...] = ("zero", "mean", "cue_mean")
DEFAULT_GROUPS = 8
"""Eval groups scored by default (each contributes K x K candidate sequences per ablation)."""


@dataclass
class HeadAblation:
    """Each head ablated on its own: metrics of the ablated model, ``[n_layers, n_heads]``."""

    kind: str
    n_groups: int
    base: dict[str, float]
    """``candidate_metrics`` of the unablated model on the same eval set."""
    candidate_loss: Float[Tensor, "n_layers n_heads"]
    delta_z: Float[Tensor, "n_layers n_heads"]
    d_candidate_loss: Float[Tensor, "n_layers n_heads"]
    """Ablated minus unablated candidate loss (positive: the head helped)."""
    d_delta_z: Float[Tensor, "n_layers n_heads"]
    """Ablated minus unablated delta_z (negative: the model uses z less without the head)."""

    @classmethod
    def from_metrics(cls, kind: str, n_groups: int, base: dict[str, float], candidate_loss: list | Tensor,
                     delta_z: list | Tensor) -> HeadAblation:
        """From the unablated metrics and each head's ablated candidate loss and delta_z (``[layer][head]``)."""
        cl, dz = torch.as_tensor(candidate_loss, dtype=torch.float32), torch.as_tensor(delta_z, dtype=torch.float32)
        return cls(kind, n_groups, base, cl, dz, cl - base["candidate_loss"], dz - base["delta_z"])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: every per-head tensor as nested lists."""
        return {"kind": self.kind, "n_groups": self.n_groups, "base": self.base,
                **{k: getattr(self, k).tolist() for k in ("candidate_loss", "delta_z", "d_candidate_loss", "d_delta_z")}}


@dataclass
class SetAblation:
    """A set of heads ablated together."""

    kind: str
    n_groups: int
    heads: list[tuple[int, int]]
    base: dict[str, float]
    ablated: dict[str, float]
    """``candidate_metrics`` with all of ``heads`` ablated."""

    @property
    def candidate_loss(self) -> float:
        """Candidate loss with the set ablated."""
        return self.ablated["candidate_loss"]

    @property
    def delta_z(self) -> float:
        """delta_z with the set ablated."""
        return self.ablated["delta_z"]

    @property
    def d_candidate_loss(self) -> float:
        """Change in candidate loss: ablated minus unablated (positive = the set helped)."""
        return self.ablated["candidate_loss"] - self.base["candidate_loss"]

    @property
    def d_delta_z(self) -> float:
        """Change in delta_z: ablated minus unablated (negative = the set carried z)."""
        return self.ablated["delta_z"] - self.base["delta_z"]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return {"kind": self.kind, "n_groups": self.n_groups, "heads": [list(h) for h in self.heads],
                "base": self.base, "ablated": self.ablated,
                "d_candidate_loss": self.d_candidate_loss, "d_delta_z": self.d_delta_z}


SEQUENCES_PER_GROUP = 32
"""A task without candidates is scored on this many evaluation sequences per requested group."""


def build_evalset(task: Task, n_groups: int = DEFAULT_GROUPS, seed: int = 0) -> Any:
    """The eval set the ablations are scored on (the task's ``build_evalset``, seeded): ``n_groups``
    groups of candidates, or ``SEQUENCES_PER_GROUP`` times as many sequences for a task without them."""
    if n_groups < 1:
        raise ValueError(f"the number of eval groups must be at least 1, got {n_groups}")
    if "candidates" not in task.capabilities:
        task.require("cue", "head ablation (does the model still read the cue?)")
    n = n_groups if "candidates" in task.capabilities else n_groups * SEQUENCES_PER_GROUP
    return task.build_evalset(n, 1, seed)


def n_scored_groups(task: Task, evalset: Any) -> int:
    """How many groups of candidates (or, without candidates, sequences) an eval set scores."""
    if "candidates" in task.capabilities:
        return int(task.candidate_tree(evalset)[0].shape[0])
    return len(task.eval_sequences(evalset))


@torch.inference_mode()
def mean_head_outputs(
    model: Model, seqs: Int[Tensor, "N seq"], input_len: int, batch_size: int = 2048
) -> Float[Tensor, "n_layers pos n_heads d_head"]:
    """Mean of every head's ``hook_z`` over the sequences, at each input position."""
    names = [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]
    device = next(model.parameters()).device
    total: Tensor | None = None
    for chunk in seqs.split(batch_size):
        cache = activations(model, chunk[:, :input_len].to(device), names)
        part = torch.stack([cache[n].float().sum(0) for n in names])
        total = part if total is None else total + part
    assert total is not None
    return total / len(seqs)


@torch.inference_mode()
def group_mean_head_outputs(
    model: Model, trees: Int[Tensor, "G K K seq"], input_len: int
) -> Float[Tensor, "G n_layers pos n_heads d_head"]:
    """Mean of every head's ``hook_z`` over each group's K true sequences (prefix j with candidate
    j, the diagonal of its candidate tree), at each input position: what ``cue_mean`` puts in."""
    G, K = trees.shape[:2]
    true = trees[:, torch.arange(K), torch.arange(K)].reshape(G * K, -1)
    names = [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]
    device = next(model.parameters()).device
    sums = []
    for chunk in true.view(G, K, -1).split(max(1, 2048 // K)):  # whole groups, one forward for many
        cache = activations(model, chunk.flatten(0, 1)[:, :input_len].to(device), names)
        sums.append(torch.stack([cache[n].float().unflatten(0, (len(chunk), K)).sum(1) for n in names], 1))
    return torch.cat(sums) / K


def _ablation_hooks(
    row_mask: Bool[Tensor, "B n_layers n_heads"],
    replacement: Float[Tensor, "n_layers pos n_heads d_head"] | Float[Tensor, "G n_layers pos n_heads d_head"] | None,
    offset: int = 0, groups: Int[Tensor, " B"] | None = None,
) -> list[tuple[str, Callable]]:
    """One ``hook_z`` hook per layer replacing the masked (row, head) outputs (``None``: by zero;
    with ``groups``, row b takes group ``groups[b]``'s replacement); the hooked activations start
    at position ``offset``."""

    def make(layer: int) -> Callable:
        def hook(z: Float[Tensor, "B pos n_heads d_head"], hook: HookPoint) -> Float[Tensor, "B pos n_heads d_head"]:
            mask = row_mask[:, layer, None, :, None].to(z.device)  # [B, 1, H, 1]
            if replacement is None:
                return z.masked_fill(mask, 0.0)
            if groups is not None:
                return torch.where(mask, replacement[groups, layer, offset: offset + z.shape[1]].to(z), z)
            return torch.where(mask, replacement[layer, offset: offset + z.shape[1]].to(z), z)

        return hook

    return [(get_act_name("z", layer), make(layer)) for layer in range(row_mask.shape[1]) if row_mask[:, layer].any()]


def ablation_scores(
    model: Model,
    task: Task,
    evalset: Any,
    masks: Bool[Tensor, "C n_layers n_heads"],
    kind: str = "zero",
    max_rows: int = 4096,
) -> Float[Tensor, "C G K K"]:
    """Candidate scores ``[ablation, group, prefix j, candidate k]`` (the task's ``candidate_tree``,
    as its evaluation builds them) for each ablation mask, all copies scored in shared batches of
    ``max_rows``."""
    if kind not in KINDS:
        raise ValueError(f"ablation kind must be one of {KINDS}, got {kind!r}")
    trees, splits = task.candidate_tree(evalset)
    G, K = trees.shape[:2]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if tuple(masks.shape[1:]) != (L, H):
        raise ValueError(f"ablation masks have shape {tuple(masks.shape)}, the model has {L} layers x {H} heads")
    replacement = (mean_head_outputs(model, task.eval_sequences(evalset), task.input_len) if kind == "mean" else
                   group_mean_head_outputs(model, trees, task.input_len) if kind == "cue_mean" else None)
    C = masks.shape[0]

    def score(sub: Bool[Tensor, "c n_layers n_heads"], **start) -> Float[Tensor, "c G K K"]:
        # Every (ablation copy, group) is a tree of K x K candidates whose prefixes are scored once:
        # its <BOS> B <SEP>, then each z_j <SEP>, then the candidates (plateauscope.model.scoring.shared_prefix_logprobs).
        # Root r is group r mod G of copy r // G.
        logp, _ = shared_prefix_logprobs(
            model, trees.expand(len(sub), -1, -1, -1, -1).reshape(len(sub) * G, K, K, -1), splits, task,
            batch_size=max_rows, hooks_for=lambda roots, offset: _ablation_hooks(
                sub[roots // G], replacement, offset, roots % G if kind == "cue_mean" else None),
            **start)
        return logp.sum(-1).view(len(sub), G, K, K)

    if not shares_prefixes(model):
        return score(masks)
    # A copy that ablates nothing below layer l equals the unablated model there, keys and values
    # included: it starts at l on the unablated run's residual stream (first ablated layer; L: none).
    ablated = masks.any(-1)  # [C, L]
    first = torch.where(ablated.any(-1), ablated.float().argmax(-1), L)  # [C]
    skip = sorted({int(x) for x in first} - {0, L})
    resid: dict[tuple[int, int], Tensor] = {(lvl, layer): torch.empty(0) for lvl in range(len(splits) + 1)
                                            for layer in skip}
    out = torch.empty(C, G, K, K)
    if skip or (first == L).any():  # the unablated run
        out[first == L] = score(torch.zeros(1, L, H, dtype=torch.bool), save_resid=resid)
    if (first == 0).any():
        out[first == 0] = score(masks[first == 0])
    for layer in skip:
        def base(lvl: int, rows: Tensor, layer: int = layer) -> Tensor:
            at = resid[(lvl, layer)]
            return at[rows % len(at)]  # copy-major: row r of a copy is row r mod (rows per copy) of the base

        out[first == layer] = score(masks[first == layer], start_layer=layer, start_resid=base)
    return out


def group_candidate_loss(scores: Float[Tensor, "C G K K"]) -> Float[Tensor, "C G"]:
    """Each ablation's candidate loss in each eval group: -log p(candidate j | prefix j) among the
    group's K candidates, averaged over j (their mean over groups is the task's candidate loss)."""
    diag = torch.arange(scores.shape[-1])
    return (scores.logsumexp(-1) - scores[..., diag, diag]).mean(-1)


def ablation_metrics_by_group(
    model: Model, task: Task, evalset: Any, masks: Bool[Tensor, "C n_layers n_heads"], kind: str = "zero",
) -> tuple[list[dict[str, float]], Float[Tensor, "C G"] | None]:
    """For each ablation mask (an all-False mask: unablated), the task's progress measure as
    ``candidate_loss`` and its cue effect as ``delta_z`` (the selector task's names): from its
    ``candidate_metrics`` when it has candidates, else from its ``evaluate`` with the heads ablated.
    With candidates, also each mask's progress measure in each eval group (the spread an interval
    over the groups is made from; None without candidates)."""
    if "candidates" in task.capabilities:
        scores = ablation_scores(model, task, evalset, masks, kind)
        return [task.candidate_metrics(s, evalset) for s in scores], group_candidate_loss(scores)
    if kind not in KINDS:
        raise ValueError(f"ablation kind must be one of {KINDS}, got {kind!r}")
    if kind == "cue_mean":
        raise ValueError("cue_mean ablation needs a task with candidates (groups that differ only in the cue); "
                         "use mean or zero")
    progress = task.progress
    replacement = mean_head_outputs(model, task.eval_sequences(evalset), task.input_len) if kind == "mean" else None
    return [{"candidate_loss": m[progress.key],  # no cue effect logged: NaN (null in the cache)
             "delta_z": m.get(progress.cue_effect_key, math.nan) if progress.cue_effect_key else math.nan}
            for m in _evaluated_ablations(model, task, evalset, masks, replacement)], None


REPLAY_BYTES = 256 * 2**20
"""At most this much of the unablated run's residual stream is kept for ablations that start at a block."""


def _evaluated_ablations(model: Model, task: Task, evalset: Any, masks: Bool[Tensor, "C n_layers n_heads"],
                         replacement: Tensor | None) -> list[dict[str, float]]:
    """The task's ``evaluate_without_loss`` (what an ablation reads of its ``evaluate``) with each mask's heads
    ablated. The unablated run goes first; on a bridge of another trainer's model that may start at a block
    (:func:`~plateauscope.model.backend.runs_from_layer`), it keeps the residual stream entering each block that
    some mask ablates first (within :data:`REPLAY_BYTES`, lowest blocks first), and each such mask's run starts
    there on it (below, nothing differs): the same forwards of the same inputs, in the same order."""
    L = model.cfg.n_layers
    ablated = masks.any(-1)  # [C, L]
    first = torch.where(ablated.any(-1), ablated.float().argmax(-1), L).tolist()
    starts = sorted(set(first) - {0, L}) if is_causal_lm(model) and runs_from_layer(model) else []
    kept: dict[int, list[Tensor]] = {layer: [] for layer in starts}
    size = [0]

    def keep(layer: int) -> Callable:
        def record(act: Tensor, hook: HookPoint) -> None:
            if layer in kept:
                kept[layer].append(act.detach().clone())
                size[0] += act.numel() * act.element_size()
                while size[0] > REPLAY_BYTES and kept:  # over budget: the highest block's runs start at 0
                    size[0] -= sum(t.numel() * t.element_size() for t in kept.pop(max(kept)))
        return record

    with hooks_added(model, [(get_act_name("resid_pre", layer), keep(layer)) for layer in starts]):
        base = task.evaluate_without_loss(model, evalset)
    out = []
    for mask, layer in zip(masks, first):
        if layer == L:  # nothing ablated
            out.append(base)
            continue
        with (replayed_from(model, layer, kept[layer]) if layer in kept else nullcontext()), \
                hooks_added(model, _ablation_hooks(mask[None], replacement)):
            out.append(task.evaluate_without_loss(model, evalset))
    return out


def ablation_metrics(
    model: Model, task: Task, evalset: Any, masks: Bool[Tensor, "C n_layers n_heads"], kind: str = "zero",
) -> list[dict[str, float]]:
    """:func:`ablation_metrics_by_group` without the per-group values."""
    return ablation_metrics_by_group(model, task, evalset, masks, kind)[0]


def ablate_each_head(
    model: Model, task: Task, kind: str = "zero", n_groups: int = DEFAULT_GROUPS, seed: int = 0
) -> HeadAblation:
    """Every head ablated on its own; candidate loss and delta_z of each ablated model."""
    evalset = build_evalset(task, n_groups, seed)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    masks = torch.cat([torch.zeros(1, L * H, dtype=torch.bool), torch.eye(L * H, dtype=torch.bool)]).view(-1, L, H)
    base, *each = ablation_metrics(model, task, evalset, masks, kind)
    return HeadAblation.from_metrics(kind, n_scored_groups(task, evalset), base,
                                     torch.tensor([m["candidate_loss"] for m in each]).view(L, H),
                                     torch.tensor([m["delta_z"] for m in each]).view(L, H))


def ablate_heads(
    model: Model,
    task: Task,
    heads: list[tuple[int, int]],
    kind: str = "zero",
    n_groups: int = DEFAULT_GROUPS,
    seed: int = 0,
) -> SetAblation:
    """The given (layer, head) pairs ablated all at once."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    mask = torch.zeros(2, L, H, dtype=torch.bool)
    for layer, head in heads:
        if not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"no head L{layer}H{head}: the model has {L} layers x {H} heads")
        mask[1, layer, head] = True
    evalset = build_evalset(task, n_groups, seed)
    base, ablated = ablation_metrics(model, task, evalset, mask, kind)
    return SetAblation(kind, n_scored_groups(task, evalset), [(int(a), int(b)) for a, b in heads], base, ablated)


MARGINAL_TOL = 0.25
"""A candidate loss within this fraction of log K of log K counts as back at the plateau."""


def near_height(value: float, height: float, tol: float = MARGINAL_TOL) -> bool:
    """Whether the progress measure ``value`` is within ``tol * height`` of its plateau height (the
    selector task: candidate loss within 0.25 log K of log K, so z no longer picks the target)."""
    return abs(float(value) - height) <= tol * height


def falls_back_to_marginal(result: HeadAblation, layer: int, head: int, log_k: float, tol: float = MARGINAL_TOL) -> bool:
    """Whether ablating (layer, head) leaves the candidate loss within ``tol * log K`` of log K."""
    return near_height(float(result.candidate_loss[layer, head]), log_k, tol)
