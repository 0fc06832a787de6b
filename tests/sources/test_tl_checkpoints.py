"""TransformerLens checkpoints imported as a series: what TransformerLens 4's ``tools.training`` saves, 3.x
HookedTransformer state dicts, and one series written as Hugging Face, TransformerLens and nanoGPT files giving
the same analysis records."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import einops
import pytest
import torch
from safetensors.torch import load_file

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.cli import main as cli_main
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.found import SourceError
from plateauscope.sources.importer import import_series
from plateauscope.sources.tl_checkpoint import file_step
from tests.sources.series_builders import SEGMENT, repeated_tokens, train_hf_series

TL_FIELDS = dict(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=128, n_ctx=32, d_vocab=24, act_fn="gelu",
                 normalization_type="LN")
"""A tiny GPT-2-style TransformerLens model (LayerNorm, learned positions, GELU)."""
TL3_PYTHON = Path("/work/main/.venv-tl3/bin/python")


def _tl4_bridge():
    """TransformerLens 4's own native model of :data:`TL_FIELDS` (no plateauscope code)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_native(TransformerBridgeConfig(**TL_FIELDS))


@pytest.fixture(scope="module")
def tools_training_series(tmp_path_factory):
    """``model_{step}.pt`` files written by TransformerLens 4's ``tools.training.train`` (steps 0, 5, ..., 20),
    with the config beside them as ``cfg.json``."""
    from transformer_lens.tools.training import TrainConfig, train

    out = tmp_path_factory.mktemp("tl4") / "checkpoints"
    out.mkdir()
    (out / "cfg.json").write_text(json.dumps(TL_FIELDS))
    torch.manual_seed(0)
    model = _tl4_bridge()
    tokens = repeated_tokens(16 * 21, TL_FIELDS["d_vocab"], torch.Generator().manual_seed(0))
    config = TrainConfig(num_epochs=1, batch_size=16, lr=5e-3, device="cpu", save_every=5, save_dir=str(out),
                         print_every=None, max_steps=20)
    train(model, config, [{"tokens": row} for row in tokens])
    return out


def test_tools_training_checkpoints_compute_what_transformer_lens_computes(tools_training_series, tmp_path):
    result = import_series(tools_training_series, tmp_path / "run")
    assert result.steps == [0, 5, 10, 15, 20] and result.architecture == "GPT2LMHeadModel"
    series = ImportedSeries(result.path)
    tokens = repeated_tokens(4, TL_FIELDS["d_vocab"], torch.Generator().manual_seed(3))
    model, reference = None, _tl4_bridge().eval()
    for step in (20, 0, 10):
        model = series.model(step, reuse=model)
        reference.load_state_dict(torch.load(tools_training_series / f"model_{step}.pt", weights_only=True))
        with torch.no_grad():
            assert torch.allclose(model(tokens), reference(tokens), atol=1e-5)


def _hooked_state(seed: int) -> dict[str, torch.Tensor]:
    """A HookedTransformer state dict of :data:`TL_FIELDS` with every tensor random (LayerNorm weights and the
    unembedding bias too), written by hand in HookedTransformer's layout."""
    gen = torch.Generator().manual_seed(seed)
    c = TL_FIELDS
    d, h, dh, m, v = c["d_model"], c["n_heads"], c["d_head"], c["d_mlp"], c["d_vocab"]
    shapes = {"embed.W_E": (v, d), "pos_embed.W_pos": (c["n_ctx"], d), "ln_final.w": (d,), "ln_final.b": (d,),
              "unembed.W_U": (d, v), "unembed.b_U": (v,)}
    for layer in range(c["n_layers"]):
        p = f"blocks.{layer}."
        shapes |= {p + "ln1.w": (d,), p + "ln1.b": (d,), p + "ln2.w": (d,), p + "ln2.b": (d,),
                   p + "attn.W_Q": (h, d, dh), p + "attn.W_K": (h, d, dh), p + "attn.W_V": (h, d, dh),
                   p + "attn.W_O": (h, dh, d), p + "attn.b_Q": (h, dh), p + "attn.b_K": (h, dh),
                   p + "attn.b_V": (h, dh), p + "attn.b_O": (d,), p + "mlp.W_in": (d, m), p + "mlp.b_in": (m,),
                   p + "mlp.W_out": (m, d), p + "mlp.b_out": (d,)}
    state = {k: 0.2 * torch.randn(shape, generator=gen) + (1.0 if k.endswith(".w") else 0.0) for k, shape in shapes.items()}
    for layer in range(c["n_layers"]):  # the buffers HookedTransformer saves
        state[f"blocks.{layer}.attn.mask"] = torch.tril(torch.ones(c["n_ctx"], c["n_ctx"], dtype=torch.bool))
        state[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-1e5)
    return state


