"""An imported run read as a :class:`~plateauscope.runs.run.Run`: the same read-only interface, for a series
trained elsewhere (``plateauscope import``, :mod:`plateauscope.runs.series`).

``Run(path)`` of an imported run returns an :class:`ImportedRun`. What it holds in place of a run trained here:

* ``task()``: the probe (:mod:`plateauscope.tasks.probe`) built for the series' model, with the settings in
  ``RUN/analysis/probe.json`` (:data:`PROBE_FILE`; written by ``plateauscope analyze --run RUN [--probe ...]``;
  default: the built-in ``induction`` probe);
* ``model(step, reuse=)``: the series' one TransformerLens 4 bridge with the step's weights (its own forward:
  the fast paths do not take a bridge of an imported model, ``plateauscope.model.backend.shares_prefixes``);
* ``metrics()``: the probe's evaluation at each evaluated step (:meth:`ImportedRun.evaluate`; the task's
  ``evaluate`` on the probe's own sequences, not on any training data, and the KL from each of the probe's
  reference predictors where it has them), from ``RUN/analysis/probe_metrics.jsonl``; the training loss is
  not among them;
* ``summary``: no ``summary.json`` (nothing was trained here): only the ladder of the probe's references
  (its stages), or None; ``plateau()``: the probe's verdict from its plateau references, or None;
* ``config``: :class:`ImportedConfig`, the model's shape and the probe's evaluation settings only.

What needs the training data (the Hessian, grafting) raises :class:`ImportedRunError`, one line saying so;
the LLC samples on the probe's sequences.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plateauscope.model.backend import Model
from plateauscope.model.config import TrainConfig
from plateauscope.runs.files import (
    ANALYSIS_DIR,
    MODEL_CONFIG_DIR,
    RunError,
    _one_line,
    append_lines_atomic,
    read_json,
    read_jsonl,
    write_json_atomic,
)
from plateauscope.runs.metrics import compute_tau, plateau_stretch
from plateauscope.runs.references import ReferenceLadder, ladder_summary
from plateauscope.runs.run import Run
from plateauscope.runs.series import Fetch, ImportedSeries
from plateauscope.tasks.base import Task

PROBE_FILE = "probe.json"
"""In ``RUN/analysis``: the probe an imported run's analyses read (``{"probe": name, "options": {...}}``)."""
PROBE_METRICS_FILE = "probe_metrics.jsonl"
"""In ``RUN/analysis``: the probe's evaluation per step (:meth:`ImportedRun.evaluate`), keyed by the probe."""
EVAL_SEQUENCES = 64
"""Probe sequences each evaluation scores (the probe's ``eval_groups`` and ``tracked_groups``)."""
UNBOUNDED_CONTEXT = 2048
"""The context of a model whose positions have no limit in its config (ALiBi: Bloom): what the probes may use."""


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with NaN and infinite floats as None (strict JSON)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


class ImportedRunError(RunError):
    """An analysis that needs what an imported run lacks (the training data, its config); one line."""


@dataclass(frozen=True)
class ImportedModel:
    """The shape of the series' model, from its Hugging Face config."""

    n_layers: int
    n_heads: int
    d_model: int
    d_vocab: int
    n_ctx: int
    architecture: str


