"""What the ground floor asks of the layers above it, as structural types: it knows no task and no
intervention, only the few members of theirs that its forwards and its loss read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from jaxtyping import Float, Int
from torch import Tensor


@runtime_checkable
class TaskPositions(Protocol):
    """Where a task's loss reads the logits: the logits at ``p`` predict token ``p + 1``."""

    @property
    def input_len(self) -> int:
        """Tokens fed to the model: a full sequence without its last token."""

    @property
    def loss_positions(self) -> Sequence[int]:
        """The positions whose logits the loss counts."""


@runtime_checkable
class TaskLoss(TaskPositions, Protocol):
    """A task's positions and its loss (:class:`plateauscope.tasks.base.Task` has both)."""

    def loss(self, logits: Float[Tensor, "N in_len vocab"], tokens: Int[Tensor, "N seq"]) -> Float[Tensor, ""]:
        """The training objective from the logits at every position."""

    def loss_at_positions(self, logits: Float[Tensor, "N n_loss vocab"], tokens: Int[Tensor, "N seq"]
                          ) -> Float[Tensor, ""]:
        """The same objective from the logits at ``loss_positions`` alone."""


@runtime_checkable
class AttentionEdit(Protocol):
    """An edit of some heads' attention patterns inside the fused forward (a clamp:
    :class:`plateauscope.runs.interventions.PatternClamp`)."""

    @property
    def layers(self) -> frozenset[int]:
        """The layers whose pattern it edits."""

    def apply(self, pattern: Float[Tensor, "batch head q k"], layer: int, queries: Sequence[int] | None = None,
              tokens: Int[Tensor, "batch k"] | None = None) -> Float[Tensor, "batch head q k"]:
        """``pattern`` of ``layer`` edited (``queries``: its query rows' positions; ``tokens``: the forward's input)."""
