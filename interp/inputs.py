"""Inputs shared by the analyses: clean / corrupted prompt pairs and the first-target metric.

A *prompt* is a sequence cut just before its target: ``<BOS> B <SEP> z <SEP>`` (backward), so
its last position (``layout.first_target_pred_pos``) predicts the first target token. Every
analysis in ``interp`` measures that first target token: the K targets of a group start with
distinct characters in the paper-style presets, so the first token alone says which target
the model picked.

A *pair* shares B and differs in the selector: the clean prompt has z_j, the corrupted one z_j'
with j' != j (a seeded derangement), so the correct first target token changes from
A_gj[0] to A_gj'[0].

Metric (sign: positive = the model prefers the clean answer): the logit difference
``logit[A_gj[0]] - logit[A_gj'[0]]`` at the prediction position, averaged over pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from training.task import Task


@dataclass
class PromptPairs:
    """Clean and corrupted prompts with their answer tokens."""

    clean: Int[Tensor, "N prompt_len"]
    corrupt: Int[Tensor, "N prompt_len"]
    clean_answer: Int[Tensor, " N"]
    """First target token of the clean example (A_gj[0])."""
    corrupt_answer: Int[Tensor, " N"]
    """First target token of the corrupted example (A_gj'[0])."""
    examples: Int[Tensor, " N"]
    """Index of each clean example in the task."""
    pred_pos: int
    """The position whose logits are measured (last position of the prompt)."""


def prompt_pairs(task: Task, n: int = 256, seed: int = 0) -> PromptPairs:
    """``n`` seeded (clean, corrupted) prompt pairs: same B, another selector."""
    if task.cfg.direction != "backward" or task.cfg.K < 2:
        raise ValueError("prompt pairs need the backward task with K >= 2 (a selector to corrupt)")
    if not task.cfg.has_selector:
        raise ValueError("prompt pairs need a selector to corrupt: this task has no_z (the (B) -> A control)")
    gen = torch.Generator().manual_seed(seed)
    D, K = task.cfg.D, task.cfg.K
    examples = torch.randperm(D, generator=gen)[: min(n, D)]
    shift = torch.randint(1, K, (len(examples),), generator=gen)
    group, sel = task.group[examples], task.selector[examples]
    corrupt_examples = group * K + (sel + shift) % K
    pred_pos = task.layout.first_target_pred_pos
    first = task.layout.target_span[0]
    return PromptPairs(
        clean=task.tokens[examples, : pred_pos + 1],
        corrupt=task.tokens[corrupt_examples, : pred_pos + 1],
        clean_answer=task.tokens[examples, first],
        corrupt_answer=task.tokens[corrupt_examples, first],
        examples=examples,
        pred_pos=pred_pos,
    )


def logit_diff(
    logits: Float[Tensor, "N pos vocab"], pairs: PromptPairs, reduce: bool = True
) -> Float[Tensor, "..."]:
    """Clean-answer logit minus corrupted-answer logit at the prediction position."""
    return last_logit_diff(logits[:, pairs.pred_pos], pairs, reduce)


def last_logit_diff(
    last: Float[Tensor, "N vocab"], pairs: PromptPairs, reduce: bool = True
) -> Float[Tensor, "..."]:
    """:func:`logit_diff` from the prediction position's logits alone."""
    diff = last.gather(-1, pairs.clean_answer[:, None].to(last.device))[:, 0] - last.gather(
        -1, pairs.corrupt_answer[:, None].to(last.device)
    )[:, 0]
    return diff.mean() if reduce else diff
