"""Forward passes that skip a shared prefix (``plateauscope.analysis.prefix``) against TransformerLens's own
full forward (``run_with_cache``) of the same model: the activations and the last-position logits agree."""

import pytest
import torch
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.prefix import activations, cached_run, first_difference, forward_from, suffix_run
from plateauscope.model.backend import build_model, shares_prefixes
from plateauscope.runs.run import Run


@pytest.fixture(scope="module")
def setting(tiny_run):
    run = Run(tiny_run)
    model = build_model({**run.hooked_config, "n_layers": 2}, seed=3).eval().double()
    pairs = prompt_pairs(run.task(), 16, seed=0)
    return model, pairs


def test_the_first_difference_is_where_a_pair_first_differs():
    clean = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert first_difference(clean, clean.clone()) == 4
    corrupt = clean.clone()
    corrupt[1, 2] = 9
    assert first_difference(clean, corrupt) == 2


def test_cached_and_suffix_runs_equal_the_full_forward(setting):
    model, pairs = setting
    assert shares_prefixes(model)  # the fast path is the one under test
    names = ["z", "attn_out"]  # activations with positions in their second dimension
    start = first_difference(pairs.clean, pairs.corrupt)
    clean = cached_run(model, pairs.clean, pairs.pred_pos, names)
    corrupt = suffix_run(model, pairs.corrupt, clean, start, pairs.pred_pos, names)
    for tokens, ours in ((pairs.clean, clean), (pairs.corrupt, corrupt)):
        logits, cache = model.run_with_cache(tokens)
        assert torch.allclose(ours.last_logits, logits[:, pairs.pred_pos], atol=1e-10)
        for layer in range(model.cfg.n_layers):
            assert torch.allclose(ours.resid_pre[layer], cache[get_act_name("resid_pre", layer)], atol=1e-10)
            for name in names:
                assert torch.allclose(ours.acts[get_act_name(name, layer)], cache[get_act_name(name, layer)], atol=1e-10)
    got = activations(model, pairs.clean, [get_act_name("z", 1)])
    assert torch.allclose(got[get_act_name("z", 1)], model.run_with_cache(pairs.clean)[1][get_act_name("z", 1)],
                          atol=1e-10)


def test_a_forward_from_a_later_layer_and_position_equals_the_hooked_full_forward(setting):
    """Zeroing head 1 of layer 1 from the first differing position on: from the cached clean run, layer 1 and
    that position on, with the batch repeated twice, against ``run_with_hooks`` over whole sequences."""
    model, pairs = setting
    start = first_difference(pairs.clean, pairs.corrupt)
    base = cached_run(model, pairs.clean, pairs.pred_pos)

    def zero_head(z, hook):
        z = z.clone()
        z[:, -(pairs.clean.shape[1] - start):, 1] = 0  # the positions from start on (the hooks align on the last)
        return z

    hooks = [(get_act_name("z", 1), zero_head)]
    ours = forward_from(model, pairs.clean, base, pairs.pred_pos, hooks, start=start, layer=1, repeat=2)
    full = model.run_with_hooks(pairs.clean, fwd_hooks=hooks)[:, pairs.pred_pos]
    assert ours.shape[0] == 2 * len(pairs.clean)
    assert torch.allclose(ours, full.repeat(2, 1), atol=1e-10)
