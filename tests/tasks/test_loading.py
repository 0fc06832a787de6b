"""The task seam: loading a task by name or from a file, one-line errors for a broken task file,
and old run directories (before tasks existed) still loading as the selector task."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plateauscope.cli.train import main as train_main
from plateauscope.runs.config import RunConfig
from plateauscope.runs.run import Run
from plateauscope.tasks.base import TaskError
from plateauscope.tasks.induction import InductionTask
from plateauscope.tasks.loading import build_task, task_class
from plateauscope.tasks.selector import SelectorTask

ROOT = Path(__file__).resolve().parents[2]

GOOD = '''
from dataclasses import dataclass

import torch

from plateauscope.model.config import JsonConfig
from plateauscope.tasks.base import ProgressMeasure, Task


@dataclass(frozen=True)
class CopyConfig(JsonConfig):
    n: int = 64
    seed: int = 0


class Copy(Task):
    """Predict the token two back: a sequence of 6 random tokens, the loss on the last 3."""
    Config = CopyConfig

    def __init__(self, cfg, tokens):
        self.cfg, self.tokens, self.vocab = cfg, tokens, [str(i) for i in range(8)]

    @classmethod
    def generate(cls, cfg):
        return cls(cfg, TOKENS(cfg))

    @property
    def loss_positions(self):
        return [2, 3, 4]

    @property
    def progress(self):
        return ProgressMeasure("loss", 2.0, "log_8", label="loss")

    def build_evalset(self, n_eval, n_tracked, seed):
        return self.tokens[:16]

    def evaluate(self, model, evalset, batch_size=512):
        return EVALUATE(self, model, evalset)


def TOKENS(cfg):
    gen = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(0, 8, (cfg.n, 6), generator=gen)


def EVALUATE(task, model, evalset):
    return {"loss": task.loss(model(evalset[:, : task.input_len]), evalset).item(), "accuracy": 0.0}
'''


CUE = GOOD.replace("    Config = CopyConfig\n", "    Config = CopyConfig\n    capabilities = frozenset({'cue'})\n") + '''

def _cue_positions(self, tokens, query):
    return torch.full((tokens.shape[0], 1), CUE_AT)


Copy.cue_positions = _cue_positions
'''


def task_file(tmp_path: Path, text: str = GOOD, name: str = "copy_task.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("spec, cls", [("selector", SelectorTask), ("induction", InductionTask),
                                       ("plateauscope.tasks.induction:InductionTask", InductionTask)])
def test_builtin_and_module_specs(spec, cls):
    assert task_class(spec) is cls


def test_a_task_file_trains_from_the_command_line(tmp_path, capsys):
    spec = f"{task_file(tmp_path)}:Copy"
    out = tmp_path / "run"
    assert train_main(["--task", spec, "--out", str(out), "--max-steps", "6", "--batch-size", "8", "--no-progress"]) == 0
    run = Run(out)
    assert run.config.task_name == spec and run.task().tokens.shape == (64, 6) and len(run.metrics()) > 1
    assert run.summary["log_8"] == 2.0  # the task's own plateau height, under its own name


def test_a_task_file_takes_its_options_with_set(tmp_path, capsys):
    spec = f"{task_file(tmp_path)}:Copy"
    out = tmp_path / "run"
    assert train_main(["--task", spec, "--set", "n=32", "--out", str(out), "--max-steps", "2", "--batch-size", "8",
                       "--no-progress"]) == 0
    assert Run(out).config.task.n == 32 and Run(out).task().tokens.shape == (32, 6)
    assert train_main(["--task", spec, "--set", "size=32", "--out", str(tmp_path / "r2"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no option named 'size': the {spec} task has n, seed; the model" in err, err
    (tmp_path / "u").mkdir()
    unseeded_file = task_file(tmp_path / "u", GOOD.replace("    seed: int = 0", "").replace("cfg.seed", "0"))
    unseeded = f"{unseeded_file}:Copy"
    assert train_main(["--task", unseeded, "--data-seed", "3", "--out", str(tmp_path / "r3"), "--no-progress"]) == 2
    assert f"--data-seed: the {unseeded} task has no seed option" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()


@pytest.mark.parametrize("body, expected", [
    (GOOD.replace("class Copy(Task):", "class Other(Task):"), "no class 'Copy'"),
    (GOOD.replace("class Copy(Task):", "class Copy:"), "must subclass plateauscope.tasks.base.Task"),
    (GOOD.replace("    @property\n    def loss_positions", "    @property\n    def loss_positions_"),
     "missing loss_positions"),
    (GOOD.replace("    Config = CopyConfig\n", ""), "missing Config"),
    (GOOD.replace("def TOKENS(cfg):", "def TOKENS(cfg):\n    return torch.zeros(cfg.n)\n"),
     r"tokens must have 2 dimensions \[D, seq\], got shape \[64\]"),
    (GOOD.replace("def TOKENS(cfg):", "def TOKENS(cfg):\n    return torch.zeros(cfg.n, 6, dtype=torch.int32)\n"),
     r"tokens must hold 64-bit integer ids \(torch.long\), got torch.int32"),
    (CUE.replace("CUE_AT", "7"), r"cue_positions at query 2 must lie in \[0, 2\] \(the positions it can attend to; -1 pads\), got 7..7"),
    (CUE.replace("CUE_AT", "-3"), r"cue_positions at query 2 must lie in \[0, 2\].*got -3..-3"),
    (CUE.replace("torch.full((tokens.shape[0], 1), CUE_AT)", "[[0]]"),
     r"cue_positions at query 2 must be a \[N, C\] torch.long tensor of key positions \(N = 64 sequences\), got list"),
    (GOOD.replace("return [2, 3, 4]", "return [2, 3, 9]"), r"loss_positions must be a non-empty list of ints in \[0, 5\)"),
    (GOOD.replace("torch.randint(0, 8,", "torch.randint(0, 9,"), r"token ids must lie in \[0, 8\)"),
    (GOOD + "\nthis is not python\n", "importing it failed"),
])
def test_a_broken_task_file_is_one_line_naming_file_and_part(tmp_path, body, expected):
    path = task_file(tmp_path, body)
    with pytest.raises(TaskError, match=expected) as err:
        cls = task_class(f"{path}:Copy")
        build_task(f"{path}:Copy", cls.Config())
    assert "\n" not in str(err.value) and (str(path) in str(err.value) or "copy_task" in str(err.value))


def test_evaluate_without_the_progress_measure_is_one_line(tmp_path, capsys):
    path = task_file(tmp_path, GOOD.replace('return {"loss":', 'return {"lost":'))
    code = train_main(["--task", f"{path}:Copy", "--out", str(tmp_path / "r"), "--max-steps", "2", "--batch-size", "8",
                       "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "evaluate() must return a dict with its progress measure 'loss'" in err


def test_bad_task_flag_is_one_line_exit_2_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "plateauscope", "train", "--task", "nosuch", "--out", "/tmp/unused-run"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a built-in task" in done.stderr, done.stderr


@pytest.mark.parametrize("spec, expected", [("missing.py:X", "no such task file"),
                                            ("no_such_module:X", "cannot import module")])
def test_bad_task_flag_is_one_line_exit_2(spec, expected, tmp_path, capsys):
    code = train_main(["--task", spec, "--out", str(tmp_path / "unused-run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "unused-run").exists()


def test_run_directories_from_before_tasks_load_as_the_selector_task(tiny_run, tmp_path):
    old = shutil.copytree(tiny_run, tmp_path / "old")
    cfg = json.loads((old / "config.json").read_text())
    del cfg["run"]["task_name"], cfg["run"]["model"]["attn_only"]  # what config.json held before
    (old / "config.json").write_text(json.dumps(cfg))
    run = Run(old)
    assert run.config.task_name == "selector" and isinstance(run.task(), SelectorTask)
    assert run.config == RunConfig.from_dict(json.loads((tiny_run / "config.json").read_text())["run"])
