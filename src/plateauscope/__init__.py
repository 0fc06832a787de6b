"""plateauscope: watch a transformer learn through a plateau, and explain why it waits.

    import plateauscope as ps

    summary = ps.train("ci", out="runs/ci")          # a preset name or a RunConfig
    ps.analyze("runs/ci", every=2)                   # the analysis cache beside the checkpoints
    run = ps.Run("runs/ci")
    model = run.model(run.steps[-1])          # a TransformerLens model
    ps.write_report(run.path); ps.write_view(run.path)

The names below are the public API; each is imported on first use, so ``import plateauscope``
(and the ``plateauscope`` command's ``--help``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from plateauscope.deprecation import install as _serve_moved_paths

__version__ = "0.3.0"

_serve_moved_paths()  # the import paths that moved in 0.3 keep working, with a warning

_API: dict[str, str] = {
    # training and runs
    "train": "plateauscope.api:train",
    "train_seeds": "plateauscope.api:train_seeds",
    "Run": "plateauscope.api:Run",
    "RunError": "plateauscope.runs.run:RunError",
    "RunConfig": "plateauscope.runs.config:RunConfig",
    "run_config": "plateauscope.runs.presets:run_config",
    "ModelConfig": "plateauscope.model.config:ModelConfig",
    "TrainConfig": "plateauscope.model.config:TrainConfig",
    "JsonConfig": "plateauscope.model.config:JsonConfig",
    "ConfigError": "plateauscope.errors:ConfigError",
    "PRESETS": "plateauscope.runs.presets:PRESETS",
    "get_preset": "plateauscope.runs.presets:get_preset",
    # tasks
    "load_task": "plateauscope.api:load_task",
    "import_series": "plateauscope.sources.importer:import_series",
    "verify": "plateauscope.runs.series:verify_checkpoints",
    "Task": "plateauscope.tasks.base:Task",
    "TaskError": "plateauscope.tasks.base:TaskError",
    "Measure": "plateauscope.tasks.base:Measure",
    "ProgressMeasure": "plateauscope.tasks.base:ProgressMeasure",
    "PromptPairs": "plateauscope.tasks.base:PromptPairs",
    "AttentionRule": "plateauscope.tasks.base:AttentionRule",
    "ReferencePredictor": "plateauscope.tasks.base:ReferencePredictor",
    "Probe": "plateauscope.tasks.probe:Probe",
    "encode_texts": "plateauscope.tasks.probe:encode_texts",
    "token_id": "plateauscope.tasks.probe:token_id",
    # sweeps
    "SweepSpec": "plateauscope.sweeps.spec:SweepSpec",
    "SWEEPS": "plateauscope.sweeps.catalogue:SWEEPS",
    "get_sweep": "plateauscope.sweeps.catalogue:get_sweep",
    "run_sweep": "plateauscope.sweeps.executors:run_sweep",
    "SWEEP_MANIFEST": "plateauscope.runs.files:MANIFEST_FILE",
    # analyses
    "analyze": "plateauscope.api:analyze",
    "load_analysis": "plateauscope.analysis.analyze:load_analysis",
    "Analysis": "plateauscope.analysis.records:Analysis",
    "AnalysisSettings": "plateauscope.analysis.analyze:AnalysisSettings",
    "patch_sweep": "plateauscope.analysis.patch:patch_sweep",
    "patch": "plateauscope.analysis.patch:patch",
    "attention_to_z": "plateauscope.analysis.attention:attention_to_z",
    "ablate_each_head": "plateauscope.analysis.ablate:ablate_each_head",
    "ablate_heads": "plateauscope.analysis.ablate:ablate_heads",
    "edge_record": "plateauscope.analysis.edges:edge_record",
    "geometry": "plateauscope.analysis.hessian:geometry",
    "hessian": "plateauscope.analysis.hessian",
    "UnconvergedEigenWarning": "plateauscope.analysis.hessian_engine:UnconvergedEigenWarning",
    "llc_series": "plateauscope.analysis.llc:llc_series",
    "head_llc_series": "plateauscope.analysis.head_llc:head_llc_series",
    "moved_first": "plateauscope.analysis.changepoint:moved_first",
    "snap_statistics": "plateauscope.analysis.snap:snap_statistics",
    "format_routing_summary": "plateauscope.cli.text.analysis:format_summary",
    # fits over runs
    "load_sweep": "plateauscope.dynamics.sweep:load_sweep",
    "analyze_sweep": "plateauscope.dynamics.fits:analyze_sweep",
    "variant_table": "plateauscope.dynamics.variants:variant_table",
    "Interval": "plateauscope.analysis.intervals:Interval",
    "mean_interval": "plateauscope.analysis.intervals:mean_interval",
    "ratio_interval": "plateauscope.analysis.intervals:ratio_interval",
    "median_interval": "plateauscope.analysis.intervals:median_interval",
    "dynamics": "plateauscope.dynamics",
    "interventions": "plateauscope.dynamics.interventions",
    "graft_bisection": "plateauscope.dynamics.graft:graft_bisection",
    "graft_table": "plateauscope.dynamics.graft:boundary_table",
    # pages
    "write_report": "plateauscope.views.report:write_report",
    "write_view": "plateauscope.views.view:write_view",
    "prompt_pairs": "plateauscope.analysis.inputs:prompt_pairs",
    "format_patch": "plateauscope.cli.text.analysis:format_result",
    "text": "plateauscope.cli.text",
    "figures": "plateauscope.views.figures",
    "sweep_figures": "plateauscope.views.sweep_figures:sweep_figures",
    "moment_steps": "plateauscope.views.report:moment_steps",
    "attention_views": "plateauscope.views.report:attention_views",
}
"""Public name -> ``module:attribute`` that defines it, or a module (``figures``: the figure functions,
each results in, ``(figure, caption)`` out; ``hessian``: the plateau-geometry study; ``dynamics``: a sweep's
per-run table and fits across runs; ``interventions``: the intervention sweep's table and its reading)."""

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        module, _, attribute = _API[name].partition(":")
        value = importlib.import_module(module)
        value = getattr(value, attribute) if attribute else value
        globals()[name] = value
        return value
    raise AttributeError(f"module 'plateauscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    import plateauscope.dynamics as dynamics
    from plateauscope.analysis import hessian
    from plateauscope.analysis.ablate import ablate_each_head, ablate_heads
    from plateauscope.analysis.analyze import AnalysisSettings, load_analysis
    from plateauscope.analysis.attention import attention_to_z
    from plateauscope.analysis.edges import edge_record
    from plateauscope.analysis.hessian import geometry
    from plateauscope.analysis.hessian_engine import UnconvergedEigenWarning
    from plateauscope.analysis.inputs import prompt_pairs
    from plateauscope.analysis.intervals import Interval, mean_interval, median_interval, ratio_interval
    from plateauscope.analysis.changepoint import moved_first
    from plateauscope.analysis.head_llc import head_llc_series
    from plateauscope.analysis.llc import llc_series
    from plateauscope.analysis.patch import patch, patch_sweep
    from plateauscope.analysis.records import Analysis
    from plateauscope.analysis.snap import snap_statistics
    from plateauscope.api import Run, analyze, load_task, train, train_seeds
    from plateauscope.cli import text
    from plateauscope.cli.text.analysis import format_result as format_patch
    from plateauscope.cli.text.analysis import format_summary as format_routing_summary
    from plateauscope.dynamics import interventions
    from plateauscope.dynamics.fits import analyze_sweep
    from plateauscope.dynamics.graft import boundary_table as graft_table
    from plateauscope.dynamics.graft import graft_bisection
    from plateauscope.dynamics.sweep import load_sweep
    from plateauscope.dynamics.variants import variant_table
    from plateauscope.errors import ConfigError
    from plateauscope.model.config import JsonConfig, ModelConfig, TrainConfig
    from plateauscope.runs.config import RunConfig
    from plateauscope.runs.files import MANIFEST_FILE as SWEEP_MANIFEST
    from plateauscope.runs.presets import PRESETS, get_preset, run_config
    from plateauscope.runs.run import RunError
    from plateauscope.runs.series import verify_checkpoints as verify
    from plateauscope.sources.importer import import_series
    from plateauscope.sweeps.catalogue import SWEEPS, get_sweep
    from plateauscope.sweeps.executors import run_sweep
    from plateauscope.sweeps.spec import SweepSpec
    from plateauscope.tasks.base import AttentionRule, Measure, ProgressMeasure, PromptPairs, ReferencePredictor, Task, TaskError
    from plateauscope.tasks.probe import Probe, encode_texts, token_id
    from plateauscope.views import figures
    from plateauscope.views.report import attention_views, moment_steps, write_report
    from plateauscope.views.sweep_figures import sweep_figures
    from plateauscope.views.view import write_view
