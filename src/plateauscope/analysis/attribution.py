"""Attribution patching: a first-order, two-pass approximation of :mod:`plateauscope.analysis.patch`.

Method. One clean forward (caching the activations), one corrupted forward (keeping them in
the autograd graph) and one backward of the metric on the corrupted run give, for every
activation entry, the clean-minus-corrupted difference and the metric's gradient. The
corrupted pass and its backward cover only the positions from the first one where the prompts
differ (:mod:`plateauscope.analysis.prefix`): before it the two runs' activations are equal, so their terms
are exactly 0. Patching a
component (a set of entries, given by the same :class:`plateauscope.analysis.components.PatchSpec` masks as exact
patching) is approximated by the first-order Taylor term::

    patched - corrupt  ~=  sum over pairs, entries in the component, features of
                           (clean_act - corrupt_act) * d metric / d corrupt_act

Every component set of every layer comes from those passes, however many there are.

Metric and sign: as in :mod:`plateauscope.analysis.patch` — the mean logit difference (clean first target
token minus corrupted one) at the prediction position; results are returned in the same
:class:`plateauscope.analysis.components.PatchResult`, ``raw = corrupt + approximate effect`` and
``normalised = approximate effect / (clean - corrupt)`` (1 = clean, 0 = corrupted; NaN when
``|clean - corrupt| < 1e-6``), same shapes, so the two can be compared directly
(:func:`agreement`).

When to trust it. Exact only where the metric is linear in the patched activation; otherwise
its error is second order in the clean-corrupted difference. It is good for small
differences (a single position, one head whose output changes a little) and as a cheap screen
of many components; it can be badly wrong where a patch moves an activation far, through
LayerNorm, softmax attention or the MLP non-linearity (notably ``resid_pre`` at the z
positions, whose clean and corrupted embeddings differ completely, and any patch that
saturates an attention pattern). Check the top components with exact patching.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from jaxtyping import Bool, Float
from scipy.stats import rankdata
from torch import Tensor
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.components import (
    PatchResult,
    PatchSpec,
    normalise,
    patch_spec,
)
from plateauscope.analysis.inputs import PromptPairs, last_logit_diff
from plateauscope.analysis.prefix import (
    cached_run,
    first_difference,
    forward_from,
    savers,
)
from plateauscope.model.backend import Model


def site_contributions(
    model: Model, pairs: PromptPairs, act_names: Iterable[str]
) -> tuple[float, float, dict[str, Float[Tensor, "layer ..."]]]:
    """Clean and corrupted metrics and, per hook kind, ``(clean - corrupt) * grad`` summed over
    pairs and features: one entry per ``[layer, *site]`` (site = ``pos`` or ``pos head``).

    Two passes in all (:mod:`plateauscope.analysis.prefix`): the clean forward, and the corrupted forward and
    backward over the positions from the first one where the prompts differ (before it the
    clean and corrupted activations are equal, so their contributions are exactly 0), reading
    only the prediction position's logits.
    """
    device = model.cfg.device
    act_names = sorted(set(act_names))
    L = model.cfg.n_layers
    start = min(first_difference(pairs.clean, pairs.corrupt), pairs.pred_pos)
    with torch.no_grad():
        clean = cached_run(model, pairs.clean.to(device), pairs.pred_pos, act_names)
    clean_metric = last_logit_diff(clean.last_logits, pairs).item()
    names = [get_act_name(a, layer) for a in act_names for layer in range(L)]
    saved: dict[str, Tensor] = {}

    with torch.enable_grad():
        # the corrupted run from ``start`` (or every position, on a model that does not share prefixes)
        last = forward_from(model, pairs.corrupt.to(device), clean, pairs.pred_pos, savers(names, saved), start)
        metric = last_logit_diff(last, pairs)
        grads = torch.autograd.grad(metric, [saved[n] for n in names], allow_unused=True)
    return clean_metric, metric.item(), contributions(act_names, L, clean.acts, saved, dict(zip(names, grads)))


def contributions(act_names: list[str], n_layers: int, clean: dict[str, Tensor], corrupt: dict[str, Tensor],
                  grads: dict[str, Tensor | None]) -> dict[str, Float[Tensor, "layer ..."]]:
    """Per hook kind, ``(clean - corrupt) * grad`` summed over pairs and features, ``[layer, *site]``,
    from the clean run's activations (every position) and the corrupted run's, with the gradient of
    the metric there (from ``start``, or every position: the clean and corrupted activations are
    equal before ``start``, so the contribution is 0 there)."""
    out: dict[str, Tensor] = {}
    for a in act_names:
        per_layer = []
        for layer in range(n_layers):
            name = get_act_name(a, layer)
            g = grads.get(name)
            c = torch.zeros(clean[name].shape[1:-1], device=clean[name].device)  # [pos, *site]
            if g is not None:
                k = corrupt[name].shape[1]
                delta = clean[name][:, -k:] - corrupt[name].detach()
                c[-k:] = (delta * g).sum(dim=(0, -1))  # over pairs and features
            per_layer.append(c)
        out[a] = torch.stack(per_layer).float()
    return out


def _contract(masks: Bool[Tensor, "P layer ..."], contrib: Float[Tensor, "layer ..."]) -> Float[Tensor, " P"]:
    """Sum each patch's entries: ``effect[p] = sum(masks[p] * contrib)``."""
    return masks.flatten(1).to(contrib.dtype) @ contrib.flatten()


