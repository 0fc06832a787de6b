"""The naming rule on attention patterns built by hand, with a known truth: a content-based induction head, a
fixed-lag copier, a layer-0 head that follows the induction pattern, and heads that attend uniformly."""

from __future__ import annotations

import torch

from plateauscope.analysis.head_naming import MARGIN, name_heads, named
from plateauscope.tasks.induction_probe import InductionProbe, induction_pattern
from plateauscope.tasks.probe import chance_scores, target_scores

PROBE = InductionProbe.for_model(200, 64, seed=3, bos=0)  # copies of 12 at lags 12..20


def uniform(n: int, seq: int) -> torch.Tensor:
    return (torch.tril(torch.ones(seq, seq)) / torch.arange(1, seq + 1)[:, None]).expand(n, seq, seq)


def lag_head(n: int, seq: int, lag: int, weight: float = 0.9) -> torch.Tensor:
    """Attention ``weight`` on the key ``lag - 1`` back (the induction target of a copy at that lag), the rest
    uniform: a head that copies at one lag, by position."""
    pattern = (1 - weight) * uniform(n, seq).clone()
    for q in range(lag - 1, seq):
        pattern[:, q, q - lag + 1] += weight
    return pattern


def patterns(tokens: torch.Tensor, heads: list[torch.Tensor]) -> torch.Tensor:
    """``[N, 2 layers, 2 heads, seq, seq]`` from four heads' patterns."""
    return torch.stack(heads, 1).reshape(len(tokens), 2, 2, tokens.shape[1], tokens.shape[1])


def test_content_head_fixed_lag_copier_layer0_and_uniform_heads_are_told_apart():
    tokens = PROBE.scored_tokens()
    controls = PROBE.controls(tokens)["induction"]
    n, seq = tokens.shape
    detection = induction_pattern(tokens)

    def content(t):  # 0.8 on the induction target wherever t has one, the rest uniform
        target = induction_pattern(t)
        has = target.sum(-1, keepdim=True) > 0
        return torch.where(has, 0.2 * uniform(n, seq) + 0.8 * target / target.sum(-1, keepdim=True).clamp_min(1),
                           uniform(n, seq))

    def heads(t):  # L0H0 content (impossible in layer 0), L0H1 uniform, L1H0 content, L1H1 copies at lag 14 by position
        return patterns(t, [content(t), uniform(n, seq), content(t), lag_head(n, seq, 14)])

    scores = target_scores(heads(tokens), detection)
    nulls = target_scores(heads(controls), detection)
    calls = {c.head: c for c in name_heads("induction", scores, nulls, chance_scores(detection),
                                           PROBE.lags()["induction"])}
    assert calls["L1H0"].kind == "named" and calls["L1H0"].interval[0] > MARGIN
    assert calls["L0H0"].kind == "layer0_offset" and not calls["L0H0"].named
    assert calls["L0H1"].kind is None
    assert calls["L1H1"].kind == "fixed_lag" and calls["L1H1"].lags == [14] and not calls["L1H1"].named
    assert named(list(calls.values())) == [(1, 0)]
    assert calls["L1H0"].by_lag["12"][0] > 0.8  # the content head copies at every lag


def test_a_head_no_better_than_its_null_is_not_named_however_high_its_score():
    tokens = PROBE.scored_tokens()
    detection = induction_pattern(tokens)
    n, seq = tokens.shape
    scores = torch.full((n, 1, 1), 0.5)
    calls = name_heads("induction", scores, scores - 0.1, chance_scores(detection))
    assert calls[0].kind is None and abs(calls[0].difference - 0.1) < 1e-6
    calls = name_heads("previous_token", scores, torch.full((n, 1, 1), 0.05), chance_scores(detection))
    assert calls[0].named and calls[0].kind == "named" and calls[0].interval == [calls[0].difference] * 2


def test_the_interval_covers_the_true_difference_at_its_stated_rate():
    """Per-sequence differences drawn around a known mean: the 95% percentile bootstrap covers it in about 95%
    of 200 draws at the probe's 128 sequences."""
    gen = torch.Generator().manual_seed(0)
    covered = 0
    for trial in range(200):
        diff = 0.3 + 0.2 * torch.randn(128, 1, 1, generator=gen, dtype=torch.float64)
        call = name_heads("induction", diff + 0.1, torch.full_like(diff, 0.1), torch.full((128,), 0.05),
                          n_boot=400, seed=trial)[0]
        covered += call.interval[0] <= 0.3 <= call.interval[1]
    assert 0.90 <= covered / 200 <= 0.99
