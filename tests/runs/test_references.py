"""The ladder of reference predictors: the KL to each rung against hand computation, each task's
ladder against counting by hand, the stage reading on series with known stages, and the training
loop's log."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import nn

from plateauscope.runs.references import (
    ReferenceLadder,
    kl_key,
    ladder_summary,
    stage_of,
    stage_segments,
)
from plateauscope.runs.run import Run
from plateauscope.tasks.base import ReferencePredictor, TaskError
from plateauscope.tasks.induction import InductionConfig, InductionTask, in_context_ngrams
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig


class FixedModel(nn.Module):
    """A model whose next-token distribution at the loss positions is given (logits elsewhere unused)."""

    def __init__(self, task, probs: torch.Tensor):
        super().__init__()
        self.task, self.probs = task, probs
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        out = torch.zeros(len(x), x.shape[1], len(self.task.vocab))
        rows = torch.stack([self.lookup[tuple(r.tolist())] for r in x])
        out[:, self.task.loss_positions] = rows.clamp_min(1e-30).log().float()
        return out

    def index(self, seqs):
        self.lookup = {tuple(s[: self.task.input_len].tolist()): p for s, p in zip(seqs, self.probs)}
        return self


def small_selector() -> SelectorTask:
    return SelectorTask.generate(TaskConfig(n_b=40, K=4, b_len=3, a_len=3, z_len=1, alphabet="abcdef", seed=3,
                                            target_uniqueness="group"))


def hand_kl(r: torch.Tensor, q: torch.Tensor) -> float:
    """sum_v r log(r / q), averaged over sequences and positions, by explicit loops."""
    total, n = 0.0, 0
    for i in range(r.shape[0]):
        for t in range(r.shape[1]):
            total += sum(float(a) * math.log(float(a) / float(b)) for a, b in zip(r[i, t], q[i, t]) if a > 0)
            n += 1
    return total / n


def test_a_model_that_is_a_reference_has_kl_zero_to_it_and_the_hand_kl_to_the_others():
    task = small_selector()
    seqs = task.tokens[:24]
    ladder = ReferenceLadder.build(task, type("E", (), {"eval_seqs": seqs})())
    assert ladder.names == ["uniform", "global_marginal", "group_marginal", "conditional"]
    compared = 0
    for j, name in enumerate(ladder.names):
        model = FixedModel(task, ladder.probs[j].double()).index(seqs)
        kls = ladder.kl(model, task, batch_size=7)  # a batch that does not divide the sequences
        assert kls[kl_key(name)] == pytest.approx(0.0, abs=1e-5)
        for i, other in enumerate(ladder.names):
            if i != j and ((ladder.probs[i] > 0) <= (ladder.probs[j] > 0)).all():  # a finite KL
                assert kls[kl_key(other)] == pytest.approx(hand_kl(ladder.probs[i], ladder.probs[j]), rel=1e-4)
                compared += 1
    assert compared >= 3  # every rung against the uniform model, at least


def test_a_hand_written_predictor_is_checked_and_zero_kl_for_itself():
    task = small_selector()
    seqs = task.tokens[:8]
    half = torch.zeros(len(seqs), len(task.loss_positions), len(task.vocab))
    half[..., -2:] = 0.5  # half on each of the last two letters
    task.reference_predictors = lambda: [ReferencePredictor("halves", "halves", lambda t: half[: len(t)])]
    ladder = ReferenceLadder.build(task, type("E", (), {"eval_seqs": seqs})())
    assert ladder.kl(FixedModel(task, half).index(seqs), task)["kl_halves"] == pytest.approx(0.0, abs=1e-6)
    uniform = torch.full_like(half, 1 / len(task.vocab))
    assert ladder.kl(FixedModel(task, uniform).index(seqs), task)["kl_halves"] == pytest.approx(
        math.log(0.5 * len(task.vocab)), rel=1e-5)
    task.reference_predictors = lambda: [ReferencePredictor("bad", "bad", lambda t: half[: len(t)] * 2)]
    with pytest.raises(TaskError, match="'bad' is not a distribution"):
        ReferenceLadder.build(task, type("E", (), {"eval_seqs": seqs})())


def test_the_selector_ladder_agrees_with_counting_by_hand():
    task = small_selector()
    ladder = task.reference_predictors()
    seqs = task.tokens[::7]
    got = {r.name: r.predict(seqs) for r in ladder}
    start, stop = task.layout.target_span
    b0, b1 = task.layout.b_span
    rows = [(tuple(s[b0:b1].tolist()), tuple(s[start:stop].tolist())) for s in task.tokens]
    letters = range(2, len(task.vocab))
    for i, s in enumerate(seqs):
        b, a = tuple(s[b0:b1].tolist()), tuple(s[start:stop].tolist())
        for t in range(stop - start):
            glob = Counter(x[t] for _, x in rows if x[:t] == a[:t])
            group = Counter(x[t] for g, x in rows if g == b and x[:t] == a[:t])
            for v in letters:
                assert float(got["uniform"][i, t, v]) == pytest.approx(1 / 6)
                assert float(got["global_marginal"][i, t, v]) == pytest.approx(glob[v] / sum(glob.values()))
                assert float(got["group_marginal"][i, t, v]) == pytest.approx(group[v] / sum(group.values()))
                assert float(got["conditional"][i, t, v]) == float(v == a[t])
            assert float(got["uniform"][i, t, :2].sum()) == 0.0  # never a special token


def test_the_induction_ladder_agrees_with_counting_by_hand():
    task = InductionTask.generate(InductionConfig(vocab_size=24, segment_len=4, max_gap=3, n_sequences=32,
                                                  repeat_fraction=0.5, seed=1))
    tokens = task.tokens
    tokens[0, 2] = tokens[0, 5]  # a repeated filler token: a bigram with two continuations
    uni, bi = in_context_ngrams(tokens, task.loss_positions, len(task.vocab))
    for n in range(len(tokens)):
        seq = tokens[n].tolist()
        for i, p in enumerate(task.loss_positions):
            counts = Counter(seq[1: p + 1])
            after = Counter(seq[q + 1] for q in range(1, p) if seq[q] == seq[p])
            expect = after if after else counts
            for v in range(len(task.vocab)):
                assert float(uni[n, i, v]) == pytest.approx(counts[v] / sum(counts.values()))
                assert float(bi[n, i, v]) == pytest.approx(expect[v] / sum(expect.values()))
    repeats = task.tokens[task.repeats]
    _, bi = in_context_ngrams(repeats, task.loss_positions, len(task.vocab))
    nxt = repeats[:, torch.tensor(task.loss_positions) + 1]
    assert (bi.argmax(-1) == nxt).all() and (bi.max(-1).values == 1).all()  # on a repeat, the bigram copies


def records_with_stages(stages: list[str], names: list[str], gap: float = 1.0) -> list[dict]:
    """One record per step whose closest rung is the given one (the others ``gap`` nats further)."""
    return [{"step": 10 * i, **{kl_key(n): (0.05 if n == s else 0.05 + gap) for n in names}}
            for i, s in enumerate(stages)]


def test_the_stage_is_the_closest_rung_by_the_margin():
    names = ["uniform", "marginal", "conditional"]
    assert stage_of({kl_key("uniform"): 2.0, kl_key("marginal"): 0.3, kl_key("conditional"): 1.0}, names) == "marginal"
    assert stage_of({kl_key("uniform"): 2.0, kl_key("marginal"): 0.3, kl_key("conditional"): 0.35}, names) is None
    assert stage_of({kl_key("uniform"): 2.0}, names) is None
    recs = records_with_stages(["uniform"] * 3 + ["marginal"] * 5 + ["conditional"] * 2, names)
    assert stage_segments(recs, names) == [{"stage": "uniform", "start": 0, "end": 20},
                                           {"stage": "marginal", "start": 30, "end": 70},
                                           {"stage": "conditional", "start": 80, "end": 90}]
    s = ladder_summary(recs, names, names, span=(20, 70))
    assert s["plateau_stage"] == "marginal" and s["plateau_stage_share"] == pytest.approx(5 / 6)
    assert s["first_reached"] == {"uniform": 0, "marginal": 30, "conditional": 80}
    assert s["final_stage"] == "conditional"
    assert ladder_summary([{"step": 0}], names, names, span=None) is None


@pytest.mark.slow
def test_training_logs_the_kl_to_every_rung_and_the_stages(tiny_run):
    run = Run(tiny_run)
    names = [r.name for r in run.task().reference_predictors()]
    records = run.metrics()
    assert names and all(kl_key(n) in r for r in records for n in names)
    ladder = run.summary["ladder"]
    assert [r["name"] for r in ladder["references"]] == names
    assert ladder["segments"][0]["start"] == records[0]["step"] and ladder["segments"][-1]["end"] == records[-1]["step"]
    # at step 0 the model is near uniform: closer to the uniform rung than to the full conditional
    assert records[0][kl_key("uniform")] < records[0][kl_key(names[-1])]


def test_the_ladder_figure_shades_each_stage_and_its_caption_reads_the_data():
    from plateauscope.views.figures import ladder_lines
    from plateauscope.views.time_data import ladder_curves

    names = ["uniform", "marginal", "conditional"]
    recs = records_with_stages(["uniform"] * 4 + ["marginal"] * 4 + ["conditional"] * 2, names)
    recs[8] = {**recs[8], kl_key("marginal"): recs[8][kl_key("conditional")] + 0.01}  # a step between rungs
    s = ladder_summary(recs, names, ["U", "M", "C"], span=(0, 30))
    fig, caption = ladder_lines(recs, s, tau=80)
    assert len(fig.data) == 3 and len(fig.layout.shapes) >= 3  # a line per rung, a band per stage (plus tau)
    assert "U at step 0, then M at step 40, then C at step 90" in caption
    assert "On the plateau it sat at U (100%" in caption and "τ = 80" in caption
    view = ladder_curves(recs, s)
    assert [x["stage"] for x in view["series"]] == names and view["segments"] == s["segments"]
    assert None in [g["stage"] for g in s["segments"]]
