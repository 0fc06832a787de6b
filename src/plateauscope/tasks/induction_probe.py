"""The built-in ``induction`` probe: repeated random tokens, for any causal language model.

A sequence is the series' start token (its tokenizer's BOS; none where it has none, or ``bos``), ``k`` filler
tokens, ``L`` random tokens, ``F - k`` filler tokens, and the same ``L`` again: the induction task of
:mod:`plateauscope.tasks.induction` with its copy at ``F + 1`` lags and positions (``L`` = 12 and ``F`` = 8, less
where the context or the vocabulary is small). Its tokens are drawn from the longest run of the model's token ids
that holds none of the tokenizer's special tokens. What it measures at every checkpoint (one forward of the scored
sequences and their controls, :meth:`InductionProbe.signals`):

* ``previous_token`` and ``induction`` head scores as the field defines them
  (:func:`plateauscope.tasks.probe.target_scores`): the mean attention from each position with a target to it (the
  position before; the position after an earlier occurrence of the current token). The induction score's null is
  the head's attention to the same positions in control sequences whose first copy is replaced by unused tokens;
  the previous-token score's, uniform attention. TransformerLens ``head_detector``'s ``mul`` scores are kept beside;
* each sequence's lag (the distance between its copies), so that a head that copies at one lag only is told from
  one that copies by content;
* the in-context loss gap per sequence: the loss on the first copy minus the loss on the second (the predictions
  of tokens 2 .. L of each), near 0 before the induction heads form and near the first copy's loss after;
* prompt pairs for patching (the induction task's: the cue token swapped for an unused one).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.tasks.base import Measure
from plateauscope.tasks.induction import InductionConfig, InductionTask, _distinct_tokens
from plateauscope.tasks.probe import (
    Probe,
    ProbeError,
    ProbeSignals,
    chance_scores,
    detection_scores,
    logits_and_patterns,
    target_scores,
)

MAX_SEGMENT = 12
"""The longest copy the probe uses."""
MAX_GAP = 8
"""The most filler around the first copy: copies at up to ``MAX_GAP + 1`` lags and positions."""
NO_BOS = "none"
"""``bos`` option: no start token, whatever the tokenizer says."""


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


def start_token(tokenizer: Any, bos: int | str | None, d_vocab: int) -> int | None:
    """The probe's start token: ``bos`` where given (an id, or ``none``), else the tokenizer's BOS, else none."""
    if bos is None:
        found = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
        return int(found) if found is not None else None
    if bos == NO_BOS:
        return None
    try:
        value = int(bos)
    except (TypeError, ValueError):
        raise ProbeError(f"--bos {bos}: a token id or '{NO_BOS}'") from None
    if not 0 <= value < d_vocab:
        raise ProbeError(f"--bos {value}: outside the model's vocabulary of {d_vocab} tokens")
    return value


def ordinary_ids(d_vocab: int, tokenizer: Any, bos: int | None) -> tuple[int, int]:
    """``(first id, count)``: the longest run of token ids with none of the tokenizer's special tokens (nor the start
    token) in it, within the tokenizer's own ids (a model's embedding may have unused rows past them)."""
    size = min(d_vocab, len(tokenizer)) if tokenizer is not None else d_vocab
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or [] if i is not None}
    special |= {bos} if bos is not None else set()
    bounds = [-1, *sorted(i for i in special if 0 <= i < size), size]
    first, count = max(((a + 1, b - a - 1) for a, b in zip(bounds[:-1], bounds[1:])), key=lambda r: (r[1], -r[0]))
    return first, count


class InductionProbe(InductionTask, Probe):
    """Repeated random tokens over a model's own token ids, at several lags and positions."""

    probe_name: ClassVar[str] = "induction"
    n_scored: ClassVar[int] = 128
    """Sequences the head scores and the loss gap are measured on."""

    @classmethod
    def for_model(cls, d_vocab: int, n_ctx: int, seed: int = 0, segment_len: int | None = None,
                  n_sequences: int = 512, tokenizer: Any = None, bos: int | str | None = None) -> InductionProbe:
        """The probe for a model of ``d_vocab`` token ids and context ``n_ctx`` (``tokenizer``: the series', for its
        start token and special tokens; ``bos``: a start token id, or ``none``, instead of the tokenizer's)."""
        start = start_token(tokenizer, bos, d_vocab)
        first, count = ordinary_ids(d_vocab, tokenizer, start)
        room = n_ctx - 1 - (start is None)  # positions after the start token (or the extra random token)
        longest = min(MAX_SEGMENT, room // 3, (count - 1) // 3)
        segment = longest if segment_len is None else segment_len
        if segment < 3 or segment > min(room // 2, (count - 2) // 2):
            raise ProbeError(f"probe induction: a copy of {segment} tokens does not fit a model of {d_vocab} tokens "
                             f"and context {n_ctx} (at most {min(room // 2, (count - 2) // 2)}, at least 3)")
        gap = max(0, min(MAX_GAP, room - 2 * segment, count - 1 - (start is None) - 2 * segment))
        return cls.generate(InductionConfig(vocab_size=count, segment_len=segment, max_gap=gap,
                                            n_sequences=n_sequences, seed=seed, first_id=first, bos_id=start))

    def scored_tokens(self) -> Int[Tensor, "N seq"]:
        """The sequences the head scores and the loss gap are measured on."""
        return self.tokens[: self.n_scored]

    def lags(self) -> dict[str, Int[Tensor, " N"]]:
        """``induction``: the distance between the two copies of each scored sequence, ``L + F - k``."""
        return {"induction": self.cfg.segment_len + self.cfg.max_gap - self.gaps[: self.n_scored]}

    def detection_patterns(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Float[Tensor, "N seq seq"]]:
        """``previous_token`` and ``induction``."""
        return {"previous_token": previous_token_pattern(tokens), "induction": induction_pattern(tokens)}

    def controls(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Int[Tensor, "N seq"]]:
        """``induction``: each scored sequence with its first copy replaced by tokens it does not use, so that a
        head's attention to the induction targets there is attention by position alone."""
        n, L = len(tokens), self.cfg.segment_len
        first_copy = self.gaps[:n, None] + 1 + torch.arange(L)
        gen = torch.Generator().manual_seed(self.cfg.seed + 7)
        fresh = _distinct_tokens(gen, n, L, self.cfg.vocab_size, avoid=tokens, first=self.cfg.first_id)
        return {"induction": tokens.clone().scatter_(1, first_copy, fresh)}

    def loss_gap(self, model: nn.Module) -> float:
        """The in-context loss gap: first copy minus second copy, averaged over the scored sequences."""
        return float(self.signals(model).loss_gap.mean())

    def signals(self, model: nn.Module) -> ProbeSignals:
        """The head scores, their nulls and the loss gap per sequence, from one forward of the scored sequences and
        their controls."""
        tokens, controls = self._scored_and_controls
        logits, patterns = logits_and_patterns(model, torch.cat([tokens, controls]), len(tokens))
        scored, control = patterns[: len(tokens)], patterns[len(tokens):]
        out = ProbeSignals({}, {}, {}, self.copy_gaps(logits[: len(tokens)], tokens), self.lags())
        for name, detection in self.detection_patterns(tokens).items():
            out.scores[name] = target_scores(scored, detection)
            out.detector[name] = detection_scores(scored, detection)
            out.nulls[name] = (target_scores(control, detection) if name == "induction"
                               else chance_scores(detection)[:, None, None].expand_as(out.scores[name]))
        return out

    @cached_property
    def _scored_and_controls(self) -> tuple[Int[Tensor, "N seq"], Int[Tensor, "N seq"]]:
        """The scored sequences and their controls, drawn once."""
        tokens = self.scored_tokens()
        return tokens, self.controls(tokens)["induction"]

    def copy_gaps(self, logits: Float[Tensor, "N seq vocab"], tokens: Int[Tensor, "N seq"]) -> Float[Tensor, " N"]:
        """Per sequence, the mean loss on the first copy minus that on the second (the predictions of tokens 2 .. L
        of each; the first copy sits after the sequence's ``k`` fillers)."""
        L, F = self.cfg.segment_len, self.cfg.max_gap
        logprobs = logits.float().log_softmax(-1)
        loss = -logprobs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]  # [N, seq - 1]: position p predicts p + 1
        first = self.gaps[: len(tokens), None] + 1 + torch.arange(1, L)  # positions of s_2 .. s_L
        first_loss = loss.gather(1, first - 1).mean(1)
        second_loss = loss[:, F + L + 1: F + 2 * L].mean(1)  # r_2 .. r_L, predicted from F + L + 1 ..
        return first_loss - second_loss

    def measures(self) -> tuple[Measure, ...]:
        """Each detection pattern's head score (per head; a subclass's own patterns too) and the in-context loss
        gap (per model)."""
        names = self.detection_patterns(self.scored_tokens()[:1])
        return (*(Measure(f"{name}_score", lambda m, task, ev, name=name: task.head_scores(m)[name], "head",
                          f"mean attention to the {name.replace('_', '-')} target") for name in names),
                Measure("in_context_loss_gap", lambda m, task, ev: task.loss_gap(m), "model",
                        "loss on the first copy minus loss on the second"))

    def describe(self) -> str:
        """``induction probe (V=..., L=..., lags a..b, BOS id)``."""
        lags = f"{self.cfg.segment_len}..{self.cfg.segment_len + self.cfg.max_gap}"
        bos = "no start token" if self.cfg.bos_id is None else f"start token {self.cfg.bos_id}"
        return f"induction probe (V={self.cfg.vocab_size}, L={self.cfg.segment_len}, lags {lags}, {bos})"
