"""Attention-to-z and head ablation: known answers on the hand-built model, machinery on `tiny`."""

import json
import math

import pytest
import torch
from transformer_lens.utilities import get_act_name

from plateauscope.analysis import ablate, attention
from plateauscope.analysis.ablate import (
    KINDS,
    ablate_each_head,
    ablate_heads,
    build_evalset,
    falls_back_to_marginal,
)
from plateauscope.analysis.attention import attention_stats, attention_to_z
from plateauscope.cli import ablate as ablate_cli
from plateauscope.cli import attention as attention_cli
from plateauscope.runs.run import Run
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_metrics import evaluate
from tests.handbuilt import ALPHA, SELECTOR_HEAD, handbuilt_task, selector_copy_model


@pytest.fixture(scope="module")
def handbuilt():
    task = handbuilt_task()
    return task, selector_copy_model(task)


@pytest.fixture(scope="module")
def tiny(tiny_run):
    run = Run(tiny_run)
    return run, run.model(run.steps[-1]), run.task()


# ---- known answers on the hand-built model ---------------------------------------------------


def test_attention_to_z_ranks_selector_head_first(handbuilt):
    task, model = handbuilt
    res = attention_to_z(model, task)
    assert res.top_head() == SELECTOR_HEAD
    others = torch.ones_like(res.to_z_first, dtype=torch.bool)
    others[SELECTOR_HEAD] = False
    assert res.to_z_first[SELECTOR_HEAD] == pytest.approx(1.0, abs=1e-6)
    assert res.to_z_first[others].max() < 1e-6  # the other heads look at BOS or at B
    # Elsewhere the selector head attends uniformly: 2 z positions out of a0 + 1 at the second one.
    a0 = task.layout.target_span[0]
    assert res.to_z_all_targets[SELECTOR_HEAD] == pytest.approx((1.0 + 2 / (a0 + 1)) / 2, abs=1e-5)
    # By hand: half on each z position -> log 2; all on one position -> 0.
    assert res.entropy_first[SELECTOR_HEAD] == pytest.approx(math.log(2), abs=1e-4)
    assert res.entropy_first[others].max() < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_ablating_selector_head_falls_back_to_marginal(handbuilt, kind):
    task, model = handbuilt
    log_k = task.cfg.log_k
    res = ablate_each_head(model, task, kind=kind)
    assert res.candidate_loss.shape == (2, 2)
    assert res.base["candidate_loss"] < 0.01 * log_k  # intact: z picks the candidate
    assert res.base["delta_z"] == pytest.approx(ALPHA, abs=1e-3)
    assert res.candidate_loss[SELECTOR_HEAD] == pytest.approx(log_k, abs=1e-3)
    assert res.d_delta_z[SELECTOR_HEAD] == pytest.approx(-ALPHA, abs=1e-3)
    assert falls_back_to_marginal(res, *SELECTOR_HEAD, log_k)
    for layer in range(2):
        for head in range(2):
            if (layer, head) != SELECTOR_HEAD:
                assert abs(float(res.d_candidate_loss[layer, head])) < 1e-3
                assert not falls_back_to_marginal(res, layer, head, log_k)


def test_ablation_scores_like_training_metrics(handbuilt):
    task, model = handbuilt
    m = evaluate(model, task, build_evalset(task, n_groups=3, seed=5))
    res = ablate_heads(model, task, [SELECTOR_HEAD], n_groups=3, seed=5)
    assert res.base["candidate_loss"] == pytest.approx(m["candidate_loss"], abs=1e-6)
    assert res.base["delta_z"] == pytest.approx(m["delta_z"], abs=1e-5)
    each = ablate_each_head(model, task, n_groups=3, seed=5)
    assert res.candidate_loss == pytest.approx(float(each.candidate_loss[SELECTOR_HEAD]), abs=1e-6)
    assert res.d_delta_z == pytest.approx(float(each.d_delta_z[SELECTOR_HEAD]), abs=1e-5)


def test_backward_only():
    task = SelectorTask.generate(TaskConfig(n_b=4, K=2, direction="forward"))
    with pytest.raises(ValueError):
        build_evalset(task)
    with pytest.raises(ValueError):
        attention_to_z(selector_copy_model(), task)


# ---- the tiny trained run --------------------------------------------------------------------


def test_entropy_matches_hand_computation_on_one_example(tiny):
    _, model, task = tiny
    lay = task.layout
    tokens = task.tokens[3:4]
    _, cache = model.run_with_cache(tokens[:, : lay.input_len])
    layer, head = 0, 1
    row = cache[get_act_name("pattern", layer)][0, head, lay.first_target_pred_pos].tolist()
    hand = -sum(p * math.log(p) for p in row if p > 0)
    res = attention_stats(model, tokens, task)
    assert float(res.entropy_first[layer, head]) == pytest.approx(hand, abs=1e-5)
    assert float(res.to_z_first[layer, head]) == pytest.approx(sum(row[slice(*lay.z_span)]), abs=1e-6)


def test_attention_shapes_and_ranges(tiny):
    _, model, task = tiny
    res = attention_to_z(model, task, n_examples=32, seed=1)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    assert res.n_examples == 32
    for t in (res.to_z_first, res.to_z_all_targets, res.entropy_first):
        assert t.shape == shape
    for t in (res.to_z_first, res.to_z_all_targets):
        assert ((t >= 0) & (t <= 1 + 1e-6)).all()
    assert ((res.entropy_first >= 0) & (res.entropy_first <= math.log(task.layout.first_target_pred_pos + 1) + 1e-5)).all()
    # chunking does not change the average
    again = attention_stats(model, task.tokens[task.sample_examples(32, 1)], task, batch_size=5)
    assert torch.allclose(again.to_z_first, res.to_z_first, atol=1e-6)
    d = json.loads(json.dumps(res.to_dict()))
    assert len(d["to_z_first"]) == shape[0] and len(d["to_z_first"][0]) == shape[1]


