"""Attention clamps and pattern-preserving ablations during training (plateauscope.runs.interventions).

Each is checked against what it must do, measured independently of how it is applied: the clamped
head's pattern read by the analyses' own attention score (``attention_to_z``: 1 on the cue at a = 1),
the scores' gradient under autograd, the unclamped run's bytes at a = 0, a mean-valued head's output
constant over sequences and positions (its pattern's rows sum to 1), frozen query-key weights equal in
every later checkpoint. Both training forwards (fused and hooked) agree on every intervention."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.attention import attention_to_z
from plateauscope.cli.train import main
from plateauscope.dynamics.interventions import condition_label
from plateauscope.model.backend import build_model, hooked_parameters, hooks_added
from plateauscope.model.fused import fused_logits
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import Interventions
from plateauscope.runs.presets import get_preset
from plateauscope.sweeps.executors import run_sweep
from plateauscope.sweeps.spec import SweepSpec
from plateauscope.tasks.loading import build_task
from plateauscope.training.train import train

TOL = 1e-5


def _setup(preset: str = "ci", **train_options):
    cfg = get_preset(preset).replace(**train_options)
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=0)
    return cfg, task, model, Interventions.build(cfg.train, task, cfg.model.n_layers, cfg.model.n_heads)


def _captured(model, iv, tokens, name, step=0):
    """The hooked forward's logits under ``iv`` and the activation ``name`` after every intervention."""
    seen = {}
    with torch.no_grad(), iv.applied(model, step), hooks_added(model, [(name, lambda t, hook: seen.update(t=t))]):
        logits = model(tokens)
    return logits, seen["t"]


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_a_clamp_mixes_the_target_into_the_clamped_rows_only_in_both_forwards(strength):
    cfg, task, model, iv = _setup(clamp_heads=("0.0",), clamp_strength=strength)
    tokens = task.tokens[:16, : task.input_len]
    plain_logits, plain = _captured(model, Interventions(), tokens, get_act_name("pattern", 0))
    logits, clamped = _captured(model, iv, tokens, get_act_name("pattern", 0))
    with torch.no_grad():
        fused = fused_logits(model.cfg, hooked_parameters(model), tokens, **iv.fused_options(0))
    torch.testing.assert_close(fused, logits, atol=TOL, rtol=TOL)
    rows = iv.clamp.shared[1]
    z0, z1 = task.layout.z_span
    target = torch.zeros(tokens.shape[1])
    target[z0:z1] = 1 / (z1 - z0)
    expected = (1 - strength) * plain[:, 0, rows] + strength * target
    torch.testing.assert_close(clamped[:, 0, rows], expected, atol=1e-6, rtol=0)
    assert torch.equal(clamped[:, 0, ~rows], plain[:, 0, ~rows])  # the rule's other queries keep P
    assert torch.equal(clamped[:, 1:], plain[:, 1:])  # the other heads are untouched
    assert (logits - plain_logits).abs().max() > 1e-4


def test_a_full_clamp_leaves_the_clamped_scores_without_gradient():
    cfg, task, model, _ = _setup()
    scores = torch.randn(4, model.cfg.n_heads, task.input_len, task.input_len, requires_grad=True)
    causal = torch.ones(task.input_len, task.input_len, dtype=torch.bool).tril()
    iv = _setup(clamp_heads=("0.0",), clamp_strength=1.0)[3]
    half = _setup(clamp_heads=("0.0",), clamp_strength=0.5)[3]
    for clamp, zero in ((iv.clamp, True), (half.clamp, False)):
        scores.grad = None
        pattern = clamp.apply(scores.masked_fill(~causal, float("-inf")).softmax(-1), layer=0)
        (pattern * torch.randn_like(pattern)).sum().backward()
        rows = clamp.shared[1]
        clamped_rows = scores.grad[:, 0, rows]
        assert (clamped_rows == 0).all() if zero else clamped_rows.abs().max() > 1e-4
        assert scores.grad[:, 0, ~rows].abs().max() > 1e-4  # unclamped queries still learn
        assert scores.grad[:, 1].abs().max() > 1e-4


