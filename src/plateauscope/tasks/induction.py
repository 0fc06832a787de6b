"""Induction heads: a random segment, then (usually) the same segment again, a random distance later.

A sequence is ``<BOS>``, ``k`` filler tokens, a segment ``s_1 .. s_L``, ``F - k`` filler tokens, and
a second half ``r_1 .. r_L`` (``k`` uniform in ``[0, F]``, F = ``max_gap``). Every token of a
sequence is distinct except the repeat: in a *repeat* sequence ``r = s``; in the others ``r`` is
``L`` fresh tokens, so that copying from context is right only where the segment repeats. The
loss counts the second half after its first token (``r_2 .. r_L``, at fixed positions): a model
that copies predicts ``r_{i+1}`` by finding the earlier occurrence of the current token ``r_i``
and reading the token after it. As the distance between the copies varies, no fixed positional
offset does it: it takes two heads in sequence (Olsson et al. 2022), a *previous-token* head in
layer 0 that writes each token's predecessor into its position, and an *induction* head in
layer 1 whose query (the current token) matches that key and copies the token it sits on.

Named positions for the analyses (``plateauscope.tasks.base.Task``): the prediction position is the
last input position; the *cue* of a query in the second half is the position after the earlier
occurrence of its token (it moves with ``k``); the ``previous token`` rule is the position before
the query. A prompt pair changes the cue token of the prediction position to one the sequence
does not use, so copying predicts that token instead.

The progress measure is ``repeat_loss``, the loss on the second half of repeat sequences, against
log V (V = ``vocab_size``): it sits near log V until the two heads form, then drops. Its cue effect
``delta_cue`` is the repeat loss with the first copy replaced by unused tokens, minus the repeat
loss: ~0 while the model ignores the earlier copy, large once it copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Bool, Int
from torch import Tensor, nn

from plateauscope.errors import ConfigError
from plateauscope.model.backend import logits_at
from plateauscope.model.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.base import AttentionRule, ProgressMeasure, PromptPairs, ReferencePredictor, Task

BOS = "<BOS>"


@dataclass(frozen=True)
class InductionConfig(JsonConfig):
    """The random-segment data set."""

    vocab_size: int = 64
    """Random tokens (the vocabulary adds ``<BOS>``); the plateau height is log vocab_size."""
    segment_len: int = 16
    """L: tokens in a segment (and in the second half)."""
    max_gap: int = 16
    """F: filler tokens around the first copy; a sequence has ``1 + F + 2L`` tokens, and the second half
    starts ``L + F - k`` positions after the first copy, ``k`` uniform in ``[0, F]``."""
    n_sequences: int = 8192
    """Sequences in the data set (training minibatches are drawn from them)."""
    repeat_fraction: float = 1.0
    """Share of the sequences whose second half repeats the segment (the rest cannot be copied)."""
    seed: int = 0
    """Seed of the data set; independent of the training seed."""
    first_id: int = 1
    """The random tokens are the ids ``first_id .. first_id + vocab_size - 1`` (a probe of a model trained elsewhere
    keeps them clear of its tokenizer's special tokens)."""
    bos_id: int | None = 0
    """The start token at position 0; None: no start token (position 0 holds one more random token)."""

    def validate(self) -> None:
        """Fail with one line when the request is impossible."""
        if self.segment_len < 3:
            raise ConfigError(f"segment_len must be at least 3, got {self.segment_len}")
        if self.max_gap < 0:
            raise ConfigError(f"max_gap must be at least 0, got {self.max_gap}")
        need = 2 * self.segment_len + self.max_gap + 1
        if self.vocab_size < need:
            raise ConfigError(f"vocab_size={self.vocab_size} must be at least 2 * segment_len + max_gap + 1 = {need} "
                              "(every token of a sequence distinct, and one left for a corrupted cue)")
        if self.first_id < 0 or (self.bos_id is not None and self.first_id <= self.bos_id < self.first_id
                                                          + self.vocab_size):
            raise ConfigError(f"the random tokens {self.first_id}..{self.first_id + self.vocab_size - 1} must be "
                              f"non-negative ids that leave out the start token {self.bos_id}")
        if self.n_sequences < 2:
            raise ConfigError(f"n_sequences must be at least 2, got {self.n_sequences}")
        if not 0.0 < self.repeat_fraction <= 1.0:
            raise ConfigError(f"repeat_fraction must lie in (0, 1], got {self.repeat_fraction}")


@dataclass
class EvalSequences:
    """The fixed sequences every evaluation of an induction run reads."""

    repeats: Int[Tensor, "E seq"]
    """Repeat sequences from the data set."""
    unrelated: Int[Tensor, "E seq"]
    """The same sequences with the first copy replaced by tokens the sequence does not use."""
    mixed: Int[Tensor, "M seq"]
    """Sequences of the data set as drawn (repeats and others): the training loss."""


def _distinct_tokens(gen: torch.Generator, n: int, length: int, vocab: int, avoid: Tensor | None = None,
                     first: int = 1) -> Int[Tensor, "n length"]:
    """``n`` rows of ``length`` distinct token ids in ``[first, first + vocab)``, none of them in ``avoid``'s row
    (ids outside that range in ``avoid`` are ignored)."""
    scores = torch.rand(n, vocab, generator=gen)
    if avoid is not None:
        index = avoid - first
        inside = (index >= 0) & (index < vocab)
        rows = torch.arange(n)[:, None].expand_as(index)
        scores[rows[inside], index[inside]] = 2.0  # the avoided tokens sort last
    return scores.argsort(dim=1)[:, :length] + first


def in_context_ngrams(tokens: Int[Tensor, "N seq"], positions: list[int], vocab: int
                      ) -> tuple[Tensor, Tensor]:
    """The in-context unigram and bigram predictions of the token after each of ``positions``: the
    counts of the tokens at ``1 .. p`` (``<BOS>`` left out), and of the tokens that followed an earlier
    occurrence of the token at ``p`` (the unigram's where there is none), each normalised."""
    n = len(tokens)
    unigram = torch.zeros(n, len(positions), vocab, dtype=torch.float64)
    bigram = torch.zeros_like(unigram)
    ones = torch.ones(n, 1, dtype=torch.float64)
    for i, p in enumerate(positions):
        context = tokens[:, 1: p + 1]
        unigram[:, i].scatter_add_(1, context, ones.expand_as(context))
        follows = tokens[:, 1: p] == tokens[:, p, None]  # earlier occurrences of the current token
        bigram[:, i].scatter_add_(1, tokens[:, 2: p + 1], follows.double())
    unigram /= unigram.sum(-1, keepdim=True)
    seen = bigram.sum(-1, keepdim=True)
    bigram = torch.where(seen > 0, bigram / seen.clamp_min(1.0), unigram)
    return unigram, bigram


def token_names(cfg: InductionConfig) -> list[str]:
    """The vocabulary, by id: ``<BOS>`` at the start token's id, ``t0 ..`` for the random tokens, ``<id>`` for an
    id a probe leaves out (a model's special tokens)."""
    size = max(cfg.first_id + cfg.vocab_size, -1 if cfg.bos_id is None else cfg.bos_id + 1)
    names = [f"<{i}>" for i in range(size)]
    names[cfg.first_id: cfg.first_id + cfg.vocab_size] = (f"t{i}" for i in range(cfg.vocab_size))
    if cfg.bos_id is not None:
        names[cfg.bos_id] = BOS
    return names


class InductionTask(Task):
    """Random segments and their repeats: the task whose circuit (previous-token head, then an
    induction head) is known."""

    name: ClassVar[str] = "induction"
    Config: ClassVar[type] = InductionConfig
    capabilities: ClassVar[frozenset[str]] = frozenset({"cue", "pairs", "references"})
    default_model: ClassVar[ModelConfig] = ModelConfig(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256,
                                                       attn_only=True)
    default_train: ClassVar[TrainConfig] = TrainConfig(batch_size=64, max_steps=1500, eval_every=10, ckpt_every=5,
                                                       eval_groups=256, tracked_groups=256, stop_after_tau=1.5)

    def __init__(self, cfg: InductionConfig, tokens: Tensor, repeats: Bool[Tensor, " D"], gaps: Int[Tensor, " D"]):
        self.cfg = cfg
        self.vocab = token_names(cfg)
        self.tokens = tokens
        self.repeats = repeats
        """Whether each sequence's second half repeats its segment."""
        self.gaps = gaps
        """k: filler tokens before each sequence's first copy."""

    @classmethod
    def generate(cls, cfg: InductionConfig) -> InductionTask:
        """The seeded data set."""
        cfg.validate()
        gen = torch.Generator().manual_seed(cfg.seed)
        n, L, F = cfg.n_sequences, cfg.segment_len, cfg.max_gap
        # segment, filler, fresh second half (and the token at position 0 where there is no start token)
        drawn = _distinct_tokens(gen, n, 2 * L + F + (cfg.bos_id is None), cfg.vocab_size, first=cfg.first_id)
        segment, filler, fresh = drawn[:, :L], drawn[:, L: L + F], drawn[:, L + F: 2 * L + F]
        gaps = torch.randint(0, F + 1, (n,), generator=gen)
        repeats = torch.rand(n, generator=gen) < cfg.repeat_fraction
        tokens = torch.zeros(n, 1 + F + 2 * L, dtype=torch.long)
        tokens[:, 0] = drawn[:, -1] if cfg.bos_id is None else cfg.bos_id
        tokens[:, 1 + F + L:] = torch.where(repeats[:, None], segment, fresh)
        # the first part: k fillers, the segment, F - k fillers
        offset = torch.arange(F + L)[None, :] - gaps[:, None]  # [n, F + L]: index into the segment where in it
        in_segment = (offset >= 0) & (offset < L)
        filler_index = torch.where(offset < 0, torch.arange(F + L)[None, :], torch.arange(F + L)[None, :] - L)
        tokens[:, 1: 1 + F + L] = torch.where(in_segment, segment.gather(1, offset.clamp(0, L - 1)),
                                              filler.gather(1, filler_index.clamp(0, max(F - 1, 0))) if F else 0)
        return cls(cfg, tokens, repeats, gaps)

    def records(self) -> list[dict]:
        """One line per sequence: whether it repeats, its gap k, and its tokens as one string."""
        return [{"repeat": bool(r), "gap": int(k), "tokens": " ".join(self.decode(t))}
                for t, r, k in zip(self.tokens, self.repeats, self.gaps)]

    # ---- the loss and the progress measure ----------------------------------------------

    @property
    def loss_positions(self) -> list[int]:
        """The second half after its first token: positions F + L + 1 .. F + 2L - 1 predict r_2 .. r_L."""
        L, F = self.cfg.segment_len, self.cfg.max_gap
        return list(range(F + L + 1, F + 2 * L))

    @property
    def progress(self) -> ProgressMeasure:
        """The repeat loss against log V, with ``delta_cue`` as its cue effect."""
        return ProgressMeasure("repeat_loss", math.log(self.cfg.vocab_size), "log_v", True, "delta_cue",
                               "repeat loss", "log V", "Δcue")

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> EvalSequences:
        """``n_eval`` seeded repeat sequences (and their unrelated-first-copy twins), and ``n_tracked``
        sequences of the data set as drawn."""
        gen = torch.Generator().manual_seed(seed + 1_000_003)  # not the training data order
        rep = self.repeats.nonzero()[:, 0]
        chosen = rep[torch.randperm(len(rep), generator=gen)[: n_eval]]
        repeats = self.tokens[chosen]
        L = self.cfg.segment_len
        first_copy = self.gaps[chosen, None] + 1 + torch.arange(L)  # [E, L]
        unrelated = repeats.clone().scatter_(
            1, first_copy, _distinct_tokens(gen, len(chosen), L, self.cfg.vocab_size, avoid=repeats,
                                            first=self.cfg.first_id))
        mixed = self.tokens[torch.randperm(len(self.tokens), generator=gen)[: n_tracked]]
        return EvalSequences(repeats, unrelated, mixed)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, evalset: EvalSequences, batch_size: int = 512,
                 training_loss: bool = True) -> dict:
        """``repeat_loss``, ``accuracy`` (every repeated token the argmax) and ``token_accuracy`` on
        repeat sequences, ``delta_cue``, and ``loss`` (the training loss on sequences as drawn; not with
        ``training_loss=False``, which saves its forward)."""
        pos = torch.tensor(self.loss_positions)

        def logp_at(seqs: Tensor, at: Tensor) -> tuple[Tensor, Tensor]:
            device = next(model.parameters()).device
            logps, hits = [], []
            for chunk in seqs.split(batch_size):
                logits = logits_at(model, chunk[:, : self.input_len].to(device), at).float().log_softmax(-1).cpu()
                target = chunk[:, at + 1]
                logps.append(logits.gather(-1, target[..., None])[..., 0])
                hits.append(logits.argmax(-1) == target)
            return torch.cat(logps), torch.cat(hits)

        rep_logp, rep_hit = logp_at(evalset.repeats, pos)
        unrelated_logp, _ = logp_at(evalset.unrelated, pos)
        repeat_loss = -rep_logp.mean().item()
        loss = {"loss": -logp_at(evalset.mixed, pos)[0].mean().item()} if training_loss else {}
        return {
            **loss,
            "repeat_loss": repeat_loss,
            "delta_cue": -unrelated_logp.mean().item() - repeat_loss,
            "accuracy": rep_hit.all(-1).float().mean().item(),
            "token_accuracy": rep_hit.float().mean().item(),
        }

    def evaluate_without_loss(self, model: nn.Module, evalset: EvalSequences) -> dict:
        """:meth:`evaluate` without the training loss (two forwards of the three)."""
        return self.evaluate(model, evalset, training_loss=False)

    def reference_predictors(self) -> list[ReferencePredictor]:
        """Uniform over the V random tokens; the in-context unigram (the tokens of the context so far, by
        count); the in-context bigram (the tokens that followed earlier occurrences of the current token,
        by count; the unigram where the current token has none). On a repeat sequence the bigram is the
        copy: the token after the earlier occurrence."""
        return [ReferencePredictor("uniform", "uniform", self._uniform),
                ReferencePredictor("unigram", "unigram (in context)", lambda t: in_context_ngrams(t, self.loss_positions,
                                                                                                len(self.vocab))[0]),
                ReferencePredictor("bigram", "bigram (in context)", lambda t: in_context_ngrams(t, self.loss_positions,
                                                                                              len(self.vocab))[1])]

    def _uniform(self, tokens: Int[Tensor, "N seq"]) -> Tensor:
        probs = torch.zeros(len(tokens), len(self.loss_positions), len(self.vocab))
        first = self.cfg.first_id
        probs[..., first: first + self.cfg.vocab_size] = 1.0 / self.cfg.vocab_size  # never <BOS>
        return probs

    def summary_fields(self) -> dict:
        """V, L and the share of repeat sequences."""
        return {"vocab_size": self.cfg.vocab_size, "segment_len": self.cfg.segment_len,
                "repeat_fraction": self.cfg.repeat_fraction}

    # ---- what the analyses read ---------------------------------------------------------

    @property
    def pred_pos(self) -> int:
        """The last input position (it predicts r_L)."""
        return self.input_len - 1

    def cue_positions(self, tokens: Int[Tensor, "N seq"], query: int) -> Int[Tensor, "N C"]:
        """The position after the earlier occurrence of the query's token (none outside r_1 .. r_{L-1},
        or where the token has no earlier occurrence)."""
        none = torch.empty(len(tokens), 0, dtype=torch.long)
        if not self.loss_positions[0] <= query <= self.loss_positions[-1]:
            return none
        earlier = (tokens[:, 1: query] == tokens[:, query, None]).long()  # [N, query - 1]: one hit in a repeat
        if not (earlier.sum(1) == 1).all():
            return none
        return (earlier.argmax(1) + 2)[:, None]  # the match sits at 1 + its index; the cue one after it

    def attention_rules(self) -> dict[str, AttentionRule]:
        """The cue (the induction pattern, from the loss positions) and the previous token (from every
        position after ``<BOS>``: a previous-token head works where the induction head reads keys)."""
        return {**super().attention_rules(), "previous token": AttentionRule(
            list(range(1, self.input_len)), lambda tokens, query: torch.full((len(tokens), 1), query - 1))}

    def sample_examples(self, n: int, seed: int) -> Int[Tensor, " n"]:
        """``n`` seeded repeat sequences (all of them if there are fewer)."""
        rep = self.repeats.nonzero()[:, 0]
        gen = torch.Generator().manual_seed(seed)
        return rep[torch.randperm(len(rep), generator=gen)[: min(n, len(rep))]]

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """Repeat sequences cut after ``pred_pos``; the corrupted prompt has another token (one the
        sequence does not use) at the cue position, so copying predicts that token instead."""
        examples = self.sample_examples(n, seed)
        clean = self.tokens[examples, : self.pred_pos + 1]
        cue = self.cue_positions(self.tokens[examples], self.pred_pos)  # [N, 1]
        gen = torch.Generator().manual_seed(seed + 1)
        replacement = _distinct_tokens(gen, len(examples), 1, self.cfg.vocab_size, avoid=self.tokens[examples],
                                       first=self.cfg.first_id)
        corrupt = clean.clone().scatter_(1, cue, replacement)
        replacement = replacement[:, 0]
        return PromptPairs(clean=clean, corrupt=corrupt, clean_answer=self.tokens[examples, self.pred_pos + 1],
                           corrupt_answer=replacement, examples=examples, pred_pos=self.pred_pos)

    def position_labels(self, n_pos: int) -> list[str]:
        """BOS, the first part's positions p1 .. p(F+L) (where the segment sits varies), r1 .. rL."""
        L, F = self.cfg.segment_len, self.cfg.max_gap
        names = ["BOS", *(f"p{i}" for i in range(1, F + L + 1)), *(f"r{i}" for i in range(1, L + 1))]
        return names[:n_pos]

    def describe(self) -> str:
        """``induction (V=64, L=16, F=16)``."""
        return f"induction (V={self.cfg.vocab_size}, L={self.cfg.segment_len}, F={self.cfg.max_gap})"

    def eval_sequences(self, evalset: EvalSequences) -> Int[Tensor, "E seq"]:
        """The repeat sequences of the evaluation set."""
        return evalset.repeats

