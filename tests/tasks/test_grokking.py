"""The grokking task: its data and split, and Nanda et al.'s measures against computations that do not go
through the task's Fourier basis (hand-built embeddings and logits with known frequencies)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from plateauscope.errors import ConfigError
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.grokking import (
    GrokkingConfig,
    GrokkingTask,
    fourier_share,
    pair_loss,
    restricted_logits,
    sum_frequency_components,
    top_frequencies,
)
from plateauscope.tasks.loading import build_task
from plateauscope.training.train import train

P = 13


def _wave(k: int, shift: float = 0.0, p: int = P) -> np.ndarray:
    return np.cos(2 * np.pi * k * np.arange(p) / p + shift)


def test_the_data_set_is_every_pair_and_the_split_is_a_seeded_partition():
    task = build_task("grokking", GrokkingConfig(p=P, train_fraction=0.4, seed=3))
    a, b, eq, c = task.tokens.T
    assert len(task.tokens) == P * P and torch.equal(c, (a + b) % P) and (eq == P).all()
    assert len({(int(x), int(y)) for x, y in zip(a, b)}) == P * P
    train_rows, held = task.train_indices(), task.heldout_indices()
    assert len(train_rows) == round(0.4 * P * P) and len(held) == P * P - len(train_rows)
    assert sorted(train_rows.tolist() + held.tolist()) == list(range(P * P))
    again = build_task("grokking", GrokkingConfig(p=P, train_fraction=0.4, seed=3))
    other = build_task("grokking", GrokkingConfig(p=P, train_fraction=0.4, seed=4))
    assert torch.equal(again.train_indices(), train_rows) and not torch.equal(other.train_indices(), train_rows)


@pytest.mark.parametrize("field, value", [("p", 12), ("p", 3), ("train_fraction", 1.0), ("n_key", 7),
                                          ("key_frequencies", (0,))])
def test_impossible_configs_are_one_line(field, value):
    with pytest.raises(ConfigError, match=field):
        GrokkingConfig(**{"p": P, field: value}).validate()


def test_fourier_share_of_an_embedding_made_of_known_frequencies():
    # Columns: frequency 3 (amplitude 2, two phases), frequency 5 (amplitude 1), a constant column (value 0.5).
    columns = [2 * _wave(3), 2 * _wave(3, 1.0), _wave(5, 0.3), np.full(P, 0.5)]
    embedding = torch.tensor(np.stack(columns, axis=1), dtype=torch.float32)
    # a column c cos(w x + phi) has squared norm c^2 p / 2; a constant v has v^2 p
    energy = {3: 2 * (4 * P / 2), 5: P / 2}
    total = sum(energy.values()) + 0.25 * P
    assert top_frequencies(embedding, 2) == [3, 5]
    assert fourier_share(embedding, 1) == pytest.approx(energy[3] / total, rel=1e-5)
    assert fourier_share(embedding, 2) == pytest.approx((energy[3] + energy[5]) / total, rel=1e-5)


def _cross_entropy_by_hand(logits: np.ndarray, rows: np.ndarray | None = None) -> float:
    flat = logits.reshape(P * P, -1)
    answers = (np.arange(P)[:, None] + np.arange(P)[None, :]).reshape(-1) % P
    if rows is not None:
        flat, answers = flat[rows], answers[rows]
    log_z = np.log(np.exp(flat - flat.max(1, keepdims=True)).sum(1)) + flat.max(1)
    return float(np.mean(log_z - flat[np.arange(len(flat)), answers]))


def test_restricted_loss_keeping_every_frequency_is_the_loss_of_logits_of_a_plus_b():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(P, P))  # logit of answer c as any function of (a + b) mod p
    s = (np.arange(P)[:, None] + np.arange(P)[None, :]) % P
    logits = torch.tensor(table[s], dtype=torch.float64)
    every = list(range(1, (P - 1) // 2 + 1))
    assert torch.allclose(restricted_logits(logits, every), logits, atol=1e-10)
    assert pair_loss(restricted_logits(logits, every)) == pytest.approx(_cross_entropy_by_hand(table[s]), rel=1e-9)
    assert pair_loss(logits) == pytest.approx(_cross_entropy_by_hand(table[s]), rel=1e-9)


def test_excluding_the_one_frequency_of_a_clean_circuit_leaves_the_uniform_loss():
    # the logits of Nanda et al.'s algorithm at one frequency: cos(w_k (a + b - c))
    a, b, c = np.meshgrid(np.arange(P), np.arange(P), np.arange(P), indexing="ij")
    logits = torch.tensor(60 * np.cos(2 * np.pi * 4 * (a + b - c) / P))
    assert pair_loss(logits) < 0.01  # the circuit alone gets every pair right
    assert pair_loss(logits - sum_frequency_components(logits, [4])) == pytest.approx(math.log(P), abs=1e-9)
    assert pair_loss(restricted_logits(logits, [4])) == pytest.approx(pair_loss(logits), rel=1e-9)
    rows = np.arange(0, P * P, 3)
    kept = logits - sum_frequency_components(logits, [2])  # another frequency: nothing to remove
    assert pair_loss(kept, torch.tensor(rows)) == pytest.approx(_cross_entropy_by_hand(logits.numpy(), rows), rel=1e-9)


def test_a_tiny_grokking_run_logs_the_held_out_split_and_its_measures(tmp_path, one_thread):
    cfg = get_preset("grokking").replace(p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, max_steps=3)
    summary = train(cfg, tmp_path / "g", device="cpu", progress=False)
    assert summary["log_p"] == pytest.approx(math.log(11)) and summary["train_pairs"] == round(0.4 * 121)
    run = Run(tmp_path / "g")
    task, model = run.task(), run.model(3)
    record = run.metrics()[-1]
    assert {"loss", "accuracy", "heldout_loss", "heldout_accuracy"} <= set(record)
    held = task.tokens[task.heldout_indices()]
    with torch.no_grad():
        logits = model(held[:, :3])[:, 2]
    assert record["heldout_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, held[:, 3])),
                                                   rel=1e-5)
    values = {m.name: m.compute(model, task, None) for m in task.measures()}
    weights = load_file(run.checkpoint_path(3))  # HookedTransformer's layout: parameters and two buffers
    by_hand = sum(float(w.double().pow(2).sum()) for k, w in weights.items() if not k.endswith(("IGNORE", "mask")))
    assert values["sum_sq_weights"] == pytest.approx(by_hand, rel=1e-9)
    embedding = weights["embed.W_E"][:11]
    assert values["fourier_share"] == pytest.approx(fourier_share(embedding, 5), rel=1e-6)
    assert 0 < values["restricted_loss"] and 0 < values["excluded_loss"]


def test_fixed_key_frequencies_are_used_as_given():
    task = GrokkingTask.generate(GrokkingConfig(p=P, key_frequencies=(2, 6)))
    assert task.key_frequencies(torch.nn.Linear(1, 1)) == [2, 6]


def test_the_pairs_sequences_are_their_rows_of_the_data_set_or_else_their_own_prompts():
    """``Task.pair_sequences``: the grokking task's pairs index ``tokens`` (both splits), so their rows come back
    whole; pairs whose ``examples`` index a held-out split kept beside ``tokens`` (a 0.2 task file) give their
    clean prompts, never another example's row."""
    import dataclasses

    task = GrokkingTask.generate(GrokkingConfig(p=11))
    pairs = task.prompt_pairs(40, seed=1)
    assert torch.equal(task.pair_sequences(pairs), task.tokens[pairs.examples])
    heldout = task.heldout_indices()
    five = {f.name: getattr(pairs, f.name)[:5] for f in dataclasses.fields(pairs) if f.name != "pred_pos"}
    beside = dataclasses.replace(pairs, **{**five, "clean": task.tokens[heldout[:5], :3],
                                           "examples": torch.arange(5)})  # 0.2: indices into the held-out split
    assert torch.equal(task.pair_sequences(beside), task.tokens[heldout[:5], :3])
    beyond = dataclasses.replace(beside, examples=torch.arange(5) + len(task.tokens))  # out of range
    assert torch.equal(task.pair_sequences(beyond), beside.clean)
