"""A tiny GPT-NeoX series trained on repeated random tokens (induction heads form), built once per session."""

from __future__ import annotations

import os

import pytest

from tests.sources.series_builders import tiny_neox_config, train_hf_series

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def neox_series(tmp_path_factory):
    """``checkpoint-N/`` folders every 10 steps to 120 (the induction heads form near step 60)."""
    out = tmp_path_factory.mktemp("neox") / "trainer_out"
    steps = train_hf_series(out, tiny_neox_config(), steps=120, save_every=10, lr=5e-3)
    return out, steps
