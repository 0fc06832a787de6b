"""Runs a user can steer: full batch, extending a finished run bit for bit, the task file kept in the run,
validation before anything is written, a task file's own error in one line, the held-out split and a
task measure as the progress measure."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from plateauscope.cli.train import main
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.loading import build_task, sha256_of
from plateauscope.training.train import RunState, evaluation_sets, train, training_tokens
from tests.tasks.test_loading import GOOD, task_file


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / rd.CHECKPOINT_DIR / rd.checkpoint_name(step))


def test_extending_a_finished_run_equals_one_longer_run(tmp_path, one_thread):
    cfg = get_preset("tiny").replace(max_steps=2, warmup_steps=3)  # the warmup spans the extension
    train(cfg, tmp_path / "short", device="cpu", progress=False)
    assert Run(tmp_path / "short").summary["final_step"] == 2
    summary = train(cfg.replace(max_steps=4), tmp_path / "short", resume=True, device="cpu", progress=False)
    train(cfg.replace(max_steps=4), tmp_path / "long", device="cpu", progress=False)
    assert summary["final_step"] == 4 and Run(tmp_path / "short").config.train.max_steps == 4
    extended, straight = _weights(tmp_path / "short", 4), _weights(tmp_path / "long", 4)
    assert extended.keys() == straight.keys() and all(torch.equal(extended[k], straight[k]) for k in straight)
    final = [r for r in Run(tmp_path / "short").metrics() if r["step"] == 4]
    assert len(final) == 1 and final[0]["loss"] == Run(tmp_path / "long").metrics()[-1]["loss"]


def test_a_shorter_horizon_or_another_change_is_still_refused(tmp_path, capsys, one_thread):
    out = tmp_path / "r"
    assert main(["--preset", "tiny", "--max-steps", "4", "--out", str(out), "--no-progress"]) == 0
    for argv in (["--max-steps", "2"], ["--max-steps", "8", "--lr", "0.5"]):
        assert main(["--preset", "tiny", "--out", str(out), "--resume", "--no-progress", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "only a larger --max-steps extends a run" in err, err


def test_full_batch_steps_on_the_whole_data_set(tmp_path, one_thread):
    cfg = get_preset("tiny").replace(full_batch=True, batch_size=100000, max_steps=1)
    task = build_task(cfg.task_name, cfg.task)
    state = RunState.start(tmp_path, cfg.train, evaluation_sets(task, cfg.train, 0), task.progress, len(task.tokens),
                           {}, None)
    assert torch.equal(state.next_batch(task.tokens), task.tokens)
    state.close()
    train(cfg, tmp_path / "r", device="cpu", progress=False)
    run = Run(tmp_path / "r")
    _assert_first_step_is_one_adamw_step_on(run, run.task().tokens)
    assert run.metrics()[-1]["tokens_seen"] == len(run.task().tokens) * run.task().tokens_per_example()


def _assert_first_step_is_one_adamw_step_on(run: Run, tokens: torch.Tensor) -> None:
    """Step 1's weights are one AdamW step, by hand, on the whole of ``tokens`` from the run's step-0 weights."""
    tc, task, model = run.config.train, run.task(), run.model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=tc.betas)
    with torch.enable_grad():
        task.loss(model(tokens[:, : task.input_len]), tokens).backward()
    opt.step()
    got = run.model(1).state_dict()
    # AdamW's first step moves each weight by lr times the sign of its gradient: where a gradient is zero but
    # for rounding (the key bias, which softmax ignores; a few others), the sign is the two forwards'
    # rounding. Any other batch moves nearly every weight differently.
    off = sum(int((got[k] - v).abs().gt(1e-6).sum()) for k, v in model.state_dict().items()
              if not k.endswith(("b_K", "k.bias")))
    assert off <= 1e-3 * sum(v.numel() for v in model.state_dict().values()), off


def test_the_task_file_is_kept_and_loaded_when_the_original_moved(tmp_path, capsys, one_thread):
    (tmp_path / "src").mkdir()
    path = task_file(tmp_path / "src")
    out = tmp_path / "run"
    assert main(["--task", f"{path}:Copy", "--out", str(out), "--max-steps", "2", "--batch-size", "8",
                 "--no-progress"]) == 0
    stored = json.loads((out / rd.CONFIG_FILE).read_text())["task_source"]
    assert stored["sha256"] == sha256_of(path) == sha256_of(out / rd.TASK_SOURCE_FILE)
    path.rename(tmp_path / "moved.py")
    run = Run(out)
    assert run.task().tokens.shape == (64, 6) and run.model(2) is not None


@pytest.mark.parametrize("argv, message", [
    (["--set", "weight_decay=-1"], "weight_decay must be at least 0, got -1.0"),
    (["--set", "betas=0.9,1.5"], "betas must be two numbers in [0, 1)"),
    (["--set", "eval_batch_size=0"], "eval_batch_size must be at least 1"),
])
def test_bad_config_values_are_one_line_and_leave_no_directory(tmp_path, capsys, argv, message):
    out = tmp_path / "r"
    assert main(["--preset", "tiny", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_misspelt_evaluate_key_fails_before_anything_is_written(tmp_path, capsys):
    path = task_file(tmp_path, GOOD.replace('return {"loss":', 'return {"los":'))
    out = tmp_path / "r"
    argv = ["--task", f"{path}:Copy", "--out", str(out), "--max-steps", "2", "--batch-size", "8"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "progress measure 'loss'" in captured.err
    assert not out.exists()
    assert main(argv) == 2 and "already holds a run" not in capsys.readouterr().err  # the next try is the same


def test_a_misspelt_name_in_a_task_method_names_the_file_the_method_and_the_line(tmp_path, capsys):
    body = GOOD.replace("def EVALUATE(task, model, evalset):\n",
                        "def EVALUATE(task, model, evalset):\n    torhc.zeros(1)\n")
    path = task_file(tmp_path, body)
    line = textwrap.dedent(body).splitlines().index("    torhc.zeros(1)") + 1
    out = tmp_path / "r"
    assert main(["--task", f"{path}:Copy", "--out", str(out), "--max-steps", "2", "--batch-size", "8",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{path}: EVALUATE() failed at line {line} (NameError: name 'torhc' is not defined)" in err, err
    assert not out.exists()


SPLIT = GOOD + '''

def _train_indices(self):
    return torch.arange(0, 48)


def _heldout_indices(self):
    return torch.arange(48, 64)


Copy.train_indices = _train_indices
Copy.heldout_indices = _heldout_indices
'''


def test_training_samples_the_training_split_and_logs_the_held_out_one(tmp_path, one_thread):
    path = task_file(tmp_path, SPLIT)
    train(_file_config(path, max_steps=3, full_batch=True), tmp_path / "r", device="cpu", progress=False)
    run = Run(tmp_path / "r")
    task = run.task()
    assert torch.equal(training_tokens(task), task.tokens[:48])
    record = run.metrics()[-1]
    model = run.model(3)
    held = task.tokens[48:]
    with torch.no_grad():
        logits = model(held[:, : task.input_len])[:, [2, 3, 4]]
    by_hand = torch.nn.functional.cross_entropy(logits.flatten(0, 1), held[:, 3:6].flatten())
    assert math.isclose(record["heldout_loss"], float(by_hand), rel_tol=1e-5)
    right = (logits.argmax(-1) == held[:, 3:6]).all(-1).float().mean()
    assert math.isclose(record["heldout_accuracy"], float(right))
    _assert_first_step_is_one_adamw_step_on(run, task.tokens[:48])


MEASURED = GOOD.replace('return ProgressMeasure("loss", 2.0, "log_8", label="loss")',
                        'return ProgressMeasure("param_sq", 2.0, "log_8", label="sum of squares")') + '''

from plateauscope.tasks.base import Measure


def _measures(self):
    return (Measure("param_sq", lambda model, task, evalset: sum(float(p.detach().pow(2).sum())
                                                                 for p in model.parameters())),)


Copy.measures = _measures
'''


def test_a_task_measure_can_be_the_progress_measure(tmp_path, one_thread):
    path = task_file(tmp_path, MEASURED)
    train(_file_config(path, max_steps=2), tmp_path / "r", device="cpu", progress=False)
    run = Run(tmp_path / "r")
    model = run.model(2)
    assert math.isclose(run.metrics()[-1]["param_sq"], sum(float(p.pow(2).sum()) for p in model.parameters()),
                        rel_tol=1e-6)


def test_a_failing_progress_measure_is_one_line_naming_it(tmp_path, capsys):
    path = task_file(tmp_path, MEASURED.replace("lambda model, task, evalset: sum(", "lambda model, task, evalset: 1 / 0 + sum("))
    assert main(["--task", f"{path}:Copy", "--out", str(tmp_path / "r"), "--max-steps", "2", "--batch-size", "8",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measure 'param_sq' failed at " in err and "ZeroDivisionError" in err, err
    assert not (tmp_path / "r").exists()


def _file_config(path: Path, **train: object):
    from plateauscope.runs.presets import run_config

    return run_config(None, f"{path}:Copy", batch_size=8, **train)


def test_full_batch_from_the_command_line(tmp_path, capsys, one_thread):
    out = tmp_path / "r"
    assert main(["--preset", "tiny", "--full-batch", "--max-steps", "1", "--out", str(out), "--no-progress"]) == 0
    assert Run(out).config.train.full_batch and "tau not reached" in capsys.readouterr().out
