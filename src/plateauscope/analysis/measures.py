"""The measures of a checkpoint: the built-in ones (``plateauscope.model.measures``) and the task's own
(``Task.measures()``), computed by the cheap pass at every analysed step and cached in
``RUN/analysis/measures.jsonl`` like every other record (``plateauscope.analysis.results``).

A record holds, per measure, what one value describes (``per``: model, layer or head) and its value
(a number, one per layer, or one per head ``[n_layers][n_heads]``). The built-in measures:

* ``weight_norm`` (model) and ``weight_norm_layer`` (layer): the parameters' L2 norm in total and per layer;
* ``embedding_rank`` (model): the effective rank of ``W_E`` (Roy & Vetterli);
* ``collapse`` (layer): representation collapse, the mean pairwise cosine similarity of each layer's
  residual stream over the loss positions (Gopalani & Hu 2025);
* ``repetition_bias`` (model): the share of consecutive loss positions with the same greedy prediction
  (Gopalani & Hu); absent where the loss counts one position;
* ``pattern_distance`` (head): each head's total-variation distance from its attention pattern at the
  run's last checkpoint (the reference step of the record's key: a run trained further recomputes).

The activation measures read ``n_examples`` seeded examples of the task's data set (the analysis's
``n_examples`` and ``seed``); the task's own get the run's evaluation set. A task measure that raises,
or returns the wrong shape, stops the pass with one line naming the task file, the measure and the line.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from plateauscope.analysis.attention import AttentionToZ, attention_stats_from_patterns
from plateauscope.analysis.prefix import activations, unembed_last
from plateauscope.model.backend import Model
from plateauscope.model.heads import head_label
from plateauscope.model.measures import (
    ActivationMeasures,
    embedding_effective_rank,
    measures_from_activations,
    pattern_distance,
    pattern_names,
    resid_names,
    weight_norms,
)
from plateauscope.runs.run import Run
from plateauscope.tasks.base import Measure, Task, TaskError

MEASURE_RECORD_VERSION = 1
"""Bumped when a built-in measure's definition changes (the cache recomputes)."""
BUILT_IN: dict[str, tuple[str, str]] = {
    "weight_norm": ("model", "the L2 norm of every parameter"),
    "weight_norm_layer": ("layer", "the L2 norm of each layer's parameters"),
    "embedding_rank": ("model", "the effective rank of the embedding W_E (Roy & Vetterli)"),
    "collapse": ("layer", "representation collapse: each layer's mean pairwise cosine similarity (Gopalani & Hu)"),
    "repetition_bias": ("model", "the share of consecutive predictions that repeat (Gopalani & Hu)"),
    "pattern_distance": ("head", "each head's attention-pattern distance from the last checkpoint's"),
}
"""The built-in measures: name -> (what one value describes, description)."""


@dataclass
class MeasureInputs:
    """What every step's measures share: the examples, the evaluation set, the last checkpoint's patterns."""

    tokens: Tensor
    """The seeded examples (full sequences) the activation measures read."""
    evalset: Any
    """The run's evaluation set (what a task's own measures get)."""
    final_patterns: Tensor
    """Every head's attention pattern on ``tokens`` at ``reference_step``."""
    reference_step: int


