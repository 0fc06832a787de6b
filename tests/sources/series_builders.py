"""Tiny checkpoint series written the way other trainers write them, built in seconds for the tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SEGMENT = 8
"""Tokens in each copy of a repeated random sequence."""


def repeated_tokens(n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` sequences: token 0, then ``SEGMENT`` random tokens in ``[1, vocab)``, then the same again."""
    half = torch.randint(1, vocab, (n, SEGMENT), generator=gen)
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), half, half], dim=1)


def tiny_neox_config(vocab: int = 24, d_model: int = 32, n_layers: int = 2, n_heads: int = 2):
    """A small GPT-NeoX config (Pythia's architecture)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=n_layers,
                         num_attention_heads=n_heads, intermediate_size=4 * d_model, max_position_embeddings=64,
                         hidden_dropout=0.0, attention_dropout=0.0, use_parallel_residual=True, tie_word_embeddings=False)


def train_hf_series(out: Path, config, steps: int = 300, save_every: int = 25, seed: int = 0, lr: float = 3e-3,
                    trainer_state: bool = True) -> list[int]:
    """Train a Hugging Face causal LM of ``config`` on repeated random tokens, saving Trainer-style folders
    ``out/checkpoint-N/`` (``config.json``, ``model.safetensors``, ``trainer_state.json``) every ``save_every``
    steps and at step 0; returns the saved steps."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    saved = []
    for step in range(steps + 1):
        if step % save_every == 0:
            folder = out / f"checkpoint-{step}"
            model.save_pretrained(folder)
            if trainer_state:
                (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
            saved.append(step)
        if step == steps:
            break
        tokens = repeated_tokens(32, config.vocab_size, gen)
        loss = model(tokens, labels=tokens).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return saved
