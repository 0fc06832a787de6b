"""Patches that start at their layer on bridges of imported models of every family the conformance matrix builds:
the bridge's own forward from block ``l`` on the residual stream entering it, the blocks below passed through
(``runs_from_layer``, ``run_causal_lm``), equals the full forward, and head patching equals TransformerLens's
``patching``; where the boot-time self-check fails, the full forwards are taken and the results are the same."""

from __future__ import annotations

import os
from copy import deepcopy
from unittest import mock

import pytest
import torch
from transformer_lens import patching as tl_patching
from transformer_lens.model_bridge.generalized_components.block import BlockBridge

from plateauscope.analysis.ablate import ablation_metrics, build_evalset
from plateauscope.analysis.patch import patch
from plateauscope.model.backend import (
    boot_causal_lm,
    hooks_added,
    logits_at,
    load_causal_lm_state,
    run_causal_lm,
    runs_from_layer,
    shares_hf_cache,
)
from plateauscope.tasks.probe import build_probe, logits_and_patterns
from tests.sources.families import FAMILIES, KV_HEADS, VOCAB, transformer_lens_patching

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _llama_gqa():
    config = FAMILIES["llama"]()
    config.num_key_value_heads = KV_HEADS  # grouped-query attention: two query heads per key/value head
    return config


CONFIGS = {**{name: FAMILIES[name] for name in ("gpt_neox", "gpt2", "mistral", "qwen2", "qwen3", "gemma2", "olmo",
                                                 "olmo2", "phi", "gptj", "opt", "bloom", "mixtral")},
           "llama_gqa": _llama_gqa}


