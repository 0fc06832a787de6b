"""Inputs shared by the analyses: clean / corrupted prompt pairs and the metric on them.

The pairs come from the task (``Task.prompt_pairs``, capability ``pairs``): a *prompt* is a
sequence cut just after its prediction position (``task.pred_pos``), whose logits predict the
answer. For the selector task a pair shares B and differs in the selector z, so the correct first
target token changes from A_gj[0] to A_gj'[0]; for induction the corrupted prompt changes the
token after the earlier occurrence, so copying predicts another token.

Metric (sign: positive = the model prefers the clean answer): the logit difference
``logit[clean_answer] - logit[corrupt_answer]`` at the prediction position, averaged over pairs.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from plateauscope.tasks.base import PromptPairs, Task

__all__ = ["PromptPairs", "prompt_pairs", "logit_diff", "last_logit_diff"]


def prompt_pairs(task: Task, n: int = 256, seed: int = 0) -> PromptPairs:
    """``n`` seeded (clean, corrupted) prompt pairs of the task (a one-line error if it has none)."""
    task.require("pairs", "patching")
    if n < 1:
        raise ValueError(f"the number of prompt pairs must be at least 1, got {n}")
    return task.prompt_pairs(n, seed)


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
