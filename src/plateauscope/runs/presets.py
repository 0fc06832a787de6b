"""Named starting points, and the one path from a preset, a task and overrides to a validated RunConfig
(:func:`run_config`: what ``plateauscope train`` and ``plateauscope.train`` both call)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from plateauscope.errors import ConfigError
from plateauscope.model.config import ModelConfig, TrainConfig
from plateauscope.runs.config import RunConfig
from plateauscope.tasks.grokking import GrokkingConfig, GrokkingTask
from plateauscope.tasks.induction import InductionConfig, InductionTask
from plateauscope.tasks.loading import task_class
from plateauscope.tasks.markov import MarkovConfig, MarkovTask
from plateauscope.tasks.selector_config import TaskConfig

PAPER_MODEL = ModelConfig(n_layers=4, d_model=128, n_heads=4, d_head=32, d_mlp=512)

SMALL_MODEL = ModelConfig(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256)

# The paper's configuration (its code: n_b 1000, K 10, batch 128, lr 1e-3, AdamW, no warmup;
# distinct first characters). About 1,400 steps to tau on this CPU. The tracked groups' exact
# match (group_acc) is logged every 100 steps, not at the early log-spaced evaluations.
PAPER = RunConfig(
    task=TaskConfig(n_b=1000, K=10),
    model=PAPER_MODEL,
    train=TrainConfig(max_steps=5000, ckpt_every=10, tracked_groups=200, tracked_every=100),
    preset="paper",
)

PRESETS: dict[str, RunConfig] = {
    "paper": PAPER,
    # The paper's model and data, stopped at 1.5 tau: the plateau and the drop in one short run. Dense
    # checkpoints (every 10 steps) only from the plateau's middle to 1.3 tau, every 100 elsewhere.
    "demo": dataclasses.replace(PAPER.replace(tracked_groups=100, stop_after_tau=1.5, checkpoints="adaptive"),
                                preset="demo"),
    # A 2-layer model on D = 5,000: the same shape (plateau, then the drop) in well under a minute.
    "ci": RunConfig(
        task=TaskConfig(n_b=500, K=10),
        model=SMALL_MODEL,
        train=TrainConfig(max_steps=3000, eval_every=25, ckpt_every=5, eval_groups=16, tracked_groups=50,
                          stop_after_tau=1.3),
        preset="ci",
    ),
    # The ci model on a task with a cheap marginal (marginal-search-2): every group's K targets come
    # from one pool of 20 strings. Its plateau is a global marginal (set loss log 2, the pool's
    # marginal), held for about 0.6 tau before the drop, in every seed.
    "marginal": RunConfig(
        task=TaskConfig(n_b=500, K=10, target_pool=20, target_uniqueness="group", distinct_first_char=False),
        model=SMALL_MODEL,
        train=TrainConfig(max_steps=3000, eval_every=25, ckpt_every=5, eval_groups=16, tracked_groups=50,
                          stop_after_tau=1.3),
        preset="marginal",
    ),
    # Induction heads (plateauscope.tasks.induction): a 2-layer attention-only model, V 64, L 16, the
    # repeat 16 to 32 positions after the segment. About 400 steps to tau, a checkpoint every 5.
    "induction": RunConfig(
        task=InductionConfig(),
        model=InductionTask.default_model,
        train=InductionTask.default_train,
        preset="induction",
        task_name="induction",
    ),
    # In-context Markov chains (plateauscope.tasks.markov): a 2-layer attention-only model, one head a
    # layer, learns the in-context unigram, waits there, then the bigram once a statistical induction
    # head forms. k = 3 states, alpha = 0.5: the rungs of the ladder lie ~0.2 nats apart (~0.1 at
    # alpha = 1, the stage margin), so each stage reads as one.
    "markov": RunConfig(
        task=MarkovConfig(alpha=0.5),
        model=MarkovTask.default_model,
        train=MarkovTask.default_train,
        preset="markov",
        task_name="markov",
    ),
    # Grokking (plateauscope.tasks.grokking): modular addition, p = 59, 40% of the pairs for training, Nanda
    # et al.'s one-layer ReLU model at half their width, full batch, AdamW lr 3e-3 (Nanda et al.: 1e-3) and
    # weight decay 1, stopped at 1.5 tau. tau on the held-out loss.
    "grokking": RunConfig(
        task=GrokkingConfig(),
        model=GrokkingTask.default_model,
        train=GrokkingTask.default_train,
        preset="grokking",
        task_name="grokking",
    ),
    # A few steps of a tiny model: for unit tests of the machinery, not of the science.
    "tiny": RunConfig(
        task=TaskConfig(n_b=40, K=4),
        model=ModelConfig(n_layers=1, d_model=32, n_heads=2, d_head=16, d_mlp=64),
        train=TrainConfig(batch_size=32, max_steps=40, eval_every=10, ckpt_every=5, eval_groups=8,
                          tracked_groups=10, early_log_points=3),
        preset="tiny",
    ),
}


def get_preset(name: str) -> RunConfig:
    """The named preset, or a one-line ConfigError naming the choices."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def task_defaults(task_name: str) -> RunConfig:
    """A run of ``task_name`` with its own defaults: its ``Config()``, and its ``default_model`` /
    ``default_train`` where the task class sets them (else ``ModelConfig()`` / ``TrainConfig()``)."""
    cls = task_class(task_name)
    return RunConfig(task=cls.Config(), model=getattr(cls, "default_model", None) or ModelConfig(),
                     train=getattr(cls, "default_train", None) or TrainConfig(), preset=None, task_name=task_name)


def run_config(preset: str | RunConfig | None = None, task: str | None = None, assignments: Sequence[str] = (),
               data_seed: int | None = None, **overrides: Any) -> RunConfig:
    """A validated :class:`RunConfig`: the preset ``preset`` (a name or a config; None: ``demo``, or with
    ``task`` that task's own defaults, :func:`task_defaults`), its task replaced by ``task``'s defaults when
    they differ, then ``assignments`` (``KEY=VALUE`` texts, :meth:`RunConfig.with_options`), ``overrides``
    (:meth:`RunConfig.replace` names: ``seed``, ``lr``, ``max_steps``, ...) and ``data_seed`` (the task's
    own ``seed`` option) applied in that order."""
    if isinstance(preset, RunConfig):
        cfg = preset
    elif preset is None and task is not None:
        cfg = task_defaults(task)
    else:
        cfg = get_preset(preset or "demo")
    if task is not None and task != cfg.task_name:
        cfg = dataclasses.replace(cfg, task=task_class(task).Config(), task_name=task)
    cfg = cfg.with_options(list(assignments)).replace(**overrides)
    if data_seed is not None:
        if "seed" not in {f.name for f in dataclasses.fields(cfg.task)}:
            raise ConfigError(f"--data-seed: the {cfg.task_name} task has no seed option")
        cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, seed=data_seed))
    return cfg.validate()
