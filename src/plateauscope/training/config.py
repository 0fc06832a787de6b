"""Configuration dataclasses for the task, the model and the training loop, and the presets.

Every field has a docstring; every config round-trips through ``to_dict``/``from_dict``
(plain JSON types only), which is how a run directory's ``config.json`` is written and read.
Nothing here is derived at import time: values that depend on others (``D``, ``log K``,
the context length) are properties or are computed where they are used.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from plateauscope.errors import ConfigError
from plateauscope.tasks.loading import task_class

DIRECTIONS: tuple[str, ...] = ("backward", "forward")
TARGET_UNIQUENESS: tuple[str, ...] = ("global", "group")
TAILS: tuple[str, ...] = ("random", "by_first_char")
ORDERS: tuple[str, ...] = ("bz", "zb")
SELECTORS: tuple[str, ...] = ("shared", "private")
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
class TaskConfig(JsonConfig):
    """The (B, z) -> A wind tunnel."""

    n_b: int = 1000
    """Number of base strings B (groups)."""
    K: int = 10
    """Targets per base string; the selector z picks one of them. H(A | B) = log K."""
    b_len: int = 6
    """Characters in a base string B."""
    z_len: int = 2
    """Characters in a selector z (the K selectors are shared by all groups unless ``selectors`` says
    ``private``)."""
    a_len: int = 4
    """Characters in a target string A (1 or more)."""
    alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789"
    """The characters B, z and A are drawn from."""
    direction: str = "backward"
    """``backward``: (B, z) -> A, the paper's task. ``forward``: A -> B."""
    distinct_first_char: bool = True
    """The K targets of a group start with K different characters (as in the paper's code)."""
    seed: int = 0
    """Seed of the data set (strings and their pairing); independent of the training seed."""
    target_uniqueness: str = "global"
    """``global``: all D targets differ, so A -> B is a function (the paper). ``group``: only the K
    targets of a group differ (short A cannot be globally unique); the forward task refuses it."""
    tails: str = "random"
    """``random``: A[1:] drawn per target. ``by_first_char``: A[1:] is one fixed global function of A[0],
    so the tails cost 36 facts instead of D (needs ``distinct_first_char``)."""
    order: str = "bz"
    """``bz``: the prompt is B then z (the paper). ``zb``: z then B."""
    selectors: str = "shared"
    """``shared``: one set of K selectors for every group (the paper). ``private``: each group draws its
    own K selectors."""
    no_z: bool = False
    """The (B) -> A control: same groups and targets, no selector in the prompt. Its candidate loss
    cannot go below log K; the time its set loss takes to reach ~0 is the price of the marginal alone."""
    target_pool: int = 0
    """0: off. M > 0: every group draws its K targets (uniformly, distinct within the group) from one
    shared pool of M strings, so the global marginal of A is uniform over M strings: cheap to learn
    and worth log(V^a_len / M) nats of set loss. Needs ``target_uniqueness=group`` and
    ``distinct_first_char`` off (a group's draws may share a first character)."""
    first_char_zipf: float = 0.0
    """0: a target's first character is uniform over the alphabet. s > 0: it follows a Zipf law of
    exponent s over the alphabet in its own order (weight 1 / rank^s, the first character most
    frequent); a group's K first characters are a weighted draw without replacement. Needs
    ``distinct_first_char``."""

    @property
    def D(self) -> int:
        """Number of examples, n_b * K."""
        return self.n_b * self.K

    @property
    def log_k(self) -> float:
        """Plateau height per example: log K nats."""
        return math.log(self.K)

    @property
    def has_selector(self) -> bool:
        """Whether the prompt holds a selector z (the backward task without ``no_z``)."""
        return self.direction == "backward" and not self.no_z

    def run_label(self) -> str:
        """The task's part of a default run directory name: ``backward_K10_nb1000``."""
        return f"{self.direction}_K{self.K}_nb{self.n_b}"

    def variant_label(self) -> str:
        """The task variant options that differ from the paper's, e.g. ``a_len=1,order=zb`` (``default``)."""
        fields_ = ("a_len", "target_uniqueness", "tails", "order", "selectors", "no_z", "distinct_first_char",
                   "target_pool", "first_char_zipf")
        base = TaskConfig()
        diff = [f"{k}={getattr(self, k)}" for k in fields_ if getattr(self, k) != getattr(base, k)]
        return ",".join(diff) or "default"

    @property
    def target_space(self) -> int:
        """How many distinct target strings the options allow (36 with ``by_first_char``, M with a pool)."""
        n_chars = len(self.alphabet)
        if self.target_pool:
            return self.target_pool
        return n_chars if self.tails == "by_first_char" else n_chars**self.a_len

    def validate(self) -> None:
        """Fail with one line when the request is impossible."""
        n_chars = len(self.alphabet)
        if len(set(self.alphabet)) != n_chars:
            raise ConfigError(f"alphabet {self.alphabet!r} repeats a character")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        for name, choices in (("target_uniqueness", TARGET_UNIQUENESS), ("tails", TAILS), ("order", ORDERS),
                              ("selectors", SELECTORS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if not isinstance(self.no_z, bool):
            raise ConfigError(f"no_z must be true or false, got {self.no_z!r}")
        if self.direction == "forward":
            if self.target_uniqueness != "global":
                raise ConfigError("the forward task needs target_uniqueness=global: with targets unique only "
                                  "within a group, A -> B is not a function")
            for name, default in (("order", "bz"), ("selectors", "shared"), ("no_z", False)):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name}={getattr(self, name)} has no meaning for the forward task "
                                      "(A -> B has no selector)")
        if self.no_z:
            for name, default in (("order", "bz"), ("selectors", "shared")):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name}={getattr(self, name)} has no meaning with no_z (no selector)")
        if self.tails == "by_first_char" and not self.distinct_first_char:
            raise ConfigError("tails=by_first_char needs distinct_first_char: the K targets of a group "
                              "then differ only in their first character")
        for name in ("n_b", "K", "b_len", "z_len", "a_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        self._validate_marginal_options(n_chars)
        if self.K > n_chars**self.z_len:
            raise ConfigError(
                f"K={self.K} is larger than the {n_chars ** self.z_len} distinct selectors "
                f"of {self.z_len} characters"
            )
        if self.n_b > n_chars**self.b_len:
            raise ConfigError(
                f"n_b={self.n_b} is larger than the {n_chars ** self.b_len} distinct base strings "
                f"of {self.b_len} characters"
            )
        if self.distinct_first_char and self.K > n_chars:
            raise ConfigError(
                f"K={self.K} targets cannot start with distinct characters: the alphabet has {n_chars}"
            )
        space = self.target_space
        what = "targets allowed by tails=by_first_char" if self.tails == "by_first_char" else \
            f"strings of {self.a_len} characters"
        if self.target_uniqueness == "global" and self.D > space // 2:
            raise ConfigError(
                f"D={self.D} unique targets need more than half of the {space} {what}; "
                f"lower n_b or K, raise a_len, or use target_uniqueness=group"
            )
        if self.K > space:
            raise ConfigError(f"K={self.K} distinct targets per group: there are only {space} {what}")

    def _validate_marginal_options(self, n_chars: int) -> None:
        """The cheap-marginal variants: a target pool and Zipf first characters."""
        if isinstance(self.target_pool, bool) or not isinstance(self.target_pool, int) or self.target_pool < 0:
            raise ConfigError(f"target_pool must be 0 (off) or a number of strings M >= K, got {self.target_pool!r}")
        if self.target_pool:
            if self.target_pool < self.K:
                raise ConfigError(f"target_pool={self.target_pool} cannot give each group K={self.K} distinct targets")
            if self.target_pool > n_chars**self.a_len:
                raise ConfigError(f"target_pool={self.target_pool} is more than the {n_chars ** self.a_len} strings "
                                  f"of {self.a_len} characters")
            for name, want in (("target_uniqueness", "group"), ("distinct_first_char", False), ("tails", "random"),
                               ("first_char_zipf", 0.0)):
                if getattr(self, name) != want:
                    raise ConfigError(f"target_pool needs {name}={want} (the groups share the pool's strings, "
                                      f"drawn uniformly), got {getattr(self, name)}")
        if not isinstance(self.first_char_zipf, (int, float)) or isinstance(self.first_char_zipf, bool) \
                or not math.isfinite(self.first_char_zipf) or self.first_char_zipf < 0:
            raise ConfigError(f"first_char_zipf must be 0 (uniform) or a positive exponent, got {self.first_char_zipf!r}")
        if self.first_char_zipf and not self.distinct_first_char:
            raise ConfigError("first_char_zipf needs distinct_first_char: a group's K first characters are a "
                              "weighted draw without replacement")


@dataclass(frozen=True)
class ModelConfig(JsonConfig):
    """A decoder-only HookedTransformer; mapped onto HookedTransformerConfig in ``plateauscope.training.model``."""

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
    """Groups whose per-group exact-match accuracy is logged (``group_acc``)."""
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
    """The training step's forward pass. ``fused``: :func:`plateauscope.training.fused.fused_logits`, the same
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
                     "eval_groups", "tracked_groups"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.checkpoints == "adaptive" and self.coarse_every % self.ckpt_every:
            raise ConfigError(f"coarse_every={self.coarse_every} must be a multiple of ckpt_every={self.ckpt_every}")
        if self.tracked_every is not None and self.tracked_every < 1:
            raise ConfigError(f"tracked_every must be at least 1 (or None), got {self.tracked_every}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
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


@dataclass(frozen=True)
class RunConfig(JsonConfig):
    """Everything that defines a run: same RunConfig, same numbers (on the same device)."""

    task: Any = field(default_factory=TaskConfig)
    """The data set: the configuration dataclass of the task named by ``task_name`` (``TaskConfig``
    for the selector task)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimiser and schedule."""
    preset: str | None = None
    """Name of the preset this run started from, for the record."""
    task_name: str = "selector"
    """The task (``plateauscope.tasks.loading``): a built-in name (``selector``, ``induction``), or a task
    of your own as ``path/to/file.py:Class`` or ``module:Class``. Runs written before tasks existed
    read as ``selector``."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """The inverse of ``to_dict`` (the task's config class comes from ``task_name``)."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"RunConfig: unknown field(s) {', '.join(unknown)}")
        task_name = d.get("task_name", "selector")
        return cls(
            task=task_class(task_name).Config.from_dict(d.get("task", {})),
            model=ModelConfig.from_dict(d.get("model", {})),
            train=TrainConfig.from_dict(d.get("train", {})),
            preset=d.get("preset"),
            task_name=task_name,
        )

    def validate(self) -> RunConfig:
        """Validate the task, model and training configs together; return self."""
        if hasattr(self.task, "validate"):  # a task config not built on JsonConfig may lack it
            self.task.validate()
        self.model.validate()
        self.train.validate()
        return self

    def replace(self, **overrides: Any) -> RunConfig:
        """Apply flat overrides (``K=3``, ``lr=3e-3``) to whichever sub-config has that field."""
        parts = {"task": self.task, "model": self.model, "train": self.train}
        for key, value in overrides.items():
            owners = [name for name, part in parts.items() if key in {f.name for f in fields(part)}]
            if key == "seed":  # one seed moves the data order and the init; the data set stays
                owners = ["model", "train"]
            if not owners:
                names = {name: ", ".join(f.name for f in fields(part)) for name, part in parts.items()}
                raise ConfigError(f"no option named {key!r}: the {self.task_name} task has {names['task']}; "
                                  f"the model {names['model']}; training {names['train']}")
            for owner in owners:
                parts[owner] = dataclasses.replace(parts[owner], **{key: value})
        return RunConfig(**parts, preset=self.preset, task_name=self.task_name)

    def with_options(self, assignments: list[str], flag: str = "--set") -> RunConfig:
        """Apply ``KEY=VALUE`` texts from a command line, each value read as the declared type of the
        field it sets (``true``/``false`` for flags, ``a,b`` for tuples, ``none`` for an optional field)."""
        hints = {k: v for part in (self.train, self.model, self.task) for k, v in get_type_hints(type(part)).items()}
        overrides = {}
        for text in assignments:
            key, sep, value = text.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ConfigError(f"{flag} expects KEY=VALUE, got {text!r}")
            try:
                overrides[key] = _read_value(value, hints.get(key, Any))
            except ValueError as e:
                raise ConfigError(f"{flag} {text}: {key} takes {e}, got {value!r}") from None
        return self.replace(**overrides)


def _read_value(text: str, hint: Any) -> Any:
    """``text`` read as a value of type ``hint``; a ValueError names what was expected."""
    lowered = text.lower()
    args = [a for a in get_args(hint) if a is not type(None)]
    if type(None) in get_args(hint):  # X | None
        return None if lowered == "none" else _read_value(text, args[0] if len(args) == 1 else Any)
    if get_origin(hint) is tuple:
        item = args[0] if args else Any
        return tuple(_read_value(t.strip(), item) for t in text.split(",") if t.strip())
    if hint is bool:
        if lowered not in ("true", "false"):
            raise ValueError("true or false")
        return lowered == "true"
    for kind, name in ((int, "an integer"), (float, "a number")):
        if hint is kind:
            try:
                return kind(text)
            except ValueError:
                raise ValueError(name) from None
    return text
