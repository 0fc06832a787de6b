"""What activation patching patches and what it returns: component sets, results, labels.

Shared by exact patching (:mod:`plateauscope.analysis.patch`) and its first-order approximation
(:mod:`plateauscope.analysis.attribution`), so that neither imports the other's internals. A component set is a
:class:`PatchSpec`: a hook (``transformer_lens.utilities.get_act_name``) and one boolean mask per
patch over ``[layer, *site]`` saying which activation entries come from the clean run; a
:class:`PatchResult` holds the patched metric per component, raw and normalised:
``(patched - corrupt) / (clean - corrupt)`` (1 = restores the clean answer, 0 = no effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from plateauscope.analysis.results import strict_json
from plateauscope.model.backend import Model
from plateauscope.model.heads import head_label

NORMALISE_EPS = 1e-6
"""Below this |clean - corrupt| gap the normalised effects are NaN."""
GAP_FLOOR = 0.1
"""Logits: a clean - corrupt gap below this (or negative) is too small to report shares of. Tables then
show raw effects, and captions give no percentage of it."""

TARGETS: tuple[str, ...] = ("heads", "heads_by_pos", "resid", "attn", "mlp", "attn_layer", "mlp_layer")
"""Component sets: head outputs over all positions [layer, head] or by position [layer, pos, head];
resid_pre [layer, pos]; attn_out / mlp_out by position [layer, pos] or per layer [layer]."""

HOOK = {"heads": "z", "heads_by_pos": "z", "resid": "resid_pre", "attn": "attn_out", "mlp": "mlp_out",
        "attn_layer": "attn_out", "mlp_layer": "mlp_out"}
"""Short hook name (``get_act_name``) of each component set."""


@dataclass(frozen=True)
class PatchSpec:
    """A set of patches: which hook, and for each patch which entries come from the clean run."""

    target: str
    act_name: str
    """Short hook name for ``get_act_name`` ("z", "resid_pre", "attn_out", "mlp_out")."""
    axes: tuple[str, ...]
    """Names of the result's axes, e.g. ("layer", "head")."""
    shape: tuple[int, ...]
    """The result's shape; ``prod(shape) == P``."""
    masks: Bool[Tensor, "P layer ..."]
    """``masks[p, l, *site]``: patch p takes the clean activation at layer l, site ``*site``
    (site = ``pos`` or ``pos head``, the activation's axes between batch and features)."""


