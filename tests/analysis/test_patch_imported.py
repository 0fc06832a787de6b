"""Exact patching on bridges of imported architectures equals TransformerLens's ``patching``: GPT-NeoX (rotary,
parallel attention and MLP; its runs share positions through Hugging Face's key/value cache), GPT-2 and Llama
(grouped-query attention, RMSNorm; the bridge leaves their cache empty, so they run full forwards)."""

from __future__ import annotations

import os

import pytest
import torch
from transformer_lens import patching as tl_patching

from plateauscope.analysis.patch import patch
from plateauscope.model.backend import boot_causal_lm, load_causal_lm_state, shares_hf_cache
from plateauscope.tasks.probe import build_probe
from tests.sources.families import transformer_lens_patching

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = 64


def _config(name: str):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig

    return {"neox": GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64),
            "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                               eos_token_id=0),
            "llama": LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)}[name]


@pytest.fixture(scope="module", params=["neox", "gpt2", "llama"])
def imported(request, tmp_path_factory):
    """A bridge booted from a random model's folder, its weights loaded as an imported series' are."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(request.param))
    hf.save_pretrained(folder)
    model = load_causal_lm_state(boot_causal_lm(str(folder)), hf.state_dict())
    return request.param, model


def test_only_gpt_neox_shares_positions_through_the_cache(imported):
    name, model = imported
    assert shares_hf_cache(model) == (name == "neox")


@pytest.mark.parametrize("target, reference", [("heads", tl_patching.get_act_patch_attn_head_out_all_pos),
                                               ("resid", tl_patching.get_act_patch_resid_pre),
                                               ("mlp", tl_patching.get_act_patch_mlp_out)])
def test_exact_patching_equals_transformer_lens(imported, target, reference):
    _, model = imported
    pairs = build_probe("induction", VOCAB, 64, segment_len=8).prompt_pairs(8, 0)
    expected = transformer_lens_patching(model, pairs, reference)
    ours = patch(model, pairs, target, max_batch=64)  # several chunks of patches
    assert ours.raw.shape == expected.shape
    torch.testing.assert_close(ours.raw, expected, atol=1e-5, rtol=0)
