"""The ladder of reference predictors, read at every evaluation: how far the model is from each rung.

A task may declare a ladder (``Task.reference_predictors``, capability ``references``): fixed rules
for the next token at the loss positions, from one that knows nothing to the full conditional
(the selector task: uniform over the alphabet, p(A), p(A | B), p(A | B, z)). At every evaluation
the training loop logs, for each rung, ``kl_<name>``: the model's KL divergence from it,

    KL(reference || model) = sum_v r(v) (log r(v) - log q(v)),

averaged over the reference sequences (at most :data:`REFERENCE_SEQUENCES` of the evaluation set)
and the loss positions. It is 0 for a model that is exactly the reference and finite where the
reference is one-hot (then it is the model's cross-entropy on that token).

The **stage** of an evaluation is the rung with the smallest KL, when every other rung is at least
:data:`STAGE_MARGIN` nats further; otherwise the evaluation lies *between* rungs (stage None).
``summary.json``'s ``ladder`` block lists the stages as segments of steps and reads the plateau
as the stage that holds most of its evaluations (:func:`ladder_summary`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from plateauscope.model.backend import logits_at
from plateauscope.tasks.base import Task, TaskError

REFERENCE_SEQUENCES = 256
"""The evaluation sequences (the first ones of ``Task.reference_sequences``) the KL is averaged over."""
STAGE_MARGIN = 0.1
"""Nats: the closest rung is the stage only when every other rung is at least this much further."""


def kl_key(name: str) -> str:
    """The ``metrics.jsonl`` field of a reference's KL."""
    return f"kl_{name}"


@dataclass
class ReferenceLadder:
    """A task's ladder evaluated once on the run's fixed reference sequences."""

    names: list[str]
    """The rungs' names, from the one that knows least to the full conditional."""
    labels: list[str]
    """How figures write them."""
    sequences: Int[Tensor, "E seq"]
    """The reference sequences."""
    probs: Float[Tensor, "R E n_loss vocab"]
    """Each rung's next-token probabilities at the loss positions."""
    neg_entropy: Float[Tensor, " R"]
    """Each rung's mean sum_v r log r (so that the KL is this minus the mean sum_v r log q)."""

    @classmethod
    def build(cls, task: Task, evalset: Any, max_sequences: int = REFERENCE_SEQUENCES) -> ReferenceLadder | None:
        """The ladder of ``task`` on its evaluation set (None: the task declares none)."""
        if "references" not in task.capabilities:
            return None
        rungs = task.reference_predictors()
        if not rungs:
            raise TaskError(f"task {task.describe()}: it offers 'references' but reference_predictors() is empty")
        seqs = task.reference_sequences(evalset)[:max_sequences]
        shape = (len(seqs), len(task.loss_positions), len(task.vocab))
        probs = []
        for rung in rungs:
            p = rung.predict(seqs).double()
            if tuple(p.shape) != shape:
                raise TaskError(f"task {task.describe()}: reference {rung.name!r} predicts shape {tuple(p.shape)}, "
                                f"expected {shape} (sequences, loss positions, vocabulary)")
            if (p < 0).any() or not torch.allclose(p.sum(-1), torch.ones(shape[:2], dtype=p.dtype), atol=1e-6):
                raise TaskError(f"task {task.describe()}: reference {rung.name!r} is not a distribution "
                                "(negative entries, or rows that do not sum to 1)")
            probs.append(p)
        stacked = torch.stack(probs)
        plogp = torch.where(stacked > 0, stacked * stacked.clamp_min(1e-300).log(), torch.zeros(()))
        return cls([r.name for r in rungs], [r.label for r in rungs], seqs, stacked.float(),
                   plogp.sum(-1).mean((1, 2)).float())

    @torch.inference_mode()
    def kl(self, model: nn.Module, task: Task, batch_size: int = 512) -> dict[str, float]:
        """``{kl_<name>: KL(reference || model)}``, averaged over the sequences and loss positions."""
        device = next(model.parameters()).device
        pos = torch.tensor(task.loss_positions)
        cross = torch.zeros(len(self.names), dtype=torch.float64)
        for chunk, probs in zip(self.sequences.split(batch_size), self.probs.split(batch_size, dim=1)):
            logq = logits_at(model, chunk[:, : task.input_len].to(device), pos).float().log_softmax(-1).cpu()
            # sum_v r log q, where r > 0 only (a zero of the model where r = 0 costs nothing)
            terms = torch.where(probs > 0, probs * logq, torch.zeros(()))
            cross += terms.sum((-1, -2)).double().sum(-1)
        n = self.probs.shape[1] * self.probs.shape[2]
        kls = self.neg_entropy.double() - cross / n
        return {kl_key(name): max(float(v), 0.0) for name, v in zip(self.names, kls)}


def stage_of(record: dict, names: list[str], margin: float = STAGE_MARGIN) -> str | None:
    """The rung closest to the model at one evaluation, or None when two are within ``margin`` nats
    (or the record has no KL)."""
    kls = [(record[kl_key(n)], n) for n in names if record.get(kl_key(n)) is not None]
    if len(kls) < len(names) or not kls:
        return None
    kls.sort()
    return kls[0][1] if len(kls) == 1 or kls[1][0] - kls[0][0] >= margin else None


def stage_segments(records: list[dict], names: list[str], margin: float = STAGE_MARGIN) -> list[dict]:
    """Consecutive evaluations in the same stage: ``[{"stage", "start", "end"}]`` (stage None: between rungs)."""
    segments: list[dict] = []
    for r in records:
        stage = stage_of(r, names, margin)
        if segments and segments[-1]["stage"] == stage:
            segments[-1]["end"] = r["step"]
        else:
            segments.append({"stage": stage, "start": r["step"], "end": r["step"]})
    return segments


def ladder_summary(records: list[dict], names: list[str], labels: list[str], span: tuple[int, int] | list[int] | None,
                   margin: float = STAGE_MARGIN) -> dict | None:
    """The ``ladder`` block of ``summary.json``: the rungs, the stage segments, the plateau's stage
    (the one that holds most of its evaluations, with that share) and the order in which the stages
    were first reached. None when no record carries the KLs."""
    logged = [r for r in records if all(r.get(kl_key(n)) is not None for n in names)]
    if not logged:
        return None
    on = [stage_of(r, names, margin) for r in logged if span and span[0] <= r["step"] <= span[1]]
    plateau_stage, share = None, None
    if on:
        plateau_stage, count = Counter(on).most_common(1)[0]
        share = count / len(on)
    first_reached = {}
    for r in logged:
        s = stage_of(r, names, margin)
        if s is not None and s not in first_reached:
            first_reached[s] = r["step"]
    return {
        "references": [{"name": n, "label": lab} for n, lab in zip(names, labels)],
        "margin": margin,
        "segments": stage_segments(logged, names, margin),
        "plateau_stage": plateau_stage,
        "plateau_stage_share": share,
        "first_reached": first_reached,
        "final_stage": stage_of(logged[-1], names, margin),
    }
