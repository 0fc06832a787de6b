"""Tiny Hugging Face configs of every family in the conformance matrix (2 layers, width 32), random init.

Each is a family's own config class with its distinguishing features switched on: grouped keys (Mistral,
Qwen2, Qwen3, Gemma 2, Mixtral), a sliding window (Mistral, Gemma 2), query/key norms (Qwen3, OLMo 2),
logit soft-capping and sandwich norms (Gemma 2), a parallel block with partial rotary (Phi, GPT-J),
learned positions (GPT-2, OPT), ALiBi (Bloom), experts (Mixtral). Dropout is off, so a checkpoint's forward is
deterministic in training mode too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

VOCAB = 24
WIDTH = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
CTX = 64


def _gpt2() -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=CTX,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _gpt_neox() -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         intermediate_size=4 * WIDTH, max_position_embeddings=CTX, hidden_dropout=0.0,
                         attention_dropout=0.0, use_parallel_residual=True, tie_word_embeddings=False)


def _llama_like(cls_name: str, **extra: Any) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        fields = dict(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=CTX,
                      tie_word_embeddings=False)
        return getattr(transformers, cls_name)(**(fields | extra))
    return build


def _phi() -> Any:
    from transformers import PhiConfig

    return PhiConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, max_position_embeddings=CTX, partial_rotary_factor=0.5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)


def _gptj() -> Any:
    from transformers import GPTJConfig

    return GPTJConfig(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=CTX, rotary_dim=4,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)


def _opt() -> Any:
    from transformers import OPTConfig

    return OPTConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, ffn_dim=2 * WIDTH,
                     num_attention_heads=HEADS, max_position_embeddings=CTX, word_embed_proj_dim=WIDTH,
                     dropout=0.0, attention_dropout=0.0, activation_function="relu")


def _bloom() -> Any:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=HEADS,
                       hidden_dropout=0.0, attention_dropout=0.0)


FAMILIES: dict[str, Callable[[], Any]] = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama_like("LlamaConfig"),
    "mistral": _llama_like("MistralConfig", num_key_value_heads=KV_HEADS, sliding_window=16),
    "qwen2": _llama_like("Qwen2Config", num_key_value_heads=KV_HEADS),
    "qwen3": _llama_like("Qwen3Config", num_key_value_heads=KV_HEADS, head_dim=WIDTH // HEADS),
    "gemma2": _llama_like("Gemma2Config", num_key_value_heads=KV_HEADS, head_dim=WIDTH // HEADS,
                          query_pre_attn_scalar=WIDTH // HEADS, sliding_window=16, final_logit_softcapping=30.0,
                          attn_logit_softcapping=50.0, hidden_activation="gelu_pytorch_tanh"),
    "olmo": _llama_like("OlmoConfig"),
    "olmo2": _llama_like("Olmo2Config"),
    "phi": _phi,
    "gptj": _gptj,
    "opt": _opt,
    "bloom": _bloom,
    "mixtral": _llama_like("MixtralConfig", num_key_value_heads=KV_HEADS, num_local_experts=2, num_experts_per_tok=1),
}
"""Family -> a function returning its tiny config (the conformance matrix's rows)."""


def transformer_lens_patching(model: Any, pairs: Any, reference: Callable) -> Any:
    """TransformerLens's own patching (``reference``: a ``transformer_lens.patching.get_act_patch_*``) of the
    corrupted prompts from the clean run's cache, with the prediction position's logit difference as the metric."""
    import torch

    rows = torch.arange(len(pairs.clean))

    def logit_diff(logits):
        last = logits[:, pairs.pred_pos]
        return (last[rows, pairs.clean_answer] - last[rows, pairs.corrupt_answer]).mean()

    with torch.no_grad():
        _, clean_cache = model.run_with_cache(pairs.clean)
        return reference(model, pairs.corrupt, clean_cache, logit_diff).float()
