"""Activation patching (exact, batched) against TransformerLens's reference; attribution patching
against exact patching; the ``plateauscope patch`` CLI and its one-line errors."""

import dataclasses
import json
import math

import pytest
import torch
import transformer_lens.patching as tl_patching

from plateauscope.analysis import attribution as attr
from plateauscope.analysis import patch as P
from plateauscope.analysis.components import TARGETS
from plateauscope.analysis.inputs import logit_diff, prompt_pairs
from plateauscope.cli import patch as patch_cli
from plateauscope.model.backend import build_model
from plateauscope.runs.run import Run

N_PAIRS = 32


@pytest.fixture(scope="module")
def tiny(tiny_run):
    run = Run(tiny_run)
    pairs = prompt_pairs(run.task(), N_PAIRS, seed=0)
    return run, pairs


def _model(run, kind):
    """The trained 1-layer tiny model, or a seeded random 2-layer one (patches in several layers)."""
    if kind == "trained":
        return run.model(run.steps[-1])
    return build_model({**run.hooked_config, "n_layers": 2}, seed=1).eval()


def _baselines(model, pairs):
    with torch.no_grad():
        return logit_diff(model(pairs.clean), pairs).item(), logit_diff(model(pairs.corrupt), pairs).item()


@pytest.mark.parametrize("kind", ["trained", "random_2layer"])
@pytest.mark.parametrize(
    "ours, reference",
    [
        (P.patch_head_out_all_pos, tl_patching.get_act_patch_attn_head_out_all_pos),
        (P.patch_resid_pre, tl_patching.get_act_patch_resid_pre),
        (P.patch_head_out_by_pos, tl_patching.get_act_patch_attn_head_out_by_pos),
        (P.patch_attn_out, tl_patching.get_act_patch_attn_out),
        (P.patch_mlp_out, tl_patching.get_act_patch_mlp_out),
    ],
    ids=["heads", "resid", "heads_by_pos", "attn", "mlp"],
)
def test_exact_patching_matches_transformer_lens(tiny, kind, ours, reference):
    run, pairs = tiny
    model = _model(run, kind)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(pairs.clean)
        ref = reference(model, pairs.corrupt, clean_cache, lambda logits: logit_diff(logits, pairs))
    # a small max_batch forces several chunks of patches
    res = ours(model, pairs, max_batch=3 * N_PAIRS)
    clean, corrupt = _baselines(model, pairs)
    assert abs(clean - corrupt) > 1e-3, "a degenerate pair set: normalised values would be NaN"
    assert res.raw.shape == ref.shape
    torch.testing.assert_close(res.raw, ref.float(), atol=1e-5, rtol=0)
    assert res.clean_metric == pytest.approx(clean, abs=1e-6)
    assert res.corrupt_metric == pytest.approx(corrupt, abs=1e-6)
    torch.testing.assert_close(res.normalised, ((ref - corrupt) / (clean - corrupt)).float(), atol=1e-5, rtol=0)


def _clean_answer_logprob(last, pairs):
    """Another metric than the default: the log-probability of the clean answer, per pair."""
    return last.log_softmax(-1).gather(-1, pairs.clean_answer[:, None])[:, 0]


def test_a_metric_callable_matches_transformer_lens_with_the_same_metric(tiny):
    run, pairs = tiny
    model = _model(run, "random_2layer")
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(pairs.clean)
        ref = tl_patching.get_act_patch_attn_head_out_by_pos(
            model, pairs.corrupt, clean_cache,
            lambda logits: _clean_answer_logprob(logits[:, pairs.pred_pos], pairs).mean())
        clean = _clean_answer_logprob(model(pairs.clean)[:, pairs.pred_pos], pairs).mean().item()
    res = P.patch_head_out_by_pos(model, pairs, max_batch=3 * N_PAIRS, metric=_clean_answer_logprob)
    torch.testing.assert_close(res.raw, ref.float(), atol=1e-5, rtol=0)
    assert res.clean_metric == pytest.approx(clean, abs=1e-5)
    default = P.patch_head_out_by_pos(model, pairs, max_batch=3 * N_PAIRS)
    assert not torch.allclose(default.raw, res.raw), "the metric argument changed nothing"


def test_chunking_does_not_change_results(tiny):
    run, pairs = tiny
    model = _model(run, "random_2layer")
    one_by_one = P.patch_head_out_by_pos(model, pairs, max_batch=1)
    all_at_once = P.patch_head_out_by_pos(model, pairs, max_batch=10**6)
    torch.testing.assert_close(one_by_one.raw, all_at_once.raw, atol=1e-5, rtol=0)


def test_normalised_is_nan_without_a_gap_and_raw_is_kept(tiny):
    run, pairs = tiny
    model = _model(run, "trained")
    same = dataclasses.replace(pairs, corrupt=pairs.clean, corrupt_answer=pairs.clean_answer)
    res = P.patch_resid_pre(model, same)
    assert res.clean_metric == res.corrupt_metric == 0.0
    assert res.normalised.isnan().all() and not res.normalisable
    assert torch.isfinite(res.raw).all()
    assert json.loads(json.dumps(res.to_dict()))["normalised"][0][0] is None  # valid JSON, NaN -> null