def _boot(name: str, folder) -> torch.nn.Module:
    """A bridge booted from a random model's folder, its weights loaded as an imported series' are."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(CONFIGS[name]())
    hf.save_pretrained(folder)
    return load_causal_lm_state(boot_causal_lm(str(folder)), hf.state_dict())


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def imported(request, tmp_path_factory):
    return request.param, _boot(request.param, tmp_path_factory.mktemp(request.param))


def _pairs():
    return build_probe("induction", VOCAB, 64, segment_len=8).prompt_pairs(8, 0)


def _block_runs(model):
    """Count the real forwards of each block (its Hugging Face module), passed-through ones excluded."""
    counts = [0] * model.cfg.n_layers

    def counter(layer):
        def count(module, args, out):
            counts[layer] += 1
        return count

    handles = [block.original_component.register_forward_hook(counter(i)) for i, block in enumerate(model.blocks)]
    return counts, handles


def test_a_run_from_each_layer_equals_the_full_forward(imported):
    _, model = imported
    assert runs_from_layer(model)
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, 10))
    pred, start = 8, 4
    with torch.no_grad():
        full, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_pre"))
        past = run_causal_lm(model, tokens[:, :start], start - 1)[1] if shares_hf_cache(model) else None
        for layer in range(model.cfg.n_layers):
            resid = cache[f"blocks.{layer}.hook_resid_pre"]
            ours = run_causal_lm(model, tokens, pred, layer=layer, resid=resid)[0]
            torch.testing.assert_close(ours, full[:, pred], atol=1e-5, rtol=0)
            if past is not None:  # the positions from ``start`` after a Hugging Face cache of the earlier ones
                later = run_causal_lm(model, tokens[:, start:], pred - start, past=deepcopy(past), layer=layer,
                                      resid=resid[:, start:])[0]
                torch.testing.assert_close(later, full[:, pred], atol=1e-5, rtol=0)
        torch.testing.assert_close(model(tokens), full, atol=1e-6, rtol=0)  # the blocks are whole again


def test_head_patching_starts_at_the_layer_and_equals_transformer_lens(imported):
    _, model = imported
    pairs = _pairs()
    expected = transformer_lens_patching(model, pairs, tl_patching.get_act_patch_attn_head_out_all_pos)
    counts, handles = _block_runs(model)
    try:
        ours = patch(model, pairs, "heads", max_batch=64)  # several chunks of patches
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(ours.raw, expected, atol=1e-5, rtol=0)
    assert counts[0] < counts[-1]  # the patches of the last layer's heads did not run block 0


def _read_only_input(self, args, kwargs):
    """A block whose ``hook_resid_pre`` sees its input but cannot change what the block reads."""
    self.hook_in(args[0] if args else kwargs["hidden_states"])
    return args, kwargs


@pytest.mark.parametrize("name, broken", [
    ("gpt_neox", "a block refuses to be skipped"),  # an exception in the check
    ("gpt2", "the block input cannot be replaced"),  # a wrong answer in the check
])
def test_where_the_self_check_fails_patching_runs_every_block_and_stays_exact(tmp_path, name, broken):
    if broken == "a block refuses to be skipped":
        breaks = mock.patch("plateauscope.model.backend.blocks_from", side_effect=NotImplementedError)
    else:
        breaks = mock.patch.object(BlockBridge, "_hook_input_hidden_states", _read_only_input)
    with breaks:
        model = _boot(name, tmp_path)
    assert not runs_from_layer(model)
    assert shares_hf_cache(model) == (name == "gpt_neox")  # the position sharing is checked on its own
    pairs = _pairs()
    expected = transformer_lens_patching(model, pairs, tl_patching.get_act_patch_attn_head_out_all_pos)
    counts, handles = _block_runs(model)
    try:
        ours = patch(model, pairs, "heads", max_batch=64)
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(ours.raw, expected, atol=1e-5, rtol=0)
    assert counts[0] == counts[-1]  # every forward ran every block


def test_head_ablations_start_at_their_layer_and_equal_hooks_on_full_forwards(imported):
    """Zero ablation of each head (``ablation_metrics``, which starts each ablated run at the head's layer on the
    unablated run's residual stream) against the task's evaluation with a hook that zeroes that head's ``hook_z``
    on the bridge's full forward."""
    _, model = imported
    task = build_probe("induction", VOCAB, 64, segment_len=8)
    evalset = build_evalset(task, 2)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    masks = torch.cat([torch.zeros(1, L * H, dtype=torch.bool), torch.eye(L * H, dtype=torch.bool)]).view(-1, L, H)
    counts, handles = _block_runs(model)
    try:
        ours = ablation_metrics(model, task, evalset, masks, "zero")
    finally:
        for handle in handles:
            handle.remove()
    key = task.progress.key
    for index, mask in enumerate(masks):
        hooks = [(f"blocks.{layer}.attn.hook_z",
                  lambda z, hook, heads=mask[layer]: torch.where(heads[None, None, :, None], 0.0, z))
                 for layer in range(L) if mask[layer].any()]
        with hooks_added(model, hooks):
            expected = task.evaluate(model, evalset)
        assert abs(ours[index]["candidate_loss"] - expected[key]) <= 1e-5
    assert counts[0] < counts[-1]  # the last layer's ablations did not run block 0


def test_logits_at_positions_equal_those_of_the_full_forward(imported):
    _, model = imported
    torch.manual_seed(2)
    tokens, positions = torch.randint(0, VOCAB, (3, 10)), torch.tensor([2, 5, 6, 9])
    with torch.no_grad():
        torch.testing.assert_close(logits_at(model, tokens, positions), model(tokens)[:, positions], atol=1e-5, rtol=0)


def test_patterns_of_rows_without_logits_equal_those_of_one_full_forward(imported):
    """``logits_and_patterns`` with logits for the first rows only (a second forward of the rest, one position
    unembedded) against ``run_with_cache`` of every row."""
    _, model = imported
    torch.manual_seed(3)
    tokens = torch.randint(0, VOCAB, (6, 10))
    with torch.no_grad():
        full, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    expected = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)], 1)
    for rows in (0, 2):
        logits, patterns = logits_and_patterns(model, tokens, rows)
        torch.testing.assert_close(patterns, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(logits, full[:rows], atol=1e-5, rtol=0)
