"""The ground floor's loss (``plateauscope.model.loss``) and the structural types it asks of a task
(``plateauscope.model.protocols``), against the task's own loss on the model's hooked forward."""

import types

import pytest
import torch

from plateauscope.model.backend import build_model, hooked_parameters
from plateauscope.model.loss import fused_loss
from plateauscope.model.protocols import AttentionEdit, TaskLoss, TaskPositions
from plateauscope.runs.interventions import PatternClamp
from plateauscope.runs.presets import get_preset
from plateauscope.tasks.loading import build_task


@pytest.mark.parametrize("preset", ["tiny", "induction"])
@pytest.mark.parametrize("trimmed", [False, True])
def test_the_fused_loss_is_the_tasks_loss_on_the_hooked_forward(preset, trimmed):
    cfg = get_preset(preset)
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=1).double()
    batch = task.tokens[:16]
    expected = task.loss(model(batch[:, : task.input_len]).double(), batch)  # TransformerLens's own forward
    got = fused_loss(model.cfg, hooked_parameters(model), batch, task, trimmed)
    assert torch.allclose(got, expected, atol=1e-9, rtol=0)


def test_a_task_is_what_the_ground_floor_asks_for():
    cfg = get_preset("tiny")
    task = build_task(cfg.task_name, cfg.task)
    assert isinstance(task, TaskLoss) and isinstance(task, TaskPositions)
    assert not isinstance(types.SimpleNamespace(input_len=3), TaskPositions)  # no loss positions
    clamp = PatternClamp.build(((0, 0),), task, "cue", 1.0, cfg.model.n_heads)
    assert isinstance(clamp, AttentionEdit) and clamp.layers == frozenset({0})