def test_all_heads_at_once_vs_one_at_a_time(tiny):
    _, model, task = tiny
    L, H = model.cfg.n_layers, model.cfg.n_heads
    each = ablate_each_head(model, task, kind="mean", n_groups=2)
    assert each.candidate_loss.shape == each.delta_z.shape == each.d_candidate_loss.shape == (L, H)
    assert torch.isfinite(each.candidate_loss).all() and torch.isfinite(each.delta_z).all()
    everything = ablate_heads(model, task, [(la, h) for la in range(L) for h in range(H)], kind="mean", n_groups=2)
    assert everything.base == each.base
    assert math.isfinite(everything.candidate_loss) and math.isfinite(everything.delta_z)
    one = ablate_heads(model, task, [(0, 1)], kind="mean", n_groups=2)
    assert one.candidate_loss == pytest.approx(float(each.candidate_loss[0, 1]), abs=1e-5)
    with pytest.raises(ValueError):
        ablate_heads(model, task, [(L, 0)])


@pytest.mark.parametrize("module", [attention, ablate])
def test_cli_prints_table_and_writes_json(tiny, tmp_path, capsys, module):
    run, model, _ = tiny
    out = tmp_path / "res.json"
    extra = ["--n-examples", "16"] if module is attention else ["--kind", "mean", "--groups", "2"]
    assert {attention: attention_cli, ablate: ablate_cli}[module].main(["--ckpt", str(run.path), "--json", str(out), *extra]) == 0
    text = capsys.readouterr().out
    assert "layer" in text and "L0" in text and f"H{model.cfg.n_heads - 1}" in text
    d = json.loads(out.read_text())
    key = "to_z_first" if module is attention else "d_candidate_loss"
    assert len(d[key]) == model.cfg.n_layers and len(d[key][0]) == model.cfg.n_heads
    assert d["step"] == run.steps[-1]


@pytest.mark.parametrize("module", [attention, ablate])
def test_cli_errors_are_one_line(tiny, tmp_path, capsys, module):
    run, _, _ = tiny
    fake = tmp_path / "x.safetensors"
    fake.write_text("not a checkpoint\n")
    for argv in (["--ckpt", str(tmp_path / "missing")], ["--ckpt", str(fake)],
                 ["--ckpt", str(run.path), "--step", "999999"]):
        assert {attention: attention_cli, ablate: ablate_cli}[module].main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_ablation_scores_equal_full_forwards(tiny, kind):
    """Ablation scores each shared prefix once; they must equal scoring every candidate sequence
    in full with the head's output replaced at every position (brute force, here)."""
    from plateauscope.model.backend import build_model

    run, _, task = tiny
    model = build_model({**run.hooked_config, "n_layers": 2}, seed=4).eval()
    evalset = build_evalset(task, n_groups=3, seed=2)
    lay, K = task.layout, task.cfg.K
    # copies that start at layer 1 (first ablated layer), unablated, and at layer 0, out of order
    masks = torch.zeros(4, 2, model.cfg.n_heads, dtype=torch.bool)
    masks[0, 1, 0] = masks[2, 0, 1] = masks[2, 1, 0] = masks[3, 1, 1] = True
    got = ablate.ablation_scores(model, task, evalset, masks, kind, max_rows=50)
    seqs = evalset.candidate_seqs
    with torch.no_grad():
        _, cache = model.run_with_cache(evalset.eval_seqs[:, : lay.input_len])
        pos = torch.tensor(lay.target_pred_positions)
        for c in range(len(masks)):
            def hook(z, hook, layer=None):
                layer = int(hook.name.split(".")[1])
                if kind == "zero":
                    value = torch.zeros_like(z)
                elif kind == "mean":
                    value = cache[hook.name].mean(0).expand_as(z)
                else:  # cue_mean: the mean over the row's own group's true sequences (K per group)
                    group = cache[hook.name].view(-1, K, *z.shape[1:]).mean(1)  # [G, pos, H, d]
                    value = group.repeat_interleave(K * K, 0)  # candidate rows are group-major, K x K each
                m = masks[c, layer][None, None, :, None]
                return torch.where(m, value, z)

            logits = model.run_with_hooks(seqs[:, : lay.input_len],
                                          fwd_hooks=[(get_act_name("z", la), hook) for la in range(2)])[:, pos]
            logp = logits.log_softmax(-1).gather(-1, seqs[:, pos + 1][..., None])[..., 0]
            torch.testing.assert_close(got[c], logp.sum(-1).view(-1, K, K), atol=1e-4, rtol=1e-5)


def test_each_head_ablation_read_from_the_set_ablations(tiny):
    """plateauscope.analysis.analyze takes the mean head ablation from the circuit's set ablations: the same numbers."""
    from plateauscope.analysis.circuit import ablate_sets, each_head_ablation
    from plateauscope.model.backend import build_model

    run, _, task = tiny
    model = build_model({**run.hooked_config, "n_layers": 2}, seed=4).eval()
    got = each_head_ablation(ablate_sets(model, task, "mean", n_groups=3, seed=2))
    want = ablate_each_head(model, task, "mean", n_groups=3, seed=2)
    assert (got.kind, got.n_groups) == (want.kind, want.n_groups) and got.base == pytest.approx(want.base, abs=1e-6)
    for field in ("candidate_loss", "delta_z", "d_candidate_loss", "d_delta_z"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), atol=1e-5, rtol=0)
