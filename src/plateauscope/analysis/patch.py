"""Exact activation patching: which components carry the task's cue to the answer.

Method. Each prompt pair from :func:`plateauscope.analysis.inputs.prompt_pairs` shares the base string B and
differs in the selector: the clean prompt is (B, z), the corrupted one (B, z'). We run the
corrupted prompts and overwrite one component's activation (a head's output ``hook_z``, the
residual stream ``resid_pre``, an ``attn_out`` or ``mlp_out``, at all positions or at one) with
its value from the clean run of the same pair, and measure how far the output moves back
towards the clean answer.

Metric. A callable ``metric(last_logits, pairs)`` that maps the prediction position's logits
``[N, vocab]`` to one value per pair ``[N]``; the sweep averages it over pairs (as
TransformerLens's ``patching_metric``, but on the last position, the only one unembedded). The
default, :func:`plateauscope.analysis.inputs.last_logit_diff`, is the task's logit difference: the
logit of the clean answer token minus that of the corrupted one. Positive = the model prefers
the clean answer.

Normalisation. ``(patched - corrupt) / (clean - corrupt)``, where ``clean`` and ``corrupt`` are
the metric on the unpatched clean and corrupted runs: 1 = the patch restores the clean
behaviour, 0 = no effect (still corrupted), negative = it pushes further towards the corrupted
answer, above 1 = it overshoots. The sign is relative to the clean-corrupt gap, so it keeps
this meaning even if that gap is negative. Normalised values are NaN when
``|clean - corrupt| < 1e-6`` (e.g. on the plateau, where the model ignores z and the clean and
corrupted runs give the same answer); the raw patched metric is always returned as well.

Implementation. One generic function, :func:`patch_sweep`, does every sweep. A component set
is a :class:`PatchSpec`: a hook (``transformer_lens.utilities.get_act_name``, ex ``utils``) and one boolean mask
per patch over ``[layer, *site]`` (site = ``pos`` or ``pos head``) saying which activation
entries come from the clean run. The results are exactly TransformerLens's (one full forward
per patch), with less arithmetic (:mod:`plateauscope.analysis.prefix`): patches that only touch positions
before the first one where clean and corrupted prompts differ are the corrupted metric, with
no forward pass; every other patch starts at its first patched layer and position, on the
cached corrupted residual stream, with the earlier positions' keys and values from the
corrupted run; only the prediction position is unembedded. Patches with the same start run
together: the batch is replicated P times and each replica gets its own mask, applied with one
``torch.where`` per hooked layer; a forward holds at most ``max_batch`` rows. The thin
wrappers (:func:`patch_head_out_all_pos` and friends) only pick a spec.
:mod:`plateauscope.analysis.attribution` uses the same specs for its first-order approximation.

CLI::

    plateauscope patch --ckpt RUN_OR_FILE [--step N] [--n-examples N]
        [--target heads|heads_by_pos|resid|attn|mlp|attn_layer|mlp_layer]
        [--method exact|attribution|both] [--json FILE] [--top N]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.components import (
    PatchResult,
    PatchSpec,
    normalise,
    patch_spec,
)
from plateauscope.analysis.inputs import PromptPairs, last_logit_diff
from plateauscope.analysis.prefix import (
    RunCache,
    cached_run,
    first_difference,
    forward_from,
    suffix_run,
)
from plateauscope.model.backend import Model, runs_from_layer

PairMetric = Callable[[Float[Tensor, "N vocab"], PromptPairs], Float[Tensor, " N"]]
"""A patching metric: the prediction position's logits of N prompts -> one value per pair."""


def _per_pair_logit_diff(last: Float[Tensor, "N vocab"], pairs: PromptPairs) -> Float[Tensor, " N"]:
    return last_logit_diff(last, pairs, reduce=False)


@torch.no_grad()
def baselines(model: Model, pairs: PromptPairs, act_name: str | None = None,
              metric: PairMetric = _per_pair_logit_diff) -> tuple[float, float, dict[str, Tensor]]:
    """Clean and corrupted metrics, and the clean activations of ``act_name`` at every layer."""
    clean, corrupt, _ = _paired_runs(model, pairs, [act_name] if act_name else [])
    return metric(clean.last_logits, pairs).mean().item(), metric(corrupt.last_logits, pairs).mean().item(), clean.acts


def _paired_runs(model: Model, pairs: PromptPairs, act_names: list[str]
                 ) -> tuple[RunCache, RunCache, int]:
    """The clean run (every position) and the corrupted one (computed from the first position
    where the prompts differ, the rest shared with the clean run), and that position."""
    device = model.cfg.device
    first = first_difference(pairs.clean, pairs.corrupt)
    clean = cached_run(model, pairs.clean.to(device), pairs.pred_pos, act_names)
    corrupt = suffix_run(model, pairs.corrupt.to(device), clean, min(first, pairs.pred_pos), pairs.pred_pos,
                         act_names)
    return clean, corrupt, first


