"""The wind tunnel: n_b base strings B, K shared selectors z, K unique targets A per B.

The variants of ``TaskConfig`` change how the strings are drawn: ``target_uniqueness=group``
(targets distinct within a group only), ``tails=by_first_char`` (A[1:] a fixed global function of
A[0]), ``selectors=private`` (each group draws its own K selectors; ``z_tokens`` is then
``[n_b, K, z_len]``), and the layout ones (``order``, ``no_z``, in ``training.layout``).
With the default options the strings are drawn exactly as before the variants existed.

``Task.generate(cfg)`` is deterministic in ``cfg.seed``. Examples are ordered by group then
selector, so example ``g * K + j`` is (B_g, z_j) -> A_gj. Both directions share the same
strings; only the token layout (``training.layout``) differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from training.config import TaskConfig
from training.layout import BOS, SEP, SPECIAL_TOKENS, Layout, vocabulary


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


def _unique_targets(rng: np.random.Generator, cfg: TaskConfig) -> np.ndarray:
    """Digit array [n_b, K, a_len] of targets, unique globally or within each group as asked
    (distinct first digits per group if asked; tails by first digit if asked)."""
    n_chars = len(cfg.alphabet)
    tail_space = n_chars ** (cfg.a_len - 1)
    if cfg.tails == "by_first_char":  # validate() guarantees distinct_first_char
        first = np.argsort(rng.random((cfg.n_b, n_chars)), axis=1)[:, : cfg.K]
        tail_of = rng.integers(0, tail_space, size=n_chars)  # one global tail per first character
        return _digits(first * tail_space + tail_of[first], n_chars, cfg.a_len)
    if cfg.target_uniqueness == "group":
        if cfg.distinct_first_char:
            first = np.argsort(rng.random((cfg.n_b, n_chars)), axis=1)[:, : cfg.K]
            codes = first * tail_space + rng.integers(0, tail_space, size=(cfg.n_b, cfg.K))
        else:
            codes = _distinct_per_row(rng, cfg.n_b, cfg.K, n_chars**cfg.a_len)
        return _digits(codes, n_chars, cfg.a_len)
    if cfg.distinct_first_char:
        first = np.argsort(rng.random((cfg.n_b, n_chars)), axis=1)[:, : cfg.K]
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
class Task:
    """A generated data set and its token tensors."""

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
    def generate(cls, cfg: TaskConfig) -> Task:
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
    def from_records(cls, cfg: TaskConfig, records: list[dict]) -> Task:
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
    def from_token_arrays(cls, cfg: TaskConfig, b: np.ndarray, z: np.ndarray, a: np.ndarray) -> Task:
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

    def decode(self, tokens: Int[Tensor, " seq"]) -> list[str]:
        """Token ids back to text."""
        return [self.vocab[t] for t in tokens.tolist()]

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