def test_hooked_transformer_state_dicts_compute_what_transformer_lens_computes(tmp_path):
    from safetensors.torch import save_file
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    source = tmp_path / "ht"
    source.mkdir()
    (source / "cfg.json").write_text(json.dumps({**TL_FIELDS, "seed": 3, "eps": 1e-5}))
    states = {step: _hooked_state(step) for step in (0, 100, 200)}
    torch.save(states[0], source / "checkpoint_0.pth")
    torch.save(states[100], source / "checkpoint_100.pt")
    save_file({k: v.contiguous() for k, v in states[200].items()}, source / "checkpoint_200.safetensors")
    series = ImportedSeries(import_series(source, tmp_path / "run").path)
    assert series.steps == [0, 100, 200]
    tokens = repeated_tokens(4, TL_FIELDS["d_vocab"], torch.Generator().manual_seed(3))
    model, reference = None, _tl4_bridge().eval()
    for step, state in states.items():  # TransformerLens's own converter and forward are the truth
        model = series.model(step, reuse=model)
        reference.load_state_dict(convert_tl_checkpoint(state, reference.cfg), strict=True)
        with torch.no_grad():
            expected = reference(tokens)
            assert torch.allclose(model(tokens), expected, atol=1e-5)
            assert not torch.allclose(model(tokens) - state["unembed.b_U"], expected, atol=1e-3)  # b_U counts


@pytest.mark.skipif(not TL3_PYTHON.exists(), reason="no TransformerLens 3.x environment")
def test_a_transformer_lens_3_state_dict_imports(tmp_path):
    source = tmp_path / "tl3"
    source.mkdir()
    script = textwrap.dedent(f"""
        import json, sys, torch
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        fields = json.loads({json.dumps(json.dumps(TL_FIELDS))})
        torch.manual_seed(0)
        model = HookedTransformer(HookedTransformerConfig(**fields, seed=0, device="cpu"))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        out = sys.argv[1]
        torch.save(model.state_dict(), out + "/model_7.pt")
        json.dump(fields, open(out + "/cfg.json", "w"))
        tokens = torch.arange(20).remainder(fields["d_vocab"])[None]
        torch.save({{"tokens": tokens, "logits": model(tokens).detach()}}, out + "/../truth.pt")
    """)
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(TL3_PYTHON), "-c", script, str(source)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    truth = torch.load(tmp_path / "truth.pt", weights_only=True)
    series = ImportedSeries(import_series(source, tmp_path / "run").path)
    with torch.no_grad():
        assert torch.allclose(series.model(7)(truth["tokens"]), truth["logits"], atol=1e-5)


# ---- one series, three formats ------------------------------------------------------------