def test_a_clamp_at_zero_strength_changes_nothing_bit_for_bit(tmp_path):
    clamp = dataclasses.replace(_setup("tiny", clamp_heads=("0.0",))[3].clamp, strength=0.0)
    pattern = torch.rand(2, 2, clamp.shared[0].shape[0], clamp.shared[0].shape[0])
    assert torch.equal(clamp.apply(pattern, 0), pattern)  # (1 - 0) P + 0 T is P in floats too
    plain, zero = tmp_path / "plain", tmp_path / "zero"
    train(get_preset("tiny"), plain, device="cpu", progress=False)
    train(get_preset("tiny").replace(clamp_heads=("0.0",), clamp_strength=0.0), zero, device="cpu", progress=False)
    for step in rd.Run(plain).steps:
        a, _ = rd.load_checkpoint(plain / rd.CHECKPOINT_DIR / rd.checkpoint_name(step))
        b, _ = rd.load_checkpoint(zero / rd.CHECKPOINT_DIR / rd.checkpoint_name(step))
        assert all(torch.equal(a[k], b[k]) for k in a)
    logged = lambda run: [{k: v for k, v in r.items() if k != "wall_s"} for r in rd.read_jsonl(run / rd.METRICS_FILE)]
    assert logged(plain) == logged(zero)


@pytest.mark.parametrize("forward", ["fused", "hooked"])
def test_a_full_clamp_holds_at_every_checkpoint_until_its_end(tmp_path, forward):
    cfg = get_preset("tiny").replace(clamp_heads=("0.1",), clamp_from=0, clamp_until=30, forward=forward)
    train(cfg, tmp_path / "r", device="cpu", progress=False)
    run = rd.Run(tmp_path / "r")
    stored = json.loads((tmp_path / "r" / rd.CONFIG_FILE).read_text())["run"]["train"]
    assert stored["clamp_heads"] == ["0.1"] and stored["clamp_until"] == 30 and stored["clamp_rule"] == "cue"
    task = run.task()
    for step in run.steps:
        # The analyses load a checkpoint with the interventions of its step, and score attention themselves.
        to_cue = attention_to_z(run.model(step), task, n_examples=64).to_z_all_targets[0, 1].item()
        if step < 30:
            assert abs(to_cue - 1) < 1e-6, (step, to_cue)
        else:
            assert to_cue < 0.99, (step, to_cue)


@pytest.mark.parametrize("rule", ["cue", "previous token"])
def test_an_induction_clamp_follows_each_sequences_own_target_in_both_forwards(rule):
    cfg, task, model, iv = _setup("induction", clamp_heads=("1.1",), clamp_rule=rule)
    assert (iv.clamp.shared is None) == (rule == "cue")  # the induction target moves with the tokens
    tokens = task.tokens[task.sample_examples(16, 0), : task.input_len]  # repeat sequences
    logits, pattern = _captured(model, iv, tokens, get_act_name("pattern", 1))
    with torch.no_grad():
        fused = fused_logits(model.cfg, hooked_parameters(model), tokens, **iv.fused_options(0))
    torch.testing.assert_close(fused, logits, atol=TOL, rtol=TOL)
    the_rule = task.attention_rules()[rule]
    for query in the_rule.queries:  # the clamped head looks exactly at each sequence's own keys
        keys = the_rule.keys(task.tokens[task.sample_examples(16, 0)], query)
        if keys.numel():
            on_keys = pattern[:, 1].gather(-1, keys.clamp_min(0)[:, None, :].expand(-1, task.input_len, -1))[:, query]
            torch.testing.assert_close((on_keys * (keys >= 0)).sum(-1), torch.ones(len(tokens)), atol=1e-6, rtol=0)


def test_mean_values_keep_the_pattern_and_make_the_heads_output_constant():
    cfg, task, model, iv = _setup(mean_value_heads=("1.2",))
    tokens = task.tokens[:16, : task.input_len]
    logits, z = _captured(model, iv, tokens, get_act_name("z", 1))
    _, pattern = _captured(model, iv, tokens, get_act_name("pattern", 1))
    _, plain_pattern = _captured(model, Interventions(), tokens, get_act_name("pattern", 1))
    with torch.no_grad():
        fused = fused_logits(model.cfg, hooked_parameters(model), tokens, **iv.fused_options(0))
    torch.testing.assert_close(fused, logits, atol=TOL, rtol=TOL)
    torch.testing.assert_close(pattern, plain_pattern, atol=0, rtol=0)
    head = z[:, :, 2]  # [batch, pos, d_head]: every row of the pattern sums to 1 over one mean value
    torch.testing.assert_close(head, head[:1, :1].expand_as(head), atol=1e-6, rtol=0)
    assert z[:, :, 1].std(dim=(0, 1)).max() > 1e-3
    assert _setup(mean_value_heads=("1.2",), ablate_from=10)[3].fused_options(5)["mean_value_heads"] == ()


