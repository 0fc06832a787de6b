"""The built-in ``induction`` probe: repeated random tokens, for any causal language model.

A sequence is token 0 (a start token), ``L`` random token ids, and the same ``L`` again (the induction
task of :mod:`plateauscope.tasks.induction` with no gap, over the model's own token ids ``1 .. d_vocab - 1``;
``L`` = 16, or less where the context or the vocabulary is small). What it measures at every checkpoint:

* ``previous_token`` and ``induction`` head scores: TransformerLens ``head_detector``'s patterns
  (previous token: the position before; induction: the position after an earlier occurrence of the
  current token) and its ``mul`` measure (:func:`plateauscope.tasks.probe.detection_scores`);
* the in-context loss gap: the loss on the first copy minus the loss on the second (copy positions
  2 .. L of each), near 0 before the induction heads form and near the first copy's loss after;
* prompt pairs for patching (the induction task's: the cue token swapped for an unused one).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.tasks.base import Measure
from plateauscope.tasks.induction import InductionConfig, InductionTask
from plateauscope.tasks.probe import Probe, ProbeError, detection_scores, logits_and_patterns

MAX_SEGMENT = 16
"""The longest copy the probe uses."""


def previous_token_pattern(tokens: Int[Tensor, "N seq"]) -> Float[Tensor, "N seq seq"]:
    """1 at (q, q - 1): ``head_detector``'s previous-token pattern, per sequence."""
    n, seq = tokens.shape
    return torch.diag(torch.ones(seq - 1), -1).expand(n, seq, seq).clone()


def induction_pattern(tokens: Int[Tensor, "N seq"]) -> Float[Tensor, "N seq seq"]:
    """1 at (q, k) where the token before k equals the token at q (k - 1 != q, k <= q): ``head_detector``'s
    induction pattern (its duplicate-token pattern moved one key to the right), per sequence."""
    duplicate = (tokens[:, :, None] == tokens[:, None, :]).float()
    duplicate.diagonal(dim1=1, dim2=2).zero_()
    shifted = torch.zeros_like(duplicate)
    shifted[:, :, 1:] = duplicate[:, :, :-1]
    return torch.tril(shifted)


class InductionProbe(InductionTask, Probe):
    """Repeated random tokens over a model's own token ids."""

    probe_name: ClassVar[str] = "induction"
    n_scored: ClassVar[int] = 64
    """Sequences the head scores and the loss gap are measured on."""

    @classmethod
    def for_model(cls, d_vocab: int, n_ctx: int, seed: int = 0, segment_len: int | None = None,
                  n_sequences: int = 512) -> InductionProbe:
        """The probe for a model of ``d_vocab`` token ids and context ``n_ctx``."""
        longest = min(MAX_SEGMENT, (n_ctx - 2) // 2, (d_vocab - 2) // 2)
        segment = longest if segment_len is None else segment_len
        if segment < 3 or segment > longest:
            raise ProbeError(f"probe induction: a copy of {segment} tokens does not fit a model of {d_vocab} tokens "
                             f"and context {n_ctx} (at most {longest}, at least 3)")
        return cls.generate(InductionConfig(vocab_size=d_vocab - 1, segment_len=segment, max_gap=0,
                                            n_sequences=n_sequences, seed=seed))

    def scored_tokens(self) -> Int[Tensor, "N seq"]:
        """The sequences the head scores and the loss gap are measured on."""
        return self.tokens[: self.n_scored]

    def detection_patterns(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Float[Tensor, "N seq seq"]]:
        """``previous_token`` and ``induction``."""
        return {"previous_token": previous_token_pattern(tokens), "induction": induction_pattern(tokens)}

    def head_scores(self, model: nn.Module) -> dict[str, Float[Tensor, "n_layers n_heads"]]:
        """Each detection pattern's score per head (``head_detector``'s ``mul`` measure)."""
        return self.signals(model)[0]

    def loss_gap(self, model: nn.Module) -> float:
        """The in-context loss gap: first copy minus second copy."""
        return self.signals(model)[1]

    def signals(self, model: nn.Module) -> tuple[dict[str, Float[Tensor, "n_layers n_heads"]], float]:
        """The head scores and the loss gap, from one forward of the scored sequences."""
        tokens = self.scored_tokens()
        logits, patterns = logits_and_patterns(model, tokens)
        scores = {name: detection_scores(patterns, det) for name, det in self.detection_patterns(tokens).items()}
        first, second = self.copy_losses(logits, tokens)
        return scores, first - second

    def copy_losses(self, logits: Float[Tensor, "N seq vocab"], tokens: Int[Tensor, "N seq"]) -> tuple[float, float]:
        """The mean loss on the first copy and on the second (the predictions of tokens 2 .. L of each)."""
        L = self.cfg.segment_len
        logprobs = logits.log_softmax(-1)
        loss = -logprobs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]  # [N, seq - 1]: position p predicts p + 1
        return float(loss[:, 1:L].mean()), float(loss[:, L + 1: 2 * L].mean())

    def measures(self) -> tuple[Measure, ...]:
        """Each detection pattern's head score (per head; a subclass's own patterns too) and the in-context loss
        gap (per model)."""
        names = self.detection_patterns(self.scored_tokens()[:1])
        return (*(Measure(f"{name}_score", lambda m, task, ev, name=name: task.head_scores(m)[name], "head",
                          f"head_detector's {name.replace('_', '-')} score") for name in names),
                Measure("in_context_loss_gap", lambda m, task, ev: task.loss_gap(m), "model",
                        "loss on the first copy minus loss on the second"))

    def describe(self) -> str:
        """``induction probe (V=..., L=...)``."""
        return f"induction probe (V={self.cfg.vocab_size}, L={self.cfg.segment_len})"
