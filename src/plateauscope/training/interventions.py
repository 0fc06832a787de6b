"""Interventions during training: hide the cue until a step, zero heads, start from half a trained model.

What does a plateau wait for: the routing that reads the cue, or the readout behind it? A run
can change what it is allowed to learn, and its metrics then answer causally (Singh et al. 2024
clamped parts of a model the same way to ask what an induction head needs). Each intervention
is a ``TrainConfig`` field, recorded in ``config.json`` like any option:

* ``hide_cue_until=S``: attention to the task's cue (the selector z) is masked in every head of
  every layer for the steps before S, then released. Evaluations before S see the same mask, so
  the logged losses are those of the model being trained.
* ``masked_heads=("0.1", ...)``: those heads' outputs (``hook_z``) are zeroed from step 0, in
  training and in evaluation, so the remaining heads are the only routes.
* ``transplant="routing" | "readout"`` with ``donor=CHECKPOINT``: the run starts from its own
  step-0 weights with one part copied from the donor (:data:`PARTS`); ``freeze_transplant`` keeps
  that part fixed.

A transplant mixes two residual bases. ``routing`` puts the trained embeddings and layer 0 under
a random readout, which reads no basis yet; ``readout`` puts trained later layers, which read the
donor's basis, on top of random embeddings that write another one. The step-0 evaluation of each
run (logged like any other) says how far each mix starts from the donor's loss.

The training step applies them in both forwards: as masks inside
:func:`plateauscope.training.fused.fused_logits`, and as permanent TransformerLens hooks on the hooked forward
and on every evaluation (:meth:`Interventions.applied`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.utilities import get_act_name

from plateauscope.backend import backend_of
from plateauscope.tasks.base import Task
from plateauscope.training.config import ConfigError, TrainConfig
from plateauscope.training.files import load_checkpoint

PARTS: dict[str, str] = {
    "routing": "the embeddings (token and position) and layer 0",
    "readout": "layers 1 and above, the final norm and the unembedding",
}
"""What each transplant copies from the donor."""

INTERVENTION_OPTIONS: tuple[str, ...] = ("hide_cue_at", "hide_cue_until", "transplant", "donor",
                                         "freeze_transplant", "masked_heads", "only_head")
"""Sweep point options that change a run's interventions (``plateauscope.sweeps.sweep``: ``hide_cue_at`` and
``only_head`` are resolved there); the rest of a point's options name its baseline run."""


def in_part(key: str, part: str) -> bool:
    """Whether the HookedTransformer weight ``key`` belongs to ``part`` (``routing`` or ``readout``)."""
    routing = key.startswith(("embed.", "pos_embed.", "blocks.0."))
    return routing if part == "routing" else not routing


def transplanted(weights: dict[str, Tensor], donor: dict[str, Tensor], part: str) -> dict[str, Tensor]:
    """``weights`` with the keys of ``part`` taken from ``donor`` (both in HookedTransformer's layout)."""
    return {k: (donor[k].clone() if in_part(k, part) else v) for k, v in weights.items()}


def has_interventions(tc: TrainConfig) -> bool:
    """Whether a run trains with any intervention."""
    return tc.hide_cue_until is not None or bool(tc.masked_heads) or tc.transplant is not None