@pytest.mark.parametrize("forward", ["fused", "hooked"])
def test_frozen_query_key_weights_stay_while_the_values_train_and_a_killed_run_resumes_bit_for_bit(tmp_path, forward):
    cfg = get_preset("tiny").replace(frozen_qk_heads=("0.1",), ablate_from=10, forward=forward)
    train(cfg, tmp_path / "whole", device="cpu", progress=False)
    train(cfg, tmp_path / "killed", device="cpu", progress=False, stop_at_step=15)
    train(cfg, tmp_path / "killed", resume=True, device="cpu", progress=False)
    weights = {s: rd.load_checkpoint(tmp_path / "whole" / rd.CHECKPOINT_DIR / rd.checkpoint_name(s))[0]
               for s in (5, 10, 20, 40)}
    for w in ("W_Q", "b_Q", "W_K", "b_K"):
        key = f"blocks.0.attn.{w}"
        assert torch.equal(weights[10][key][1], weights[40][key][1]) and torch.equal(weights[20][key][1], weights[40][key][1])
        assert not torch.equal(weights[10][key][0], weights[40][key][0])  # the other head's QK trains
    assert not torch.equal(weights[5]["blocks.0.attn.W_Q"][1], weights[10]["blocks.0.attn.W_Q"][1])  # before: trained
    for w in ("W_V", "W_O"):
        assert not torch.equal(weights[10][f"blocks.0.attn.{w}"][1], weights[40][f"blocks.0.attn.{w}"][1])
    resumed, _ = rd.load_checkpoint(tmp_path / "killed" / rd.CHECKPOINT_DIR / rd.checkpoint_name(40))
    assert all(torch.equal(weights[40][k], resumed[k]) for k in resumed)


@pytest.mark.parametrize("flags, message", [
    (["--clamp-heads", "0.7"], "clamped head 0.7 does not exist"),
    (["--clamp-heads", "0.0,0.0"], "name a head twice"),
    (["--clamp-heads", "0.0", "--clamp-rule", "previous token"], "has no such attention rule (its rules: 'cue')"),
    (["--clamp-heads", "0.0", "--clamp-from", "10", "--clamp-until", "5"], "clamp_until=5 must come after"),
    (["--clamp-heads", "0.0", "--clamp-strength", "1.5"], "clamp_strength must lie in [0, 1]"),
    (["--clamp-heads", "0.0", "--clamp-strength", "-0.1"], "clamp_strength must lie in [0, 1]"),
    (["--mean-value-heads", "1.0"], "mean-value head 1.0 does not exist"),
    (["--freeze-qk-heads", "x"], "write heads as L.H"),
    (["--freeze-qk-heads", "0.1", "--ablate-from", "-3"], "ablate_from must be a step >= 0"),
])
def test_impossible_clamps_and_ablations_are_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
    assert main(["--preset", "tiny", "--no-progress", "--out", str(tmp_path / "r"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert not (tmp_path / "r").exists()


def test_a_sweep_clamps_each_seeds_routing_head_once_its_baseline_is_analysed(tmp_path):
    spec = SweepSpec(name="routing-clamp", base="tiny", fixed={"max_steps": 20},
                     grids=({"seed": (0,)}, {"seed": (0,), "clamp_head_of": ("routing",)}))
    first = {o["name"]: o for o in run_sweep(spec, tmp_path, executor="serial", threads=1, progress=False)}
    clamped = next(name for name in first if name != "seed0")
    assert first["seed0"]["status"] == "done" and first[clamped]["status"] == "failed"
    assert "run plateauscope analyze --run" in first[clamped]["error"]
    # The baseline's analysis names head 0.1 (written by hand here: what plateauscope analyze records).
    rd.write_json_atomic(tmp_path / "seed0" / rd.ANALYSIS_DIR / rd.ROUTING_FILE, {"head": [0, 1], "label": "L0H1"})
    again = {o["name"]: o for o in run_sweep(spec, tmp_path, executor="serial", threads=1, progress=False)}
    assert again[clamped]["status"] == "done"
    train_cfg = rd.Run(tmp_path / clamped).config.train
    assert train_cfg.clamp_heads == ("0.1",) and train_cfg.clamp_rule == "cue"
    assert condition_label(rd.read_json(tmp_path / rd.MANIFEST_FILE)["points"][1]["options"]) == \
        "routing head clamped to the cue (a = 1)"
