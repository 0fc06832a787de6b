"""The selector task ((B, z) -> A): its strings and positions, its variants (each builds a valid task, trains a
few steps and is recorded; impossible ones fail with one line), and the cheap-marginal variants and the
global-marginal reference against brute-force counts and hand-built models."""

import collections
import json
import math

import numpy as np
import pytest
import torch

from plateauscope.cli.train import main
from plateauscope.errors import ConfigError
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.metrics import summarize
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_layout import BOS, SEP, Layout
from plateauscope.tasks.selector_metrics import EvalSet, evaluate, global_marginal_reference
from plateauscope.training.train import train
from tests.handbuilt import GlobalMarginal, UniformOverAlphabet, UniformOverCandidates
from tests.runs.test_metrics import records_of, small_task


def test_strings_are_unique_and_shaped():
    cfg = TaskConfig(n_b=200, K=12, seed=3)
    task = SelectorTask.generate(cfg)
    assert task.tokens.shape == (cfg.D, task.layout.seq_len)
    assert len({tuple(r) for r in task.b_tokens.tolist()}) == cfg.n_b
    assert len({tuple(r) for r in task.z_tokens.tolist()}) == cfg.K
    flat_a = task.a_tokens.reshape(-1, cfg.a_len).tolist()
    assert len({tuple(r) for r in flat_a}) == cfg.D  # A -> B is a function
    first = task.a_tokens[:, :, 0]
    assert all(len(set(row)) == cfg.K for row in first.tolist())  # distinct first characters


def test_deterministic_in_seed():
    a, b, c = (SelectorTask.generate(TaskConfig(n_b=50, K=5, seed=s)) for s in (1, 1, 2))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)


def test_backward_layout_positions():
    task = SelectorTask.generate(TaskConfig(n_b=20, K=4))
    lay = task.layout
    sep, bos = task.vocab.index(SEP), task.vocab.index(BOS)
    assert (task.tokens[:, 0] == bos).all()
    assert (task.tokens[:, lay.sep_positions] == sep).all()
    assert lay.first_target_pred_pos == lay.sep_positions[-1] == lay.a_span[0] - 1
    assert lay.target_pred_positions == list(range(lay.a_span[0] - 1, lay.a_span[1] - 1))
    assert lay.input_len == lay.seq_len - 1 == lay.a_span[1] - 1
    # example g*K + j is (B_g, z_j) -> A_gj
    g, j = 7, 2
    row = task.tokens[g * 4 + j]
    assert torch.equal(row[slice(*lay.b_span)], task.b_tokens[g])
    assert torch.equal(row[slice(*lay.z_span)], task.z_tokens[j])
    assert torch.equal(row[slice(*lay.a_span)], task.a_tokens[g, j])


def test_forward_layout_has_no_selector():
    task = SelectorTask.generate(TaskConfig(n_b=20, K=4, direction="forward"))
    lay = task.layout
    assert lay.z_span is None and lay.target_span == lay.b_span
    assert lay.a_span[1] < lay.b_span[0]
    assert torch.equal(task.tokens[5, slice(*lay.b_span)], task.b_tokens[1])


def test_records_round_trip():
    task = SelectorTask.generate(TaskConfig(n_b=30, K=3, seed=5))
    back = SelectorTask.from_records(task.cfg, task.records())
    assert torch.equal(back.tokens, task.tokens)
    r = task.records()[4]
    assert r["group"] == 1 and r["selector"] == 1 and len(r["b"]) == 6 and len(r["a"]) == 4


def test_candidate_sequences_diagonal_is_the_data():
    task = SelectorTask.generate(TaskConfig(n_b=10, K=3))
    groups = torch.tensor([2, 5])
    seqs = task.candidate_sequences(groups)
    assert seqs.shape == (2, 3, 3, task.layout.seq_len)
    diag = seqs[:, torch.arange(3), torch.arange(3)]
    assert torch.equal(diag, task.tokens[task.example_ids(groups)])
    a0, a1 = task.layout.a_span
    assert torch.equal(seqs[1, 0, 2, a0:a1], task.a_tokens[5, 2])  # prefix of j=0, target of k=2


@pytest.mark.parametrize("kwargs, message", [
    ({"K": 1297}, "K=1297 is larger than the 1296 distinct selectors"),
    ({"n_b": 40, "b_len": 1}, "n_b=40 is larger than the 36 distinct base strings"),
    ({"K": 37, "z_len": 3}, "cannot start with distinct characters"),
    ({"n_b": 700, "K": 1, "a_len": 2}, "unique targets need more than half"),
    ({"direction": "sideways"}, "direction must be one of"),
    ({"K": 0}, "K must be at least 1"),
])
def test_impossible_requests_fail_with_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        SelectorTask.generate(TaskConfig(**kwargs))
    assert "\n" not in str(info.value)


