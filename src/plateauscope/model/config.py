"""The ground floor's configs: the base of every config dataclass (a round trip through plain JSON), the
model's architecture and the training loop's options.

Every field has a docstring; every config round-trips through ``to_dict``/``from_dict`` (plain JSON types
only), which is how a run directory's ``config.json`` is written and read. Nothing here knows a task: the
task's own config is the task's (``plateauscope.tasks``), and the config of a whole run, which names its
task, is :class:`plateauscope.runs.config.RunConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from plateauscope.errors import ConfigError

FORWARDS: tuple[str, ...] = ("fused", "trimmed", "hooked")
CHECKPOINT_POLICIES: tuple[str, ...] = ("dense", "adaptive")
TRANSPLANTS: tuple[str, ...] = ("routing", "readout")
"""The transplants of the intervention sweep; :func:`transplant_part` reads every part a transplant can copy."""
PART_FORMS = "routing, readout, embeddings, layerL, L.H:qk or L.H:ov"


def transplant_part(name: str) -> tuple[str, int | None, int | None]:
    """A transplant's part: ``routing`` (the embeddings and layer 0), ``readout`` (layers 1 and above, the
    final norm and the unembedding), ``embeddings``, ``layerL`` (block L), ``L.H:qk`` (head H's W_Q, b_Q,
    W_K, b_K) or ``L.H:ov`` (its W_V, b_V, W_O), as (kind, layer, head); else a one-line ConfigError."""
    if name in (*TRANSPLANTS, "embeddings"):
        return name, None, None
    if name.startswith("layer") and name[5:].isdigit():
        return "layer", int(name[5:]), None
    head, colon, kind = name.partition(":")
    layer, dot, index = head.partition(".")
    if colon and dot and kind in ("qk", "ov") and layer.isdigit() and index.isdigit():
        return kind, int(layer), int(index)
    raise ConfigError(f"transplant part {name!r}: give one of {PART_FORMS}")


T = TypeVar("T", bound="JsonConfig")


class JsonConfig:
    """Base of every config dataclass: a round trip through plain JSON types (``config.json``).
    A task of your own can build its ``Config`` on it."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
        # JSON has no tuples: every sequence-valued field of these configs is a tuple.
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def validate(self) -> None:
        """Raise a one-line ``ConfigError`` for a config that cannot work; a task of your own overrides
        it (this default accepts everything). Called before training starts."""


