"""The in-context Markov chain task: its data against the chains it was drawn from, the ladder of
reference predictors against hand counts, the evaluation and the prompt pairs against models that
*are* a reference, the cue on hand-made sequences and under a uniform head, loading by name, and
(slow) a short run that climbs the ladder."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor, nn

from plateauscope.analysis.inputs import logit_diff
from plateauscope.errors import ConfigError
from plateauscope.runs.presets import get_preset
from plateauscope.runs.references import ReferenceLadder
from plateauscope.runs.run import Run
from plateauscope.tasks.loading import build_task
from plateauscope.tasks.markov import MarkovConfig, MarkovTask, bigram_probs, unigram_probs
from plateauscope.training.train import train

SMALL = MarkovConfig(n_states=3, length=12, n_sequences=64, seed=5)

# ---- pure-Python truths ---------------------------------------------------------------------


def hand_unigram(seq: list[int], p: int, k: int, alpha: float) -> list[float]:
    """(count of s among the states at 1 .. p + alpha) / (p + k alpha); 0 on <BOS>."""
    counts = [0] * (k + 1)
    for j in range(1, p + 1):
        counts[seq[j]] += 1
    return [0.0] + [(counts[s] + alpha) / (p + k * alpha) for s in range(1, k + 1)]


def hand_bigram(seq: list[int], p: int, k: int, alpha: float) -> list[float]:
    """(transitions x_p -> s with both ends in 1 .. p + alpha) / (transitions out of x_p + k alpha)."""
    counts = [0] * (k + 1)
    for j in range(1, p):
        if seq[j] == seq[p]:
            counts[seq[j + 1]] += 1
    total = sum(counts)
    return [0.0] + [(counts[s] + alpha) / (total + k * alpha) for s in range(1, k + 1)]


def hand_loss(rule, seqs: Tensor, positions: list[int], k: int, alpha: float) -> float:
    """The mean cross-entropy of the next state under a pure-Python reference."""
    terms = [-math.log(rule(seq, p, k, alpha)[seq[p + 1]]) for seq in seqs.tolist() for p in positions]
    return sum(terms) / len(terms)


class ReferenceModel(nn.Module):
    """A 'model' whose next-token distribution at the loss positions is exactly one reference."""

    def __init__(self, task: MarkovTask, name: str):
        super().__init__()
        self.task, self.rung = task, next(r for r in task.reference_predictors() if r.name == name)
        self.unused = nn.Parameter(torch.zeros(1))  # evaluate() reads the device from a parameter

    def forward(self, inputs: Tensor) -> Tensor:
        # the references read the context only: a dummy last token stands in for the answer
        probs = self.rung.predict(torch.cat([inputs, torch.ones_like(inputs[:, :1])], 1))
        logits = torch.zeros(*inputs.shape, len(self.task.vocab))
        logits[:, self.task.loss_positions] = probs.clamp_min(1e-30).log().float()
        return logits


# ---- the data -------------------------------------------------------------------------------


def test_sequences_follow_their_own_chain():
    """Every sequence is <BOS> then states; the transitions counted over the data set match the
    expected counts under each sequence's own matrix; the start state is uniform."""
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=200, n_sequences=600, seed=1))
    tokens, P = task.tokens, task.transitions
    assert tokens.shape == (600, 201) and (tokens[:, 0] == 0).all() and (tokens[:, 1:] >= 1).all()
    assert torch.allclose(P.sum(-1), torch.ones(600, 3, dtype=P.dtype))
    observed = torch.zeros(3, 3, dtype=torch.float64)
    expected = torch.zeros(3, 3, dtype=torch.float64)
    for seq, m in zip(tokens.tolist(), P):
        for a, b in zip(seq[1:-1], seq[2:]):
            observed[a - 1, b - 1] += 1
            expected[a - 1] += m[a - 1]
    # 119,400 transitions: each of the 9 cells within 3% of its expected count
    assert ((observed - expected).abs() / expected).max() < 0.03
    starts = torch.bincount(tokens[:, 1] - 1, minlength=3).float() / 600
    assert (starts - 1 / 3).abs().max() < 0.07


