"""Built-in measures (plateauscope.model.measures), each against an independent computation: numpy on the
model's own parameters and cached activations, and hand-built cases with a known value."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from plateauscope.model.backend import build_model, hooked_parameters
from plateauscope.model.config import ModelConfig, hooked_config_dict
from plateauscope.model.measures import (
    activation_measures,
    effective_rank,
    embedding_effective_rank,
    pattern_distance,
    repetition_bias,
    representation_collapse,
    weight_norms,
)

CFG = hooked_config_dict(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32), d_vocab=11, n_ctx=9)
LOSS_POSITIONS = [3, 4, 5, 6, 7]


def _model():
    return build_model(CFG, seed=0)  # the installed TransformerLens's backend (hooked on 3.x, the bridge on 4.x)


def _layer_of(name: str) -> int | None:
    """The layer of a parameter in either backend's own names (``blocks.0.`` / ``layers.0.``)."""
    found = re.match(r"(?:blocks|layers)\.(\d+)\.", name)
    return int(found.group(1)) if found else None


def _tokens(n: int = 12) -> torch.Tensor:
    return torch.randint(0, 11, (n, 9), generator=torch.Generator().manual_seed(1))


def test_weight_norms_are_numpys_norms_of_every_parameter():
    model = _model()
    # the backend's own parameters, in its own layout (the measure reads HookedTransformer's)
    params = {k: v.detach().numpy().astype(np.float64) for k, v in model.named_parameters()}
    total, per_layer = weight_norms(model)
    assert total == pytest.approx(np.sqrt(sum((v ** 2).sum() for v in params.values())), rel=1e-9)
    for layer in range(2):
        own = [v for k, v in params.items() if _layer_of(k) == layer]
        assert per_layer[layer] == pytest.approx(np.linalg.norm(np.concatenate([v.ravel() for v in own])), rel=1e-9)
    assert sum(x ** 2 for x in per_layer) < total ** 2  # embeddings and unembedding count in the total only


def test_effective_rank_has_its_known_values_and_is_numpys_entropy():
    # k equal singular values: exactly k; rank one: 1
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(20, 20)))
    for k in (1, 3, 7):
        m = q[:, :k] @ np.eye(k, 10) * 2.5
        assert effective_rank(torch.tensor(m)) == pytest.approx(k, rel=1e-9)
    m = np.random.default_rng(1).normal(size=(11, 16))
    s = np.linalg.svd(m, compute_uv=False)
    p = s / s.sum()
    assert effective_rank(torch.tensor(m)) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    model = _model()
    w_e = hooked_parameters(model)["embed.W_E"].detach().numpy().astype(np.float64)
    s = np.linalg.svd(w_e, compute_uv=False)
    p = s / s.sum()
    assert embedding_effective_rank(model) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-6)


def test_collapse_and_repetition_match_numpy_on_the_cached_activations():
    model, tokens = _model(), _tokens()
    logits, cache = model.run_with_cache(tokens[:, :-1])
    collapse = representation_collapse(model, tokens, LOSS_POSITIONS)
    for layer in range(2):
        h = cache[f"blocks.{layer}.hook_resid_post"][:, LOSS_POSITIONS].double().numpy()
        sims = []
        for row in h:
            pairs = [(i, j) for i in range(len(row)) for j in range(len(row)) if i != j]
            sims.append(np.mean([row[i] @ row[j] / np.linalg.norm(row[i]) / np.linalg.norm(row[j]) for i, j in pairs]))
        assert collapse[layer] == pytest.approx(np.mean(sims), abs=1e-6)
    pred = logits[:, LOSS_POSITIONS].argmax(-1).numpy()
    expected = np.mean([[pred[n, i] == pred[n, i + 1] for i in range(len(LOSS_POSITIONS) - 1)]
                        for n in range(len(pred))])
    assert repetition_bias(model, tokens, LOSS_POSITIONS) == pytest.approx(expected)
    assert repetition_bias(model, tokens, [7]) is None


def _constant_model():
    """Every weight but the unembedding bias zero: every position's residual is the positional
    embedding alone, which we set equal at every position (full collapse), and every prediction is
    the argmax of ``b_U`` (full repetition)."""
    model = _model()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.zero_()
            if name.startswith(("pos_embed.", "pos.")):  # [n_ctx, d_model] in both layouts
                p[:] = torch.linspace(1, 2, 16)
            if name in ("unembed.b_U", "head._original_component.bias"):
                p[4] = 1.0
    return model


def test_a_model_that_says_one_thing_everywhere_is_fully_collapsed_and_repetitive():
    model, tokens = _constant_model(), _tokens()
    for value in representation_collapse(model, tokens, LOSS_POSITIONS):
        assert value == pytest.approx(1.0, abs=1e-9)
    assert repetition_bias(model, tokens, LOSS_POSITIONS) == 1.0


def test_pattern_distance_is_total_variation_and_known_on_uniform_against_one_hot():
    model, tokens = _model(), _tokens()
    patterns = activation_measures(model, tokens, LOSS_POSITIONS).patterns
    assert pattern_distance(patterns, patterns).abs().max() == 0
    # the constant model attends uniformly (all scores 0): causal row q spreads 1/(q+1) over q+1 keys
    uniform = activation_measures(_constant_model(), tokens, LOSS_POSITIONS).patterns
    n_q = uniform.shape[-2]
    assert torch.allclose(uniform[0, 0, 0, 3, :4], torch.full((4,), 0.25, dtype=torch.float64))
    one_hot = torch.zeros_like(uniform)
    one_hot[..., 0] = 1.0  # all attention on the first key
    known = np.mean([1 - 1 / (q + 1) for q in range(n_q)])  # TV of uniform over q+1 keys and a point mass
    assert torch.allclose(pattern_distance(uniform, one_hot), torch.full((2, 2), known, dtype=torch.float64))
    a, b = patterns.numpy(), uniform.numpy()
    assert np.allclose(pattern_distance(patterns, uniform).numpy(), 0.5 * np.abs(a - b).sum(-1).mean(axis=(0, 3)))
