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
* ``clamp_heads=("0.0",)``, ``clamp_rule``, ``clamp_strength=a``, ``clamp_from=S1``,
  ``clamp_until=S2``: those heads' attention pattern P becomes ``(1 - a) P + a T`` at the steps
  S1 .. S2 - 1, where T is the task's named attention rule (:meth:`Task.attention_rules`: the cue;
  for induction also the previous token), uniform over the rule's keys at each of its queries; the
  other queries keep P. At a = 1 the scores get no gradient. Where the rule's keys differ between
  sequences (induction's token after the earlier occurrence), T is each sequence's own, read from
  the tokens of the forward. At a = 0 nothing is applied: the run is the unclamped one, bit for bit.
* ``mean_value_heads`` and ``frozen_qk_heads``, from step ``ablate_from``: pattern-preserving
  ablations. The first replaces a head's values by their mean over the forward's batch and
  positions (its pattern still forms; what it carries is gone); the second keeps its W_Q, b_Q, W_K,
  b_K at their values of that step (where it looks is fixed; what it carries trains).

A transplant mixes two residual bases. ``routing`` puts the trained embeddings and layer 0 under
a random readout, which reads no basis yet; ``readout`` puts trained later layers, which read the
donor's basis, on top of random embeddings that write another one. The step-0 evaluation of each
run (logged like any other) says how far each mix starts from the donor's loss.

The training step applies them in both forwards: as masks inside
:func:`plateauscope.model.fused.fused_logits`, and as permanent TransformerLens hooks on the hooked forward
and on every evaluation (:meth:`Interventions.applied`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from plateauscope.errors import ConfigError
from plateauscope.model.backend import backend_of, hooked_parameters
from plateauscope.model.config import TrainConfig, transplant_part
from plateauscope.model.fused import by_layer, mean_values
from plateauscope.runs.files import load_checkpoint
from plateauscope.tasks.base import AttentionRule, Task

PARTS: dict[str, str] = {
    "routing": "the embeddings (token and position) and layer 0",
    "readout": "layers 1 and above, the final norm and the unembedding",
    "embeddings": "the token and position embeddings",
    "layerL": "block L: its norms, attention and MLP",
    "L.H:qk": "head H of layer L's W_Q, b_Q, W_K and b_K: where it looks",
    "L.H:ov": "head H of layer L's W_V, b_V and W_O: what it carries",
}
"""What each transplant copies from the donor (``plateauscope.model.config.transplant_part`` reads them)."""
HEAD_WEIGHTS: dict[str, tuple[str, ...]] = {"qk": ("W_Q", "b_Q", "W_K", "b_K"), "ov": ("W_V", "b_V", "W_O")}
"""The weights a head's QK and OV parts hold (each indexed by the head in its first dimension); ``frozen_qk_heads``
keeps the first."""

INTERVENTION_OPTIONS: tuple[str, ...] = ("hide_cue_at", "hide_cue_until", "transplant", "donor",
                                         "freeze_transplant", "masked_heads", "only_head", "clamp_heads",
                                         "clamp_rule", "clamp_strength", "clamp_from", "clamp_until",
                                         "mean_value_heads", "frozen_qk_heads", "ablate_from", "clamp_head_of",
                                         "clamp_layer")
"""Sweep point options that change a run's interventions (``plateauscope.sweeps.spec``: ``hide_cue_at``,
``only_head``, ``clamp_head_of`` and ``clamp_layer`` are resolved there); the rest of a point's options
name its baseline run."""


def in_part(key: str, part: str) -> bool:
    """Whether the HookedTransformer weight ``key`` belongs to ``part`` (:data:`PARTS`; for a head's QK or
    OV: holds its slice)."""
    kind, layer, head = transplant_part(part)
    if kind in ("routing", "readout"):
        routing = key.startswith(("embed.", "pos_embed.", "blocks.0."))
        return routing if kind == "routing" else not routing
    if kind == "embeddings":
        return key.startswith(("embed.", "pos_embed."))
    if kind == "layer":
        return key.startswith(f"blocks.{layer}.")
    return key in {f"blocks.{layer}.attn.{w}" for w in HEAD_WEIGHTS[kind]}


def transplanted(weights: dict[str, Tensor], donor: dict[str, Tensor], part: str) -> dict[str, Tensor]:
    """``weights`` with ``part`` taken from ``donor`` (both in HookedTransformer's layout): whole keys, or
    for a head's QK or OV its slice of them."""
    kind, _, head = transplant_part(part)
    out = {}
    for key, value in weights.items():
        if not in_part(key, part):
            out[key] = value
        elif head is None:
            out[key] = donor[key].clone()
        else:
            out[key] = value.clone()
            out[key][head] = donor[key][head]
    return out


def check_part(part: str, n_layers: int, n_heads: int) -> None:
    """A one-line ConfigError when ``part`` names a layer or head the model does not have."""
    _, layer, head = transplant_part(part)
    if (layer is not None and layer >= n_layers) or (head is not None and head >= n_heads):
        raise ConfigError(f"transplant part {part}: the model has {n_layers} layer(s) of {n_heads} heads")


def has_interventions(tc: TrainConfig) -> bool:
    """Whether a run trains with any intervention."""
    return (tc.hide_cue_until is not None or bool(tc.masked_heads) or tc.transplant is not None
            or bool(tc.clamp_heads) or bool(tc.mean_value_heads) or bool(tc.frozen_qk_heads))


def parse_head(name: str, n_layers: int, n_heads: int, what: str = "masked head") -> tuple[int, int]:
    """``"L.H"`` as (layer, head), or a one-line ConfigError when the model has no such head."""
    layer, dot, head = str(name).partition(".")
    if not dot or not layer.isdigit() or not head.isdigit():
        raise ConfigError(f"{what} {name!r}: write heads as L.H, e.g. 0.1")
    if int(layer) >= n_layers or int(head) >= n_heads:
        raise ConfigError(f"{what} {name} does not exist: the model has {n_layers} layer(s) of "
                          f"{n_heads} heads (L < {n_layers}, H < {n_heads})")
    return int(layer), int(head)


def parse_heads(names: tuple[str, ...], n_layers: int, n_heads: int, what: str) -> tuple[tuple[int, int], ...]:
    """Every ``"L.H"`` of ``names`` (:func:`parse_head`), each at most once."""
    heads = tuple(parse_head(h, n_layers, n_heads, what) for h in names)
    if len(set(heads)) != len(heads):
        raise ConfigError(f"{what}s {', '.join(names)} name a head twice")
    return heads


def rule_targets(rule: AttentionRule, tokens: Int[Tensor, "batch pos"], n_pos: int
                 ) -> tuple[Float[Tensor, "batch query key"], Bool[Tensor, "batch query"]]:
    """An attention rule's target pattern for each sequence over its first ``n_pos`` positions: uniform
    over the rule's keys in each of its query rows that has keys; and which rows those are."""
    target = torch.zeros(len(tokens), n_pos, n_pos)
    rows = torch.zeros(len(tokens), n_pos, dtype=torch.bool)
    for query in (q for q in rule.queries if q < n_pos):
        keys = rule.keys(tokens, query).cpu()  # [batch, C]; -1 pads a row with fewer keys
        if keys.numel() == 0:
            continue
        valid = keys >= 0
        count = valid.sum(1)
        target[:, query].scatter_add_(1, keys.clamp_min(0), valid.float() / count.clamp_min(1)[:, None])
        rows[:, query] = count > 0
    return target, rows


def clamp_rule(task: Task, rule_name: str) -> AttentionRule:
    """The task's attention rule ``rule_name``; a one-line ConfigError when it has none by that name."""
    rules = task.attention_rules()
    if rule_name not in rules:
        raise ConfigError(f"clamp_rule {rule_name!r}: task {task.describe()} has no such attention rule "
                          f"(its rules: {', '.join(map(repr, rules)) or 'none'})")
    return rules[rule_name]


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


@torch.no_grad()
def top_head(model: Any, task: Task, rule_name: str, n_examples: int = 256) -> str:
    """``"L.H"``: the model's head with the most attention by the task's rule ``rule_name`` (its weight
    on the rule's keys, averaged over the rule's query rows with keys in ``n_examples`` sequences)."""
    tokens = task.tokens[:n_examples, : task.input_len]
    target, rows = rule_targets(clamp_rule(task, rule_name), tokens, task.input_len)
    seen: dict[int, Tensor] = {}
    hooks = [(get_act_name("pattern", layer), lambda p, hook, layer=layer: seen.__setitem__(layer, p))
             for layer in range(model.cfg.n_layers)]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    on_keys = (target > 0).to(seen[0].device)[:, None]  # [batch, 1, query, key]
    scores = torch.stack([(seen[layer] * on_keys).sum(-1)[:, :, rows.any(0)].mean((0, 2)) for layer in sorted(seen)])
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return f"{layer}.{head}"


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
class PatternClamp:
    """Attention patterns clamped towards a target: ``(1 - a) P + a T`` in the target's query rows of
    the clamped heads, P elsewhere (``TrainConfig.clamp_heads``). T is the task's attention rule
    (:func:`rule_targets`): one pattern for every sequence where the rule's keys are the same positions
    in all of them, else each sequence's own, from the tokens of the forward."""

    heads: tuple[tuple[int, int], ...]
    """(layer, head) pairs whose pattern is clamped."""
    rule_name: str
    rule: AttentionRule = field(compare=False)
    strength: float
    """a, in [0, 1]."""
    n_heads: int
    shared: tuple[Tensor, Tensor] | None = field(default=None, compare=False)
    """T and its rows over the model's input positions when every sequence shares them (None: per sequence)."""
    seen: dict = field(default_factory=dict, compare=False)
    """The tokens of the model's forward in progress (``tokens``), for a per-sequence T."""

    @classmethod
    def build(cls, heads: tuple[tuple[int, int], ...], task: Task, rule_name: str, strength: float,
              n_heads: int) -> PatternClamp:
        """The clamp of ``heads`` to the task's rule; T is shared when it is the same in 256 sequences."""
        rule = clamp_rule(task, rule_name)
        target, rows = rule_targets(rule, task.tokens[:256], task.input_len)
        if not rows.any():
            raise ConfigError(f"clamp_rule {rule_name!r}: task {task.describe()} has no keys for it")
        same = bool((target == target[:1]).all() and (rows == rows[:1]).all())
        return cls(heads, rule_name, rule, strength, n_heads, (target[0], rows[0]) if same else None)

    @property
    def layers(self) -> frozenset[int]:
        """The layers with a clamped head."""
        return frozenset(layer for layer, _ in self.heads)

    def watch_tokens(self, model: Any) -> Any:
        """For a per-sequence T: record the tokens of each forward of ``model`` (its ``forward`` wrapped on
        the instance: TransformerLens 4's ``run_with_cache`` calls ``forward``, not the module, so a
        forward pre-hook would miss it); an object whose ``remove()`` unwraps it (None when T is shared).
        A forward from a residual stream (a later layer on) forgets the tokens, so a clamp there fails
        in one line instead of using another batch's."""
        if self.shared is not None:
            return None
        original = model.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            given = args[0] if args else kwargs.get("input")
            if isinstance(given, Tensor) and not given.is_floating_point():
                self.seen["tokens"] = given
            else:
                self.seen.pop("tokens", None)
            return original(*args, **kwargs)

        model.forward = forward
        return SimpleNamespace(remove=lambda: model.__dict__.pop("forward", None))

    def apply(self, pattern: Float[Tensor, "batch head q k"], layer: int, queries: Sequence[int] | None = None,
              tokens: Int[Tensor, "batch k"] | None = None) -> Float[Tensor, "batch head q k"]:
        """``pattern`` of ``layer`` with its clamped heads' rows mixed with T. ``queries``: the positions of its
        query rows (default: the last ``q`` of its ``k`` key positions, as a forward after a key/value cache);
        ``tokens``: the forward's input (default: the recorded one), for a per-sequence T."""
        n_q, n_k = pattern.shape[-2:]
        at = torch.arange(n_k - n_q, n_k) if queries is None else torch.as_tensor(list(queries))
        if self.shared is not None:
            target, rows = self.shared[0][None, at, :n_k], self.shared[1][None, at]
        else:
            tokens = self.seen.get("tokens") if tokens is None else tokens
            if tokens is None or tokens.shape != (pattern.shape[0], n_k):
                raise ConfigError(f"clamp_rule {self.rule_name!r}: its keys depend on the tokens, and this forward's "
                                  "attention is not over the whole sequences it was given (a key/value cache?)")
            target, rows = rule_targets(self.rule, tokens, n_k)
            target, rows = target[:, at], rows[:, at]
        heads = torch.zeros(self.n_heads, dtype=torch.bool)
        heads[[h for l, h in self.heads if l == layer]] = True
        clamped = (heads[None, :, None, None] & rows[:, None, :, None]).to(pattern.device)  # [batch, head, q, 1]
        a = self.strength
        return torch.where(clamped, (1 - a) * pattern + a * target[:, None].to(pattern), pattern)


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
    clamp: PatternClamp | None = None
    """The pattern clamp (None: no head is clamped, or a = 0)."""
    clamp_steps: tuple[int, int | None] = (0, None)
    """S1 and S2: the clamp acts at S1 <= step < S2 (S2 None: to the end)."""
    mean_value_heads: tuple[tuple[int, int], ...] = ()
    """(layer, head) pairs whose values are replaced by their mean from ``ablate_from``."""
    frozen_qk_heads: tuple[tuple[int, int], ...] = ()
    """(layer, head) pairs whose query-key weights stay at their values of ``ablate_from``."""
    ablate_from: int = 0
    """The first step of the pattern-preserving ablations."""
    held: dict = field(default_factory=dict, compare=False)
    """The frozen query-key weights, read at the first step they are held (a resumed run reads them
    from its checkpoint, where they were held)."""

    @classmethod
    def build(cls, tc: TrainConfig, task: Task, n_layers: int, n_heads: int) -> Interventions:
        """Resolve ``tc``'s interventions; impossible requests are one-line ConfigErrors."""
        heads = parse_heads(tc.masked_heads, n_layers, n_heads, "masked head")
        if tc.transplant is not None:
            check_part(tc.transplant, n_layers, n_heads)
        keys = fixed_cue_positions(task) if tc.hide_cue_until is not None else ()
        clamp = None
        if tc.clamp_heads:
            clamped = parse_heads(tc.clamp_heads, n_layers, n_heads, "clamped head")
            clamp = PatternClamp.build(clamped, task, tc.clamp_rule, tc.clamp_strength, n_heads)
            # a = 0 changes nothing: no clamp at all, so the run is the unclamped one bit for bit
            clamp = clamp if tc.clamp_strength > 0 else None
        return cls(keys, tc.hide_cue_until, heads, n_layers, clamp, (tc.clamp_from, tc.clamp_until),
                   parse_heads(tc.mean_value_heads, n_layers, n_heads, "mean-value head"),
                   parse_heads(tc.frozen_qk_heads, n_layers, n_heads, "frozen-QK head"), tc.ablate_from)

    def cue_hidden(self, step: int) -> bool:
        """Whether attention to the cue is masked at ``step``."""
        return self.hide_until is not None and step < self.hide_until

    def clamp_at(self, step: int) -> PatternClamp | None:
        """The clamp acting at ``step`` (None: none)."""
        start, stop = self.clamp_steps
        return self.clamp if start <= step and (stop is None or step < stop) else None

    def ablating(self, step: int) -> bool:
        """Whether the pattern-preserving ablations act at ``step``."""
        return step >= self.ablate_from

    def fused_options(self, step: int) -> dict[str, Any]:
        """The keyword arguments of :func:`plateauscope.model.fused.fused_logits` at ``step``."""
        return {"hidden_keys": self.hidden_keys if self.cue_hidden(step) else (), "zeroed_heads": self.zeroed_heads,
                "clamp": self.clamp_at(step),
                "mean_value_heads": self.mean_value_heads if self.ablating(step) else ()}

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
        clamp = self.clamp_at(step)
        for layer in sorted(clamp.layers) if clamp else ():
            def clamped(pattern: Float[Tensor, "batch head q k"], hook: Any, layer: int = layer) -> Tensor:
                return clamp.apply(pattern, layer)

            hooks.append((get_act_name("pattern", layer), clamped))
        for layer, heads in by_layer(self.mean_value_heads if self.ablating(step) else ()).items():
            def averaged(v: Float[Tensor, "batch pos head d_head"], hook: Any, heads: list[int] = heads) -> Tensor:
                return mean_values(v, heads, head_dim=-2, mean_dims=(0, 1))

            hooks.append((get_act_name("v", layer), averaged))
        for layer, heads in by_layer(self.zeroed_heads).items():
            def zero(z: Float[Tensor, "batch pos head d_head"], hook: Any, heads: list[int] = heads) -> Tensor:
                keep = torch.ones(z.shape[-2], 1, dtype=z.dtype, device=z.device)
                keep[heads] = 0
                return z * keep

            hooks.append((get_act_name("z", layer), zero))
        return hooks

    @contextmanager
    def holding_frozen_qk(self, model: Any, step: int) -> Iterator[None]:
        """Around an update at ``step``: put the frozen heads' query-key weights back after it (undoing
        the optimiser's step and weight decay on them)."""
        if not self.frozen_qk_heads or not self.ablating(step):
            yield
            return
        params = hooked_parameters(model)
        if not self.held:
            self.held.update({(f"blocks.{layer}.attn.{w}", head): params[f"blocks.{layer}.attn.{w}"][head].detach().clone()
                              for layer, head in self.frozen_qk_heads for w in HEAD_WEIGHTS["qk"]})
        try:
            yield
        finally:
            with torch.no_grad():
                for (name, head), value in self.held.items():
                    params[name][head].copy_(value)

    def attach(self, model: Any, step: int, hooks: list[tuple[str, Any]] | None = None) -> Any:
        """Add the interventions of ``step`` (or the given ``hooks``) to ``model`` as permanent hooks,
        for good; return the handle of the clamp's token recorder (None without one)."""
        for name, fn in self.hooks(step, backend_of(model) == "bridge") if hooks is None else hooks:
            model.mod_dict[name].add_hook(fn, is_permanent=True)
        clamp = self.clamp_at(step)
        return clamp.watch_tokens(model) if clamp is not None else None

    @contextmanager
    def applied(self, model: Any, step: int) -> Iterator[None]:
        """The interventions of ``step`` as permanent hooks on ``model`` for the passes inside (they
        survive ``run_with_hooks`` and ``hooks_added``, which remove only temporary hooks), and the
        frozen query-key weights held through an update inside."""
        hooks = self.hooks(step, backend_of(model) == "bridge")
        recorder = self.attach(model, step, hooks)
        try:
            with self.holding_frozen_qk(model, step):
                yield
        finally:
            for name, _ in hooks:
                model.mod_dict[name].remove_hooks("fwd", including_permanent=True)
            if recorder is not None:
                recorder.remove()
