"""The loss of a batch through the fused forward: the one function that training, the seed ensemble, the
per-head LLC and the benches call for a task's objective.

The ground floor knows no task: it asks the object it is given for its positions and its loss only
(:class:`plateauscope.model.protocols.TaskLoss`), which every :class:`plateauscope.tasks.base.Task` has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.model.fused import fused_logits
from plateauscope.model.protocols import TaskLoss


def fused_loss(model_cfg: object, params: Mapping[str, Tensor], batch: Int[Tensor, "batch seq"], task: TaskLoss,
               trimmed: bool, **interventions: Any) -> Float[Tensor, ""]:
    """The task's loss of ``batch`` through :func:`plateauscope.model.fused.fused_logits` (``trimmed``: its
    logits at the task's loss positions alone, and ``task.loss_at_positions``)."""
    inputs = batch[:, : task.input_len]
    if trimmed:
        logits = fused_logits(model_cfg, params, inputs, positions=task.loss_positions, **interventions)
        return task.loss_at_positions(logits, batch)
    return task.loss(fused_logits(model_cfg, params, inputs, **interventions), batch)