def test_digits_cover_the_alphabet():
    task = SelectorTask.generate(TaskConfig(n_b=500, K=10))
    used = np.unique(task.a_tokens.numpy())
    assert len(used) == 36 and used.min() == 2  # ids 0, 1 are <BOS>, <SEP>
    assert Layout.for_task(task.cfg).seq_len == 15


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
    summary = rd.read_json(out / rd.SUMMARY_FILE)
    if summary["plateau_counts"]["holds"]:  # a verdict only on a plateau its counts support
        assert f"plateau verdict {summary['plateau']['verdict'] or 'none'}" in last
    else:
        assert "no plateau at log K" in last and "plateau verdict" not in last
    assert str(out) in last
    task = rd.read_json(out / rd.CONFIG_FILE)["run"]["task"]
    assert (task["a_len"], task["target_uniqueness"], task["order"]) == (1, "group", "zb")


def test_set_reads_each_value_as_the_declared_type_of_its_field():
    cfg = get_preset("tiny").with_options(["K=8", "order=zb", "no_z=false", "lr=2e-3", "masked_heads=0.1,0.0",
                                           "grad_clip=1.5", "donor=none"])
    assert (cfg.task.K, cfg.task.order, cfg.task.no_z, cfg.train.lr) == (8, "zb", False, 0.002)
    assert cfg.train.masked_heads == ("0.1", "0.0") and cfg.train.grad_clip == 1.5 and cfg.train.donor is None
    assert cfg == get_preset("tiny").replace(K=8, order="zb", no_z=False, lr=2e-3, masked_heads=("0.1", "0.0"),
                                             grad_clip=1.5)


POOL = {"target_pool": 6, "target_uniqueness": "group", "distinct_first_char": False}
MARGINAL_VARIANTS = [{}, POOL, {"first_char_zipf": 1.0}, {"tails": "by_first_char", "target_uniqueness": "group"},
            {"a_len": 2, "target_uniqueness": "group", "distinct_first_char": False}]


def brute_force_global(task: SelectorTask) -> dict:
    """Count every example's target and first character in Python; sum each group's distinct ones."""
    targets = [tuple(a) for grp in task.a_tokens.tolist() for a in grp]
    count, first = collections.Counter(targets), collections.Counter(a[0] for a in targets)
    set_losses, first_losses = [], []
    for grp in task.a_tokens.tolist():
        set_losses.append(-math.log(sum(count[a] for a in {tuple(a) for a in grp}) / len(targets)))
        first_losses.append(-math.log(sum(first[c] for c in {a[0] for a in grp}) / len(targets)))
    return {"set_loss": np.mean(set_losses), "first_token_set_loss": np.mean(first_losses)}