def test_data_and_evaluation_sets_are_deterministic_in_their_seeds():
    a, b = MarkovTask.generate(SMALL), MarkovTask.generate(SMALL)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.transitions, b.transitions)
    other = MarkovTask.generate(MarkovConfig(**{**SMALL.to_dict(), "seed": 6}))
    assert not torch.equal(a.tokens, other.tokens)
    e1, e2, e3 = a.build_evalset(32, 0, 0), b.build_evalset(32, 0, 0), a.build_evalset(32, 0, 1)
    assert torch.equal(e1.sequences, e2.sequences) and torch.equal(e1.shuffled, e2.shuffled)
    assert not torch.equal(e1.sequences, e3.sequences)
    assert not (e1.sequences[:, None] == a.tokens[None]).all(-1).any()  # fresh chains, not trained on


def test_shuffled_twins_keep_the_counts_and_the_current_state():
    task = MarkovTask.generate(SMALL)
    ev = task.build_evalset(40, 0, 3)
    q = task.pred_pos
    assert torch.equal(ev.shuffled[:, q:], ev.sequences[:, q:]) and (ev.shuffled[:, 0] == 0).all()
    for clean, shuffled in zip(ev.sequences.tolist(), ev.shuffled.tolist()):
        assert sorted(clean[1:q]) == sorted(shuffled[1:q])
    assert not torch.equal(ev.shuffled, ev.sequences)


@pytest.mark.parametrize("change, message", [
    ({"n_states": 1}, "n_states must be at least 2, got 1"),
    ({"length": 2}, "length must be at least 3"),
    ({"alpha": 0.0}, "alpha must be a positive finite number, got 0.0"),
    ({"alpha": float("inf")}, "alpha must be a positive finite number"),
    ({"n_sequences": 1}, "n_sequences must be at least 2, got 1"),
    ({"seed": -1}, "seed must be at least 0, got -1"),
])
def test_impossible_configs_are_one_line_errors(change, message):
    with pytest.raises(ConfigError, match=message) as info:
        MarkovTask.generate(MarkovConfig(**change))
    assert "\n" not in str(info.value)


# ---- the ladder of reference predictors ------------------------------------------------------


def test_ladder_equals_hand_counts_on_a_hand_made_sequence():
    """k = 2, alpha = 1: <BOS> a b a b a b a b, with its closed forms written out."""
    tokens = torch.tensor([[0, 1, 2, 1, 2, 1, 2, 1, 2]])
    positions = [1, 2, 5, 7]
    uni, bi = unigram_probs(tokens, positions, 2, 1.0), bigram_probs(tokens, positions, 2, 1.0)
    # at p = 5 (a): states a b a b a -> (3 + 1) / (5 + 2); transitions out of a: a -> b twice -> (2 + 1) / (2 + 2)
    assert uni[0, 2].tolist() == pytest.approx([0.0, 4 / 7, 3 / 7])
    assert bi[0, 2].tolist() == pytest.approx([0.0, 1 / 4, 3 / 4])
    # at p = 1 nothing is counted out of a yet: uniform; at p = 2 (b) b was never left: uniform
    assert bi[0, 0].tolist() == pytest.approx([0.0, 0.5, 0.5]) and bi[0, 1].tolist() == pytest.approx([0.0, 0.5, 0.5])
    assert uni[0, 0].tolist() == pytest.approx([0.0, 2 / 3, 1 / 3])
    # at p = 7 (a): a -> b three times: (3 + 1) / (3 + 2)
    assert bi[0, 3].tolist() == pytest.approx([0.0, 1 / 5, 4 / 5])


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_ladder_equals_pure_python_counts(alpha):
    task = MarkovTask.generate(MarkovConfig(n_states=4, length=10, alpha=alpha, n_sequences=8, seed=2))
    seqs, pos, k = task.tokens, task.loss_positions, 4
    uniform, unigram, bigram = (r.predict(seqs) for r in task.reference_predictors())
    assert [r.name for r in task.reference_predictors()] == ["uniform", "unigram", "bigram"]
    for probs in (uniform, unigram, bigram):
        assert probs.shape == (8, len(pos), k + 1)
        assert torch.allclose(probs.sum(-1), torch.ones(8, len(pos), dtype=probs.dtype))
        assert (probs[..., 0] == 0).all() and (probs >= 0).all()
    assert torch.allclose(uniform[..., 1:], torch.full((8, len(pos), k), 0.25, dtype=uniform.dtype))
    for n, seq in enumerate(seqs.tolist()):
        for i, p in enumerate(pos):
            assert unigram[n, i].tolist() == pytest.approx(hand_unigram(seq, p, k, alpha), abs=1e-12)
            assert bigram[n, i].tolist() == pytest.approx(hand_bigram(seq, p, k, alpha), abs=1e-12)