def attribution_sweep(
    model: Model, pairs: PromptPairs, specs: Iterable[PatchSpec]
) -> dict[str, PatchResult]:
    """Attribution patching of several component sets from one forward/backward; keyed by target."""
    specs = list(specs)
    return attribution_results(pairs, specs, *site_contributions(model, pairs, [s.act_name for s in specs]))


def attribution_results(pairs: PromptPairs, specs: list[PatchSpec], clean: float, corrupt: float,
                        contrib: dict[str, Float[Tensor, "layer ..."]]) -> dict[str, PatchResult]:
    """Each component set's attribution from the site contributions (:func:`contributions`)."""
    out = {}
    for s in specs:
        effect = _contract(s.masks.to(contrib[s.act_name].device), contrib[s.act_name]).reshape(s.shape).cpu()
        raw = corrupt + effect
        out[s.target] = PatchResult(s.target, s.axes, raw, normalise(raw, clean, corrupt), clean, corrupt,
                                    "attribution", pairs.corrupt.shape[0])
    return out


def target_specs(model: Model, pairs: PromptPairs, targets: Iterable[str]) -> list[PatchSpec]:
    """The patch specs of the named component sets on these pairs."""
    return [patch_spec(model, t, pairs.corrupt.shape[1]) for t in targets]


def attribute_all(model: Model, pairs: PromptPairs, targets: Iterable[str]) -> dict[str, PatchResult]:
    """Attribution patching of the named component sets (see ``plateauscope.analysis.components.TARGETS``), one backward."""
    return attribution_sweep(model, pairs, target_specs(model, pairs, targets))


def attribute(model: Model, pairs: PromptPairs, target: str) -> PatchResult:
    """Attribution patching of one component set, same shape and normalisation as ``plateauscope.analysis.patch.patch``."""
    return attribute_all(model, pairs, [target])[target]


def attribute_head_out_all_pos(model: Model, pairs: PromptPairs) -> PatchResult:
    """[layer, head]."""
    return attribute(model, pairs, "heads")


def attribute_head_out_by_pos(model: Model, pairs: PromptPairs) -> PatchResult:
    """[layer, pos, head]."""
    return attribute(model, pairs, "heads_by_pos")


def attribute_resid_pre(model: Model, pairs: PromptPairs) -> PatchResult:
    """[layer, pos]."""
    return attribute(model, pairs, "resid")


def attribute_attn_out(model: Model, pairs: PromptPairs, by_pos: bool = True) -> PatchResult:
    """[layer, pos] (``by_pos``) or [layer]."""
    return attribute(model, pairs, "attn" if by_pos else "attn_layer")


def attribute_mlp_out(model: Model, pairs: PromptPairs, by_pos: bool = True) -> PatchResult:
    """[layer, pos] (``by_pos``) or [layer]."""
    return attribute(model, pairs, "mlp" if by_pos else "mlp_layer")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (average ranks for ties); NaN if either side is constant or too short."""
    if a.size < 2:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def agreement(exact: PatchResult, approx: PatchResult) -> dict[str, float]:
    """How well attribution reproduces exact patching, over all components.

    ``spearman``: rank correlation of the effects (``raw - corrupt``; the normalisation is one
    shared scale, so it does not change ranks; components that cannot matter, e.g. positions before
    z, are exactly 0 in both and, as ties, raise it); ``max_abs_err``: largest |difference| of the raw
    patched metric, in logits; ``max_abs_err_normalised``: the same on the normalised scale (NaN
    when the normalisation is undefined).
    """
    if exact.raw.shape != approx.raw.shape:
        raise ValueError(f"shapes differ: {tuple(exact.raw.shape)} vs {tuple(approx.raw.shape)}")
    e = exact.effect.detach().double().cpu().numpy().ravel()
    a = approx.effect.detach().double().cpu().numpy().ravel()
    raw_err = (exact.raw.double() - approx.raw.double()).abs().max().item() if e.size else 0.0
    norm_err = (exact.normalised.double() - approx.normalised.double()).abs()
    norm = norm_err.max().item() if norm_err.numel() and not norm_err.isnan().any() else math.nan
    return {"spearman": _spearman(e, a), "max_abs_err": raw_err, "max_abs_err_normalised": norm}
