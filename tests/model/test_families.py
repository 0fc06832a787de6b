"""The family adapter (plateauscope.model.families) on a model built here, and a mixture of experts' checkpoint
merged as Hugging Face's own ``from_pretrained`` merges it. The adapter on every imported family is tested
against Hugging Face in ``tests/sources/test_families.py``."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from plateauscope.model.backend import BackendError, build_model, merged_experts
from plateauscope.model.config import ModelConfig, hooked_config_dict
from plateauscope.model.families import embedding_matrix, family_of, parameters_by_layer

CFG = hooked_config_dict(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32), d_vocab=11, n_ctx=9)


def test_a_model_built_here_is_its_own_family_with_every_parameter_once():
    model = build_model(CFG, seed=0)
    family = family_of(model)
    assert (family.name, family.norm, family.mlp, family.n_heads, family.grouped, family.parallel) == \
        ("plateauscope", "LayerNorm", "plain", 2, False, False)
    listed = parameters_by_layer(model)
    assert sum(p.numel() for _, p, _ in listed) == sum(p.numel() for p in model.parameters())
    assert {layer for _, _, layer in listed} == {None, 0, 1}
    assert embedding_matrix(model).shape == (11, 16)


def test_experts_merge_as_from_pretrained_merges_them(tmp_path):
    """A Mixtral saved with ``save_pretrained`` (one tensor per expert) merged here equals the fused parameters
    Hugging Face's ``from_pretrained`` builds from the same file; shapes merge the same way; a missing part is
    one line."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(vocab_size=24, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=3, num_experts_per_tok=1)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert any(".experts.2." in k for k in saved)  # per expert on disk
    # Mixtral's files name the block block_sparse_moe, its module mlp (a renaming from_pretrained applies too)
    merged = {k.replace("block_sparse_moe", "mlp"): v for k, v in merged_experts(saved).items()}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    for key in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert torch.equal(merged[key], loaded[key]), key
    shapes = merged_experts({k: tuple(v.shape) for k, v in saved.items()})
    assert shapes == {k: tuple(v.shape) for k, v in merged_experts(saved).items()}
    incomplete = {k: v for k, v in saved.items() if not k.endswith("experts.1.w2.weight")}
    with pytest.raises(BackendError, match="incomplete"):
        merged_experts(incomplete)