def test_references_read_only_the_context():
    """Changing the tokens after a position leaves the prediction at it unchanged."""
    task = MarkovTask.generate(SMALL)
    seqs = task.tokens[:16]
    later = seqs.clone()
    later[:, 7:] = later[:, 7:] % 3 + 1  # another state everywhere from position 7 on
    for rung in task.reference_predictors():
        a, b = rung.predict(seqs), rung.predict(later)
        assert torch.equal(a[:, :6], b[:, :6])  # loss positions 1 .. 6


def test_height_is_the_unigram_excess_over_the_data_set():
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=9, n_sequences=30, seed=4))
    uni = hand_loss(hand_unigram, task.tokens, task.loss_positions, 3, 1.0)
    bi = hand_loss(hand_bigram, task.tokens, task.loss_positions, 3, 1.0)
    assert task.progress.height == pytest.approx(uni - bi, abs=1e-12) and task.progress.height > 0
    assert task.progress.key == "excess_loss" and task.progress.falls and task.progress.cue_effect_key == "delta_cue"
    assert task.reference_losses["uniform"] == pytest.approx(math.log(3))


def test_a_model_that_is_a_reference_has_kl_zero_to_it():
    task = MarkovTask.generate(SMALL)
    ev = task.build_evalset(48, 0, 0)
    ladder = ReferenceLadder.build(task, ev)
    assert ladder is not None and ladder.names == ["uniform", "unigram", "bigram"]
    for name in ladder.names:
        kls = ladder.kl(ReferenceModel(task, name), task)
        assert kls[f"kl_{name}"] < 1e-6, (name, kls)
        assert all(v > 1e-3 for key, v in kls.items() if key != f"kl_{name}"), (name, kls)


def test_evaluation_without_loss_is_the_evaluation_less_its_loss():
    """The base task's default: the whole evaluation, its training loss dropped (what an imported run records)."""
    task = MarkovTask.generate(SMALL)
    ev = task.build_evalset(48, 8, 0)
    model = ReferenceModel(task, "bigram")
    whole, without = task.evaluate(model, ev), task.evaluate_without_loss(model, ev)
    assert "loss" in whole and without == {k: v for k, v in whole.items() if k != "loss"}


def test_evaluate_reads_the_references():
    """The bigram 'model' has excess loss 0 and the unigram's is the evaluation set's own
    unigram-bigram gap (pure Python); the shuffle keeps every count, so the unigram's delta_cue is 0,
    while it hurts the bigram's. Accuracy is the share of next states the argmax names."""
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=16, n_sequences=64, seed=0))
    ev = task.build_evalset(200, 0, 0)
    pos = task.loss_positions
    bigram, unigram = (task.evaluate(ReferenceModel(task, name), ev, batch_size=64) for name in ("bigram", "unigram"))
    assert set(bigram) == {"loss", "excess_loss", "delta_cue", "accuracy"}
    assert all(type(v) is float for v in bigram.values())
    gap = hand_loss(hand_unigram, ev.sequences, pos, 3, 1.0) - hand_loss(hand_bigram, ev.sequences, pos, 3, 1.0)
    assert bigram["excess_loss"] == pytest.approx(0.0, abs=1e-5)
    assert bigram["loss"] == pytest.approx(hand_loss(hand_bigram, ev.sequences, pos, 3, 1.0), abs=1e-5)
    assert unigram["excess_loss"] == pytest.approx(gap, abs=1e-5)
    assert unigram["delta_cue"] == pytest.approx(0.0, abs=1e-6) and bigram["delta_cue"] > 0.05
    hits = [max(range(4), key=lambda s: hand_bigram(seq, p, 3, 1.0)[s]) == seq[p + 1]
            for seq in ev.sequences.tolist() for p in pos]
    assert bigram["accuracy"] == pytest.approx(sum(hits) / len(hits), abs=0.01)  # ties break either way


# ---- the cue ---------------------------------------------------------------------------------


