"""The plateau verdict and the know-nothing reference against hand-built models and brute force; the plateau's
stretch and counts in ``summary.json`` against records counted by hand."""

import itertools
import json
import math

import pytest

from plateauscope.runs.metrics import compute_tau, plateau_stretch, summarize
from plateauscope.runs.run import Run
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_layout import SPECIAL_TOKENS
from plateauscope.tasks.selector_metrics import (
    EvalSet,
    evaluate,
    know_nothing_reference,
)
from tests.conftest import copy_run
from tests.handbuilt import UniformOverAlphabet, UniformOverCandidates

VARIANTS = [
    {},
    {"a_len": 2, "target_uniqueness": "group", "distinct_first_char": False},  # first characters repeat
    {"a_len": 1, "target_uniqueness": "group", "order": "zb"},
    {"tails": "by_first_char", "target_uniqueness": "group", "a_len": 3},
    {"selectors": "private"},
    {"no_z": True},
]


def small_task(**kw) -> SelectorTask:
    base = {"n_b": 12, "K": 4, "b_len": 3, "a_len": 3, "alphabet": "abcdef", "seed": 2}
    return SelectorTask.generate(TaskConfig(**{**base, **kw}))


def brute_force_reference(task: SelectorTask) -> dict:
    """Enumerate every string of the alphabet: the mass a uniform model puts on each group's
    candidates, and on the characters that start one of them."""
    V, L = len(task.cfg.alphabet), task.cfg.a_len
    ids = range(len(SPECIAL_TOKENS), len(SPECIAL_TOKENS) + V)
    set_losses, first_losses = [], []
    for cands in task.a_tokens.tolist():
        cands = {tuple(c) for c in cands}
        mass = sum(V ** -L for s in itertools.product(ids, repeat=L) if s in cands)
        first_mass = sum(1 / V for c in ids if any(s[0] == c for s in cands))
        set_losses.append(-math.log(mass))
        first_losses.append(-math.log(first_mass))
    return {"set_loss": sum(set_losses) / len(set_losses), "first_token_set_loss": sum(first_losses) / len(first_losses)}


def records_of(model, task: SelectorTask, steps=(0, 10, 20, 30)) -> list[dict]:
    """The metrics a frozen model would log at each step (evaluated once, on every group)."""
    evalset = EvalSet.build(task, n_eval_groups=task.cfg.n_b, n_tracked_groups=2, seed=0)
    m = evaluate(model, task, evalset)
    return [{**m, "step": s} for s in steps]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_know_nothing_reference_equals_brute_force(variant):
    task = small_task(**variant)
    ref, brute = know_nothing_reference(task), brute_force_reference(task)
    assert ref["set_loss"] == pytest.approx(brute["set_loss"], rel=1e-12)
    assert ref["first_token_set_loss"] == pytest.approx(brute["first_token_set_loss"], rel=1e-12)
    # ... and the uniform-over-alphabet model, scored by evaluate, gets exactly that.
    m = records_of(UniformOverAlphabet(task), task)[0]
    assert m["set_loss"] == pytest.approx(brute["set_loss"], abs=1e-4)
    assert m["first_token_set_loss"] == pytest.approx(brute["first_token_set_loss"], abs=1e-4)
    assert m["first_token_loss"] == pytest.approx(math.log(len(task.cfg.alphabet)), abs=1e-4)


