"""The induction task: its data, a hand-built model with the known circuit, TransformerLens's
head detector, and the trained `induction` preset analysed with no task-specific code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformer_lens.head_detector import detect_head

from plateauscope.analysis.ablate import ablate_each_head
from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.attention import attention_stats, attention_to_z
from plateauscope.analysis.inputs import logit_diff, prompt_pairs
from plateauscope.analysis.patch import patch
from plateauscope.errors import ConfigError
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.induction import InductionConfig, InductionTask
from plateauscope.training.train import train
from tests.conftest import built_once
from tests.handbuilt_induction import (
    INDUCTION_HEAD,
    PREVIOUS_TOKEN_HEAD,
    handbuilt_induction_task,
    induction_model,
)

# ---- the data -------------------------------------------------------------------------------


def test_sequences_repeat_their_segment_a_varying_distance_later():
    task = InductionTask.generate(InductionConfig(n_sequences=200, repeat_fraction=0.5, seed=3))
    L, F = task.cfg.segment_len, task.cfg.max_gap
    assert task.tokens.shape == (200, 1 + F + 2 * L) and (task.tokens[:, 0] == 0).all()
    assert 0.3 < task.repeats.float().mean() < 0.7 and len(set(task.gaps.tolist())) > F // 2
    for row, rep, k in zip(task.tokens, task.repeats, task.gaps):
        first, second = row[1 + k: 1 + k + L], row[1 + F + L:]
        assert torch.equal(first, second) == bool(rep)
        body = row[1: 1 + F + L] if rep else row[1:]
        assert len(set(body.tolist())) == len(body)  # every token distinct but the repeat
    assert torch.equal(InductionTask.generate(InductionConfig(n_sequences=200, repeat_fraction=0.5, seed=3)).tokens,
                       task.tokens)


def test_cue_is_the_token_to_predict():
    task = InductionTask.generate(InductionConfig(n_sequences=50))
    for q in task.loss_positions:
        cue = task.cue_positions(task.tokens, q)
        assert cue.shape == (50, 1)
        assert torch.equal(task.tokens.gather(1, cue)[:, 0], task.tokens[:, q + 1])
    pairs = task.prompt_pairs(20, seed=1)
    changed = (pairs.clean != pairs.corrupt).sum(1)
    assert (changed == 1).all() and pairs.pred_pos == task.input_len - 1
    assert torch.equal(pairs.clean_answer, task.tokens[pairs.examples, pairs.pred_pos + 1])
    assert not (task.tokens[pairs.examples] == pairs.corrupt_answer[:, None]).any()  # a token the row lacks


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": 40}, "vocab_size=40 must be at least"), ({"segment_len": 2}, "segment_len must be at least 3"),
    ({"repeat_fraction": 0.0}, "repeat_fraction must lie in"), ({"max_gap": -1}, "max_gap must be at least 0"),
])
def test_impossible_configs_are_one_line_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        InductionTask.generate(InductionConfig(**change))


# ---- the hand-built model: the known circuit -----------------------------------------------


@pytest.fixture(scope="module")
def handbuilt():
    task = handbuilt_induction_task()
    return task, induction_model(task)


def test_handbuilt_model_copies(handbuilt):
    task, model = handbuilt
    metrics = task.evaluate(model, task.build_evalset(32, 32, 0))
    assert metrics["repeat_loss"] < 1e-3 and metrics["accuracy"] == 1.0 and metrics["delta_cue"] > 2.0


def test_what_an_ablation_reads_equals_the_whole_evaluation(handbuilt):
    """``evaluate_without_loss`` (what an ablation reads) is ``evaluate`` without the training loss's forward: the
    same numbers, bit for bit, for the same forwards of the same inputs."""
    task, model = handbuilt
    evalset = task.build_evalset(32, 32, 0)
    whole, read = task.evaluate(model, evalset), task.evaluate_without_loss(model, evalset)
    assert "loss" in whole and read == {k: v for k, v in whole.items() if k != "loss"}
    assert {task.progress.key, task.progress.cue_effect_key} <= set(read)


def test_toolkit_names_the_built_heads(handbuilt):
    task, model = handbuilt
    res = attention_to_z(model, task, n_examples=64)
    assert res.top_head() == INDUCTION_HEAD
    assert float(res.to_z_all_targets[INDUCTION_HEAD]) > 0.99
    prev = res.rules["previous token"]
    assert divmod(int(prev.argmax()), prev.shape[1]) == PREVIOUS_TOKEN_HEAD and float(prev[PREVIOUS_TOKEN_HEAD]) > 0.99
    pairs = prompt_pairs(task, 32, seed=0)
    with torch.no_grad():
        assert float(logit_diff(model(pairs.clean), pairs)) > 10  # the clean answer, by the unembedding's margin
    heads = patch(model, pairs, "heads")
    effect = heads.normalised
    assert float(effect[INDUCTION_HEAD]) == pytest.approx(1.0, abs=1e-3)
    others = [float(effect[la, h]) for la in range(2) for h in range(2) if (la, h) != INDUCTION_HEAD]
    assert max(abs(x) for x in others) < 1e-3  # the corrupted cue is read by the induction head alone


def test_ablation_of_the_built_heads_has_the_known_effect(handbuilt):
    """Zero-ablating the induction head leaves every logit 0: the repeat loss is log(vocabulary size)
    exactly. Ablating a head with no weights changes nothing; the previous-token head's mean-ablation
    removes the key the induction head matches on, so the repeat loss rises."""
    task, model = handbuilt
    zero = ablate_each_head(model, task, "zero", n_groups=1)
    assert float(zero.candidate_loss[INDUCTION_HEAD]) == pytest.approx(math.log(len(task.vocab)), abs=1e-4)
    idle = [(la, h) for la in range(2) for h in range(2) if (la, h) not in (INDUCTION_HEAD, PREVIOUS_TOKEN_HEAD)]
    for head in idle:
        assert float(zero.d_candidate_loss[head]) == pytest.approx(0.0, abs=1e-6)
    mean = ablate_each_head(model, task, "mean", n_groups=1)
    assert float(mean.candidate_loss[PREVIOUS_TOKEN_HEAD]) > 1.0 > zero.base["candidate_loss"]


def detector_scores(model, tokens: torch.Tensor, pattern: str) -> torch.Tensor:
    """``transformer_lens.head_detector.detect_head`` averaged over sequences. Our model has no
    tokenizer, so ``to_tokens`` hands the detector the sequence named by its index."""
    model.to_tokens = lambda seq: tokens if isinstance(seq, list) else tokens[int(seq)][None]
    try:
        return detect_head(model, [str(i) for i in range(len(tokens))], pattern).float()
    finally:
        del model.to_tokens


def check_against_detector(model, task: InductionTask, n: int = 24) -> None:
    """Our attention rules equal TransformerLens's detection scores, which average over every query
    row of the input: the previous-token rule misses only row 0, and the induction pattern marks
    exactly our cue positions (every token of a repeat sequence is distinct but the repeat)."""
    tokens = task.tokens[task.sample_examples(n, seed=2)][:, : task.input_len]
    ours = attention_stats(model, tokens, task)
    n_rows = task.input_len
    prev = detector_scores(model, tokens, "previous_token_head")
    torch.testing.assert_close(ours.rules["previous token"] * (n_rows - 1) / n_rows, prev, atol=1e-5, rtol=0)
    induction = detector_scores(model, tokens, "induction_head")
    torch.testing.assert_close(ours.to_z_all_targets * len(task.loss_positions) / n_rows, induction, atol=1e-5, rtol=0)


def test_attention_rules_equal_the_head_detector_on_the_handbuilt_model(handbuilt):
    task, model = handbuilt
    check_against_detector(model, task)


# ---- the trained preset, analysed with no task-specific code --------------------------------


@pytest.fixture(scope="session")
def induction_run(tmp_path_factory):
    """The `induction` preset trained and analysed once for the session (about 40 s on 2 cores)."""
    def build(out: Path) -> dict:
        train(get_preset("induction"), out, device="cpu", progress=False)
        # the edges of induction are tested in tests/analysis/test_edges.py (hand-built) and test_edges_autocircuit.py;
        # here they would add minutes (49-token prompts)
        return analyze_run(out, every=6, n_exact=4, progress=False, edges=False)

    return built_once(tmp_path_factory, "induction", build)


@pytest.mark.slow
def test_induction_run_has_a_plateau_and_a_drop(induction_run):
    out, _ = induction_run
    run = Run(out)
    summary = run.summary
    assert summary["tau"] is not None and summary["plateau_stretch"] is not None
    first, last = run.metrics()[0], run.metrics()[-1]
    assert first["repeat_loss"] > 0.9 * run.progress.height and last["repeat_loss"] < 0.5 * run.progress.height
    assert json.loads((out / "config.json").read_text())["run"]["task_name"] == "induction"


@pytest.mark.slow
def test_analysis_finds_the_known_circuit(induction_run):
    _, s = induction_run
    assert s["head"][0] == 1, s["label"]  # the induction head: layer 1
    prev = s["attention_rules"]["previous token"]
    assert prev["head"][0] == 0 and prev["final_value"] > 0.3, prev  # the previous-token head: layer 0
    assert s["final_value"] > 0.5  # the induction head reads the cue at the end
    assert s["t_form"] is not None and prev["t_form"] is not None


@pytest.mark.slow
def test_attention_rules_equal_the_head_detector_on_trained_checkpoints(induction_run):
    out, s = induction_run
    run = Run(out)
    steps = run.steps
    for step in (steps[0], s["tau"], steps[-1]):
        check_against_detector(run.model(step), run.task())


@pytest.mark.slow
def test_another_task_meets_no_selector_words(induction_run):
    """The routing summary of a task that is not the selector task names nothing of the selector task:
    no key, and no line of the printed summary, speaks of log K, candidate loss, delta_z or z."""
    from plateauscope.analysis.results import ROUTING_FILE, analysis_dir
    from plateauscope.cli.text.analysis import format_summary

    out, s = induction_run

    def keys(obj):
        if isinstance(obj, dict):
            return set(obj) | {k for v in obj.values() for k in keys(v)}
        return {k for v in obj for k in keys(v)} if isinstance(obj, list) else set()

    stored = keys(json.loads((analysis_dir(out) / ROUTING_FILE).read_text()))
    assert not {k for k in stored if "log_k" in k or "candidate_loss" in k or "delta_z" in k or "reads_z" in k}
    text = format_summary(s, Run(out).progress)
    for word in ("log K", "log_k", "candidate loss", "delta_z", " z ", "selector"):
        assert word not in text, word