@dataclass(frozen=True)
class ModelConfig(JsonConfig):
    """A decoder-only HookedTransformer; mapped onto HookedTransformerConfig by :func:`hooked_config_dict`."""

    n_layers: int = 4
    """Transformer blocks."""
    d_model: int = 128
    """Residual stream width."""
    n_heads: int = 4
    """Attention heads per layer."""
    d_head: int = 32
    """Width of each head."""
    d_mlp: int = 512
    """Hidden width of each MLP."""
    act_fn: str = "gelu"
    """MLP nonlinearity (a TransformerLens name)."""
    normalization_type: str | None = "LN"
    """``LN``, ``LNPre`` or ``None``."""
    positional_embedding_type: str = "standard"
    """Learned absolute positions (``standard``) or ``rotary``."""
    seed: int = 0
    """Seed of the weight initialisation."""
    attn_only: bool = False
    """Attention blocks only, no MLPs (TransformerLens's ``attn_only``; ``d_mlp`` is then unused)."""

    def validate(self) -> None:
        """Raise a one-line ConfigError for a model that cannot be built."""
        for name in ("n_layers", "d_model", "n_heads", "d_head"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.attn_only and self.d_mlp < 1:
            raise ConfigError(f"d_mlp must be at least 1 (or attn_only=true), got {self.d_mlp}")
        if self.normalization_type not in ("LN", "LNPre", None):
            raise ConfigError(f"normalization_type must be LN, LNPre or none, got {self.normalization_type!r}")
        if self.positional_embedding_type not in ("standard", "rotary"):
            raise ConfigError(f"positional_embedding_type must be standard or rotary, "
                              f"got {self.positional_embedding_type!r}")


@dataclass(frozen=True)
class TrainConfig(JsonConfig):
    """The optimiser, the schedule and what is written during training."""

    seed: int = 0
    """Seed of minibatch order and of the evaluation subsets."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    batch_size: int = 128
    """Examples per step; minibatches are drawn by shuffling the data set each epoch."""
    full_batch: bool = False
    """Every step's batch is the whole training split (the task's ``train_indices``, else the data set),
    in its own order; ``batch_size`` is then unused."""
    max_steps: int = 6000
    """Steps to train at most."""
    warmup_steps: int = 0
    """Linear learning-rate warmup (0: none)."""
    grad_clip: float | None = None
    """Clip the global gradient norm to this value (None: no clipping)."""
    eval_every: int = 100
    """Evaluate every this many steps (plus the log-spaced early steps). One evaluation of the
    default sets costs about 8 training steps of the paper model: 100 keeps it near 10%."""
    ckpt_every: int = 10
    """Write a checkpoint every this many steps (plus the log-spaced early steps)."""
    checkpoints: str = "dense"
    """Which checkpoints the run keeps (``plateauscope.training.checkpoint_policy``). ``dense``: every
    ``ckpt_every`` steps. ``adaptive``: every ``ckpt_every`` steps only in the transition window (the
    plateau's middle to 1.3 tau), and elsewhere every ``coarse_every`` steps; the kept files are
    byte-identical to a dense run's, and no step is trained twice."""
    coarse_every: int = 100
    """``checkpoints=adaptive``: the spacing of the checkpoints kept outside the window (a multiple of
    ``ckpt_every``)."""
    resume_every: int = 100
    """Write the state a killed run resumes from (optimiser, data order, RNG states) at the first
    checkpoint at or after every multiple of this many steps, and at the last: a resumed run trains
    again, bit for bit, the steps since then. Writing it at every checkpoint made a ``ci`` run 1.12x
    slower at 1 thread (``bench/train_step.py --only-resume``)."""
    early_log_points: int = 12
    """Extra log-spaced checkpoint and evaluation steps between 1 and the first interval."""
    eval_groups: int = 16
    """Groups whose K x K candidate scores give candidate loss, set loss and delta_z."""
    tracked_groups: int = 100
    """Examples whose per-example exact-match accuracy is logged (``group_acc``); 0: none."""
    tracked_every: int | None = None
    """Log the tracked groups only at the steps that are multiples of this (None: at every
    evaluation). Their exact match is half of an evaluation of the paper model, and before the
    plateau ends no group is matched; the records in between have no ``group_acc``."""
    eval_batch_size: int = 512
    """Sequences per forward pass during evaluation (speed and memory, not numerics: the logged values
    are the same at 512 and 2048; 512 keeps a pass's keys and values in the CPU cache, 10% faster)."""
    stop_after_tau: float | None = None
    """Stop at step ``stop_after_tau * tau`` once tau is known (None: run to max_steps)."""
    threads: int | None = None
    """torch intra-op threads (None: torch's default)."""
    forward: str = "fused"
    """The training step's forward pass. ``fused``: :func:`plateauscope.model.fused.fused_logits`, the same
    function from the model's own parameters with fused kernels (1.5x faster a step on the paper
    model). ``trimmed``: the fused forward with the last block and the unembedding only at the task's
    loss positions (``fused_logits(positions=...)``; 1.15x faster again on the paper model, 1.37x on
    ``ci``); a task that overrides ``Task.loss`` cannot use it. ``hooked``: the model's own forward,
    every hook point included. Evaluation, checkpoints and every analysis are the same in all three;
    they differ in float rounding only, so their runs diverge as runs on two CPU types do. Runs
    written before this field existed read as ``hooked``."""

    hide_cue_until: int | None = None
    """Intervention: mask attention to the task's cue (the selector z; every head, every layer) at
    the steps before this one, in training and in the evaluations, then release it (None: never)."""
    masked_heads: tuple[str, ...] = ()
    """Intervention: heads ``"L.H"`` whose outputs are zeroed from step 0, in training and in the
    evaluations (``("0.1", "0.2", "0.3")`` leaves head 0.0 as layer 0's only route)."""
    transplant: str | None = None
    """Intervention: a part of the model (:func:`transplant_part`: ``routing``, ``readout``,
    ``embeddings``, ``layerL``, ``L.H:qk``, ``L.H:ov``) copied from ``donor`` into the run's own step-0
    weights."""
    donor: str | None = None
    """The checkpoint (``.safetensors`` of a run of the same shape) that ``transplant`` copies from."""
    freeze_transplant: bool = False
    """Keep the transplanted weights fixed: they get no gradient and no weight decay."""
    clamp_heads: tuple[str, ...] = ()
    """Intervention: heads ``"L.H"`` whose attention pattern is clamped to the task's ``clamp_rule``
    target, ``(1 - a) P + a T`` with ``a = clamp_strength``, at the steps ``clamp_from`` ..
    ``clamp_until - 1``, in training and in the evaluations."""
    clamp_rule: str = "cue"
    """The clamp's target: a named attention rule of the task (``Task.attention_rules``: ``cue``, and for
    induction ``previous token``), uniform over the rule's key positions at each of its query positions."""
    clamp_strength: float = 1.0
    """The clamp's ``a`` in [0, 1]: 1 replaces the pattern by the target, 0 leaves it as it is."""
    clamp_from: int = 0
    """The first step the clamp acts at (S1)."""
    clamp_until: int | None = None
    """The first step it no longer acts at (S2; None: to the end of the run)."""
    mean_value_heads: tuple[str, ...] = ()
    """Pattern-preserving ablation: heads ``"L.H"`` whose values are replaced by their mean over the
    forward's batch and positions from step ``ablate_from``; the pattern still trains and is kept."""
    frozen_qk_heads: tuple[str, ...] = ()
    """Pattern-preserving ablation: heads ``"L.H"`` whose W_Q, b_Q, W_K, b_K stay at their values of step
    ``ablate_from`` (no gradient, no update, no decay), while their OV trains."""
    ablate_from: int = 0
    """The first step of ``mean_value_heads`` and ``frozen_qk_heads``."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The inverse of ``to_dict``; a run written before ``forward`` existed was trained with ``hooked``."""
        return super().from_dict({"forward": "hooked", **d})

    def validate(self) -> None:
        """Raise a one-line ConfigError for values the training loop cannot run with; return self."""
        if self.forward not in FORWARDS:
            raise ConfigError(f"forward must be one of {', '.join(FORWARDS)}, got {self.forward!r}")
        if self.checkpoints not in CHECKPOINT_POLICIES:
            raise ConfigError(f"checkpoints must be one of {', '.join(CHECKPOINT_POLICIES)}, got {self.checkpoints!r}")
        for name in ("batch_size", "max_steps", "eval_every", "ckpt_every", "coarse_every", "resume_every",
                     "eval_groups"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.tracked_groups < 0:
            raise ConfigError(f"tracked_groups must be at least 0 (0: no per-example accuracy), got {self.tracked_groups}")
        if self.checkpoints == "adaptive" and self.coarse_every % self.ckpt_every:
            raise ConfigError(f"coarse_every={self.coarse_every} must be a multiple of ckpt_every={self.ckpt_every}")
        if self.tracked_every is not None and self.tracked_every < 1:
            raise ConfigError(f"tracked_every must be at least 1 (or None), got {self.tracked_every}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be at least 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas}")
        for name in ("warmup_steps", "early_log_points"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.eval_batch_size < 1:
            raise ConfigError(f"eval_batch_size must be at least 1, got {self.eval_batch_size}")
        for name in ("grad_clip", "stop_after_tau"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive (or None), got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be at least 1 (or None), got {self.threads}")
        if self.hide_cue_until is not None and not 0 < self.hide_cue_until < self.max_steps:
            raise ConfigError(f"hide_cue_until={self.hide_cue_until} is outside the run: give a step "
                              f"between 1 and max_steps - 1 ({self.max_steps - 1})")
        if self.transplant is not None:
            kind, _, _ = transplant_part(self.transplant)
            if self.freeze_transplant and kind in ("qk", "ov"):
                raise ConfigError(f"freeze_transplant keeps whole weights, not the slice {self.transplant} of a head")
        if (self.transplant is None) != (self.donor is None):
            raise ConfigError("transplant and donor go together: --transplant routing|readout --donor CHECKPOINT")
        if self.freeze_transplant and self.transplant is None:
            raise ConfigError("freeze_transplant needs a transplant (--transplant routing|readout --donor CHECKPOINT)")
        if not 0 <= self.clamp_strength <= 1:
            raise ConfigError(f"clamp_strength must lie in [0, 1], got {self.clamp_strength}")
        if self.clamp_from < 0:
            raise ConfigError(f"clamp_from must be a step >= 0, got {self.clamp_from}")
        if self.clamp_until is not None and self.clamp_until <= self.clamp_from:
            raise ConfigError(f"clamp_until={self.clamp_until} must come after clamp_from={self.clamp_from}")
        if self.ablate_from < 0:
            raise ConfigError(f"ablate_from must be a step >= 0, got {self.ablate_from}")




def hooked_config_dict(model: ModelConfig, d_vocab: int, n_ctx: int) -> dict[str, Any]:
    """Keyword arguments that ``HookedTransformerConfig(**d)`` accepts (stored in ``config.json``): the
    architecture, a vocabulary of ``d_vocab`` tokens and a context of ``n_ctx`` positions."""
    return {
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "n_heads": model.n_heads,
        "d_head": model.d_head,
        "d_mlp": model.d_mlp,
        "act_fn": model.act_fn,
        "normalization_type": model.normalization_type,
        "positional_embedding_type": model.positional_embedding_type,
        "n_ctx": n_ctx,
        "d_vocab": d_vocab,
        "d_vocab_out": d_vocab,
        "attn_only": model.attn_only,
        "default_prepend_bos": False,
        "seed": None,
    }
