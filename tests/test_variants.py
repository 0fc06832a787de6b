"""SelectorTask variants: each builds a valid task, trains a few steps and is recorded; impossible ones fail
with one line and exit code 2; old run directories load with the defaults."""

import json

import pytest
import torch

from plateauscope.cli.train import main
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_layout import SEP, Layout
from plateauscope.training import run as rd
from plateauscope.training.config import ConfigError, RunConfig, TaskConfig
from plateauscope.training.presets import get_preset
from plateauscope.training.run import Run
from plateauscope.training.train import train

VARIANTS = {
    "a_len1_group": {"a_len": 1, "target_uniqueness": "group"},
    "a_len2_group_any_first": {"a_len": 2, "target_uniqueness": "group", "distinct_first_char": False},
    "tails_by_first_char": {"tails": "by_first_char", "target_uniqueness": "group"},
    "order_zb": {"order": "zb"},
    "a_len1_zb": {"a_len": 1, "target_uniqueness": "group", "order": "zb"},
    "selectors_private": {"selectors": "private"},
    "no_z": {"no_z": True},
    "no_z_a_len1": {"no_z": True, "a_len": 1, "target_uniqueness": "group"},
}


def check_task(task: SelectorTask) -> None:
    """The invariants every variant keeps: K distinct targets per group, layout-placed tokens."""
    cfg, lay = task.cfg, task.layout
    for grp in task.a_tokens.tolist():
        assert len({tuple(a) for a in grp}) == cfg.K
    if cfg.target_uniqueness == "global":
        assert len({tuple(a) for a in task.a_tokens.reshape(-1, cfg.a_len).tolist()}) == cfg.D
    if cfg.distinct_first_char:
        assert all(len(set(row)) == cfg.K for row in task.a_tokens[:, :, 0].tolist())
    if cfg.tails == "by_first_char":  # one global tail per first character
        tail = {}
        for a in task.a_tokens.reshape(-1, cfg.a_len).tolist():
            assert tail.setdefault(a[0], tuple(a[1:])) == tuple(a[1:])
    z = task.selector_tokens()
    assert all(len({tuple(s) for s in grp}) == cfg.K for grp in z.tolist())
    if cfg.selectors == "shared":
        assert bool((z == z[:1]).all())
    assert (task.tokens[:, lay.sep_positions] == task.vocab.index(SEP)).all()
    assert lay.a_span[1] == lay.seq_len and lay.first_target_pred_pos == lay.a_span[0] - 1
    g, j = task.group, task.selector
    assert torch.equal(task.tokens[:, slice(*lay.b_span)], task.b_tokens[g])
    assert torch.equal(task.tokens[:, slice(*lay.a_span)], task.a_tokens[g, j])
    if lay.z_span is None:
        assert cfg.no_z and lay.seq_len == 1 + cfg.b_len + 1 + cfg.a_len
    else:
        assert torch.equal(task.tokens[:, slice(*lay.z_span)], z[g, j])
        assert (lay.z_span[0] < lay.b_span[0]) == (cfg.order == "zb")
    back = SelectorTask.from_records(cfg, task.records())
    assert torch.equal(back.tokens, task.tokens)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_builds_a_valid_task(name):
    check_task(SelectorTask.generate(TaskConfig(n_b=300, K=10, **VARIANTS[name])))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_trains_and_is_recorded(tmp_path, name):
    cfg = get_preset("tiny").replace(max_steps=8, **VARIANTS[name])
    summary = train(cfg, tmp_path / name, device="cpu", progress=False)
    run = Run(tmp_path / name)
    stored = rd.read_json(tmp_path / name / rd.CONFIG_FILE)
    for key, value in VARIANTS[name].items():
        assert stored["run"]["task"][key] == value
    assert run.config == cfg and run.task().layout == Layout.for_task(cfg.task)
    assert stored["layout"]["seq_len"] == run.task().layout.seq_len
    check_task(run.task())
    rec = run.metrics()[-1]
    assert rec["candidate_loss"] is not None and rec["first_token_set_loss"] is not None
    assert summary["plateau"] is not None and summary["plateau"]["know_nothing"]["set_loss"] > 0
    if cfg.task.no_z:
        assert rec["delta_z"] == pytest.approx(0.0, abs=1e-6)  # no selector to replace


