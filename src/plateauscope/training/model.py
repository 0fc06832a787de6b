"""ModelConfig + task -> the HookedTransformerConfig kwargs of a run.

Models are built from them in :mod:`plateauscope.backend` (the only module that imports a
TransformerLens model class); ``build_hooked_transformer`` is re-exported from there.
"""

from __future__ import annotations

from typing import Any

from plateauscope.backend import build_hooked_transformer  # noqa: F401  (re-exported)
from plateauscope.tasks.base import Task
from plateauscope.training.config import ModelConfig


def hooked_config_dict(model: ModelConfig, task: Task) -> dict[str, Any]:
    """Keyword arguments that ``HookedTransformerConfig(**d)`` accepts (stored in ``config.json``):
    the architecture, and the task's vocabulary and sequence length."""
    d_vocab = len(task.vocab)
    return {
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "n_heads": model.n_heads,
        "d_head": model.d_head,
        "d_mlp": model.d_mlp,
        "act_fn": model.act_fn,
        "normalization_type": model.normalization_type,
        "positional_embedding_type": model.positional_embedding_type,
        "n_ctx": task.seq_len,
        "d_vocab": d_vocab,
        "d_vocab_out": d_vocab,
        "attn_only": model.attn_only,
        "default_prepend_bos": False,
        "seed": None,
    }
