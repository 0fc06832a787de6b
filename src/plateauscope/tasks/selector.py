"""The wind tunnel: n_b base strings B, K shared selectors z, K unique targets A per B.

The variants of ``TaskConfig`` change how the strings are drawn: ``target_uniqueness=group``
(targets distinct within a group only), ``tails=by_first_char`` (A[1:] a fixed global function of
A[0]), ``selectors=private`` (each group draws its own K selectors; ``z_tokens`` is then
``[n_b, K, z_len]``), ``target_pool=M`` (every group's targets come from one pool of M strings),
``first_char_zipf=s`` (Zipf-distributed first characters), and the layout ones (``order``,
``no_z``, in ``training.layout``).
With the default options the strings are drawn exactly as before the variants existed.

``SelectorTask.generate(cfg)`` is deterministic in ``cfg.seed``. Examples are ordered by group then
selector, so example ``g * K + j`` is (B_g, z_j) -> A_gj. Both directions share the same
strings; only the token layout (``training.layout``) differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.tasks import selector_metrics as metrics
from plateauscope.tasks.base import ProgressMeasure, PromptPairs, ReferencePredictor, Task
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_layout import (
    BOS,
    SEP,
    SPECIAL_TOKENS,
    Layout,
    vocabulary,
)


def _distinct_codes(rng: np.random.Generator, n: int, space: int) -> np.ndarray:
    """``n`` distinct integers in ``[0, space)``, in random order."""
    if space <= 1_000_000:
        return rng.permutation(space)[:n]
    codes = np.empty(0, dtype=np.int64)
    while len(codes) < n:
        draw = rng.integers(0, space, size=2 * (n - len(codes)) + 16)
        merged = np.concatenate([codes, draw])
        _, first = np.unique(merged, return_index=True)
        codes = merged[np.sort(first)]
    return codes[:n]


def _digits(codes: np.ndarray, base: int, length: int) -> np.ndarray:
    """Integer codes to their base-``base`` digits, most significant first."""
    powers = base ** np.arange(length - 1, -1, -1, dtype=np.int64)
    return (codes[..., None] // powers) % base


def _distinct_per_row(rng: np.random.Generator, rows: int, n: int, space: int) -> np.ndarray:
    """``[rows, n]`` integers in ``[0, space)``, distinct within each row (n <= space)."""
    if rows * space <= 4_000_000:
        return np.argsort(rng.random((rows, space)), axis=1)[:, :n]
    codes = rng.integers(0, space, size=(rows, n))
    while True:  # redraw the repeats of a row until every row is distinct
        order = np.argsort(codes, axis=1, kind="stable")
        srt = np.take_along_axis(codes, order, axis=1)
        dup_sorted = np.zeros_like(codes, dtype=bool)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        if not dup_sorted.any():
            return codes
        dup = np.zeros_like(dup_sorted)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        codes[dup] = rng.integers(0, space, size=int(dup.sum()))


def _first_chars(rng: np.random.Generator, cfg: TaskConfig) -> np.ndarray:
    """``[n_b, K]`` distinct first digits per group: uniform, or a Zipf-weighted draw without
    replacement (``first_char_zipf``; Gumbel top-K, which is sequential weighted sampling)."""
    n_chars = len(cfg.alphabet)
    u = rng.random((cfg.n_b, n_chars))
    if not cfg.first_char_zipf:
        return np.argsort(u, axis=1)[:, : cfg.K]
    log_w = -cfg.first_char_zipf * np.log(np.arange(1, n_chars + 1))
    with np.errstate(divide="ignore"):
        keys = log_w - np.log(-np.log(u))
    return np.argsort(-keys, axis=1, kind="stable")[:, : cfg.K]


def _unique_targets(rng: np.random.Generator, cfg: TaskConfig) -> np.ndarray:
    """Digit array [n_b, K, a_len] of targets, unique globally or within each group as asked
    (distinct first digits per group if asked, Zipf-weighted if asked; tails by first digit if
    asked; drawn from one shared pool if asked)."""
    n_chars = len(cfg.alphabet)
    if cfg.target_pool:  # validate() guarantees group uniqueness, random tails, no distinct first chars
        pool = _distinct_codes(rng, cfg.target_pool, n_chars**cfg.a_len)
        return _digits(pool[_distinct_per_row(rng, cfg.n_b, cfg.K, cfg.target_pool)], n_chars, cfg.a_len)
    tail_space = n_chars ** (cfg.a_len - 1)
    if cfg.tails == "by_first_char":  # validate() guarantees distinct_first_char
        first = _first_chars(rng, cfg)
        tail_of = rng.integers(0, tail_space, size=n_chars)  # one global tail per first character
        return _digits(first * tail_space + tail_of[first], n_chars, cfg.a_len)
    if cfg.target_uniqueness == "group":
        if cfg.distinct_first_char:
            first = _first_chars(rng, cfg)
            codes = first * tail_space + rng.integers(0, tail_space, size=(cfg.n_b, cfg.K))
        else:
            codes = _distinct_per_row(rng, cfg.n_b, cfg.K, n_chars**cfg.a_len)
        return _digits(codes, n_chars, cfg.a_len)
    if cfg.distinct_first_char:
        first = _first_chars(rng, cfg)
        tails = rng.integers(0, tail_space, size=(cfg.n_b, cfg.K))
        while True:  # redraw the tails of repeated targets until every target is unique
            codes = (first * tail_space + tails).ravel()
            _, first_idx = np.unique(codes, return_index=True)
            repeated = np.ones(codes.size, dtype=bool)
            repeated[first_idx] = False
            if not repeated.any():
                break
            tails.ravel()[repeated] = rng.integers(0, tail_space, size=int(repeated.sum()))
        codes = codes.reshape(cfg.n_b, cfg.K)
    else:
        codes = _distinct_codes(rng, cfg.D, n_chars**cfg.a_len).reshape(cfg.n_b, cfg.K)
    return _digits(codes, n_chars, cfg.a_len)


@dataclass
class SelectorTask(Task):
    """The (B, z) -> A task: a generated data set, its token tensors and its layout."""

    name: ClassVar[str] = "selector"
    Config: ClassVar[type] = TaskConfig

    cfg: TaskConfig
    layout: Layout
    vocab: list[str]
    b_tokens: Int[Tensor, "n_b b_len"]
    z_tokens: Int[Tensor, "K z_len"] | Int[Tensor, "n_b K z_len"]
    """The selectors: ``[K, z_len]`` shared by all groups, or ``[n_b, K, z_len]`` with ``selectors=private``."""
    a_tokens: Int[Tensor, "n_b K a_len"]
    tokens: Int[Tensor, "D seq"]
    """Every example as a full token sequence, example index = group * K + selector."""
    group: Int[Tensor, " D"]
    selector: Int[Tensor, " D"]

    @classmethod
    def generate(cls, cfg: TaskConfig) -> SelectorTask:
        """The seeded data set of a task configuration."""
        cfg.validate()
        rng = np.random.default_rng(cfg.seed)
        n_chars = len(cfg.alphabet)
        b = _digits(_distinct_codes(rng, cfg.n_b, n_chars**cfg.b_len), n_chars, cfg.b_len)
        if cfg.selectors == "private":
            z = _digits(_distinct_per_row(rng, cfg.n_b, cfg.K, n_chars**cfg.z_len), n_chars, cfg.z_len)
        else:
            z = _digits(_distinct_codes(rng, cfg.K, n_chars**cfg.z_len), n_chars, cfg.z_len)
        a = _unique_targets(rng, cfg)
        offset = len(SPECIAL_TOKENS)  # the alphabet's ids follow the special tokens'
        return cls.from_token_arrays(cfg, b + offset, z + offset, a + offset)

    @classmethod
    def from_records(cls, cfg: TaskConfig, records: list[dict]) -> SelectorTask:
        """Rebuild from ``dataset.jsonl`` records (b, z, a, group, selector)."""
        vocab = vocabulary(cfg.alphabet)
        index = {ch: i for i, ch in enumerate(vocab)}
        b = np.zeros((cfg.n_b, cfg.b_len), dtype=np.int64)
        private = cfg.selectors == "private"
        z = np.zeros((cfg.n_b, cfg.K, cfg.z_len) if private else (cfg.K, cfg.z_len), dtype=np.int64)
        a = np.zeros((cfg.n_b, cfg.K, cfg.a_len), dtype=np.int64)
        for r in records:
            g, j = r["group"], r["selector"]
            b[g] = [index[c] for c in r["b"]]
            z[(g, j) if private else j] = [index[c] for c in r["z"]]
            a[g, j] = [index[c] for c in r["a"]]
        return cls.from_token_arrays(cfg, b, z, a)

    @classmethod
    def from_token_arrays(cls, cfg: TaskConfig, b: np.ndarray, z: np.ndarray, a: np.ndarray) -> SelectorTask:
        """A task from its token arrays of B, z and A per (group, selector) (what the constructors share)."""
        layout = Layout.for_task(cfg)
        vocab = vocabulary(cfg.alphabet)
        b_t, z_t, a_t = (torch.as_tensor(x, dtype=torch.long) for x in (b, z, a))
        D = cfg.n_b * cfg.K
        group = torch.arange(cfg.n_b).repeat_interleave(cfg.K)
        selector = torch.arange(cfg.K).repeat(cfg.n_b)
        tokens = torch.empty(D, layout.seq_len, dtype=torch.long)
        tokens[:, 0] = vocab.index(BOS)
        tokens[:, layout.sep_positions] = vocab.index(SEP)
        tokens[:, slice(*layout.b_span)] = b_t[group]
        tokens[:, slice(*layout.a_span)] = a_t[group, selector]
        if layout.z_span is not None:
            tokens[:, slice(*layout.z_span)] = z_t[group, selector] if z_t.dim() == 3 else z_t[selector]
        return cls(cfg, layout, vocab, b_t, z_t, a_t, tokens, group, selector)

    def records(self) -> list[dict]:
        """One dict per example, for ``dataset.jsonl``."""
        b = ["".join(self.vocab[t] for t in row) for row in self.b_tokens.tolist()]
        z = self.selector_tokens()
        z = [["".join(self.vocab[t] for t in row) for row in grp] for grp in z.tolist()]
        a = [["".join(self.vocab[t] for t in row) for row in grp] for grp in self.a_tokens.tolist()]
        return [
            {"b": b[g], "z": z[g][j], "a": a[g][j], "group": g, "selector": j}
            for g, j in zip(self.group.tolist(), self.selector.tolist())
        ]

    def selector_tokens(self) -> Int[Tensor, "n_b K z_len"]:
        """Selector j of group g, for shared and private selectors alike."""
        if self.z_tokens.dim() == 3:
            return self.z_tokens
        return self.z_tokens[None].expand(self.cfg.n_b, -1, -1)

    def example_ids(self, groups: Int[Tensor, " G"]) -> Int[Tensor, "G K"]:
        """Example indices of the given groups, one row per group in selector order."""
        return groups[:, None] * self.cfg.K + torch.arange(self.cfg.K)

    def candidate_sequences(
        self, groups: Int[Tensor, " G"]
    ) -> Int[Tensor, "G K K seq"]:
        """For each group g, selector j (prefix B_g, z_j) and candidate k: the sequence ending in A_gk.

        Only meaningful backward; the diagonal j == k holds the true examples.
        """
        K = self.cfg.K
        start, stop = self.layout.a_span
        seqs = self.tokens[self.example_ids(groups)][:, :, None, :].repeat(1, 1, K, 1)  # [G, j, k, seq]
        seqs[..., start:stop] = self.a_tokens[groups][:, None, :, :]  # candidate k's target
        return seqs


    # ---- the task protocol (plateauscope.tasks.base) -----------------------------------------

    @property
    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        """Going backward with K >= 2: the plateau verdict and the ladder, and with a selector z the cue, pairs
        and candidates."""
        caps = set()
        if self.cfg.direction == "backward" and self.cfg.K >= 2:
            caps |= {"plateau_reference", "references"}
            if self.cfg.has_selector:
                caps |= {"cue", "pairs", "candidates"}
        return frozenset(caps)

    @property
    def loss_positions(self) -> list[int]:
        """The positions that predict the target tokens."""
        return self.layout.target_pred_positions

    @property
    def progress(self) -> ProgressMeasure:
        """Candidate loss against log K going backward; exact-match accuracy forward (no candidates)."""
        if self.cfg.direction == "backward":
            return ProgressMeasure("candidate_loss", self.cfg.log_k, "log_k", True, "delta_z", "candidate loss",
                                   "log K", "Δz")
        return ProgressMeasure("accuracy", self.cfg.log_k, "log_k", False, None, "exact-match accuracy", "log K", "Δz")

    def build_evalset(self, n_eval: int, n_tracked: int, seed: int) -> Any:
        """``plateauscope.tasks.selector_metrics.EvalSet``: the seeded evaluation and tracked groups."""
        return metrics.EvalSet.build(self, n_eval, n_tracked, seed)

    def untracked(self, evalset: Any) -> Any:
        """The evaluation set without its tracked groups: no ``group_acc`` is logged with it."""
        return dataclasses.replace(evalset, tracked_groups=evalset.tracked_groups[:0],
                                   tracked_seqs=evalset.tracked_seqs[:0])

    def evaluate(self, model: nn.Module, evalset: Any, batch_size: int = 512) -> dict:
        """``plateauscope.tasks.selector_metrics.evaluate``: candidate, set and first-token losses, delta_z, group accuracy."""
        return metrics.evaluate(model, self, evalset, batch_size)

    def eval_sequences(self, evalset: Any) -> Int[Tensor, "E seq"]:
        """The true sequences of the evaluation groups."""
        return evalset.eval_seqs

    def candidate_tree(self, evalset: Any) -> tuple[Int[Tensor, "G K K seq"], tuple[int, ...]]:
        """The K x K candidate sequences of each evaluation group; prefixes split at z and at A."""
        self.require("candidates", "candidate scoring")
        G, K = evalset.shift.shape[0], self.cfg.K
        return evalset.candidate_seqs.view(G, K, K, -1), (self.layout.z_span[0], self.layout.target_span[0])

    def candidate_metrics(self, scores: Float[Tensor, "G K K"], evalset: Any) -> dict[str, float]:
        """``plateauscope.tasks.selector_metrics.candidate_metrics``: candidate loss and accuracy, set loss, delta_z, seq NLL."""
        return metrics.candidate_metrics(scores, evalset.shift)

    def plateau_reference(self, evalset: Any = None) -> dict | None:
        """Going backward (None forward): ``plateauscope.tasks.selector_metrics.know_nothing_reference``,
        with ``global_marginal_reference`` under ``global_marginal``, over ``evalset``'s groups (the
        groups whose set loss the verdict reads; default every group)."""
        if self.cfg.direction != "backward":
            return None
        groups = None if evalset is None else evalset.groups
        return {**metrics.know_nothing_reference(self, groups),
                "global_marginal": metrics.global_marginal_reference(self, groups)}

    def reference_predictors(self) -> list[ReferencePredictor]:
        """Going backward: uniform over the alphabet, p(A), p(A | B), p(A | B, z)
        (``plateauscope.tasks.selector_metrics.target_ladder``); the stages of the paper's title."""
        if "references" not in self.capabilities:
            return []
        rungs = {"uniform": ("uniform", "shelf"), "global_marginal": ("p(A)", "global marginal"),
                 "group_marginal": ("p(A | B)", "marginal"),
                 "conditional": ("p(A | B, z)" if self.cfg.has_selector else "p(A | B, example)", None)}
        return [ReferencePredictor(name, label, lambda tokens, name=name: metrics.target_ladder(self, tokens)[name],
                                   verdict) for name, (label, verdict) in rungs.items()]

    def summary_fields(self) -> dict:
        """D, K and the direction."""
        return {"D": self.cfg.D, "K": self.cfg.K, "direction": self.cfg.direction}

    @property
    def pred_pos(self) -> int:
        """The last ``<SEP>``: it predicts the first target token."""
        return self.layout.first_target_pred_pos

    def cue_positions(self, tokens: Int[Tensor, "N seq"], query: int) -> Int[Tensor, "N C"]:
        """The selector z, for every sequence and query position (none without z)."""
        span = torch.arange(*self.layout.z_span) if self.layout.z_span is not None else torch.empty(0, dtype=torch.long)
        return span.expand(len(tokens), -1)

    def prompt_pairs(self, n: int = 256, seed: int = 0) -> PromptPairs:
        """``n`` seeded pairs ``<BOS> B <SEP> z <SEP>``: same B, another selector (a seeded shift of j).

        The K targets of a group start with distinct characters in the paper-style presets, so the
        first target token alone says which target the model picked: the answers are A_gj[0]
        (clean) and A_gj'[0] (corrupted)."""
        self.require("pairs", "prompt pairs")
        gen = torch.Generator().manual_seed(seed)
        D, K = self.cfg.D, self.cfg.K
        examples = torch.randperm(D, generator=gen)[: min(n, D)]
        shift = torch.randint(1, K, (len(examples),), generator=gen)
        group, sel = self.group[examples], self.selector[examples]
        corrupt_examples = group * K + (sel + shift) % K
        pred_pos, first = self.pred_pos, self.layout.target_span[0]
        return PromptPairs(
            clean=self.tokens[examples, : pred_pos + 1],
            corrupt=self.tokens[corrupt_examples, : pred_pos + 1],
            clean_answer=self.tokens[examples, first],
            corrupt_answer=self.tokens[corrupt_examples, first],
            examples=examples,
            pred_pos=pred_pos,
        )

    def position_labels(self, n_pos: int) -> list[str]:
        """BOS, b1.., SEP, z1.., a1.. (from the layout)."""
        labels = super().position_labels(n_pos)
        spans = [("b", self.layout.b_span), ("z", self.layout.z_span), ("a", self.layout.a_span)]
        for name, span in spans:
            if span is None:
                continue
            for i, pos in enumerate(range(*span)):
                if pos < n_pos:
                    labels[pos] = f"{name}{i + 1}"
        for pos in self.layout.sep_positions:
            if pos < n_pos:
                labels[pos] = "SEP"
        return labels

    def layout_record(self) -> dict:
        """``Layout.to_dict``: the spans of B, z and A."""
        return self.layout.to_dict()

    def describe(self) -> str:
        """``selector (backward, K=10, default)``."""
        return f"selector ({self.cfg.direction}, K={self.cfg.K}, {self.cfg.variant_label()})"
