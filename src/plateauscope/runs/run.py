"""The Run API: a run directory read back (config, dataset, metrics, the checkpoint series).

The files, their layout and how they are written are :mod:`plateauscope.runs.files`, whose
names this module re-exports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from plateauscope.errors import ConfigError
from plateauscope.model.backend import (
    Model,
    backend_of,
    load_hooked_state_dict,
    model_from_hooked_state,
    resolve_backend,
)
from plateauscope.runs.config import RunConfig
from plateauscope.runs.files import _CKPT_RE, _one_line

# The run directory's files, re-exported so that ``run`` (imported as ``rd``) is the one name for them.
from plateauscope.runs.files import (
    ANALYSIS_DIR as ANALYSIS_DIR,
)
from plateauscope.runs.files import (
    CHECKPOINT_DIR as CHECKPOINT_DIR,
)
from plateauscope.runs.files import (
    CHECKPOINT_FORMAT as CHECKPOINT_FORMAT,
)
from plateauscope.runs.files import (
    CHECKSUMS_FILE as CHECKSUMS_FILE,
)
from plateauscope.runs.files import (
    CONFIG_FILE as CONFIG_FILE,
)
from plateauscope.runs.files import (
    DATASET_FILE as DATASET_FILE,
)
from plateauscope.runs.files import (
    MANIFEST_FILE as MANIFEST_FILE,
)
from plateauscope.runs.files import (
    METRICS_FILE as METRICS_FILE,
)
from plateauscope.runs.files import (
    PREVIOUS_RESUME_FILE as PREVIOUS_RESUME_FILE,
)
from plateauscope.runs.files import (
    READABLE_CHECKPOINT_FORMATS as READABLE_CHECKPOINT_FORMATS,
)
from plateauscope.runs.files import (
    RESUME_FILE as RESUME_FILE,
)
from plateauscope.runs.files import (
    ROUTING_FILE as ROUTING_FILE,
)
from plateauscope.runs.files import (
    SUMMARY_FILE as SUMMARY_FILE,
)
from plateauscope.runs.files import (
    TASK_SOURCE_FILE as TASK_SOURCE_FILE,
)
from plateauscope.runs.files import (
    RunError as RunError,
)
from plateauscope.runs.files import (
    atomic_write as atomic_write,
)
from plateauscope.runs.files import (
    checkpoint_name as checkpoint_name,
)
from plateauscope.runs.files import (
    load_checkpoint as load_checkpoint,
)
from plateauscope.runs.files import (
    load_resume_state as load_resume_state,
)
from plateauscope.runs.files import (
    read_checkpoint_metadata as read_checkpoint_metadata,
)
from plateauscope.runs.files import (
    read_checksums as read_checksums,
)
from plateauscope.runs.files import (
    read_json as read_json,
)
from plateauscope.runs.files import (
    read_jsonl as read_jsonl,
)
from plateauscope.runs.files import (
    save_checkpoint as save_checkpoint,
)
from plateauscope.runs.files import (
    save_resume_state as save_resume_state,
)
from plateauscope.runs.files import (
    write_json_atomic as write_json_atomic,
)
from plateauscope.runs.files import (
    write_text_atomic as write_text_atomic,
)
from plateauscope.runs.interventions import Interventions, has_interventions
from plateauscope.runs.metrics import (
    LEGACY_PLATEAU_SPAN,
    PLATEAU_STRETCH,
    compute_tau,
    plateau_stretch,
    plateau_verdict,
)
from plateauscope.runs.series import is_imported
from plateauscope.tasks.base import ProgressMeasure, Task
from plateauscope.tasks.loading import task_class, use_task_copy


class Run:
    """A run directory, read-only: config, dataset, metrics, and the checkpoint series."""

    imported_class: ClassVar[type[Run] | None] = None
    """The class ``cls(path)`` returns for an imported run, a subclass of ``cls``: for this class
    :class:`plateauscope.runs.imported.ImportedRun`, which sets it (the package imports that module)."""

    def __new__(cls, path: str | os.PathLike | None = None, *args: Any, **kwargs: Any) -> Run:
        """An :class:`~plateauscope.runs.imported.ImportedRun` (or ``cls.imported_class``) for an imported run
        (it has a ``series.json``): the same read-only interface, over a series trained elsewhere."""
        target = cls.imported_class
        if target is not None and path is not None and is_imported(path) and not issubclass(cls, target) \
                and issubclass(target, cls):
            return super().__new__(target)
        return super().__new__(cls)

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise RunError(f"{self.path}: no such run directory")
        raw = read_json(self.path / CONFIG_FILE)
        try:
            copy = raw.get("task_source") if isinstance(raw, dict) else None
            if isinstance(copy, dict) and isinstance(raw.get("run"), dict):
                use_task_copy(raw["run"].get("task_name", ""), self.path / TASK_SOURCE_FILE, copy.get("sha256"))
            self.config = RunConfig.from_dict(raw["run"])
            self.hooked_config: dict[str, Any] = raw["hooked_transformer_config"]
            self.vocab: list[str] = raw["vocab"]
        except ConfigError as e:  # e.g. the file of a task of one's own is gone
            raise RunError(f"{self.path / CONFIG_FILE}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise RunError(f"{self.path / CONFIG_FILE}: not a run config of this toolkit ({_one_line(e)})") from None
        self._task: Task | None = None

    @classmethod
    def of_checkpoint(cls, path: str | os.PathLike) -> tuple[Run, int]:
        """The run a checkpoint file belongs to, and its step."""
        path = Path(path)
        meta = read_checkpoint_metadata(path)
        return cls(path.parent.parent), int(meta["step"])

    @property
    def progress(self) -> ProgressMeasure:
        """The task's progress measure: what defines tau and the plateau."""
        return self.task().progress

    @property
    def log_k(self) -> float:
        """The plateau height of the progress measure (log K for the selector task)."""
        return self.progress.height

    @property
    def steps(self) -> list[int]:
        """Steps with a checkpoint, ascending."""
        folder = self.path / CHECKPOINT_DIR
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _CKPT_RE.match(p.name)))

    def checkpoint_path(self, step: int) -> Path:
        """The checkpoint file of ``step``, or a one-line RunError naming the steps that exist."""
        path = self.path / CHECKPOINT_DIR / checkpoint_name(step)
        if not path.is_file():
            if f"{CHECKPOINT_DIR}/{path.name}" in (read_checksums(self.path) or {}):
                raise RunError(f"{path}: missing (listed in {CHECKSUMS_FILE})")
            have = self.steps
            span = f"{have[0]}..{have[-1]}, {len(have)} checkpoints" if have else "none"
            raise RunError(f"{self.path}: no checkpoint at step {step} (steps: {span})")
        return path

    def model(self, step: int, device: str | torch.device = "cpu", backend: str | None = None,
              reuse: Model | None = None) -> Model:
        """The model at ``step``, in eval mode, on ``backend`` (``hooked``: TransformerLens 3.x
        HookedTransformer, ``bridge``: 4.x TransformerBridge; None: the installed one). An
        uninstalled backend raises ``plateauscope.model.backend.BackendError`` (one line).

        ``reuse``: a model this method returned before for this run, on the same backend and device.
        It gets the step's weights in place, its hooks removed, and is returned: a series read one
        checkpoint at a time skips building a model per step (most of a load's time on a small
        model). A run trained with interventions always gets a fresh model.

        A run trained with interventions (``plateauscope.runs.interventions``) gets them as permanent hooks,
        as they were at ``step`` (zeroed heads; the cue hidden before its release), so that every
        analysis sees the model that was trained."""
        state, _ = load_checkpoint(self.checkpoint_path(step))
        tc = self.config.train
        if reuse is not None and not has_interventions(tc) and backend_of(reuse) == resolve_backend(backend) \
                and str(next(reuse.parameters()).device) == str(torch.device(device)):
            reuse.reset_hooks(including_permanent=True)
            load_hooked_state_dict(reuse, state)
            return reuse.eval() if reuse.training else reuse  # eval() walks the bridge's whole module tree
        model = model_from_hooked_state(self.hooked_config, state, backend=backend, device=device).eval()
        if has_interventions(tc):
            Interventions.build(tc, self.task(), self.config.model.n_layers, self.config.model.n_heads).attach(model, step)
        return model

    def models(self, steps: list[int] | None = None, device: str = "cpu",
               backend: str | None = None) -> Iterator[tuple[int, Model]]:
        """Lazily load the series, one model at a time."""
        for step in self.steps if steps is None else steps:
            yield step, self.model(step, device, backend)

    def metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl``, one per evaluation."""
        return read_jsonl(self.path / METRICS_FILE)

    @property
    def summary(self) -> dict | None:
        """``summary.json``, or None while the run is unfinished."""
        path = self.path / SUMMARY_FILE
        return read_json(path) if path.exists() else None

    def plateau(self) -> dict | None:
        """The plateau verdict block: ``summary.json``'s, or computed from the metrics and the task for
        runs written before it existed (None for a task without references, or an empty run)."""
        summary = self.summary or {}
        if "plateau" in summary:
            return summary["plateau"]
        records = self.metrics() if (self.path / METRICS_FILE).exists() else []
        if not records:
            return None
        tc, task = self.config.train, self.task()
        # the references over the run's own evaluation groups, as train() computes them
        reference = task.plateau_reference(task.build_evalset(tc.eval_groups, tc.tracked_groups, tc.seed))
        if reference is None:
            return None
        progress = self.progress
        tau = compute_tau(records, progress)
        return plateau_verdict(records, progress.height, plateau_stretch(records, progress, tau)["stretch"], reference)

    def plateau_stretch(self) -> list[int] | None:
        """The plateau as a window of steps, ``[first, last]``: the longest stretch of consecutive evaluations
        before tau inside the band (:func:`plateauscope.runs.metrics.plateau_stretch`), as ``summary.json``
        records it; an older ``summary.json`` gives its ``plateau_span`` instead, and a run without one (still
        training, or imported) has it computed from its metrics by the same rule. None: no evaluation before
        tau lies inside the band."""
        summary = self.summary or {}
        if PLATEAU_STRETCH in summary:
            return summary[PLATEAU_STRETCH]
        if LEGACY_PLATEAU_SPAN in summary:
            return summary[LEGACY_PLATEAU_SPAN]
        records = self.metrics() if (self.path / METRICS_FILE).exists() else []
        if not records:
            return None
        progress = self.progress
        tau = summary["tau"] if "tau" in summary else compute_tau(records, progress)
        return plateau_stretch(records, progress, tau)["stretch"]

    def task_fingerprint(self) -> str:
        """What made the run's task, as 16 hex digits of a SHA-256: the source file of its class and
        its config. The analysis caches are keyed on it, so an edited task file recomputes."""
        cls = task_class(self.config.task_name)
        digest = hashlib.sha256(Path(inspect.getsourcefile(cls) or "").read_bytes())
        digest.update(json.dumps(dataclasses.asdict(self.config.task), sort_keys=True, default=str).encode())
        return digest.hexdigest()[:16]

    def task(self) -> Task:
        """The run's task, rebuilt from ``dataset.jsonl`` (cached)."""
        if self._task is None:
            self._task = task_class(self.config.task_name).from_records(
                self.config.task, read_jsonl(self.path / DATASET_FILE))
        return self._task


def trained_run(path: str | os.PathLike, what: str) -> Run:
    """The run at ``path`` for an analysis ``what`` that needs the training data (its data set, its training
    loss, its config): an imported run (``plateauscope import``) is a one-line
    :class:`~plateauscope.runs.imported.ImportedRunError` saying so."""
    run = Run(path)
    if is_imported(run.path):
        raise run.needs_training(what)  # type: ignore[attr-defined]
    return run