def test_old_run_directory_loads_with_defaults(tmp_path, tiny_run):
    import shutil
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    raw = json.loads((old / rd.CONFIG_FILE).read_text())
    for key in ("target_uniqueness", "tails", "order", "selectors", "no_z"):
        del raw["run"]["task"][key]
    (old / rd.CONFIG_FILE).write_text(json.dumps(raw))
    run = Run(old)
    assert run.config == Run(tiny_run).config
    assert torch.equal(run.task().tokens, Run(tiny_run).task().tokens)
    train(run.config, old, resume=True, device="cpu", progress=False)  # resumes as a no-op, no config clash


IMPOSSIBLE = [
    (["--set", "a_len=1"], "unique targets need more than half"),
    (["--set", "a_len=0"], "a_len must be at least 1"),
    (["--set", "tails=by_first_char"], "more than half of the 36 targets allowed by tails=by_first_char"),
    (["--set", "direction=forward", "--set", "target_uniqueness=group"], "A -> B is not a function"),
    (["--set", "direction=forward", "--set", "order=zb"], "order=zb has no meaning for the forward task"),
    (["--set", "direction=forward", "--set", "selectors=private"], "selectors=private has no meaning for the forward"),
    (["--set", "direction=forward", "--set", "no_z=true"], "no_z=True has no meaning for the forward task"),
    (["--set", "no_z=true", "--set", "order=zb"], "order=zb has no meaning with no_z"),
    (["--set", "no_z=true", "--set", "selectors=private"], "selectors=private has no meaning with no_z"),
    (["--set", "K=37", "--set", "a_len=1", "--set", "target_uniqueness=group"],
     "cannot start with distinct characters"),
    (["--set", "Kk=3"], "no option named 'Kk': the selector task has n_b, K, "),
    (["--set", "K=three"], "--set K=three: K takes an integer, got 'three'"),
    (["--set", "no_z=maybe"], "no_z takes true or false"),
    (["--set", "K"], "--set expects KEY=VALUE"),
]


@pytest.mark.parametrize("argv, message", IMPOSSIBLE, ids=[" ".join(a) for a, _ in IMPOSSIBLE])
def test_impossible_variant_is_one_line_exit_2(tmp_path, capsys, argv, message):
    assert main(["--preset", "tiny", "--no-progress", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_bad_choice_is_one_line_exit_2(capsys):
    assert main(["--preset", "tiny", "--set", "order=ba"]) == 2
    err = capsys.readouterr().err.strip()
    assert "order must be one of ('bz', 'zb'), got 'ba'" in err and len(err.splitlines()) == 1, err


def test_group_uniqueness_without_distinct_first_char_needs_enough_strings():
    with pytest.raises(ConfigError, match="K=40 distinct targets per group: there are only 36"):
        TaskConfig(K=40, a_len=1, target_uniqueness="group", distinct_first_char=False, z_len=2).validate()
    assert RunConfig.from_dict({"task": {"a_len": 2}}).task.order == "bz"


def test_cli_trains_a_variant_and_prints_the_verdict(tmp_path, capsys):
    out = tmp_path / "v"
    argv = ["--preset", "tiny", "--no-progress", "--max-steps", "5", "--out", str(out),
            "--set", "a_len=1", "--set", "target_uniqueness=group", "--set", "order=zb"]
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    verdict = rd.read_json(out / rd.SUMMARY_FILE)["plateau"]["verdict"]
    assert f"plateau verdict {verdict or 'none'}" in last and str(out) in last
    task = rd.read_json(out / rd.CONFIG_FILE)["run"]["task"]
    assert (task["a_len"], task["target_uniqueness"], task["order"]) == (1, "group", "zb")


def test_set_reads_each_value_as_the_declared_type_of_its_field():
    cfg = get_preset("tiny").with_options(["K=8", "order=zb", "no_z=false", "lr=2e-3", "masked_heads=0.1,0.0",
                                           "grad_clip=1.5", "donor=none"])
    assert (cfg.task.K, cfg.task.order, cfg.task.no_z, cfg.train.lr) == (8, "zb", False, 0.002)
    assert cfg.train.masked_heads == ("0.1", "0.0") and cfg.train.grad_clip == 1.5 and cfg.train.donor is None
    assert cfg == get_preset("tiny").replace(K=8, order="zb", no_z=False, lr=2e-3, masked_heads=("0.1", "0.0"),
                                             grad_clip=1.5)