def _gpt2_config():
    """A tiny GPT-2 with nanoGPT's choices (exact GELU, LayerNorm epsilon 1e-5, tied embeddings, no dropout)."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=24, n_positions=32, n_embd=32, n_layer=2, n_head=2, activation_function="gelu",
                      layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)


def _hf_to_hooked(hf: dict[str, torch.Tensor], n_heads: int) -> dict[str, torch.Tensor]:
    """GPT-2's weights in HookedTransformer's layout, by hand (TransformerLens's GPT-2 conversion)."""
    out = {"embed.W_E": hf["transformer.wte.weight"], "pos_embed.W_pos": hf["transformer.wpe.weight"],
           "ln_final.w": hf["transformer.ln_f.weight"], "ln_final.b": hf["transformer.ln_f.bias"],
           "unembed.W_U": hf["transformer.wte.weight"].T.contiguous(),  # tied
           "unembed.b_U": torch.zeros(hf["transformer.wte.weight"].shape[0])}
    layers = {int(k.split(".")[2]) for k in hf if k.startswith("transformer.h.")}
    for layer in sorted(layers):
        g, p = f"transformer.h.{layer}.", f"blocks.{layer}."
        q, k, v = hf[g + "attn.c_attn.weight"].chunk(3, dim=1)
        bq, bk, bv = hf[g + "attn.c_attn.bias"].chunk(3)
        for name, w, b in (("Q", q, bq), ("K", k, bk), ("V", v, bv)):
            out[p + f"attn.W_{name}"] = einops.rearrange(w, "m (h d) -> h m d", h=n_heads).contiguous()
            out[p + f"attn.b_{name}"] = einops.rearrange(b, "(h d) -> h d", h=n_heads).contiguous()
        out[p + "attn.W_O"] = einops.rearrange(hf[g + "attn.c_proj.weight"], "(h d) m -> h d m", h=n_heads).contiguous()
        out[p + "attn.b_O"] = hf[g + "attn.c_proj.bias"]
        out |= {p + "ln1.w": hf[g + "ln_1.weight"], p + "ln1.b": hf[g + "ln_1.bias"], p + "ln2.w": hf[g + "ln_2.weight"],
                p + "ln2.b": hf[g + "ln_2.bias"], p + "mlp.W_in": hf[g + "mlp.c_fc.weight"],
                p + "mlp.b_in": hf[g + "mlp.c_fc.bias"], p + "mlp.W_out": hf[g + "mlp.c_proj.weight"],
                p + "mlp.b_out": hf[g + "mlp.c_proj.bias"]}
    return out


def _hf_to_nanogpt(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPT-2's weights in nanoGPT's layout, by hand: its ``nn.Linear`` weights are Conv1D's transposed."""
    linear = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
    out = {k: (v.T.contiguous() if k.endswith(linear) else v) for k, v in hf.items() if not k.endswith(".attn.bias")}
    out["lm_head.weight"] = hf["transformer.wte.weight"]
    return out


@pytest.fixture(scope="module")
def three_formats(tmp_path_factory):
    """One trained GPT-2 series (steps 0, 20, 40, 60) written as Hugging Face folders, TransformerLens state dicts
    and nanoGPT ckpt.pt files."""
    root = tmp_path_factory.mktemp("formats")
    config = _gpt2_config()
    steps = train_hf_series(root / "hf", config, steps=60, save_every=20, lr=5e-3)
    (root / "tl").mkdir()
    (root / "nanogpt").mkdir()
    (root / "tl" / "cfg.json").write_text(json.dumps({**TL_FIELDS, "d_mlp": 4 * 32}))
    model_args = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "vocab_size": 24, "bias": True,
                  "dropout": 0.0}
    for step in steps:
        hf = load_file(root / "hf" / f"checkpoint-{step}" / "model.safetensors")
        torch.save(_hf_to_hooked(hf, config.n_head), root / "tl" / f"model_{step}.pt")
        torch.save({"model": _hf_to_nanogpt(hf), "model_args": model_args, "iter_num": step},
                   root / "nanogpt" / f"ckpt_{step}.pt")
    return root, steps


def test_the_formats_agree(three_formats, tmp_path):
    root, steps = three_formats
    results = {}
    for fmt in ("hf", "tl", "nanogpt"):
        run = import_series(root / fmt, tmp_path / fmt).path
        results[fmt] = analyze_imported(run, progress=False, segment_len=SEGMENT, n_pairs=16)
    assert results["tl"].architecture == results["nanogpt"].architecture == "GPT2LMHeadModel"
    hf = results["hf"]
    for fmt in ("tl", "nanogpt"):
        for a, b in zip(hf.steps, results[fmt].steps, strict=True):
            assert a.step == b.step
            for name in a.head_scores:
                assert torch.allclose(torch.tensor(a.head_scores[name]), torch.tensor(b.head_scores[name]), atol=1e-5)
            assert b.loss_gap == pytest.approx(a.loss_gap, abs=1e-5)
            assert torch.allclose(torch.tensor(a.head_patching), torch.tensor(b.head_patching), atol=1e-5)
        assert results[fmt].named_heads == hf.named_heads
    assert hf.steps[-1].loss_gap > hf.steps[0].loss_gap + 0.1  # the weights trained: the records are not all alike


# ---- bad input ----------------------------------------------------------------------------


def _one_line_error(argv, capsys, match):
    capsys.readouterr()
    code = cli_main(["import", *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert match in err, err


def test_a_tl_file_that_needs_code_is_refused_never_loaded(tmp_path, capsys):
    source = tmp_path / "tl"
    source.mkdir()
    (source / "cfg.json").write_text(json.dumps(TL_FIELDS))

    class Payload:  # unpickling it would run code
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({**_hooked_state(0), "extra": Payload()}, source / "model_0.pt")
    _one_line_error([str(source), "--out", str(tmp_path / "out")], capsys, "needs code to be unpickled")
    assert "ran" not in capsys.readouterr().out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, match", [
    ({"normalization_type": "LNPre"}, "normalization_type='LNPre' is not supported"),
    ({"normalization_type": "RMS"}, "normalization_type='RMS'"),
    ({"positional_embedding_type": "rotary"}, "positional_embedding_type='rotary'"),
    ({"n_key_value_heads": 1}, "n_key_value_heads=1"),
    ({"act_fn": "solu_ln"}, "act_fn='solu_ln'"),
    ({"attn_only": True}, "attn_only=True"),
])
def test_an_unsupported_config_is_one_line(tmp_path, capsys, change, match):
    source = tmp_path / "tl"
    source.mkdir()
    (source / "cfg.json").write_text(json.dumps({**TL_FIELDS, **change}))
    torch.save(_hooked_state(0), source / "model_0.pt")
    _one_line_error([str(source), "--out", str(tmp_path / "out")], capsys, match)


def test_a_folded_state_dict_or_a_missing_config_is_one_line(tmp_path, capsys):
    source = tmp_path / "tl"
    source.mkdir()
    folded = {k: v for k, v in _hooked_state(0).items() if ".ln1." not in k and ".ln2." not in k}
    torch.save(folded, source / "model_0.pt")
    _one_line_error([str(source), "--out", str(tmp_path / "out")], capsys, "without their config")
    (source / "cfg.json").write_text(json.dumps(TL_FIELDS))
    _one_line_error([str(source), "--out", str(tmp_path / "out")], capsys, "no LayerNorm weights")
    (source / "model_0.pt").unlink()
    torch.save(_hooked_state(0), source / "final.pt")
    assert file_step(source / "run2_model_300.pt") == 300
    with pytest.raises(SourceError, match="cannot read its step"):
        import_series(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
