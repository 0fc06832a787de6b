"""The public API (``import plateauscope as ps``) and the one command (``plateauscope <verb>``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import plateauscope as ps
from plateauscope.cli import VERBS, main

SRC = Path(__file__).resolve().parent.parent / "src" / "plateauscope"


def test_every_public_name_resolves_and_the_type_checking_imports_match():
    for name in ps._API:
        assert getattr(ps, name) is not None, name
    tree = ast.parse((SRC / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    imported = {a.asname or a.name for n in ast.walk(block) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert imported == set(ps._API)
    assert sorted(dir(ps)) == sorted(["__version__", *ps._API])
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ps.nothing  # noqa: B018


def test_train_analyze_and_open_a_run_through_the_api(tmp_path):
    summary = ps.train("tiny", out=tmp_path / "run", progress=False, seed=3)
    run = ps.Run(tmp_path / "run")
    assert run.config.train.seed == 3 and run.summary == summary and len(run.steps) > 2
    result = ps.analyze(run, steps=run.steps[-2:], n_exact=1, progress=False, edges=False)
    assert result["head"] is not None
    assert ps.load_analysis(run.path)["attention"], "the analysis cache holds attention records"
    model = run.model(run.steps[-1])
    pairs = ps.prompt_pairs(run.task(), 8)
    assert ps.patch(model, pairs, "heads").effect.shape[0] == model.cfg.n_layers


def test_api_errors_are_one_line(tmp_path):
    with pytest.raises(ps.ConfigError, match="unknown preset 'nope'"):
        ps.train("nope", out=tmp_path / "r")
    with pytest.raises(ps.ConfigError, match="give out="):
        ps.train("tiny")
    with pytest.raises(ps.ConfigError, match="the task's options are"):
        ps.load_task("selector", n_bb=3)
    assert ps.load_task("selector", n_b=20, K=3).cfg.K == 3


def test_help_lists_every_verb_once(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in VERBS:
        assert sum(line.split()[0] == verb for line in out.splitlines() if line.startswith("  ")) == 1, verb


def test_unknown_verb_is_one_line_exit_2(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown verb 'trian'" in err and "train" in err


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_bad_flag_of_every_verb_is_one_line_exit_2(verb, capsys):
    with pytest.raises(SystemExit) as stop:
        main([verb, "--no-such-flag"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and f"see plateauscope {verb} --help" in err, err


@pytest.mark.parametrize("argv", [["-m", "plateauscope", "--help"], ["-m", "interp.patch", "--help"]])
def test_module_entry_points(argv):
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: plateauscope" in done.stdout


def test_the_first_command_still_works_as_an_alias(tiny_run, tmp_path):
    """``python -m interp.patch --ckpt CKPT``: the same table as ``plateauscope patch``, and its one-line errors."""
    args = ["--ckpt", str(tiny_run), "--n-examples", "8", "--top", "3", "--no-progress"]
    alias = subprocess.run([sys.executable, "-m", "interp.patch", *args], capture_output=True, text=True)
    verb = subprocess.run([sys.executable, "-m", "plateauscope", "patch", *args], capture_output=True, text=True)
    assert alias.returncode == 0 and alias.stdout == verb.stdout and "L0" in alias.stdout
    bad = subprocess.run([sys.executable, "-m", "interp.patch", "--ckpt", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing" in bad.stderr


def test_run_analysis_is_typed_and_holds_what_the_cache_holds(tiny_run, tmp_path):
    import shutil

    import numpy as np
    import torch

    path = shutil.copytree(tiny_run, tmp_path / "tiny")
    run = ps.Run(path)
    ps.analyze(run, every=2, n_exact=2, progress=False)
    analysis, raw = run.analysis(), ps.load_analysis(path)
    assert isinstance(analysis, ps.Analysis) and analysis.steps == [r["step"] for r in raw["attention"]]
    last = analysis.attention[-1]
    assert last.to_cue.shape == (run.config.model.n_layers, run.config.model.n_heads)
    np.testing.assert_array_equal(last.to_cue, np.array(raw["attention"][-1]["to_z_first"]))
    assert analysis.summary is not None and analysis.summary.head == tuple(raw["routing"]["head"])
    assert set(analysis.summary.formation) == set(raw["routing"]["t_form_rules"])
    assert analysis.summary.circuit_verdict == raw["routing"]["circuit"]["verdict"]
    assert {a.step for a in analysis.ablation} <= set(analysis.steps) and analysis.edges and analysis.circuit
    # the ablation cache's selector-task field names arrive in neutral words
    zero, cached = analysis.ablation[-1].kinds["zero"], raw["ablation"][-1]["zero"]
    assert set(zero.ablated) == {"progress", "cue_effect"} and zero.base["progress"] == cached["base"]["candidate_loss"]
    np.testing.assert_array_equal(zero.ablated["progress"], np.array(cached["candidate_loss"]))
    assert analysis.summary.height == run.progress.height
    # the stored head patching is what patching the checkpoint again gives
    patched = analysis.patching[-1]
    settings = raw["patch"][-1]["settings"]
    pairs = ps.prompt_pairs(run.task(), settings["n_examples"], seed=settings["seed"])
    again = ps.patch(run.model(patched.step), pairs, "heads")
    torch.testing.assert_close(patched.sweeps["heads"].raw, again.raw, atol=1e-6, rtol=0)
    assert patched.sweeps["heads"].clean_metric == pytest.approx(again.clean_metric, abs=1e-6)


def test_the_api_and_the_command_line_take_one_path_to_a_config(monkeypatch, tmp_path):
    """``plateauscope train``'s flags and ``ps.train``'s keywords make the same RunConfig
    (``plateauscope.runs.presets.run_config``)."""
    from plateauscope import api
    from plateauscope.cli.train import build_parser, config_from_args
    from plateauscope.runs.presets import run_config, task_defaults

    flags = ["--preset", "ci", "--set", "K=8", "--lr", "0.003", "--data-seed", "2", "--seed", "5"]
    expected = run_config("ci", assignments=["K=8"], lr=0.003, seed=5, data_seed=2)
    assert config_from_args(build_parser().parse_args(flags)) == expected
    assert expected.task.K == 8 and expected.task.seed == 2 and expected.model.seed == expected.train.seed == 5
    assert config_from_args(build_parser().parse_args(["--task", "induction"])) == task_defaults("induction")
    seen = []
    monkeypatch.setattr(api, "train_run", lambda cfg, out, **kw: seen.append(cfg) or {})
    api.train(task="induction", out=tmp_path)
    api.train("ci", out=tmp_path, K=8, lr=0.003)
    assert seen == [task_defaults("induction"), run_config("ci", K=8, lr=0.003)]