def test_unknown_target_is_a_value_error(tiny):
    run, pairs = tiny
    with pytest.raises(ValueError, match="unknown patch target"):
        P.patch(_model(run, "trained"), pairs, "embed")


@pytest.mark.parametrize("target", TARGETS)
def test_attribution_shapes_and_agreement_on_trained_model(tiny, target):
    run, pairs = tiny
    model = _model(run, "trained")
    exact, approx = P.patch(model, pairs, target), attr.attribute(model, pairs, target)
    assert approx.raw.shape == exact.raw.shape and approx.axes == exact.axes
    assert approx.method == "attribution"
    assert approx.clean_metric == pytest.approx(exact.clean_metric, abs=1e-6)
    assert approx.corrupt_metric == pytest.approx(exact.corrupt_metric, abs=1e-6)
    agree = attr.agreement(exact, approx)
    assert math.isfinite(agree["max_abs_err"])
    if exact.raw.numel() > 1:
        assert math.isfinite(agree["spearman"]) and agree["spearman"] > 0


def test_attribution_is_exact_where_the_metric_is_linear(tiny):
    """Without LayerNorm the logits are linear in the last layer's mlp_out (nothing reads it but
    the unembedding), so the first-order estimate there must equal exact patching."""
    run, pairs = tiny
    model = build_model({**run.hooked_config, "n_layers": 2, "normalization_type": None}, seed=2).eval()
    exact, approx = P.patch_mlp_out(model, pairs), attr.attribute_mlp_out(model, pairs)
    assert abs(exact.clean_metric - exact.corrupt_metric) > 1e-3
    torch.testing.assert_close(approx.raw[-1], exact.raw[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(approx.normalised[-1], exact.normalised[-1], atol=1e-4, rtol=0)
    # ... and one backward serves every component set
    both = attr.attribute_all(model, pairs, ["mlp_layer", "heads"])
    whole_layer = P.patch_mlp_out(model, pairs, by_pos=False)
    torch.testing.assert_close(both["mlp_layer"].raw[-1], whole_layer.raw[-1], atol=1e-5, rtol=0)
    assert both["heads"].raw.shape == (2, model.cfg.n_heads)


def test_cli_prints_table_and_writes_json(tiny_run, tmp_path, capsys):
    out = tmp_path / "patch.json"
    rc = patch_cli.main(["--ckpt", str(tiny_run), "--n-examples", "16", "--target", "heads", "--json", str(out),
                 "--top", "3", "--no-progress", "--method", "both"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "layer" in text and "H0" in text and "L0H1" in text and "spearman" in text
    data = json.loads(out.read_text())
    assert data["exact"]["axes"] == ["layer", "head"] and data["exact"]["shape"] == [1, 2]
    assert data["attribution"]["shape"] == [1, 2]
    assert data["step"] == Run(tiny_run).steps[-1] and data["n_examples"] == 16


def test_cli_by_position_target_at_a_step(tiny_run, capsys):
    rc = patch_cli.main(["--ckpt", str(tiny_run), "--step", "20", "--n-examples", "8", "--target", "resid", "--top", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "step 20" in text and "z1" in text and "resid_pre L0@" in text


def _error(capsys, argv):
    rc = patch_cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_cli_errors_are_one_line(tiny_run, tmp_path, capsys):
    assert "no such" in _error(capsys, ["--ckpt", str(tmp_path / "missing")])
    fake = tmp_path / "x.safetensors"
    fake.write_text("not a checkpoint\n")
    assert "x.safetensors" in _error(capsys, ["--ckpt", str(fake)])
    assert "no checkpoint at step 7" in _error(capsys, ["--ckpt", str(tiny_run), "--step", "7"])


def test_patches_over_several_layers_and_positions_match_full_forwards(tiny):
    """The engine starts each patch at its first patched layer and position; a spec whose patches
    span two layers and start at different positions (before z, at z, at the prediction position)
    must equal one full hooked forward per patch."""
    run, pairs = tiny
    model = _model(run, "random_2layer")
    n_pos, L = pairs.corrupt.shape[1], model.cfg.n_layers
    z0, pred = run.task().layout.z_span[0], pairs.pred_pos
    masks = torch.zeros(5, L, n_pos, dtype=torch.bool)
    masks[0, 0, : z0 - 1] = True  # before z only: the corrupted metric
    masks[1, 0, z0] = masks[1, 1, pred] = True  # two layers
    masks[2, 1, z0 - 2: z0 + 1] = True  # straddles the first difference
    masks[3, :, pred] = True
    masks[4] = True
    spec = P.PatchSpec("custom", "resid_pre", ("patch",), (5,), masks)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(pairs.clean)
        expected = []
        for m in masks:
            hooks = [(f"blocks.{layer}.hook_resid_pre",
                      lambda act, hook, m=m[layer], c=clean_cache[f"blocks.{layer}.hook_resid_pre"]:
                      torch.where(m[None, :, None], c, act)) for layer in range(L)]
            expected.append(logit_diff(model.run_with_hooks(pairs.corrupt, fwd_hooks=hooks), pairs).item())
    res = P.patch_sweep(model, pairs, spec, max_batch=2 * N_PAIRS)
    torch.testing.assert_close(res.raw, torch.tensor(expected), atol=1e-5, rtol=0)
    assert res.raw[0] == res.corrupt_metric
