"""The fused training forward (plateauscope.model.fused) against HookedTransformer's own forward: logits and
every parameter's gradient at 1e-5, on the ci and paper models and on the other architectures a
ModelConfig can build, in full and trimmed to the loss positions; a run records its forward, resumes
only in it, and refuses what it cannot run."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens.utilities import get_act_name

from plateauscope.cli.train import main
from plateauscope.errors import ConfigError
from plateauscope.model.backend import build_model, hooked_parameters
from plateauscope.model.config import ModelConfig, TrainConfig
from plateauscope.model.fused import fused_logits, unsupported_reason
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.presets import get_preset
from plateauscope.tasks.base import Task
from plateauscope.tasks.loading import build_task
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.train import check_forward, train

TOL = 1e-5


def _model_and_batch(cfg: RunConfig, seed: int = 0, n: int = 64):
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=seed)
    batch = task.tokens[torch.randperm(len(task.tokens))[:n]]
    return task, model, batch


def _loss_and_grads(model, task, batch, logits_of):
    model.zero_grad(set_to_none=True)
    logits = logits_of(batch[:, : task.input_len])
    task.loss(logits, batch).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


ARCHITECTURES = [
    "ci", "paper",
    ModelConfig(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, normalization_type="LNPre", act_fn="gelu_new"),
    ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_mlp=64, normalization_type=None, act_fn="relu"),
    ModelConfig(n_layers=2, d_model=32, n_heads=2, d_head=16, attn_only=True, act_fn="silu"),
]
ARCHITECTURE_IDS = ["ci", "paper", "LNPre-gelu_new", "no-norm-relu", "attn-only"]


def _trained_a_little(model_cfg):
    """The preset (or ``tiny`` with this ModelConfig), its model trained 3 steps so that no parameter is at
    its (often zero or one) initial value, and a batch."""
    cfg = get_preset(model_cfg) if isinstance(model_cfg, str) else get_preset("tiny").replace(**model_cfg.to_dict())
    task, model, batch = _model_and_batch(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        task.loss(model(batch[:, : task.input_len]), batch).backward()
        opt.step()
    return task, model, batch


def _assert_same_to_rounding(run_a, run_b, step):
    """The two runs' weights at ``step`` agree at 1e-4 (every float parameter but b_K, whose exact
    gradient is zero: AdamW normalises rounding noise into steps of about lr, in any forward)."""
    a = rd.load_checkpoint(run_a / rd.CHECKPOINT_DIR / rd.checkpoint_name(step))[0]
    b = rd.load_checkpoint(run_b / rd.CHECKPOINT_DIR / rd.checkpoint_name(step))[0]
    for k in a:
        if a[k].is_floating_point() and a[k].numel() and not k.endswith(("IGNORE", "b_K")):
            torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-4, msg=k)


@pytest.mark.parametrize("model_cfg", ARCHITECTURES, ids=ARCHITECTURE_IDS)
def test_logits_and_gradients_equal_the_hooked_forward(model_cfg):
    task, model, batch = _trained_a_little(model_cfg)
    ref_logits, ref_grads = _loss_and_grads(model, task, batch, model)
    params = hooked_parameters(model)
    logits, grads = _loss_and_grads(model, task, batch, lambda t: fused_logits(model.cfg, params, t))
    torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=TOL)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=TOL, rtol=TOL, msg=name)


def test_a_forward_stopped_at_a_block_is_its_resid_pre_and_resumes_from_it():
    """``stop_at`` returns HookedTransformer's ``resid_pre`` of that block; ``start`` from it gives the whole
    forward's logits, in full and trimmed to the loss positions."""
    task, model, batch = _trained_a_little("paper")
    params, inputs = hooked_parameters(model), batch[:, : task.input_len]
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs)
        for layer in range(model.cfg.n_layers):
            stream = fused_logits(model.cfg, params, inputs, stop_at=layer)
            torch.testing.assert_close(stream, cache[get_act_name("resid_pre", layer)], atol=TOL, rtol=TOL)
            for positions in (None, task.loss_positions):
                torch.testing.assert_close(fused_logits(model.cfg, params, inputs, positions=positions,
                                                        start=(layer, stream)),
                                           fused_logits(model.cfg, params, inputs, positions=positions))


