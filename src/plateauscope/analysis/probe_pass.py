"""The cheap pass on an imported run: a probe's signals at every checkpoint of a series trained elsewhere.

At each chosen step, with the series' one model (:class:`plateauscope.runs.series.ImportedSeries`, each
checkpoint's weights loaded into it): the probe's head scores (for ``induction``: TransformerLens
``head_detector``'s previous-token and induction scores), the in-context loss gap, and exact activation
patching of every head's output on the probe's prompt pairs (``plateauscope.analysis.patch``; the
bridge's own forward where the fast paths do not cover the architecture). Then the project's one
change-point rule (``plateauscope.analysis.changepoint``) on the loss gap, with the first quarter of the
series as its baseline, and the heads named at the last step.

The result is written to ``RUN/analysis/probe_<name>.json``. An analysis that needs the training data
(the Hessian, the plateau verdict) is not run on an imported run.

    plateauscope analyze --run IMPORTED [--probe induction] [--every N | --steps ...]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.changepoint import ChangePointRule, change_point
from plateauscope.analysis.patch import patch
from plateauscope.analysis.results import analysis_dir, pick_steps, write_json_result
from plateauscope.runs.imported import record_probe
from plateauscope.runs.run import RunError
from plateauscope.runs.series import ImportedSeries, is_imported
from plateauscope.tasks.base import Task
from plateauscope.tasks.probe import (
    BUILTIN_PROBES,
    ProbeError,
    build_probe,
    offers_pairs,
    probe_class,
    probe_code_error,
)

HEAD_THRESHOLD = 0.4
"""A head is named (an induction head, a previous-token head) where its score at the last step is above this."""


@dataclass
class ProbeStep:
    """The probe's signals at one checkpoint."""

    step: int
    head_scores: dict[str, list[list[float]]]
    """Detection score name -> ``[n_layers][n_heads]``."""
    loss_gap: float | None
    """Loss on the first copy minus loss on the second (the induction probe), or None."""
    head_patching: list[list[float]] | None
    """Exact patching of each head's output, the share of the clean-corrupted logit difference it restores."""


@dataclass
class ProbeSeriesResult:
    """The cheap pass over an imported series."""

    probe: str
    architecture: str
    steps: list[ProbeStep]
    named_heads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Detection score name -> heads scoring above :data:`HEAD_THRESHOLD` at the last step, strongest first."""
    loss_gap_change: dict[str, Any] | None = None
    """The change point of the loss gap (``plateauscope.analysis.changepoint.ChangePoint.to_dict``), or None."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


def named_heads(scores: torch.Tensor, threshold: float = HEAD_THRESHOLD) -> list[tuple[int, int]]:
    """(layer, head) pairs scoring above ``threshold``, strongest first."""
    n_heads = scores.shape[1]
    order = scores.flatten().argsort(descending=True).tolist()
    return [(i // n_heads, i % n_heads) for i in order if scores.flatten()[i] > threshold]


def _probe_call(call: Callable[[], Any], built: Any, spec: str, what: str) -> Any:
    """``call()``; an error raised in a probe of one's own is one line naming its file and line (a built-in
    probe's error is the toolkit's: raised as it is)."""
    try:
        return call()
    except ProbeError:
        raise
    except Exception as e:
        if spec in BUILTIN_PROBES:
            raise
        raise probe_code_error(e, type(built), spec, what) from None


def analyze_imported(run_dir: str | Path, probe: str = "induction", steps: list[int] | None = None, every: int = 1,
                     device: str = "cpu", patching: bool = True, progress: bool = True,
                     rule: ChangePointRule | None = None, n_pairs: int = 64, on_step: Callable[[int], None] | None = None,
                     **probe_options: Any) -> ProbeSeriesResult:
    """The probe's cheap pass over the chosen checkpoints of an imported run (module docstring);
    ``n_pairs``: the prompt pairs head patching runs on; ``probe_options``: the probe's own (the induction
    probe: ``segment_len``); ``on_step(step)``: called after
    each step."""
    rule = rule or ChangePointRule()
    probe_name = probe_class(probe).probe_name  # a probe file that lacks what a probe needs fails here, in one line
    series = ImportedSeries(run_dir)
    chosen = pick_steps(series.steps, every, steps)
    model = None
    records: list[ProbeStep] = []
    built = None
    for step in tqdm(chosen, desc=f"probe {Path(run_dir).name}", disable=not progress, dynamic_ncols=True):
        model = series.model(step, device, reuse=model)
        if built is None:
            built = build_probe(probe, model.cfg.d_vocab, model.cfg.n_ctx, tokenizer=series.loaded_tokenizer,
                                    **probe_options)
            pairs = (_probe_call(lambda: built.prompt_pairs(n_pairs, 0), built, probe, "prompt_pairs")
                     if patching and offers_pairs(built) else None)
        scores, gap = _probe_call(lambda: built.signals(model), built, probe, "head_scores / loss_gap")
        patched = patch(model, pairs, "heads").normalised.tolist() if pairs is not None else None
        records.append(ProbeStep(step, {k: v.tolist() for k, v in scores.items()}, gap, patched))
        if on_step is not None:
            on_step(step)
    result = ProbeSeriesResult(probe_name, series.architecture, records)
    if records:
        result.named_heads = {name: named_heads(torch.tensor(values))
                              for name, values in records[-1].head_scores.items()}
    gaps = [r.loss_gap for r in records]
    if len(records) >= 2 * rule.min_baseline and all(g is not None for g in gaps):
        quarter = chosen[max(rule.min_baseline, len(chosen) // 4) - 1]
        found = change_point(chosen, gaps, (chosen[0], quarter), rule=rule)
        result.loss_gap_change = found.to_dict() if found else None
    write_json_result(analysis_dir(run_dir) / f"probe_{probe_name}.json", result.to_dict())
    return result


def analyze_series(run_dir: str | Path, probe: str = "induction", probe_options: dict[str, Any] | None = None,
                   steps: list[int] | None = None, every: int = 1, device: str = "cpu", progress: bool = True,
                   **analysis: Any) -> tuple[ProbeSeriesResult | None, dict[str, Any] | None]:
    """A run's whole analysis, trained here or imported: for an imported run, the probe's pass
    (:func:`plateauscope.analysis.probe_pass.analyze_imported`), then, where the probe is also a task, every analysis on
    the probe's data (:func:`analyze_run`, ``analysis``: its keyword arguments), the probe recorded for the report,
    the view and ``ps.Run``; for a run trained here, :func:`analyze_run` alone (``probe`` must be left as it is).
    Returns ``(the probe's pass or None, the summary or None)``: None where a probe that is not a task has no more."""
    options = probe_options or {}
    if not is_imported(run_dir):
        if probe != "induction" or options:
            raise RunError(f"{run_dir}: a probe is for an imported run (plateauscope import); this run's analyses read "
                           "its own task")
        return None, analyze_run(run_dir, steps, every, device=device, progress=progress, **analysis)
    passed = analyze_imported(run_dir, probe, steps, every, device, progress=progress, **options)
    if not issubclass(probe_class(probe), Task):  # prompts and patterns only: its pass is all of it
        return passed, None
    record_probe(run_dir, probe, options)  # the probe every later analysis and view reads
    return passed, analyze_run(run_dir, steps, every, device=device, progress=progress, **analysis)