def parse_head(name: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``"L.H"`` as (layer, head), or a one-line ConfigError when the model has no such head."""
    layer, dot, head = str(name).partition(".")
    if not dot or not layer.isdigit() or not head.isdigit():
        raise ConfigError(f"masked head {name!r}: write heads as L.H, e.g. 0.1")
    if int(layer) >= n_layers or int(head) >= n_heads:
        raise ConfigError(f"masked head {name} does not exist: the model has {n_layers} layer(s) of "
                          f"{n_heads} heads (L < {n_layers}, H < {n_heads})")
    return int(layer), int(head)


def fixed_cue_positions(task: Task, sample: int = 256) -> tuple[int, ...]:
    """The key positions of the task's cue, the same in every sequence (the selector z), read from
    :meth:`Task.cue_positions` at every loss position; else a one-line ConfigError."""
    if "cue" not in task.capabilities:
        raise ConfigError(f"hide_cue_until: task {task.describe()} has no cue to hide")
    tokens = task.tokens[:sample]
    found: set[int] = set()
    for query in task.loss_positions:
        pos = task.cue_positions(tokens, query)
        if pos.numel() and not (pos == pos[:1]).all():
            raise ConfigError(f"hide_cue_until: the cue of task {task.describe()} sits at different positions in "
                              "different sequences; hiding it needs positions that every sequence shares")
        found |= set(pos[0].tolist()) if pos.numel() else set()
    if not found or 0 in found:
        raise ConfigError(f"hide_cue_until: task {task.describe()} has no cue positions after the first token")
    return tuple(sorted(found))


def load_donor(tc: TrainConfig, own: dict[str, Tensor]) -> dict[str, Tensor]:
    """The donor checkpoint's weights, checked against the run's own (same keys and shapes) in one line."""
    path = Path(tc.donor)
    donor, _ = load_checkpoint(path)
    for key, value in own.items():
        if in_part(key, tc.transplant):
            if key not in donor:
                raise ConfigError(f"{path}: the donor has no {key}: a checkpoint of another model")
            if donor[key].shape != value.shape:
                raise ConfigError(f"{path}: a checkpoint of another shape ({key} is {tuple(value.shape)} in this "
                                  f"model, {tuple(donor[key].shape)} in the donor)")
    return donor


@dataclass(frozen=True)
class Interventions:
    """A run's interventions, resolved against its task and model."""

    hidden_keys: tuple[int, ...] = ()
    """Key positions masked while the cue is hidden (the cue's positions)."""
    hide_until: int | None = None
    """The first step at which the cue is seen (None: never hidden)."""
    zeroed_heads: tuple[tuple[int, int], ...] = ()
    """(layer, head) pairs whose outputs are zeroed at every step."""
    n_layers: int = 0
    """Layers of the model: every layer's attention hides the cue."""

    @classmethod
    def build(cls, tc: TrainConfig, task: Task, n_layers: int, n_heads: int) -> Interventions:
        """Resolve ``tc``'s interventions; impossible requests are one-line ConfigErrors."""
        heads = tuple(parse_head(h, n_layers, n_heads) for h in tc.masked_heads)
        if len(set(heads)) != len(heads):
            raise ConfigError(f"masked_heads {', '.join(tc.masked_heads)} names a head twice")
        keys = fixed_cue_positions(task) if tc.hide_cue_until is not None else ()
        return cls(keys, tc.hide_cue_until, heads, n_layers)

    def cue_hidden(self, step: int) -> bool:
        """Whether attention to the cue is masked at ``step``."""
        return self.hide_until is not None and step < self.hide_until

    def fused_options(self, step: int) -> dict[str, Any]:
        """The keyword arguments of :func:`plateauscope.training.fused.fused_logits` at ``step``."""
        return {"hidden_keys": self.hidden_keys if self.cue_hidden(step) else (), "zeroed_heads": self.zeroed_heads}

    def hooks(self, step: int, on_pattern: bool = False) -> list[tuple[str, Any]]:
        """Forward hooks that apply the interventions of ``step`` to a model. The cue is hidden in the
        attention scores (``-inf`` before the softmax), or, ``on_pattern``, in the pattern (its
        weights on the cue zeroed, the rest renormalised: the same function): TransformerLens 4's
        bridge discards an edit of its scores but applies one of its pattern."""
        hooks = []
        if self.cue_hidden(step):
            hidden = torch.tensor(self.hidden_keys)

            def hidden_mask(n_keys: int, device: torch.device) -> Tensor:
                mask = torch.zeros(n_keys, dtype=torch.bool, device=device)
                mask[hidden[hidden < n_keys].to(device)] = True
                return mask

            def hide(scores: Float[Tensor, "batch head q k"], hook: Any) -> Tensor:
                return scores.masked_fill(hidden_mask(scores.shape[-1], scores.device), float("-inf"))

            def hide_in_pattern(pattern: Float[Tensor, "batch head q k"], hook: Any) -> Tensor:
                kept = pattern.masked_fill(hidden_mask(pattern.shape[-1], pattern.device), 0.0)
                return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)

            hooks += [(get_act_name("pattern", layer), hide_in_pattern) if on_pattern else
                      (get_act_name("attn_scores", layer), hide) for layer in range(self.n_layers)]
        by_layer: dict[int, list[int]] = {}
        for layer, head in self.zeroed_heads:
            by_layer.setdefault(layer, []).append(head)
        for layer, heads in by_layer.items():
            def zero(z: Float[Tensor, "batch pos head d_head"], hook: Any, heads: list[int] = heads) -> Tensor:
                keep = torch.ones(z.shape[-2], 1, dtype=z.dtype, device=z.device)
                keep[heads] = 0
                return z * keep

            hooks.append((get_act_name("z", layer), zero))
        return hooks

    def attach(self, model: Any, step: int, hooks: list[tuple[str, Any]] | None = None) -> Any:
        """Add the interventions of ``step`` (or the given ``hooks``) to ``model`` as permanent hooks,
        for good; return it."""
        for name, fn in self.hooks(step, backend_of(model) == "bridge") if hooks is None else hooks:
            model.mod_dict[name].add_hook(fn, is_permanent=True)
        return model

    @contextmanager
    def applied(self, model: Any, step: int) -> Iterator[None]:
        """The interventions of ``step`` as permanent hooks on ``model`` for the passes inside (they
        survive ``run_with_hooks`` and ``hooks_added``, which remove only temporary hooks)."""
        hooks = self.hooks(step, backend_of(model) == "bridge")
        self.attach(model, step, hooks)
        try:
            yield
        finally:
            for name, _ in hooks:
                model.mod_dict[name].remove_hooks("fwd", including_permanent=True)
