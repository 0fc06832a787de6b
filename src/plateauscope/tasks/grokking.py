"""Grokking: modular addition ``a + b mod p`` (Power et al. 2022), with the progress measures of Nanda
et al. 2023 (arXiv 2301.05217).

A sequence is ``a b = c`` with ``c = (a + b) mod p``; the loss counts the logits at ``=``. A seeded share
of the p² pairs (``train_fraction``) is the training split, the rest the held-out split
(``Task.train_indices``, ``Task.heldout_indices``): a one-layer model trained on the whole split each
step, with strong weight decay, first memorises it (the held-out loss rises), then forms a Fourier
circuit, then cleans the memorisation up and the held-out loss falls: the progress measure is
``heldout_loss`` against log p, and tau is when it falls below half of log p.

The measures (:meth:`GrokkingTask.measures`), on the logits of every pair over the p answers, in the
Fourier basis of Z_p (:func:`fourier_basis`):

* ``restricted_loss``: the loss over all pairs of the logits restricted to the key frequencies (each
  answer's logits as a function of ``(a, b)``: their mean and their components along
  ``cos(w_k (a + b))`` and ``sin(w_k (a + b))``, ``w_k = 2 pi k / p``, for the key ``k``);
* ``excluded_loss``: the loss on the training split of the logits with those components removed;
* ``fourier_share``: the share of the embedding's squared norm (the p number tokens' rows of W_E) in its
  ``n_key`` largest frequencies;
* ``sum_sq_weights``: the sum of the squared parameters, the quantity weight decay shrinks.

The key frequencies are ``key_frequencies`` when given, else at each checkpoint the ``n_key`` frequencies
with the largest norm in that checkpoint's embedding (Nanda et al. read them off the final model: give
them here to do the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.errors import ConfigError
from plateauscope.model.backend import hooked_parameters
from plateauscope.model.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.base import Measure, ProgressMeasure, PromptPairs, Task

EQUALS = "="


@dataclass(frozen=True)
class GrokkingConfig(JsonConfig):
    """The modular-addition data set and its split."""

    p: int = 59
    """The modulus (odd; Nanda et al. use the prime 113): p² pairs, p answers, log p the plateau height."""
    train_fraction: float = 0.4
    """Share of the p² pairs in the training split (Nanda et al.: 0.3)."""
    seed: int = 0
    """Seed of the split; independent of the training seed."""
    n_key: int = 5
    """Key frequencies the measures keep or remove, and that ``fourier_share`` counts."""
    key_frequencies: tuple[int, ...] = ()
    """Fixed key frequencies (each in 1 .. (p - 1) / 2); empty: the ``n_key`` largest of each checkpoint's
    embedding."""

    def validate(self) -> None:
        """Fail with one line when the request is impossible."""
        if self.p < 5 or self.p % 2 == 0:
            raise ConfigError(f"p must be odd and at least 5 (the Fourier basis of Z_p), got {self.p}")
        if not 0 < self.train_fraction < 1:
            raise ConfigError(f"train_fraction must lie in (0, 1), got {self.train_fraction}")
        n_freq = (self.p - 1) // 2
        if not 1 <= self.n_key <= n_freq:
            raise ConfigError(f"n_key must lie in [1, {n_freq}] (the frequencies of Z_{self.p}), got {self.n_key}")
        bad = [k for k in self.key_frequencies if not 1 <= k <= n_freq]
        if bad:
            raise ConfigError(f"key_frequencies must lie in [1, {n_freq}], got {bad}")


# ---- the Fourier basis and the measures, as functions of tensors -------------------------------


def fourier_basis(p: int) -> Float[Tensor, "p p"]:
    """The orthonormal Fourier basis of functions on Z_p (p odd), one basis vector a row: the constant,
    then ``cos(w_k x)`` and ``sin(w_k x)`` for k = 1 .. (p - 1) / 2, each of unit norm."""
    x = torch.arange(p, dtype=torch.float64)
    rows = [torch.ones(p, dtype=torch.float64)]
    for k in range(1, (p - 1) // 2 + 1):
        rows += [torch.cos(2 * math.pi * k * x / p), torch.sin(2 * math.pi * k * x / p)]
    basis = torch.stack(rows)
    return basis / basis.norm(dim=1, keepdim=True)


def frequency_norms(embedding: Float[Tensor, "p d"]) -> Float[Tensor, " n_freq"]:
    """The squared norm of the embedding in each frequency k = 1 .. (p - 1) / 2 (its cos and sin rows
    in :func:`fourier_basis`, over every embedding dimension)."""
    p = embedding.shape[0]
    coefficients = fourier_basis(p) @ embedding.double()
    squared = coefficients.pow(2).sum(-1)
    return squared[1::2] + squared[2::2]


def top_frequencies(embedding: Float[Tensor, "p d"], n: int) -> list[int]:
    """The ``n`` frequencies (1-based) with the largest :func:`frequency_norms`, largest first."""
    return [int(k) + 1 for k in frequency_norms(embedding).argsort(descending=True)[:n]]


def fourier_share(embedding: Float[Tensor, "p d"], n: int = 5) -> float:
    """The share of the embedding's squared norm in its ``n`` largest frequencies (the constant
    counts in the total, not as a frequency)."""
    norms = frequency_norms(embedding)
    return float(norms.sort(descending=True).values[:n].sum() / embedding.double().pow(2).sum())


def sum_frequency_components(logits: Float[Tensor, "p p C"], frequencies: list[int]) -> Float[Tensor, "p p C"]:
    """For each output, the component of its logits as a function of ``(a, b)`` along the unit directions
    ``cos(w_k (a + b))`` and ``sin(w_k (a + b))`` over the p² pairs, summed over ``frequencies``."""
    p = logits.shape[0]
    s = (torch.arange(p)[:, None] + torch.arange(p)[None, :]).double()
    out = torch.zeros_like(logits, dtype=torch.float64)
    for k in frequencies:
        for wave in (torch.cos(2 * math.pi * k * s / p), torch.sin(2 * math.pi * k * s / p)):
            unit = wave / wave.norm()
            out += unit[:, :, None] * torch.einsum("ab,abc->c", unit, logits.double())[None, None, :]
    return out.to(logits.dtype)


def restricted_logits(logits: Float[Tensor, "p p C"], frequencies: list[int]) -> Float[Tensor, "p p C"]:
    """The logits restricted to ``frequencies``: each output's mean over the pairs plus its
    :func:`sum_frequency_components`."""
    return logits.mean(dim=(0, 1), keepdim=True) + sum_frequency_components(logits, frequencies)


def pair_loss(logits: Float[Tensor, "p p C"], rows: Int[Tensor, " N"] | None = None) -> float:
    """The mean cross-entropy of ``c = (a + b) mod p`` over the pairs (row ``a * p + b``; ``rows``: only
    those pairs, None: all)."""
    p = logits.shape[0]
    flat = logits.reshape(p * p, -1).double()
    answers = (torch.arange(p)[:, None] + torch.arange(p)[None, :]).reshape(-1) % p
    if rows is not None:
        flat, answers = flat[rows], answers[rows]
    return float(nn.functional.cross_entropy(flat, answers))


# ---- the task ------------------------------------------------------------------------------------


class GrokkingTask(Task):
    """Modular addition with a held-out split: grokking (Power et al. 2022, Nanda et al. 2023)."""

    name = "grokking"
    Config = GrokkingConfig
    capabilities: ClassVar[frozenset[str]] = frozenset({"pairs"})
    default_model: ClassVar[ModelConfig] = ModelConfig(n_layers=1, d_model=64, n_heads=4, d_head=16, d_mlp=256,
                                                       act_fn="relu", normalization_type=None)
    """Nanda et al.'s one-layer ReLU transformer without layer norm, at half their width (d_model 64, 4 heads
    of 16, d_mlp 256), so that it trains on 2 CPU cores in minutes."""
    default_train: ClassVar[TrainConfig] = TrainConfig(
        lr=3e-3, weight_decay=1.0, betas=(0.9, 0.98), full_batch=True, max_steps=10000, stop_after_tau=1.5,
        eval_every=50, ckpt_every=50, early_log_points=8, eval_groups=1, tracked_groups=1, forward="trimmed")
    """Full batch, AdamW weight decay 1, betas (0.9, 0.98), as Nanda et al., but lr 3e-3 (at their 1e-3 this
    half-width model had not grokked in 4,000 steps: ``bench/grokking.py``); stopped at 1.5 tau. The
    ``trimmed`` forward (the loss reads only the ``=`` position) is the same model, 1.5x faster a step."""

    def __init__(self, cfg: GrokkingConfig):
        self.cfg = cfg
        p = cfg.p
        self.vocab = [str(i) for i in range(p)] + [EQUALS]
        a, b = torch.arange(p).repeat_interleave(p), torch.arange(p).repeat(p)
        self.tokens = torch.stack([a, b, torch.full_like(a, p), (a + b) % p], dim=1)
        order = torch.randperm(p * p, generator=torch.Generator().manual_seed(cfg.seed))
        n_train = round(cfg.train_fraction * p * p)
        self._train, self._heldout = order[:n_train].sort().values, order[n_train:].sort().values

    @classmethod
    def generate(cls, cfg: GrokkingConfig) -> GrokkingTask:
        """Every pair; the split is seeded."""
        cfg.validate()
        return cls(cfg)

    def records(self) -> list[dict]:
        """One dict per pair, with its split."""
        train = set(self._train.tolist())
        return [{"tokens": self.decode(row), "split": "train" if i in train else "heldout"}
                for i, row in enumerate(self.tokens)]

    def train_indices(self) -> Int[Tensor, " D_train"]:
        return self._train

    def heldout_indices(self) -> Int[Tensor, " D_heldout"]:
        return self._heldout

    @property
    def loss_positions(self) -> list[int]:
        return [2]

    @property
    def progress(self) -> ProgressMeasure:
        return ProgressMeasure("heldout_loss", math.log(self.cfg.p), "log_p", label="held-out loss",
                               height_label="log p")

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> Tensor:
        """The training split (``evaluate`` logs its loss and accuracy; the held-out split is logged
        under ``heldout_``)."""
        return self.tokens[self._train]

    def evaluate(self, model: nn.Module, evalset: Tensor, batch_size: int = 512) -> dict:
        """``loss`` and ``accuracy`` on ``evalset`` (the training split)."""
        device = next(model.parameters()).device
        loss_sum, right = 0.0, 0
        with torch.no_grad():
            for chunk in evalset.split(batch_size):
                chunk = chunk.to(device)
                logits = model(chunk[:, : self.input_len])
                loss_sum += float(self.loss(logits, chunk)) * len(chunk)
                right += int((logits[:, 2].argmax(-1) == chunk[:, 3]).sum())
        return {"loss": loss_sum / len(evalset), "accuracy": right / len(evalset)}

    def summary_fields(self) -> dict:
        return {"p": self.cfg.p, "train_pairs": len(self._train), "heldout_pairs": len(self._heldout)}

    def describe(self) -> str:
        return f"'grokking' (p={self.cfg.p}, train_fraction={self.cfg.train_fraction})"

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """Clean ``a b =`` and corrupted ``a' b =`` (a different ``a``), drawn from every pair."""
        gen = torch.Generator().manual_seed(seed)
        p = self.cfg.p
        examples = torch.randperm(p * p, generator=gen)[: min(n, p * p)]
        clean = self.tokens[examples]
        shift = torch.randint(1, p, (len(examples),), generator=gen)
        corrupt = clean.clone()
        corrupt[:, 0] = (clean[:, 0] + shift) % p
        corrupt[:, 3] = (corrupt[:, 0] + corrupt[:, 1]) % p
        return PromptPairs(clean=clean[:, :3], corrupt=corrupt[:, :3], clean_answer=clean[:, 3],
                           corrupt_answer=corrupt[:, 3], examples=examples, pred_pos=2)

    # ---- Nanda et al.'s progress measures -------------------------------------------------

    def pair_logits(self, model: nn.Module) -> Float[Tensor, "p p p"]:
        """The model's logits over the p answers at ``=``, for every pair ``(a, b)``."""
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(self.tokens[:, : self.input_len].to(device))[:, 2, : self.cfg.p]
        return logits.float().cpu().reshape(self.cfg.p, self.cfg.p, self.cfg.p)

    def embedding(self, model: nn.Module) -> Float[Tensor, "p d_model"]:
        """The number tokens' rows of W_E."""
        return hooked_parameters(model)["embed.W_E"].detach().float().cpu()[: self.cfg.p]

    def key_frequencies(self, model: nn.Module) -> list[int]:
        """``key_frequencies`` of the config, else the ``n_key`` largest of the model's embedding."""
        return list(self.cfg.key_frequencies) or top_frequencies(self.embedding(model), self.cfg.n_key)

    def measures(self) -> tuple[Measure, ...]:
        def restricted(model: nn.Module, task: Any, evalset: Any) -> float:
            return pair_loss(restricted_logits(self.pair_logits(model), self.key_frequencies(model)))

        def excluded(model: nn.Module, task: Any, evalset: Any) -> float:
            logits = self.pair_logits(model)
            return pair_loss(logits - sum_frequency_components(logits, self.key_frequencies(model)), self._train)

        def share(model: nn.Module, task: Any, evalset: Any) -> float:
            return fourier_share(self.embedding(model), self.cfg.n_key)

        def sum_sq(model: nn.Module, task: Any, evalset: Any) -> float:
            return float(sum(w.detach().double().pow(2).sum() for w in hooked_parameters(model).values()))

        return (
            Measure("restricted_loss", restricted, description="loss over all pairs of the logits restricted "
                                                               "to the key frequencies"),
            Measure("excluded_loss", excluded, description="training loss of the logits without the key "
                                                           "frequencies"),
            Measure("fourier_share", share, description="share of the embedding's squared norm in its top "
                                                        "frequencies"),
            Measure("sum_sq_weights", sum_sq, description="sum of the squared parameters"),
        )