def test_induction_model_equals_the_hooked_forward():
    task, model, batch = _model_and_batch(get_preset("induction"))
    ref_logits, ref_grads = _loss_and_grads(model, task, batch, model)
    params = hooked_parameters(model)
    logits, grads = _loss_and_grads(model, task, batch, lambda t: fused_logits(model.cfg, params, t))
    torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=TOL)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=TOL, rtol=TOL, msg=name)


def test_a_run_records_its_forward_and_resumes_only_in_it(tmp_path, one_thread):
    tiny = get_preset("tiny").replace(max_steps=20)
    train(tiny, tmp_path / "fused", device="cpu", progress=False)
    stored = rd.read_json(tmp_path / "fused" / rd.CONFIG_FILE)["run"]
    assert stored["train"]["forward"] == "fused"
    with pytest.raises(ConfigError, match=r"train\.forward: stored 'fused', asked 'hooked'"):
        train(tiny.replace(forward="hooked"), tmp_path / "fused", resume=True, device="cpu", progress=False)
    # A config.json from before the field existed was trained with the hooked forward.
    old = {k: v for k, v in stored["train"].items() if k != "forward"}
    assert TrainConfig.from_dict(old).forward == "hooked"
    # The two forwards train the same model to within float rounding: after 20 steps, close but
    # (in general) not bit-identical weights (b_K aside: a key bias adds the same score to every key).
    train(tiny.replace(forward="hooked"), tmp_path / "hooked", device="cpu", progress=False)
    _assert_same_to_rounding(tmp_path / "fused", tmp_path / "hooked", 20)


def test_kill_and_resume_is_bit_identical_in_the_hooked_forward(tmp_path):
    """tests/training/test_train.py checks the default (fused) forward; the hooked one resumes exactly too."""
    cfg = get_preset("tiny").replace(forward="hooked")
    train(cfg, tmp_path / "whole", device="cpu", progress=False)
    train(cfg, tmp_path / "killed", device="cpu", progress=False, stop_at_step=23)
    train(cfg, tmp_path / "killed", resume=True, device="cpu", progress=False)
    name = rd.CHECKPOINT_DIR + "/" + rd.checkpoint_name(cfg.train.max_steps)
    a = rd.load_checkpoint(tmp_path / "whole" / name)[0]
    b = rd.load_checkpoint(tmp_path / "killed" / name)[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_unsupported_models_fail_in_one_line_before_anything_is_written(tmp_path):
    assert unsupported_reason(ModelConfig()) is None
    assert "rotary" in unsupported_reason(ModelConfig(positional_embedding_type="rotary"))
    assert "act_fn=solu" in unsupported_reason(ModelConfig(act_fn="solu"))
    cfg = get_preset("tiny").replace(positional_embedding_type="rotary")
    with pytest.raises(ConfigError, match="--forward fused does not support positional_embedding_type=rotary"):
        train(cfg, tmp_path / "r", device="cpu", progress=False)
    assert not (tmp_path / "r").exists()
    # the hooked forward trains it
    train(cfg.replace(forward="hooked", max_steps=5), tmp_path / "r", device="cpu", progress=False)


def test_cli_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", "--forward", "eager", "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--forward" in err
    assert main(["--preset", "tiny", "--forward", "hooked", "--max-steps", "5", "--out", str(tmp_path / "h"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "h" / rd.CONFIG_FILE).read_text())["run"]["train"]["forward"] == "hooked"


# ---- trimmed: the last block and the unembedding at the loss positions only ----------------


@pytest.mark.parametrize("model_cfg", [*ARCHITECTURES, "induction"], ids=[*ARCHITECTURE_IDS, "induction"])
def test_trimmed_logits_and_gradients_equal_the_hooked_forward_at_the_loss_positions(model_cfg):
    task, model, batch = _trained_a_little(model_cfg)
    pos = task.loss_positions
    model.zero_grad(set_to_none=True)
    ref_logits = model(batch[:, : task.input_len])
    ref_loss = task.loss(ref_logits, batch)
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    logits = fused_logits(model.cfg, hooked_parameters(model), batch[:, : task.input_len], positions=pos)
    assert logits.shape == (len(batch), len(pos), model.cfg.d_vocab_out)
    loss = task.loss_at_positions(logits, batch)
    loss.backward()
    torch.testing.assert_close(logits, ref_logits[:, pos].detach(), atol=TOL, rtol=TOL)
    torch.testing.assert_close(loss, ref_loss.detach(), atol=TOL, rtol=TOL)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], atol=TOL, rtol=TOL, msg=name)


