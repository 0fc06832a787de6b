"""ModelConfig + task -> the HookedTransformerConfig kwargs of a run.

Models are built from them in :mod:`training.backend` (the only module that imports a
TransformerLens model class); ``build_hooked_transformer`` is re-exported from there.
"""

from __future__ import annotations

from typing import Any

from training.backend import build_hooked_transformer  # noqa: F401  (re-exported)
from training.config import ModelConfig
from training.layout import Layout


def hooked_config_dict(model: ModelConfig, layout: Layout, d_vocab: int) -> dict[str, Any]:
    """Keyword arguments that ``HookedTransformerConfig(**d)`` accepts (stored in ``config.json``)."""
    return {
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "n_heads": model.n_heads,
        "d_head": model.d_head,
        "d_mlp": model.d_mlp,
        "act_fn": model.act_fn,
        "normalization_type": model.normalization_type,
        "positional_embedding_type": model.positional_embedding_type,
        "n_ctx": layout.seq_len,
        "d_vocab": d_vocab,
        "d_vocab_out": d_vocab,
        "attn_only": False,
        "default_prepend_bos": False,
        "seed": None,
    }