@dataclass(frozen=True)
class ImportedConfig:
    """What an imported run has of a run's config: the model's shape, the probe, and the probe's evaluation
    settings as a :class:`TrainConfig` whose training fields are the defaults, which name no intervention (only
    ``seed``, ``eval_groups`` and ``tracked_groups`` are read: the probe's evaluation)."""

    model: ImportedModel
    task_name: str
    """The probe's name (``induction``) or ``file.py:Class``."""
    task: Any
    """The probe's task config (e.g. ``InductionConfig``)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(eval_groups=EVAL_SEQUENCES,
                                                                   tracked_groups=EVAL_SEQUENCES))
    preset: str | None = None


def model_shape(series: ImportedSeries) -> ImportedModel:
    """The model's shape read from the series' ``model/config.json`` (Transformers' names, any architecture)."""
    from transformers import AutoConfig

    folder = series.path / MODEL_CONFIG_DIR
    try:
        cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        n_ctx = next((getattr(cfg, k) for k in ("max_position_embeddings", "n_positions", "seq_length")
                      if isinstance(getattr(cfg, k, None), int)), UNBOUNDED_CONTEXT)
        return ImportedModel(int(cfg.num_hidden_layers), int(cfg.num_attention_heads), int(cfg.hidden_size),
                             int(cfg.vocab_size), int(n_ctx), series.architecture)
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise RunError(f"{folder / 'config.json'}: not a readable model config ({_one_line(e)})") from None


def read_probe_choice(path: str | os.PathLike) -> dict[str, Any]:
    """The probe recorded in ``RUN/analysis/probe.json``, or the default (``induction``, its own options)."""
    file = Path(path) / ANALYSIS_DIR / PROBE_FILE
    if not file.exists():
        return {"probe": "induction", "options": {}}
    raw = read_json(file)
    if not isinstance(raw, dict) or not isinstance(raw.get("probe"), str) \
            or not isinstance(raw.get("options", {}), dict):
        raise RunError(f"{file}: not a probe choice ({{\"probe\": name, \"options\": {{...}}}})")
    return {"probe": raw["probe"], "options": raw.get("options", {})}


def record_probe(path: str | os.PathLike, probe: str, options: dict[str, Any]) -> None:
    """Write the probe an imported run's analyses read (atomically; unchanged when it is the same)."""
    choice = {"probe": probe, "options": options}
    file = Path(path) / ANALYSIS_DIR / PROBE_FILE
    if not file.exists() or read_probe_choice(path) != choice:
        write_json_atomic(file, choice)


class ImportedRun(Run):
    """An imported run with the read-only interface of :class:`~plateauscope.runs.run.Run` (module docstring)."""

    def __init__(self, path: str | os.PathLike, fetch: Fetch | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise RunError(f"{self.path}: no such run directory")
        self.series = ImportedSeries(self.path, fetch)  # fetch: a hub series' checkpoints, fetched when read
        self.choice = read_probe_choice(self.path)
        self.shape = model_shape(self.series)
        self._task: Task | None = None
        self.config = ImportedConfig(self.shape, self.choice["probe"], None)
        self.hooked_config: dict[str, Any] = {}
        self.vocab: list[str] = []

    @classmethod
    def of_checkpoint(cls, path: str | os.PathLike) -> tuple[Run, int]:
        """Not for an imported run (its checkpoints live outside it)."""
        raise ImportedRunError(f"{path}: a checkpoint of a run trained here is needed; an imported run's are "
                               "named by its series.json")

    @property
    def steps(self) -> list[int]:
        """Steps with a checkpoint, ascending."""
        return self.series.steps

    def checkpoint_path(self, step: int) -> Path:
        """The external weights file of ``step`` (a one-line RunError naming the steps that exist)."""
        return self.series.checkpoint_path(step)

    def model(self, step: int, device: str | torch.device = "cpu", backend: str | None = None,
              reuse: Model | None = None) -> Model:
        """The series' bridge with ``step``'s weights (``reuse``: one this method returned before, on ``device``,
        its hooks removed); ``backend`` must be None or ``bridge`` (the only one that reads another trainer's
        layout)."""
        if backend not in (None, "bridge"):
            raise ImportedRunError(f"{self.path}: an imported series runs on the bridge backend (TransformerLens 4), "
                                   f"not --backend {backend}")
        if reuse is not None:  # the bridge's own permanent hooks stay (OPT's fire its MLP's input hook)
            reuse.reset_hooks(including_permanent=False)
        model = self.series.model(step, device, reuse=reuse)
        return model.eval() if model.training else model

    def metrics(self) -> list[dict]:
        """The probe's evaluation at each evaluated step (module docstring), ascending; [] before any."""
        fingerprint = self.task_fingerprint()
        file = self.path / ANALYSIS_DIR / PROBE_METRICS_FILE
        if not file.exists():
            return []
        by_step = {r["step"]: {k: v for k, v in r.items() if k != "task"}
                   for r in read_jsonl(file) if r.get("task") == fingerprint}
        return [by_step[s] for s in sorted(by_step)]

    def evaluate(self, steps: list[int], device: str = "cpu",
                 on_step: Callable[[int], None] | None = None) -> list[dict]:
        """The probe's evaluation (its task's ``evaluate_without_loss``: ``loss`` is the training loss in a run trained
        here, and on a probe it would be the probe's, so it is left out, unrun) at each of ``steps``
        that has none for this probe, appended to ``RUN/analysis/probe_metrics.jsonl`` as each is made (a killed
        evaluation resumes from there); return :meth:`metrics`."""
        have = {r["step"] for r in self.metrics()}
        todo = [s for s in steps if s not in have]
        if todo:
            task, tc, fingerprint = self.task(), self.config.train, self.task_fingerprint()
            evalset = task.build_evalset(tc.eval_groups, tc.tracked_groups, tc.seed)
            ladder = ReferenceLadder.build(task, evalset)  # the probe's references, where it has them
            file, model = self.path / ANALYSIS_DIR / PROBE_METRICS_FILE, None
            for step in todo:
                model = self.model(step, device, reuse=model)
                values = task.evaluate_without_loss(model, evalset)
                values.update(ladder.kl(model, task) if ladder is not None else {})
                record = {"step": step, **values, "task": fingerprint}
                append_lines_atomic(file, [json.dumps(_finite(record), allow_nan=False)])
                if on_step is not None:
                    on_step(step)
        return self.metrics()

    @property
    def summary(self) -> dict | None:
        """No ``summary.json`` (nothing was trained here): only the ``ladder`` block, computed from the probe's
        evaluation where the probe has references (its stages; the plateau the probe's longest in-band stretch),
        else None."""
        task = self.task()
        records = self.metrics()
        if "references" not in task.capabilities or not records:
            return None
        rungs = task.reference_predictors()
        progress = task.progress
        stretch = plateau_stretch(records, progress, compute_tau(records, progress))["stretch"]
        ladder = ladder_summary(records, [r.name for r in rungs], [r.label for r in rungs], stretch)
        return {"ladder": ladder} if ladder else None

    def plateau(self) -> dict | None:
        """The probe's plateau verdict from its references on its evaluations (None: a probe without
        references, or none evaluated yet)."""
        return super().plateau()

    def task_fingerprint(self) -> str:
        """The probe's class source, its config and the model's shape, as 16 hex digits of a SHA-256."""
        task = self.task()
        digest = hashlib.sha256(Path(inspect.getsourcefile(type(task)) or "").read_bytes())
        digest.update(json.dumps({"probe": self.choice, "task": dataclasses.asdict(task.cfg),
                                  "model": dataclasses.asdict(self.shape)}, sort_keys=True, default=str).encode())
        return digest.hexdigest()[:16]

    def task(self) -> Task:
        """The probe (``probe.json``'s, default ``induction``) built for the series' model (cached)."""
        if self._task is None:
            from plateauscope.errors import ConfigError
            from plateauscope.tasks.probe import build_probe

            try:
                probe = build_probe(self.choice["probe"], self.shape.d_vocab, self.shape.n_ctx,
                                    tokenizer=self.series.loaded_tokenizer, **self.choice["options"])
            except TypeError as e:  # an option the probe does not take
                raise RunError(f"{self.path / ANALYSIS_DIR / PROBE_FILE}: {_one_line(e)}") from None
            except ConfigError as e:
                raise RunError(f"{self.path}: {e}") from None
            if not isinstance(probe, Task):
                raise RunError(f"{self.path / ANALYSIS_DIR / PROBE_FILE}: probe {self.choice['probe']} is not a "
                               "plateauscope.Task; the analyses of a run read a probe that subclasses a task too")
            self._task = probe  # type: ignore[assignment]
            self.config = dataclasses.replace(self.config, task=getattr(probe, "cfg", None))
        return self._task  # type: ignore[return-value]

    def needs_training(self, what: str) -> ImportedRunError:
        """The one-line error of an analysis ``what`` that needs the training data."""
        return ImportedRunError(f"{self.path}: an imported series ({self.series.source or 'series.json'}), which has "
                                f"no training data: {what} needs the training data of a run trained here")


Run.imported_class = ImportedRun
