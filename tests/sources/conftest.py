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


@pytest.fixture(scope="session")
def llama_induction_series(tmp_path_factory):
    """``step-N/`` folders every 20 steps to 800 of a 2-layer, 2-head Llama with its tokenizer (BOS 1), trained on
    copies at several lags and positions: both layer-1 heads become induction heads near step 500."""
    from tests.sources.series_builders import train_llama_induction_series

    out = tmp_path_factory.mktemp("llama_induction") / "series"
    return out, train_llama_induction_series(out)
