"""Probes: tasks that bring prompts instead of a data set, for a series trained elsewhere.

A probe is a :class:`~plateauscope.tasks.base.Task` built for a given model (its vocabulary size and
context length) rather than trained on: its prompts, attention rules, prompt pairs and measures are what
the analyses read on an imported run (:mod:`plateauscope.runs.series`). It is written against token ids
(or the model's own tokenizer); :meth:`Probe.check_vocab` refuses, in one line, a probe whose tokens fall
outside the model's vocabulary.

Built in (:data:`BUILTIN_PROBES`): ``induction`` (:mod:`plateauscope.tasks.induction_probe`). A probe of
one's own is a ``file.py:Class`` whose class subclasses both a task and :class:`Probe`.

The head scores (:func:`detection_scores`) are TransformerLens's ``head_detector`` measure (``mul``):
per head and sequence, the attention on the detection pattern's entries over all attention, then
averaged over the sequences.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.utilities import get_act_name

from plateauscope.tasks.base import TaskError
from plateauscope.tasks.loading import task_class

BUILTIN_PROBES: dict[str, str] = {"induction": "plateauscope.tasks.induction_probe:InductionProbe"}
"""Probe name -> ``module:Class``."""


class ProbeError(TaskError):
    """A probe that does not fit the model (one line)."""


class Probe:
    """What a probe adds to a task: it is built for a model, and its token ids are checked against it."""

    probe_name: ClassVar[str] = "probe"

    @classmethod
    def for_model(cls, d_vocab: int, n_ctx: int, seed: int = 0, **options: Any) -> Probe:
        """The probe for a model of ``d_vocab`` token ids and context ``n_ctx``."""
        raise NotImplementedError

    def probe_tokens(self) -> Int[Tensor, "N seq"]:
        """Every sequence the probe runs (default: the task's ``tokens``)."""
        return self.tokens  # type: ignore[attr-defined]

    def check_vocab(self, d_vocab: int) -> None:
        """A ProbeError naming the largest token id when one falls outside ``[0, d_vocab)``."""
        tokens = self.probe_tokens()
        top, low = int(tokens.max()), int(tokens.min())
        if top >= d_vocab or low < 0:
            raise ProbeError(f"probe {self.probe_name}: token ids {low}..{top} fall outside the model's vocabulary "
                             f"of {d_vocab} tokens")

    def detection_patterns(self, tokens: Int[Tensor, "N seq"]) -> dict[str, Float[Tensor, "N seq seq"]]:
        """Named detection patterns (0 / 1, lower triangular) per sequence, for :func:`detection_scores`."""
        return {}

    def signals(self, model: nn.Module) -> tuple[dict[str, Float[Tensor, "n_layers n_heads"]], float | None]:
        """What the probe's pass records at each checkpoint: the head scores by name (``head_scores``, where the
        probe has it) and the in-context loss gap (``loss_gap``, or None). A probe may override this to read
        both from one forward."""
        scores = self.head_scores(model) if hasattr(self, "head_scores") else {}
        return scores, (self.loss_gap(model) if hasattr(self, "loss_gap") else None)


def probe_class(spec: str) -> type:
    """The probe class a name (:data:`BUILTIN_PROBES`) or ``file.py:Class`` names; else a one-line ProbeError."""
    if spec in BUILTIN_PROBES:
        module, _, name = BUILTIN_PROBES[spec].partition(":")
        cls = getattr(importlib.import_module(module), name)
    else:
        try:
            cls = task_class(spec)
        except TaskError as e:
            raise ProbeError(f"--probe {spec}: not a built-in probe ({', '.join(BUILTIN_PROBES)}) ({e})") from None
    if not issubclass(cls, Probe):
        raise ProbeError(f"--probe {spec}: {cls.__name__} is a task, not a probe (subclass plateauscope.Probe too)")
    return cls


def build_probe(spec: str, d_vocab: int, n_ctx: int, seed: int = 0, **options: Any) -> Probe:
    """The probe ``spec`` built for a model (``options``: the probe's own, e.g. ``segment_len``), its tokens
    checked against the vocabulary."""
    probe = probe_class(spec).for_model(d_vocab, n_ctx, seed, **options)
    probe.check_vocab(d_vocab)
    return probe


@torch.no_grad()
def logits_and_patterns(model: nn.Module, tokens: Int[Tensor, "N seq"]
                        ) -> tuple[Float[Tensor, "N seq vocab"], Float[Tensor, "N n_layers n_heads seq seq"]]:
    """The logits and every layer's attention pattern on ``tokens``, from one forward."""
    n_layers = model.cfg.n_layers
    names = {get_act_name("pattern", layer) for layer in range(n_layers)}
    device = next(model.parameters()).device
    logits, cache = model.run_with_cache(tokens.to(device), names_filter=lambda name: name in names)
    patterns = torch.stack([cache[get_act_name("pattern", layer)] for layer in range(n_layers)], dim=1)
    return logits.float().cpu(), patterns.float().cpu()


def detection_scores(patterns: Float[Tensor, "N n_layers n_heads seq seq"],
                     detection: Float[Tensor, "N seq seq"]) -> Float[Tensor, "n_layers n_heads"]:
    """``head_detector``'s ``mul`` score per head: attention on the detection pattern over all attention, per
    sequence, averaged over the sequences."""
    hit = (patterns * detection[:, None, None]).sum((-1, -2))
    return (hit / patterns.sum((-1, -2))).mean(0)
