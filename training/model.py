"""ModelConfig + task -> a plain TransformerLens HookedTransformer."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

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


def build_hooked_transformer(cfg_dict: dict[str, Any], seed: int | None = None,
                             device: str | torch.device = "cpu") -> HookedTransformer:
    """A HookedTransformer from a config dict; weights initialised from ``seed`` when given.

    TransformerLens 3.x warns that HookedTransformer is deprecated each time one is built;
    that one warning is silenced here, where all our models are built.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        cfg = HookedTransformerConfig(**cfg_dict, device=str(device))
        if seed is None:
            return HookedTransformer(cfg)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return HookedTransformer(cfg)