@torch.no_grad()
def patch_sweep(
    model: Model,
    pairs: PromptPairs,
    spec: PatchSpec,
    max_batch: int = 4096,
    progress: bool = False,
    metric: PairMetric = _per_pair_logit_diff,
) -> PatchResult:
    """Run every patch of ``spec`` on the corrupted prompts; the generic engine of this module.

    Exact, with less arithmetic than a full forward per patch (see :mod:`plateauscope.analysis.prefix`):

    * a patch whose entries all lie before the first position where the clean and corrupted
      prompts differ changes nothing (the activations there are equal): its result is the
      corrupted metric, with no forward pass;
    * any other patch starts at its first patched layer ``l`` and position ``s``: the forward
      runs the blocks from ``l`` on the corrupted residual stream of positions ``>= s``, with the
      keys and values of earlier positions from the corrupted run (causal attention: the patch
      cannot change them); only the prediction position is unembedded.

    Patches sharing ``(l, s)`` (``s`` alone on a model that runs every block: not
    :func:`~plateauscope.model.backend.runs_from_layer`) run ``max(1, max_batch // N)`` at a time
    (N = number of pairs): the batch is replicated once per patch and, at each hooked layer,
    ``torch.where(mask, clean, corrupt)`` writes each replica's clean entries. Returns ``metric`` (per pair, averaged
    over pairs) per patch in ``spec.shape``.
    """
    n, n_pos = pairs.corrupt.shape
    if spec.masks.shape[2] != n_pos:
        raise ValueError(f"the spec is for {spec.masks.shape[2]} positions, the prompts have {n_pos}")
    device = model.cfg.device
    clean, corrupt, first = _paired_runs(model, pairs, [spec.act_name])
    clean_metric = metric(clean.last_logits, pairs).mean().item()
    corrupt_metric = metric(corrupt.last_logits, pairs).mean().item()
    masks = spec.masks.to(device)
    active = masks.clone()
    active[:, :, : min(first, n_pos)] = False  # equal activations: patching them is a no-op
    active[:, :, pairs.pred_pos + 1:] = False  # later positions cannot reach the prediction
    n_patch, L = masks.shape[:2]
    by_layer = active.flatten(2).any(-1)  # [P, layer]
    by_pos = active.transpose(1, 2).flatten(2).any(-1)  # [P, pos]
    todo = by_layer.any(-1)
    # first True; a model that runs every block anyway batches all layers together
    start_layer = by_layer.float().argmax(-1) if runs_from_layer(model) else torch.zeros_like(todo, dtype=torch.long)
    start_pos = by_pos.float().argmax(-1)
    raw = torch.full((n_patch,), corrupt_metric, dtype=torch.float64, device=device)
    per_chunk = max(1, max_batch // n)
    groups = []
    for key in torch.unique(start_layer[todo] * n_pos + start_pos[todo]).tolist():
        idx = (todo & (start_layer * n_pos + start_pos == key)).nonzero()[:, 0]
        groups += [(key // n_pos, key % n_pos, idx[i: i + per_chunk]) for i in range(0, len(idx), per_chunk)]
    for layer, s, idx in tqdm(groups, desc=f"patch {spec.target}", disable=not progress or len(groups) <= 1,
                              dynamic_ncols=True, leave=False):
        p = len(idx)
        chunk = active[idx][:, :, s:]  # [p, layer, pos - s, ...]
        hooks = []
        for later in range(layer, L):
            m = chunk[:, later]
            if m.any():
                name = get_act_name(spec.act_name, later)
                hooks.append((name, _make_hook(m, clean.acts[name][:, s:], p, n)))
        last = forward_from(model, pairs.corrupt.to(device), corrupt, pairs.pred_pos, hooks, s, layer, p)
        per_pair = torch.stack([metric(replica, pairs) for replica in last.view(p, n, -1)])  # [p, N]
        raw[idx] = per_pair.double().mean(1)
    raw = raw.reshape(spec.shape).float().cpu()
    return PatchResult(spec.target, spec.axes, raw, normalise(raw, clean_metric, corrupt_metric),
                       clean_metric, corrupt_metric, "exact", n)


def _make_hook(mask: Bool[Tensor, "p ..."], clean: Float[Tensor, "n ..."], p: int, n: int):
    """A hook that gives replica r the clean entries where ``mask[r]`` is set. ``mask`` and ``clean``
    cover positions ``s..``; the activation covers them or all positions (a full forward, see
    :func:`plateauscope.analysis.prefix.forward_from`), whose earlier positions are left as they are."""
    # mask [p, pos, *site] -> [p, 1, pos, *site, 1]; clean [n, pos, *site, d] -> [1, n, pos, *site, d]
    m = mask.reshape(p, 1, *mask.shape[1:], 1)

    def hook(act: Tensor, hook) -> Tensor:
        rep = act.reshape(p, n, *act.shape[1:])
        k = m.shape[2]
        patched = torch.where(m, clean.unsqueeze(0), rep[:, :, -k:])
        if k < act.shape[1]:
            patched = torch.cat([rep[:, :, :-k], patched], dim=2)
        return patched.reshape(act.shape)

    return hook


def patch(model: Model, pairs: PromptPairs, target: str, **kw) -> PatchResult:
    """Exact patching of one component set by name (see :data:`TARGETS`)."""
    return patch_sweep(model, pairs, patch_spec(model, target, pairs.corrupt.shape[1]), **kw)


def patch_head_out_all_pos(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """Each head's output (``hook_z``) at every position; result [layer, head]."""
    return patch(model, pairs, "heads", **kw)


def patch_head_out_by_pos(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """Each head's output at one position; result [layer, pos, head]."""
    return patch(model, pairs, "heads_by_pos", **kw)


def patch_resid_pre(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """The residual stream before each block, one position at a time; result [layer, pos]."""
    return patch(model, pairs, "resid", **kw)


def patch_attn_out(model: Model, pairs: PromptPairs, by_pos: bool = True, **kw) -> PatchResult:
    """Each layer's attention output; result [layer, pos] (``by_pos``) or [layer]."""
    return patch(model, pairs, "attn" if by_pos else "attn_layer", **kw)


def patch_mlp_out(model: Model, pairs: PromptPairs, by_pos: bool = True, **kw) -> PatchResult:
    """Each layer's MLP output; result [layer, pos] (``by_pos``) or [layer]."""
    return patch(model, pairs, "mlp" if by_pos else "mlp_layer", **kw)


# ---------------------------------------------------------------------------------------- CLI