def test_cue_positions_on_hand_made_sequences():
    """Positions:        0  1  2  3  4  5  6  7
    first:           <BOS> a  b  a  c  a  b  c
    second:          <BOS> c  c  c  c  a  b  a
    Every loss position's rows have T - 2 = 5 columns, -1 after the cue positions."""
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=7, n_sequences=4))
    tokens = torch.tensor([[0, 1, 2, 1, 3, 1, 2, 3], [0, 3, 3, 3, 3, 1, 2, 1]])
    cue = task.cue_positions
    pad = [-1] * 5
    assert cue(tokens, 5).tolist() == [[2, 4, -1, -1, -1], pad]  # a after a at 1, 3; the second's a is new
    assert cue(tokens, 4).tolist() == [pad, [2, 3, 4, -1, -1]]  # c is new in the first; c c c before it
    assert cue(tokens, 3).tolist() == [[2, -1, -1, -1, -1], [2, 3, -1, -1, -1]]  # a self-transition reads 3
    assert cue(tokens, 6).tolist() == [[3, -1, -1, -1, -1], pad]
    assert cue(tokens, 1).tolist() == [pad, pad]  # nothing earlier at the first state
    assert cue(tokens, 0).shape == (2, 0) and cue(tokens, 7).shape == (2, 0)  # not loss positions
    assert cue(tokens, 3).dtype == torch.long


def test_the_cue_holds_the_bigram_counts():
    """The states at the cue positions of a query, counted, are the bigram reference's counts."""
    task = MarkovTask.generate(SMALL)
    seqs = task.tokens[:20]
    counts = bigram_probs(seqs, task.loss_positions, 3, 1.0)[..., 1:]
    for i, q in enumerate(task.loss_positions):
        keys = task.cue_positions(seqs, q)
        read = torch.where(keys >= 0, seqs.gather(1, keys.clamp_min(0)), 0)
        histogram = torch.stack([(read == s).sum(1) for s in (1, 2, 3)], 1).double()
        # (n + alpha) / (total + k alpha), solved for n
        assert torch.allclose(counts[:, i] * (histogram.sum(1, keepdim=True) + 3) - 1, histogram, atol=1e-9)


def test_attention_to_the_cue_of_a_uniform_head_is_its_share_of_the_keys():
    """With W_Q = W_K = 0 every head attends uniformly to the q + 1 positions it can see, so its attention
    to the cue is (number of earlier occurrences of the query's state) / (q + 1), counted by hand, and
    to the previous token 1 / (q + 1)."""
    from plateauscope.analysis.attention import attention_stats
    from plateauscope.model.backend import initial_hooked_state, model_from_hooked_state


    task = MarkovTask.generate(SMALL)
    cfg = task.hooked_config(MarkovTask.default_model)
    state = initial_hooked_state(cfg, seed=0)
    for key in state:
        if key.rsplit(".", 1)[-1] in ("W_Q", "W_K", "b_Q", "b_K"):
            state[key] = torch.zeros_like(state[key])
    model = model_from_hooked_state(cfg, state)
    seqs = task.tokens[:24]
    stats = attention_stats(model, seqs, task)
    shares = [sum(seq[j] == seq[q] for j in range(1, q)) / (q + 1)
              for seq in seqs.tolist() for q in task.loss_positions]
    previous = [1 / (q + 1) for q in range(1, task.input_len)]
    expected_cue, expected_previous = sum(shares) / len(shares), sum(previous) / len(previous)
    assert torch.allclose(stats.to_z_all_targets, torch.full_like(stats.to_z_all_targets, expected_cue), atol=1e-5)
    assert torch.allclose(stats.rules["previous token"], torch.full_like(stats.to_z_all_targets, expected_previous),
                          atol=1e-5)


def test_previous_token_rule_points_one_back():
    task = MarkovTask.generate(SMALL)
    rule = task.attention_rules()["previous token"]
    assert rule.queries == list(range(1, task.input_len))
    assert rule.keys(task.tokens[:3], 5).tolist() == [[4]] * 3
    assert set(task.attention_rules()) == {"cue", "previous token"}


# ---- prompt pairs -------------------------------------------------------------------------------


