"""The measures of the cheap pass (plateauscope.analysis.measures): cached per analysed step under the run's
key, equal to the built-in measures computed on the checkpoint directly, a task's own measures beside them,
and a measure that raises or returns the wrong shape gives one line naming the task file, the measure and
the line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from plateauscope.analysis.analyze import analyze_run, load_analysis
from plateauscope.analysis.attention import attention_to_z
from plateauscope.analysis.changepoint import ChangePointRule, change_point, measure_signals
from plateauscope.analysis.measures import (
    BUILT_IN,
    MeasureInputs,
    measure_record,
    measure_series,
    task_measure,
)
from plateauscope.analysis.results import MEASURES_FILE, analysis_dir
from plateauscope.model.measures import activation_measures, embedding_effective_rank, weight_norms
from plateauscope.runs.run import Run
from plateauscope.tasks.base import Measure, TaskError
from tests.conftest import copy_run


def test_the_cheap_pass_caches_every_measure_at_every_step(tiny_run, tmp_path):
    path = copy_run(tiny_run, tmp_path / "tiny", steps=[0, 20, 40])
    analyze_run(path, expensive=False, progress=False, edges=False)
    records = load_analysis(path)["measures"]
    run = Run(path)
    assert [r["step"] for r in records] == run.steps
    assert set(records[0]["values"]) == set(BUILT_IN)
    assert records[0]["settings"]["reference_step"] == 40
    # the record is the measure of the checkpoint, computed here directly
    model, task = run.model(20), run.task()
    middle = records[1]["values"]
    total, per_layer = weight_norms(model)
    assert middle["weight_norm"] == pytest.approx(total) and middle["weight_norm_layer"] == pytest.approx(per_layer)
    assert middle["embedding_rank"] == pytest.approx(embedding_effective_rank(model))
    tokens = task.tokens[task.sample_examples(256, 0)]
    acts = activation_measures(model, tokens, task.loss_positions)
    assert middle["collapse"] == pytest.approx(acts.collapse)
    # the attention record came from the same forward: exactly attention_to_z's
    cached = next(r for r in load_analysis(path)["attention"] if r["step"] == 20)
    alone = attention_to_z(model, task, 256, 0).to_dict()
    assert all(cached[k] == alone[k] for k in alone)
    # the last checkpoint is its own reference pattern; an earlier one is some way from it
    assert np.allclose(records[-1]["values"]["pattern_distance"], 0)
    assert np.asarray(records[0]["values"]["pattern_distance"]).min() > 0
    # a second pass computes nothing: the file is unchanged
    before = (analysis_dir(path) / MEASURES_FILE).read_text()
    analyze_run(path, expensive=False, progress=False, edges=False)
    assert (analysis_dir(path) / MEASURES_FILE).read_text() == before
    series = measure_series(records)
    assert {"weight_norm", "collapse[L0]", "pattern_distance:mean"} <= set(series)
    assert series["pattern_distance:top"]["head"] in {"L0H0", "L0H1"}
    assert all(json.loads(line)["settings"]["task"] for line in before.splitlines())


def _task_with(tiny_run, *measures: Measure):
    task = Run(tiny_run).task()
    task.measures = lambda: measures  # an instance's own: the task file is still the class's
    return task


def _inputs(task) -> MeasureInputs:
    tokens = task.tokens[:8]
    return MeasureInputs(tokens, task.tokens[:16], torch.zeros(0), 0)


def test_a_task_measure_is_recorded_beside_the_built_in_ones(tiny_run):
    run = Run(tiny_run)
    model = run.model(40)

    def first_layer_norm(model, task, evalset):  # per layer: an independent count of the evalset
        return torch.full((model.cfg.n_layers,), float(len(evalset)))

    task = _task_with(tiny_run, Measure("examples_seen", first_layer_norm, per="layer"))
    inputs = MeasureInputs(task.tokens[:8], task.tokens[:16],
                           activation_measures(model, task.tokens[:8], task.loss_positions).patterns, 40)
    record = measure_record(model, task, inputs)
    assert record["values"]["examples_seen"] == [16.0] and record["per"]["examples_seen"] == "layer"


def test_a_measure_that_raises_is_one_line_naming_the_file_the_measure_and_the_line(tiny_run):
    model = Run(tiny_run).model(40)
    task = _task_with(tiny_run)

    def broken(model, task, evalset):
        return undefined_name  # noqa: F821 -- the task author's misspelling
    line = broken.__code__.co_firstlineno + 1

    with pytest.raises(TaskError) as err:
        task_measure(Measure("broken", broken), model, task, None)
    message = str(err.value)
    assert "\n" not in message and "'broken'" in message and "NameError" in message
    assert f"test_measures.py:{line}" in message


def test_a_measure_of_the_wrong_shape_is_one_line(tiny_run):
    model = Run(tiny_run).model(40)
    task = _task_with(tiny_run)
    with pytest.raises(TaskError, match=r"'per_head' \(per head\) returned shape \[3\], not \[1, 2\]"):
        task_measure(Measure("per_head", lambda m, t, e: [1.0, 2.0, 3.0], per="head"), model, task, None)
    with pytest.raises(TaskError, match="name of a built-in measure"):
        measure_record(model, _task_with(tiny_run, Measure("collapse", lambda m, t, e: 0.0)), _inputs(task))


def _records(values_of_step, steps):
    return [{"step": s, "per": {"rank": "model", "collapse": "layer", "dist": "head"},
             "values": values_of_step(s)} for s in steps]


def test_measures_enter_the_one_change_point_rule_with_a_known_change():
    steps = list(range(0, 400, 10))
    rng = np.random.default_rng(0)

    def values(s):  # the rank steps up at 200; layer 1's collapse falls at 300; head (0, 1) moves most
        return {"rank": 1.0 + (s >= 200) + 0.01 * rng.normal(), "collapse": [0.5, 0.9 - 0.5 * (s >= 300)],
                "dist": [[0.1, 1.0 - s / 400]]}

    signals = measure_signals(_records(values, steps))
    assert set(signals) == {"measure:rank", "measure:collapse[L0]", "measure:collapse[L1]", "measure:dist:mean",
                            "measure:dist:top"}
    assert signals["measure:dist:top"].head == "L0H1"
    rule = ChangePointRule()
    assert change_point(*_series(signals["measure:rank"]), (0, 100), 0, rule).step == 200
    found = change_point(*_series(signals["measure:collapse[L1]"]), (0, 100), 0, rule)
    assert found.step == 300 and found.direction == "fall"


def _series(signal):
    return signal.steps, signal.values
