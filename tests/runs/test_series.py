"""Imported runs (runs/series.py): the same weights as Hugging Face and nanoGPT files give the same analysis;
a file changed after the import is named."""

from __future__ import annotations

import os

import pytest
import torch

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.cli import import_ as import_verb
from plateauscope.runs.files import RunError
from plateauscope.runs.series import ImportedSeries, nanogpt_to_hf
from plateauscope.sources.importer import import_series
from plateauscope.sources.nanogpt import read_nanogpt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_LINEAR = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def _gpt2(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=40, n_positions=48, n_embd=32, n_layer=2, n_head=4, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    return GPT2LMHeadModel(config).eval()


def _as_nanogpt(model) -> dict:
    """A nanoGPT ``ckpt.pt`` of a Hugging Face GPT-2: nn.Linear weights ([out, in]), its model_args."""
    state = {k: (v.t().contiguous() if k.endswith(_LINEAR) else v) for k, v in model.state_dict().items()
             if not k.endswith(".attn.bias")}
    c = model.config
    return {"model": state, "iter_num": None, "model_args": {"n_layer": c.n_layer, "n_head": c.n_head, "n_embd": c.n_embd,
                                                               "block_size": c.n_positions, "vocab_size": c.vocab_size,
                                                               "bias": True, "dropout": 0.0}}


@pytest.fixture(scope="module")
def same_weights_two_ways(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    for step, seed in ((0, 1), (100, 2)):
        model = _gpt2(seed)
        model.save_pretrained(root / "hf" / f"checkpoint-{step}")
        ckpt = _as_nanogpt(model)
        ckpt["iter_num"] = step
        (root / "nano").mkdir(exist_ok=True)
        torch.save(ckpt, root / "nano" / f"ckpt_{step}.pt")
    return root


def test_nanogpt_layout_is_hugging_faces(same_weights_two_ways):
    model = _gpt2(1)
    converted = nanogpt_to_hf(_as_nanogpt(model)["model"])
    expected = {k: v for k, v in model.state_dict().items() if not k.endswith(".attn.bias")}
    assert converted.keys() == expected.keys() and all(torch.equal(converted[k], expected[k]) for k in expected)
    found = read_nanogpt(same_weights_two_ways / "nano")
    assert [c.step for c in found] == [0, 100] and found[0].architecture == "GPT2LMHeadModel"


def test_the_same_weights_as_hf_and_nanogpt_files_give_the_same_analysis(same_weights_two_ways, tmp_path):
    runs = {fmt: import_series(same_weights_two_ways / fmt, tmp_path / fmt).path for fmt in ("hf", "nano")}
    results = {fmt: analyze_imported(run, progress=False, segment_len=6) for fmt, run in runs.items()}
    for a, b in zip(results["hf"].steps, results["nano"].steps):
        assert a.step == b.step
        for name in a.head_scores:
            assert torch.allclose(torch.tensor(a.head_scores[name]), torch.tensor(b.head_scores[name]), atol=1e-5)
        assert a.loss_gap == pytest.approx(b.loss_gap, abs=1e-5)
        assert torch.allclose(torch.tensor(a.head_patching), torch.tensor(b.head_patching), atol=1e-5, equal_nan=True)
    tokens = torch.randint(0, 40, (2, 12))
    hf = _gpt2(2)
    with torch.no_grad():
        assert torch.allclose(ImportedSeries(runs["nano"]).model(100)(tokens), hf(tokens).logits, atol=1e-5)


def test_a_file_changed_after_the_import_is_named(same_weights_two_ways, tmp_path):
    import shutil

    source = tmp_path / "src"
    shutil.copytree(same_weights_two_ways / "hf", source)
    series = ImportedSeries(import_series(source, tmp_path / "run").path)
    file = source / "checkpoint-100" / "model.safetensors"
    _gpt2(3).save_pretrained(file.parent)
    with pytest.raises(RunError, match="changed since it was imported"):
        series.model(100)
    assert "format_probe_series" in dir(import_verb)