def test_prompt_pairs_shuffle_the_context_and_change_the_bigram_choice():
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=20, alpha=0.5, n_sequences=400, seed=3))
    pairs = task.prompt_pairs(50, seed=1)
    q = task.pred_pos
    assert pairs.pred_pos == q and pairs.clean.shape == pairs.corrupt.shape == (50, q + 1)
    assert torch.equal(pairs.clean, task.tokens[pairs.examples, : q + 1])
    assert len(set(pairs.examples.tolist())) == 50
    for clean, corrupt, a, b in zip(pairs.clean.tolist(), pairs.corrupt.tolist(), pairs.clean_answer.tolist(),
                                    pairs.corrupt_answer.tolist()):
        assert corrupt[0] == 0 and corrupt[q] == clean[q] and sorted(corrupt[1:q]) == sorted(clean[1:q])
        on_clean, on_corrupt = hand_bigram(clean, q, 3, 0.5), hand_bigram(corrupt, q, 3, 0.5)
        assert a == on_clean.index(max(on_clean)) and b == on_corrupt.index(max(on_corrupt)) and a != b
        assert hand_unigram(clean, q, 3, 0.5) == hand_unigram(corrupt, q, 3, 0.5)  # the unigram cannot tell
    again = task.prompt_pairs(50, seed=1)
    assert torch.equal(again.corrupt, pairs.corrupt) and not torch.equal(task.prompt_pairs(50, seed=2).clean,
                                                                         pairs.clean)


def test_the_metric_separates_the_bigram_from_the_unigram():
    """The bigram 'model' prefers the clean answer on the clean prompt and the corrupted one on the
    corrupted prompt; the unigram 'model' gives both prompts the same logit difference."""
    task = MarkovTask.generate(MarkovConfig(n_states=3, length=20, alpha=0.5, n_sequences=400, seed=3))
    pairs = task.prompt_pairs(40, seed=0)
    bigram, unigram = ReferenceModel(task, "bigram"), ReferenceModel(task, "unigram")
    per_pair = {name: (logit_diff(m(pairs.clean), pairs, reduce=False),
                       logit_diff(m(pairs.corrupt), pairs, reduce=False))
                for name, m in (("bigram", bigram), ("unigram", unigram))}
    assert (per_pair["bigram"][0] > 0).all() and (per_pair["bigram"][1] < 0).all()
    assert torch.allclose(*per_pair["unigram"], atol=1e-6)


def test_a_data_set_without_pairs_is_one_line():
    task = MarkovTask.generate(MarkovConfig(n_states=2, length=3, n_sequences=2, seed=0))
    with pytest.raises(ConfigError, match="has no prompt pairs") as info:
        task.prompt_pairs(4)
    assert "\n" not in str(info.value)


# ---- loading ----------------------------------------------------------------------------------


def test_loads_by_name_and_passes_the_protocol_check():
    task = build_task("markov", SMALL)  # build_task runs check_task
    assert isinstance(task, MarkovTask) and task.vocab == ["<BOS>", "s0", "s1", "s2"]
    assert task.loss_positions == list(range(1, 12)) and task.pred_pos == 11 and task.input_len == 12
    assert task.capabilities == {"cue", "pairs", "references"}
    with pytest.raises(ConfigError, match="its config must be a MarkovConfig"):
        build_task("markov", object())


# ---- a short run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_short_run_climbs_the_ladder(tmp_path, one_thread):
    """The preset's task with T = 32 on a 4-head model: uniform, the unigram plateau (the cue unused),
    then the bigram (the cue used), inside 400 steps."""
    base = get_preset("markov")
    cfg = dataclasses.replace(
        base, task=dataclasses.replace(base.task, length=32, n_sequences=4096),
        model=dataclasses.replace(base.model, n_heads=4, d_head=16),
        train=dataclasses.replace(base.train, lr=1e-3, eval_groups=128, eval_every=20, ckpt_every=100, max_steps=400,
                                  stop_after_tau=1.3))
    summary = train(cfg, tmp_path / "run", device="cpu", progress=False)
    run = Run(tmp_path / "run")
    h, records = run.progress.height, run.metrics()
    assert summary["tau"] is not None and summary["plateau_stretch"] is not None
    assert records[0]["excess_loss"] > 2 * h and records[-1]["excess_loss"] < 0.5 * h
    start = next(r for r in records if r["step"] == summary["plateau_stretch"][0])
    assert start["delta_cue"] < 0.1 * h < 0.5 * h < records[-1]["delta_cue"]
    ladder = summary["ladder"]
    assert ladder["plateau_stage"] == "unigram" and ladder["final_stage"] == "bigram"
    assert ladder["first_reached"]["uniform"] < ladder["first_reached"]["unigram"] < ladder["first_reached"]["bigram"]