@dataclass
class PatchResult:
    """Patched metric per component, raw and normalised, with the unpatched baselines."""

    target: str
    axes: tuple[str, ...]
    raw: Float[Tensor, "*shape"]
    """The metric (mean logit difference) of the patched corrupted run."""
    normalised: Float[Tensor, "*shape"]
    """``(raw - corrupt_metric) / (clean_metric - corrupt_metric)``; NaN when the gap < 1e-6."""
    clean_metric: float
    corrupt_metric: float
    method: str = "exact"
    n_pairs: int = 0

    @property
    def effect(self) -> Float[Tensor, "*shape"]:
        """``raw - corrupt_metric``: the change the patch makes, in logits."""
        return self.raw - self.corrupt_metric

    @property
    def normalisable(self) -> bool:
        """Whether the clean-corrupt gap is large enough for normalised effects."""
        return abs(self.clean_metric - self.corrupt_metric) >= NORMALISE_EPS

    @property
    def gap_problem(self) -> str | None:
        """Why the gap cannot carry shares (negative, or below :data:`GAP_FLOOR`), or None."""
        return gap_problem(self.clean_metric - self.corrupt_metric)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (NaN as None): what the analysis cache stores."""
        return {
            "target": self.target,
            "method": self.method,
            "axes": list(self.axes),
            "shape": list(self.raw.shape),
            "n_pairs": self.n_pairs,
            "clean_metric": self.clean_metric,
            "corrupt_metric": self.corrupt_metric,
            "raw": strict_json(self.raw.detach().cpu().double().tolist()),
            "normalised": strict_json(self.normalised.detach().cpu().double().tolist()),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PatchResult:
        """The inverse of :meth:`to_dict` (``None`` back to NaN)."""
        def tensor(values: Any) -> Tensor:
            return torch.tensor(_nan_for_none(values), dtype=torch.float32).reshape(d["shape"])
        return cls(d["target"], tuple(d["axes"]), tensor(d["raw"]), tensor(d["normalised"]), d["clean_metric"],
                   d["corrupt_metric"], d.get("method", "exact"), d.get("n_pairs", 0))


def gap_problem(gap: float) -> str | None:
    """Why a clean - corrupt gap (in logits) cannot carry shares of it, or None when it can: the
    corrupted prompts favour the clean answer more than the clean ones do (negative), or the model
    barely tells them apart (below :data:`GAP_FLOOR`)."""
    if gap < 0:
        return (f"the clean - corrupt gap is negative ({gap:+.2f} logits): the corrupted prompts favour the "
                "clean answer more than the clean ones do")
    if gap < GAP_FLOOR:
        return f"the clean - corrupt gap is {gap:.3f} logits, below the {GAP_FLOOR:g} floor: the model barely tells them apart"
    return None

def _nan_for_none(values: Any) -> Any:
    if isinstance(values, list):
        return [_nan_for_none(v) for v in values]
    return float("nan") if values is None else values


def normalise(raw: Float[Tensor, "*shape"], clean: float, corrupt: float) -> Float[Tensor, "*shape"]:
    """``(raw - corrupt) / (clean - corrupt)``; all NaN when ``|clean - corrupt| < 1e-6``."""
    gap = clean - corrupt
    if abs(gap) < NORMALISE_EPS:
        return torch.full_like(raw, float("nan"))
    return (raw - corrupt) / gap


def patch_spec(model: Model, target: str, n_pos: int) -> PatchSpec:
    """The masks of one component set for ``model`` on prompts of ``n_pos`` positions."""
    if target not in HOOK:
        raise ValueError(f"unknown patch target {target!r}; choose one of {', '.join(TARGETS)}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layer = torch.arange(L)
    if target == "heads":  # [layer, head]: head h of layer l at every position
        m = torch.zeros(L, H, L, n_pos, H, dtype=torch.bool)
        h = torch.arange(H)
        m[layer[:, None], h[None, :], layer[:, None], :, h[None, :]] = True
        axes, shape = ("layer", "head"), (L, H)
    elif target == "heads_by_pos":  # [layer, pos, head]
        m = torch.zeros(L, n_pos, H, L, n_pos, H, dtype=torch.bool)
        lx, px, hx = torch.meshgrid(layer, torch.arange(n_pos), torch.arange(H), indexing="ij")
        m[lx, px, hx, lx, px, hx] = True
        axes, shape = ("layer", "pos", "head"), (L, n_pos, H)
    elif target.endswith("_layer"):  # [layer]: the whole attn_out / mlp_out of a layer
        m = torch.zeros(L, L, n_pos, dtype=torch.bool)
        m[layer, layer] = True
        axes, shape = ("layer",), (L,)
    else:  # resid / attn / mlp: [layer, pos]
        m = torch.zeros(L, n_pos, L, n_pos, dtype=torch.bool)
        lx, px = torch.meshgrid(layer, torch.arange(n_pos), indexing="ij")
        m[lx, px, lx, px] = True
        axes, shape = ("layer", "pos"), (L, n_pos)
    masks = m.reshape(math.prod(shape), *m.shape[len(shape):])
    return PatchSpec(target, HOOK[target], axes, shape, masks)


def component_label(target: str, index: tuple[int, ...], pos_names: list[str]) -> str:
    """E.g. ``L0H3``, ``L0H3@z1``, ``resid_pre L1@SEP``, ``mlp_out L2``."""
    if target == "heads":
        return head_label(index[0], index[1])
    if target == "heads_by_pos":
        return f"{head_label(index[0], index[2])}@{pos_names[index[1]]}"
    hook = HOOK[target]
    if target.endswith("_layer"):
        return f"{hook} L{index[0]}"
    return f"{hook} L{index[0]}@{pos_names[index[1]]}"