@pytest.mark.parametrize("variant", MARGINAL_VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_global_marginal_reference_equals_brute_force_and_the_model_that_knows_p_a(variant):
    task = small_task(**variant)
    ref, brute = global_marginal_reference(task), brute_force_global(task)
    assert ref["set_loss"] == pytest.approx(brute["set_loss"], rel=1e-12)
    assert ref["first_token_set_loss"] == pytest.approx(brute["first_token_set_loss"], rel=1e-12)
    # The model that knows p(A), scored by evaluate through its own logits, gets exactly that.
    m = records_of(GlobalMarginal(task), task)[0]
    assert m["set_loss"] == pytest.approx(ref["set_loss"], abs=1e-4)
    assert m["first_token_set_loss"] == pytest.approx(ref["first_token_set_loss"], abs=1e-4)
    assert task.plateau_reference()["global_marginal"] == ref


def test_a_pool_is_m_strings_drawn_uniformly_and_its_marginal_is_worth_log_m_over_k():
    cfg = TaskConfig(n_b=2000, K=10, target_pool=50, target_uniqueness="group", distinct_first_char=False)
    task = SelectorTask.generate(cfg)
    targets = collections.Counter(tuple(a) for grp in task.a_tokens.tolist() for a in grp)
    assert len(targets) == 50
    assert all(len({tuple(a) for a in grp}) == 10 for grp in task.a_tokens.tolist())
    # Each string is in a group with probability K / M: 400 of 2,000 groups, binomial sd ~18.
    assert all(abs(c - 400) < 5 * 18 for c in targets.values())
    assert global_marginal_reference(task)["set_loss"] == pytest.approx(math.log(50 / 10), abs=0.01)
    assert task.plateau_reference()["set_loss"] == pytest.approx(4 * math.log(36) - math.log(10))


def test_zipf_first_characters_follow_the_law():
    # One draw per group (K = 1): the first character's frequencies are the Zipf weights 1 / rank.
    cfg = TaskConfig(n_b=40000, K=1, first_char_zipf=1.0)
    task = SelectorTask.generate(cfg)
    first_ids = [task.vocab.index(c) for c in cfg.alphabet]
    freq = np.array([(task.a_tokens[:, 0, 0] == i).float().mean().item() for i in first_ids])
    weights = 1 / np.arange(1, 37)
    assert freq == pytest.approx(weights / weights.sum(), abs=0.006)
    # K > 1: distinct first characters per group, and the frequent ones are in more groups.
    task = SelectorTask.generate(TaskConfig(n_b=500, K=10, first_char_zipf=1.0))
    assert all(len(set(grp)) == 10 for grp in task.a_tokens[:, :, 0].tolist())
    per_char = [(task.a_tokens[:, :, 0] == i).sum().item() for i in first_ids]
    assert per_char[0] > per_char[9] > per_char[35]
    assert len({tuple(a) for grp in task.a_tokens.tolist() for a in grp}) == 5000  # still globally unique
    assert global_marginal_reference(task)["first_token_set_loss"] < math.log(36 / 10) - 0.3


def test_the_paper_data_is_unchanged_by_the_new_options():
    base = SelectorTask.generate(TaskConfig(n_b=100, K=10, seed=3))
    explicit = SelectorTask.generate(TaskConfig(n_b=100, K=10, seed=3, target_pool=0, first_char_zipf=0.0))
    assert bool((base.tokens == explicit.tokens).all())


def test_verdicts_with_a_pool_the_model_that_knows_the_pool_is_a_global_marginal_not_a_shelf():
    task = small_task(n_b=30, K=3, target_pool=6, target_uniqueness="group", distinct_first_char=False)
    ref = task.plateau_reference()
    for model, want in [(GlobalMarginal(task), "global marginal"), (UniformOverCandidates(task), "marginal"),
                        (UniformOverAlphabet(task), "shelf")]:
        block = summarize(records_of(model, task), task.progress, ref)["plateau"]
        assert block["verdict"] == want, (want, block)
    block = summarize(records_of(GlobalMarginal(task), task), task.progress, ref)["plateau"]
    assert block["share"]["global_marginal"] == 1.0 and block["t_global_marginal"] == 0
    assert block["global_marginal_threshold"] == pytest.approx(ref["global_marginal"]["set_loss"] + 0.1 * math.log(3))


def test_a_global_marginal_equal_to_the_know_nothing_model_is_no_kind_of_its_own():
    # One-character targets, uniform first characters: knowing p(A) is knowing nothing.
    task = small_task(a_len=1, target_uniqueness="group", alphabet="abcdefghijkl", n_b=40)
    block = summarize(records_of(GlobalMarginal(task), task), task.progress, task.plateau_reference())["plateau"]
    assert block["global_marginal_threshold"] is None and block["verdict"] == "shelf"


@pytest.mark.parametrize("options, message", [
    ({"target_pool": 3}, "cannot give each group K=10"),
    ({"target_pool": 20}, "target_pool needs target_uniqueness=group"),
    ({"target_pool": 20, "target_uniqueness": "group"}, "target_pool needs distinct_first_char=False"),
    ({"target_pool": -1}, "target_pool must be 0"),
    ({"target_pool": 10**7, "target_uniqueness": "group", "distinct_first_char": False}, "more than the 1679616"),
    ({"first_char_zipf": -1.0}, "first_char_zipf must be 0"),
    ({"first_char_zipf": float("nan")}, "first_char_zipf must be 0"),
    ({"first_char_zipf": 1.0, "distinct_first_char": False, "target_uniqueness": "group"},
     "first_char_zipf needs distinct_first_char"),
])
def test_impossible_marginal_variants_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        TaskConfig(n_b=100, K=10, **options).validate()


def test_the_command_line_refuses_a_pool_without_its_options(capsys):
    from plateauscope.cli.train import main

    assert main(["--preset", "tiny", "--set", "target_pool=20", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "target_pool needs target_uniqueness=group" in err


ZIPF_REPEATING = {"first_char_zipf": 1.0, "target_uniqueness": "group"}


@pytest.mark.parametrize("variant", [POOL, ZIPF_REPEATING], ids=["pool", "zipf"])
def test_the_references_are_over_the_groups_the_set_loss_is_measured_on(variant):
    # 5 of 30 groups evaluated: the know-nothing and p(A) models, scored on those groups, get exactly the
    # references over the same groups. The p(A) reference over every group differs from it.
    task = small_task(n_b=30, **variant)
    evalset = EvalSet.build(task, n_eval_groups=5, n_tracked_groups=2, seed=1)
    ref, everywhere = task.plateau_reference(evalset), task.plateau_reference()
    assert evaluate(UniformOverAlphabet(task), task, evalset)["set_loss"] == pytest.approx(ref["set_loss"], abs=1e-4)
    measured = evaluate(GlobalMarginal(task), task, evalset)["set_loss"]
    assert measured == pytest.approx(ref["global_marginal"]["set_loss"], abs=1e-4)
    assert abs(measured - everywhere["global_marginal"]["set_loss"]) > 1e-2
