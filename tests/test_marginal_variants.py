"""The cheap-marginal task variants (a shared target pool, Zipf first characters) and the
global-marginal reference, against brute-force counts and hand-built models."""

import collections
import math

import numpy as np
import pytest

from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_metrics import EvalSet, evaluate, global_marginal_reference
from plateauscope.training.config import ConfigError, TaskConfig
from plateauscope.training.metrics import summarize
from tests.handbuilt import GlobalMarginal, UniformOverAlphabet, UniformOverCandidates
from tests.test_plateau import records_of, small_task

POOL = {"target_pool": 6, "target_uniqueness": "group", "distinct_first_char": False}
VARIANTS = [{}, POOL, {"first_char_zipf": 1.0}, {"tails": "by_first_char", "target_uniqueness": "group"},
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


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
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
