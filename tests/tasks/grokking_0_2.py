"""Grokking on modular addition as plateauscope 0.2's manual had an author write it, kept unchanged:
``tests/test_deprecation.py`` trains and analyses it.

0.2's protocol had no held-out split: training draws its minibatches from ``tokens``, so this file keeps the
training pairs there and the held-out pairs beside them (``self.heldout``), logs the held-out loss from
``evaluate``, and draws its prompt pairs from the held-out pairs: their ``examples`` index ``self.heldout``,
not ``tokens``.

a + b mod p (Power et al. 2022): a sequence is ``a b = c``; the loss counts the logits at ``=``. A seeded 40% of
the p^2 pairs train a one-layer model with strong weight decay on the whole split each step; it memorises them
(the held-out loss rises), then generalises (the held-out loss falls below half of log p: tau)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from plateauscope.training.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.base import ProgressMeasure, PromptPairs, Task


@dataclass(frozen=True)
class ModAddConfig(JsonConfig):
    p: int = 59  # the modulus
    train_fraction: float = 0.4  # share of the p^2 pairs that train
    seed: int = 0  # seed of the split


class ModularAddition(Task):
    Config = ModAddConfig
    capabilities = frozenset({"cue", "pairs"})
    default_model = ModelConfig(n_layers=1, d_model=128, n_heads=4, d_head=32, d_mlp=512, act_fn="relu",
                                normalization_type=None)
    # the whole training split every step (0.2 has no full-batch option: the batch is the split's size)
    default_train = TrainConfig(lr=1e-3, weight_decay=1.0, betas=(0.9, 0.98), batch_size=1392, max_steps=3000,
                                eval_every=20, ckpt_every=20, eval_groups=1, tracked_groups=1)

    def __init__(self, cfg: ModAddConfig, train: Tensor, heldout: Tensor):
        self.cfg, self.tokens, self.heldout = cfg, train, heldout
        self.vocab = [str(i) for i in range(cfg.p)] + ["="]

    @classmethod
    def generate(cls, cfg: ModAddConfig) -> ModularAddition:
        p = cfg.p
        a, b = torch.arange(p).repeat_interleave(p), torch.arange(p).repeat(p)
        pairs = torch.stack([a, b, torch.full_like(a, p), (a + b) % p], dim=1)
        order = torch.randperm(p * p, generator=torch.Generator().manual_seed(cfg.seed))
        n_train = int(cfg.train_fraction * p * p)
        return cls(cfg, pairs[order[:n_train]], pairs[order[n_train:]])

    @property
    def loss_positions(self) -> list[int]:
        return [2]  # the logits at "=" predict c

    @property
    def progress(self) -> ProgressMeasure:
        return ProgressMeasure("heldout_loss", math.log(self.cfg.p), "log_p", True, None, "held-out loss", "log p")

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> Tensor:
        return self.tokens  # the whole training split; the held-out split is evaluated beside it

    def _scores(self, model, seqs: Tensor, batch_size: int) -> tuple[float, float]:
        loss, right = 0.0, 0
        for chunk in seqs.split(batch_size):
            logits = model(chunk[:, :3])[:, 2].float()
            loss += torch.nn.functional.cross_entropy(logits, chunk[:, 3], reduction="sum").item()
            right += int((logits.argmax(-1) == chunk[:, 3]).sum())
        return loss / len(seqs), right / len(seqs)

    @torch.inference_mode()
    def evaluate(self, model, evalset: Tensor, batch_size: int = 512) -> dict:
        loss, accuracy = self._scores(model, evalset, batch_size)
        heldout_loss, heldout_accuracy = self._scores(model, self.heldout, batch_size)
        return {"loss": loss, "accuracy": accuracy, "heldout_loss": heldout_loss, "heldout_accuracy": heldout_accuracy}

    def cue_positions(self, tokens: Tensor, query: int) -> Tensor:
        if query != 2:
            return torch.empty(len(tokens), 0, dtype=torch.long)
        return torch.tensor([[0, 1]]).expand(len(tokens), 2)  # "=" must read a and b

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """Held-out ``a b =`` against ``a' b =`` (another a): does the model add, or recall?"""
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randperm(len(self.heldout), generator=gen)[:n]
        clean = self.heldout[idx]
        corrupt = clean.clone()
        corrupt[:, 0] = (clean[:, 0] + torch.randint(1, self.cfg.p, (len(idx),), generator=gen)) % self.cfg.p
        corrupt[:, 3] = (corrupt[:, 0] + corrupt[:, 1]) % self.cfg.p
        return PromptPairs(clean[:, :3], corrupt[:, :3], clean[:, 3], corrupt[:, 3], idx, 2)