def test_trimmed_logits_keep_the_interventions():
    """A hidden cue and zeroed heads, one of them in the trimmed last block: the untrimmed forward's
    logits at the loss positions (that forward is checked against the hooked one with the intervention
    hooks in tests/training/test_interventions.py)."""
    task, model, batch = _trained_a_little("ci")
    params, inputs = hooked_parameters(model), batch[:, : task.input_len]
    options = {"hidden_keys": tuple(range(*task.layout.z_span)), "zeroed_heads": ((0, 1), (1, 2))}
    full = fused_logits(model.cfg, params, inputs, **options)
    trimmed = fused_logits(model.cfg, params, inputs, positions=task.loss_positions, **options)
    torch.testing.assert_close(trimmed, full[:, task.loss_positions], atol=TOL, rtol=TOL)
    # and the interventions change the logits there: the comparison is not vacuous
    plain = fused_logits(model.cfg, params, inputs, positions=task.loss_positions)
    assert (plain - trimmed).abs().max() > 1e-2


def test_a_trimmed_run_trains_as_the_fused_one_and_its_ensemble_member_is_its_solo_run(tmp_path, one_thread):
    tiny = get_preset("tiny").replace(max_steps=20, forward="trimmed")
    solo = [train(tiny.replace(seed=s), tmp_path / f"solo{s}", device="cpu", progress=False) for s in (0, 1)]
    assert rd.read_json(tmp_path / "solo0" / rd.CONFIG_FILE)["run"]["train"]["forward"] == "trimmed"
    train_ensemble([tiny.replace(seed=s) for s in (0, 1)], [tmp_path / f"member{s}" for s in (0, 1)],
                   device="cpu", progress=False)
    for s in (0, 1):
        a = rd.load_checkpoint(tmp_path / f"solo{s}" / rd.CHECKPOINT_DIR / rd.checkpoint_name(20))[0]
        b = rd.load_checkpoint(tmp_path / f"member{s}" / rd.CHECKPOINT_DIR / rd.checkpoint_name(20))[0]
        assert all(torch.equal(a[k], b[k]) for k in a), f"seed {s}"
    # The same model as the fused forward's to within float rounding.
    train(tiny.replace(forward="fused"), tmp_path / "fused", device="cpu", progress=False)
    _assert_same_to_rounding(tmp_path / "solo0", tmp_path / "fused", 20)
    assert solo[0]["final_step"] == 20


def test_trimmed_refuses_a_task_with_its_own_loss_in_one_line(tmp_path):
    cfg = get_preset("tiny").replace(forward="trimmed")
    task = build_task(cfg.task_name, cfg.task)
    check_forward(cfg, task)  # the built-in tasks keep Task.loss

    class EveryPosition(type(task)):
        def loss(self, logits, tokens):
            return Task.loss(self, logits, tokens) + 0.0 * logits.sum()

    task.__class__ = EveryPosition
    with pytest.raises(ConfigError, match="--forward trimmed: task .* defines its own loss") as e:
        check_forward(cfg, task)
    assert len(str(e.value).splitlines()) == 1
    check_forward(cfg.replace(forward="fused"), task)
    with pytest.raises(ConfigError, match="--forward trimmed does not support positional_embedding_type=rotary"):
        train(cfg.replace(positional_embedding_type="rotary"), tmp_path / "r", device="cpu", progress=False)
    assert not (tmp_path / "r").exists()


def test_a_seed_ensemble_calls_the_same_hooks(tmp_path):
    from plateauscope.training.train import TrainingHooks

    cfg = get_preset("tiny").replace(max_steps=6)
    losses, evaluations = [], []
    hooks = TrainingHooks(on_step=lambda step, loss: losses.append((step, tuple(loss.shape))),
                          on_evaluation=lambda record, seconds: evaluations.append(record["step"]))
    outs = [tmp_path / f"member{s}" for s in (0, 1)]
    train_ensemble([cfg.replace(seed=s) for s in (0, 1)], outs, device="cpu", progress=False, hooks=hooks)
    assert losses == [(step, (2,)) for step in range(1, 7)]
    member_steps = [r["step"] for r in rd.read_jsonl(outs[0] / rd.METRICS_FILE)]
    assert sorted(evaluations) == sorted(member_steps * 2)