def test_paper_task_reference_is_the_readme_number():
    ref = know_nothing_reference(SelectorTask.generate(TaskConfig(n_b=100, K=10)))
    assert ref["set_loss"] == pytest.approx(4 * math.log(36) - math.log(10), abs=1e-9)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_verdicts_on_hand_built_models(variant):
    task = small_task(**variant)
    ref, log_k = know_nothing_reference(task), task.cfg.log_k
    marginal = records_of(UniformOverCandidates(task), task)
    assert marginal[0]["set_loss"] == pytest.approx(0.0, abs=1e-5)
    assert marginal[0]["candidate_loss"] == pytest.approx(log_k, abs=1e-5)
    assert marginal[0]["first_token_set_loss"] == pytest.approx(0.0, abs=1e-5)
    shelf = records_of(UniformOverAlphabet(task), task)
    for records, want in [(marginal, "marginal"), (shelf, "shelf")]:
        block = summarize(records, task.progress, ref)["plateau"]
        assert block["verdict"] == want
        assert block["share"][want] == 1.0 and block["n_evaluations"] == len(records)
    # Half the plateau on the shelf, half on the marginal: neither holds two thirds.
    half = shelf[:2] + [{**r, "step": r["step"] + 100} for r in marginal[:2]]
    block = summarize(half, task.progress, ref)["plateau"]
    assert block["verdict"] == "mixed" and block["t_marginal"] == 100
    assert block["share"]["marginal"] == block["share"]["shelf"] == 0.5


def test_no_plateau_no_verdict():
    task = small_task()
    rec = records_of(UniformOverCandidates(task), task)
    assert summarize(rec, task.progress, None)["plateau"] is None
    moved = [{**r, "candidate_loss": 0.0} for r in rec]  # never near log K: no plateau stretch
    assert summarize(moved, task.progress, know_nothing_reference(task))["plateau"]["verdict"] is None


def _grokking_like(h: float) -> list[dict]:
    """A held-out loss at its height for steps 0-20, memorised far above it for steps 30-900, back inside the
    band for 910-950, then the drop at 960: the first and the last in-band step would join 0 to 950."""
    value = {**{s: h for s in range(0, 21, 10)}, **{s: 3.5 * h for s in range(30, 901, 10)},
             **{s: 1.05 * h for s in range(910, 951, 10)}, 960: 0.2 * h, 970: 0.1 * h}
    return [{"step": s, "heldout_loss": v, "set_loss": 7.0 + (s >= 910)} for s, v in sorted(value.items())]


def test_summary_json_holds_the_longest_stretch_and_its_counts_not_a_join():
    h = math.log(59)
    progress = ProgressMeasure("heldout_loss", h, "log_p")
    records = _grokking_like(h)
    summary = summarize(records, progress, {"metric": "set_loss", "set_loss": 8.0})
    assert "plateau_span" not in summary and "plateau_fraction_of_tau" not in summary
    # counted by hand: 96 evaluations before tau (960), 3 + 5 inside, the longest run the last five
    counts = summary["plateau_counts"]
    assert summary["tau"] == 960 and summary["plateau_stretch"] == [910, 950] == counts["stretch"]
    assert (counts["n_before"], counts["n_inside"], counts["n_stretch"], counts["holds"]) == (96, 8, 5, False)
    assert counts["range"] == [h, 3.5 * h]
    # the median set loss and the verdict read the stretch's evaluations only (8.0 there, 7.0 before)
    assert summary["plateau_median_set_loss"] == 8.0 and summary["plateau"]["n_evaluations"] == 5
    assert summarize(records, progress, None)["plateau_stretch"] == [910, 950]


def test_a_run_reads_its_stretch_an_older_summary_its_span_and_none_computes_it(tiny_run, tmp_path):
    run_dir = copy_run(tiny_run, tmp_path / "run")
    run = Run(run_dir)
    records, progress = run.metrics(), run.progress
    computed = plateau_stretch(records, progress, compute_tau(records, progress))["stretch"]
    assert run.plateau_stretch() == run.summary["plateau_stretch"] == computed
    summary = {k: v for k, v in run.summary.items() if k not in ("plateau_stretch", "plateau_counts")}
    (run_dir / "summary.json").write_text(json.dumps({**summary, "plateau_span": [3, 77]}))  # an older summary
    assert Run(run_dir).plateau_stretch() == [3, 77]
    (run_dir / "summary.json").unlink()  # still training: from the metrics
    assert Run(run_dir).plateau_stretch() == computed