@torch.inference_mode()
def step_activations(model: Model, task: Task, tokens: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """One forward of ``tokens``'s inputs, the way the attention analysis runs it
    (``plateauscope.analysis.prefix.activations``): the residual stream and the attention patterns of every
    layer, and the logits at the loss positions (the last layer's residual stream unembedded there)."""
    n_layers = model.cfg.n_layers
    inputs = tokens[:, : task.input_len].to(next(model.parameters()).device)
    cache = activations(model, inputs, resid_names(n_layers) + pattern_names(n_layers))
    last = cache[resid_names(n_layers)[-1]][:, task.loss_positions]  # [N, P, d_model]
    logits = unembed_last(model, last.reshape(-1, last.shape[-1])).reshape(*last.shape[:2], -1)
    return cache, logits


def from_activations(model: Model, task: Task, acts: tuple[dict[str, Tensor], Tensor]) -> ActivationMeasures:
    """:func:`plateauscope.model.measures.measures_from_activations` of :func:`step_activations`'s forward."""
    cache, logits = acts
    return measures_from_activations(cache, logits, model.cfg.n_layers, task.loss_positions, task.input_len)


def measure_inputs(run: Run, n_examples: int, seed: int, device: str = "cpu", backend: str | None = None,
                   model: Model | None = None) -> MeasureInputs:
    """The shared inputs of :func:`measure_record` for ``run``: one forward of its last checkpoint (``model``:
    that checkpoint already loaded; None: loaded here)."""
    task = run.task()
    tokens = task.tokens[task.sample_examples(n_examples, seed)]
    tc = run.config.train
    evalset = task.build_evalset(tc.eval_groups, tc.tracked_groups, tc.seed) if task.measures() else None
    last = run.steps[-1]
    model = run.model(last, device, backend) if model is None else model
    final = from_activations(model, task, step_activations(model, task, tokens)).patterns
    return MeasureInputs(tokens, evalset, final, last)


def attention_and_measures(model: Model, task: Task, inputs: MeasureInputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The attention record (``plateauscope.analysis.attention.attention_to_z`` on the same examples, the same
    numbers) and :func:`measure_record`, from one forward."""
    acts = step_activations(model, task, inputs.tokens)
    names = pattern_names(model.cfg.n_layers)
    patterns = torch.stack([acts[0][n] for n in names], dim=1).float().cpu()
    stats = attention_stats_from_patterns(patterns, inputs.tokens, task)
    n = torch.tensor([stats.n_examples], dtype=torch.float32)[:, None, None]

    def avg(value: Tensor) -> Tensor:  # attention_stats's average over its one chunk, for the same rounding
        return (torch.stack([value]) * n).sum(0) / n.sum()

    attention = AttentionToZ(avg(stats.to_z_first), avg(stats.to_z_all_targets), avg(stats.entropy_first),
                             len(inputs.tokens), {k: avg(v) for k, v in stats.rules.items()})
    return attention.to_dict(), measure_record(model, task, inputs, acts)


def _where(task: Task, error: BaseException) -> str:
    """``file:line`` of the deepest frame of the traceback in the task's own file (else the deepest frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    source = inspect.getsourcefile(type(task)) or ""
    own = [f for f in frames if Path(f.filename) == Path(source)] or frames[-1:]
    return f"{own[-1].filename}:{own[-1].lineno}" if own else source


def task_measure(measure: Measure, model: Model, task: Task, evalset: Any) -> float | list:
    """One of the task's own measures at this checkpoint, as plain JSON (a number or nested lists), checked
    against its ``per``; a one-line TaskError naming the task file, the measure and the line when it raises."""
    source = inspect.getsourcefile(type(task)) or type(task).__name__
    try:
        with torch.no_grad():
            value = measure.compute(model, task, evalset)
    except Exception as e:  # noqa: BLE001 -- any error of the task author's code becomes one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise TaskError(f"{_where(task, e)}: the measure {measure.name!r} raised {type(e).__name__}: {first}") from None
    shape = {"model": (), "layer": (model.cfg.n_layers,), "head": (model.cfg.n_layers, model.cfg.n_heads)}[measure.per]
    array = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value, dtype=float)
    if array.shape != shape:
        raise TaskError(f"{source}: the measure {measure.name!r} (per {measure.per}) returned shape "
                        f"{list(array.shape)}, not {list(shape)}")
    return float(array) if not shape else array.tolist()


def measure_record(model: Model, task: Task, inputs: MeasureInputs,
                   acts: tuple[dict[str, Tensor], Tensor] | None = None) -> dict[str, Any]:
    """Every measure of ``model`` (module docstring): ``{"per": {name: per}, "values": {name: value}}``."""
    for measure in task.measures():
        if measure.name in BUILT_IN:
            raise TaskError(f"{inspect.getsourcefile(type(task))}: the measure {measure.name!r} has the name of a "
                            "built-in measure; rename it")
    total, per_layer = weight_norms(model)
    acts_ = from_activations(model, task, acts or step_activations(model, task, inputs.tokens))
    values: dict[str, Any] = {"weight_norm": total, "weight_norm_layer": per_layer,
                              "embedding_rank": embedding_effective_rank(model), "collapse": acts_.collapse,
                              "pattern_distance": pattern_distance(acts_.patterns, inputs.final_patterns).tolist()}
    if acts_.repetition is not None:
        values["repetition_bias"] = acts_.repetition
    per = {name: BUILT_IN[name][0] for name in values}
    for measure in task.measures():
        values[measure.name] = task_measure(measure, model, task, inputs.evalset)
        per[measure.name] = measure.per
    return {"per": per, "values": values}


def descriptions(task: Task) -> dict[str, str]:
    """Every measure's one-line description: the built-in ones', then the task's."""
    return {**{name: what for name, (_, what) in BUILT_IN.items()},
            **{m.name: m.description or m.name.replace("_", " ") for m in task.measures()}}


def measure_series(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The cached records as one series per value: a model measure under its name, a layer measure per
    layer (``collapse[L0]``), a head measure as its mean over heads (``pattern_distance:mean``) and the
    head whose value changes most from the first to the last record (``pattern_distance:top``, with
    ``head``). Each: ``{"steps", "values", "per", "measure", "head"}``."""
    if not records:
        return {}
    steps = [int(r["step"]) for r in records]
    names = list(dict.fromkeys(n for r in records for n in r.get("values", {})))
    out: dict[str, dict[str, Any]] = {}

    def add(key: str, name: str, values: list[float | None], head: str | None = None) -> None:
        out[key] = {"steps": steps, "values": values, "per": records[-1]["per"].get(name), "measure": name,
                    "head": head}

    for name in names:
        raw = [r["values"].get(name) for r in records]
        per = next((r["per"][name] for r in reversed(records) if name in r.get("per", {})), "model")
        if per == "model":
            add(name, name, [None if v is None else float(v) for v in raw])
        elif per == "layer":
            n = max(len(v) for v in raw if v is not None)
            for layer in range(n):
                add(f"{name}[L{layer}]", name, [None if v is None else v[layer] for v in raw])
        else:
            grids = [None if v is None else np.asarray(v, dtype=float) for v in raw]
            add(f"{name}:mean", name, [None if g is None else float(np.nanmean(g)) for g in grids])
            known = [g for g in grids if g is not None]
            change = np.abs(known[-1] - known[0])
            if np.isfinite(change).any():
                layer, head = divmod(int(np.nanargmax(change)), change.shape[1])
                add(f"{name}:top", name, [None if g is None else float(g[layer, head]) for g in grids],
                    head_label(layer, head))
    return out


def final_values(records: list[dict[str, Any]]) -> Mapping[str, tuple[float | None, float | None]]:
    """Each series of :func:`measure_series` at its first and last record (for a table)."""
    out = {}
    for key, series in measure_series(records).items():
        vals = [v for v in series["values"] if v is not None and math.isfinite(v)]
        out[key] = (vals[0], vals[-1]) if vals else (None, None)
    return out
