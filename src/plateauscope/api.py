"""The verbs of the public API as functions: ``train``, ``train_seeds``, ``analyze``, ``load_task``.

Each is a thin layer over the module that does the work (the training loop, the analysis driver,
the task loader), taking a preset's name or a config, and a run directory's path or a
:class:`~plateauscope.runs.run.Run`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from plateauscope.analysis.analyze import AnalysisSettings
from plateauscope.analysis.landmarks import DEFAULT_BUDGET
from plateauscope.analysis.probe_pass import analyze_series
from plateauscope.analysis.records import Analysis, read_analysis
from plateauscope.analysis.shards import run_shards, shard_executor
from plateauscope.errors import ConfigError
from plateauscope.runs import imported as imported_run
from plateauscope.runs import run as run_directory
from plateauscope.runs.config import RunConfig
from plateauscope.runs.presets import run_config
from plateauscope.sources.hf_hub import analysis_fetch
from plateauscope.tasks.base import Task
from plateauscope.tasks.loading import build_task, task_class
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.train import train as train_run


class Run(run_directory.Run):
    """A run directory: its config, steps, models, metrics and summary
    (:class:`plateauscope.runs.run.Run`), and its analysis, typed."""

    def analysis(self, settings: AnalysisSettings | None = None) -> Analysis:
        """The analysis cache made with ``settings`` (default: those of the latest ``analyze``), as typed
        records (:mod:`plateauscope.analysis.records`)."""
        return read_analysis(self.path, settings)


class ImportedRun(imported_run.ImportedRun, Run):
    """An imported run (``plateauscope import``): :class:`plateauscope.runs.imported.ImportedRun`, with
    :meth:`Run.analysis`. ``Run(path)`` returns one where ``path`` holds a ``series.json``."""


Run.imported_class = ImportedRun


def train(config: str | RunConfig | None = None, out: str | Path | None = None, *, task: str | None = None,
          resume: bool = False, progress: bool = True, device: str = "auto", backend: str | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Train one run into ``out`` and return its summary (``summary.json``).

    ``config``: a preset's name (``"tiny"``, ``"ci"``, ``"demo"``, ...) or a :class:`RunConfig`; ``None``:
    ``demo``, or with ``task`` (a built-in name, ``path/to/file.py:Class`` or ``module:Class``) takes that
    task's own defaults. ``overrides`` change single fields, as the command line's flags do."""
    if out is None:
        raise ConfigError("train: give out=, the run directory to write")
    return train_run(run_config(config, task, **overrides), out, resume=resume, device=device,
                     progress=progress, backend=backend)


def train_seeds(config: str | RunConfig, out: str | Path, seeds: list[int], *, progress: bool = True,
                device: str = "auto", **overrides: Any) -> list[dict[str, Any]]:
    """Train one run per seed (model and data seed together) as one vectorised seed ensemble, into
    ``out/seed<i>``; return their summaries."""
    cfgs = [run_config(config, data_seed=s, seed=s, **overrides) for s in seeds]
    return train_ensemble(cfgs, [Path(out) / f"seed{s}" for s in seeds], resume=True, device=device,
                          progress=progress)


def analyze(run: str | Path | Run, *, every: int = 1, steps: list[int] | None = None, n_exact: int = DEFAULT_BUDGET,
            progress: bool = True, backend: str | None = None, edges: bool = True, full: bool = False,
            workers: int | None = None, probe: str = "induction", probe_options: dict[str, Any] | None = None,
            probe_only: bool = False, device: str = "cpu", keep: int | None = None, executor: str | None = None,
            shards: int | None = None, threads: int = 1, retries: int = 1, slurm: dict[str, Any] | None = None,
            **settings: Any) -> dict[str, Any]:
    """Analyse a run's checkpoints into its cache (what the cache lacks) and return the run's summary
    of the analyses (the routing head, t_form by each rule, the lead, the circuit and edges). The
    expensive analyses run at the landmarks the cheap pass finds, then at the steps where it changes
    fastest, up to ``n_exact`` steps in all; ``full``: the exhaustive plan (``plateauscope.analysis.analyze``);
    ``workers``: checkpoints of the cheap pass analysed side by side (None: ``default_workers`` there).

    An imported run (``plateauscope import``) is analysed on ``probe`` (``induction`` or ``file.py:Class``, with
    ``probe_options`` such as ``{"segment_len": 8}``), as ``plateauscope analyze --probe`` does: the probe's pass
    (its record under the summary's ``probe`` key), then every analysis where the probe is a task too (only the
    pass, ``{"probe": ...}``, where it is not, or with ``probe_only``). A series imported from the hub is fetched
    as it is read, ``keep`` revisions left in the cache (``analyze --keep``). ``executor`` (``slurm`` or
    ``submitit-local``) with ``shards``: the per-step passes in that many jobs of ``threads`` CPUs each, a dead
    job submitted again up to ``retries`` times, ``slurm`` its options (``partition``, ``timeout_min``), as
    ``analyze --executor`` does (:mod:`plateauscope.analysis.shards`)."""
    path = run.path if isinstance(run, run_directory.Run) else Path(run)
    if (executor is None) != (shards is None):
        raise ConfigError("analyze: executor and shards go together, e.g. executor='slurm', shards=8")
    analysis_settings = AnalysisSettings(**settings) if settings else None
    fetch, fetch_for = analysis_fetch(path, keep, progress)
    if executor is not None:
        run_shards(path, shards, shard_executor(path, executor), probe, probe_options, steps, every, analysis_settings,
                   threads, retries, fetch_for, device, edges, probe_only, slurm)
    passed, summary = analyze_series(path, probe, probe_options, steps, every, device, progress=progress,
                                     probe_only=probe_only, n_exact=n_exact, backend=backend, edges=edges, full=full,
                                     workers=workers, settings=analysis_settings, fetch=fetch)
    return (summary or {}) | ({"probe": passed.to_dict()} if passed is not None else {})


def load_task(spec: str, **options: Any) -> Task:
    """A task generated from its config: ``spec`` is a built-in name (``selector``, ``induction``) or
    ``path/to/file.py:Class`` / ``module:Class``; ``options`` are fields of the task's ``Config``."""
    cls = task_class(spec)
    try:
        cfg = cls.Config(**options)
    except TypeError:
        names = ", ".join(f.name for f in dataclasses.fields(cls.Config))
        raise ConfigError(f"load_task({spec!r}): unknown option among {sorted(options)}; the task's options "
                          f"are {names}") from None
    return build_task(spec, cfg)
