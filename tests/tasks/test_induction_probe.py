"""The induction probe: its patterns are TransformerLens head_detector's, its tokens fit the model, its loss gap
reads a hand-built copier."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.head_detector import (
    get_induction_head_detection_pattern,
    get_previous_token_head_detection_pattern,
)

from plateauscope.tasks.induction_probe import InductionProbe, induction_pattern, previous_token_pattern
from plateauscope.tasks.probe import ProbeError, build_probe, detection_scores, probe_class


def test_the_detection_patterns_are_head_detectors():
    probe = build_probe("induction", 40, 64)
    for row in probe.tokens[:5]:
        assert torch.equal(induction_pattern(row[None])[0], get_induction_head_detection_pattern(row[None]))
        assert torch.equal(previous_token_pattern(row[None])[0], get_previous_token_head_detection_pattern(row[None]))


def test_detection_scores_is_head_detectors_mul_measure():
    gen = torch.Generator().manual_seed(0)
    patterns = torch.rand(3, 2, 2, 6, 6, generator=gen).tril()
    patterns /= patterns.sum(-1, keepdim=True)
    detection = torch.randint(0, 2, (3, 6, 6), generator=gen).float().tril()
    expected = torch.stack([(patterns[i] * detection[i]).sum((-1, -2)) / patterns[i].sum((-1, -2)) for i in range(3)])
    assert torch.allclose(detection_scores(patterns, detection), expected.mean(0))


def test_the_probe_fits_the_model_or_says_so_in_one_line():
    probe = build_probe("induction", 30, 64)
    assert int(probe.tokens.max()) < 30 and probe.tokens.shape[1] == 1 + probe.cfg.max_gap + 2 * probe.cfg.segment_len
    lags = probe.lags()["induction"]
    assert len(set(lags.tolist())) == probe.cfg.max_gap + 1 > 1  # copies at several lags and positions
    with pytest.raises(ProbeError, match="outside the model's vocabulary of 20 tokens"):
        probe.check_vocab(20)
    with pytest.raises(ProbeError, match="does not fit"):
        InductionProbe.for_model(6, 64)
    with pytest.raises(ProbeError, match="not a built-in probe"):
        probe_class("nonsense")


class _Copier(torch.nn.Module):
    """Predicts, at each position, the token after the earlier occurrence of the current token (uniform where
    there is none): a perfect induction circuit, as logits."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        n, seq = tokens.shape
        logits = torch.zeros(n, seq, self.vocab)
        for p in range(seq):
            earlier = (tokens[:, :p] == tokens[:, p, None]).nonzero()
            for i, j in earlier.tolist():
                logits[i, p, tokens[i, j + 1]] = 50.0
        return logits


def test_the_loss_gap_of_a_perfect_copier_is_the_first_copys_loss():
    probe = build_probe("induction", 30, 64)
    tokens = probe.scored_tokens()
    gaps = probe.copy_gaps(_Copier(30)(tokens), tokens)  # first copy: uniform over 30 tokens; second: exact
    assert gaps == pytest.approx(torch.full_like(gaps, torch.log(torch.tensor(30.0)).item()), rel=1e-5)
    names = [m.name for m in probe.measures()]
    assert names == ["previous_token_score", "induction_score", "in_context_loss_gap"]
