import numpy as np
import pytest
import torch

from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_layout import BOS, SEP, Layout
from plateauscope.training.config import ConfigError, TaskConfig


def test_strings_are_unique_and_shaped():
    cfg = TaskConfig(n_b=200, K=12, seed=3)
    task = SelectorTask.generate(cfg)
    assert task.tokens.shape == (cfg.D, task.layout.seq_len)
    assert len({tuple(r) for r in task.b_tokens.tolist()}) == cfg.n_b
    assert len({tuple(r) for r in task.z_tokens.tolist()}) == cfg.K
    flat_a = task.a_tokens.reshape(-1, cfg.a_len).tolist()
    assert len({tuple(r) for r in flat_a}) == cfg.D  # A -> B is a function
    first = task.a_tokens[:, :, 0]
    assert all(len(set(row)) == cfg.K for row in first.tolist())  # distinct first characters


def test_deterministic_in_seed():
    a, b, c = (SelectorTask.generate(TaskConfig(n_b=50, K=5, seed=s)) for s in (1, 1, 2))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)


def test_backward_layout_positions():
    task = SelectorTask.generate(TaskConfig(n_b=20, K=4))
    lay = task.layout
    sep, bos = task.vocab.index(SEP), task.vocab.index(BOS)
    assert (task.tokens[:, 0] == bos).all()
    assert (task.tokens[:, lay.sep_positions] == sep).all()
    assert lay.first_target_pred_pos == lay.sep_positions[-1] == lay.a_span[0] - 1
    assert lay.target_pred_positions == list(range(lay.a_span[0] - 1, lay.a_span[1] - 1))
    assert lay.input_len == lay.seq_len - 1 == lay.a_span[1] - 1
    # example g*K + j is (B_g, z_j) -> A_gj
    g, j = 7, 2
    row = task.tokens[g * 4 + j]
    assert torch.equal(row[slice(*lay.b_span)], task.b_tokens[g])
    assert torch.equal(row[slice(*lay.z_span)], task.z_tokens[j])
    assert torch.equal(row[slice(*lay.a_span)], task.a_tokens[g, j])


def test_forward_layout_has_no_selector():
    task = SelectorTask.generate(TaskConfig(n_b=20, K=4, direction="forward"))
    lay = task.layout
    assert lay.z_span is None and lay.target_span == lay.b_span
    assert lay.a_span[1] < lay.b_span[0]
    assert torch.equal(task.tokens[5, slice(*lay.b_span)], task.b_tokens[1])


def test_records_round_trip():
    task = SelectorTask.generate(TaskConfig(n_b=30, K=3, seed=5))
    back = SelectorTask.from_records(task.cfg, task.records())
    assert torch.equal(back.tokens, task.tokens)
    r = task.records()[4]
    assert r["group"] == 1 and r["selector"] == 1 and len(r["b"]) == 6 and len(r["a"]) == 4


def test_candidate_sequences_diagonal_is_the_data():
    task = SelectorTask.generate(TaskConfig(n_b=10, K=3))
    groups = torch.tensor([2, 5])
    seqs = task.candidate_sequences(groups)
    assert seqs.shape == (2, 3, 3, task.layout.seq_len)
    diag = seqs[:, torch.arange(3), torch.arange(3)]
    assert torch.equal(diag, task.tokens[task.example_ids(groups)])
    a0, a1 = task.layout.a_span
    assert torch.equal(seqs[1, 0, 2, a0:a1], task.a_tokens[5, 2])  # prefix of j=0, target of k=2


@pytest.mark.parametrize("kwargs, message", [
    ({"K": 1297}, "K=1297 is larger than the 1296 distinct selectors"),
    ({"n_b": 40, "b_len": 1}, "n_b=40 is larger than the 36 distinct base strings"),
    ({"K": 37, "z_len": 3}, "cannot start with distinct characters"),
    ({"n_b": 700, "K": 1, "a_len": 2}, "unique targets need more than half"),
    ({"direction": "sideways"}, "direction must be one of"),
    ({"K": 0}, "K must be at least 1"),
])
def test_impossible_requests_fail_with_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        SelectorTask.generate(TaskConfig(**kwargs))
    assert "\n" not in str(info.value)


def test_digits_cover_the_alphabet():
    task = SelectorTask.generate(TaskConfig(n_b=500, K=10))
    used = np.unique(task.a_tokens.numpy())
    assert len(used) == 36 and used.min() == 2  # ids 0, 1 are <BOS>, <SEP>
    assert Layout.for_task(task.cfg).seq_len == 15
