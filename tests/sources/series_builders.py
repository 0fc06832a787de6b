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


def copies_at_several_lags(n: int, vocab: int, gen: torch.Generator, segment: int = 12, gap: int = 8,
                           bos: int = 1, first: int = 3) -> torch.Tensor:
    """``n`` sequences: ``bos``, ``k`` random tokens (``k`` uniform in ``[0, gap]``), ``segment`` random tokens,
    ``gap - k`` random tokens, the segment again. Random tokens lie in ``[first, vocab)``. The copy sits at
    ``gap + 1`` lags and positions, so only copying by content predicts it."""
    tokens = torch.randint(first, vocab, (n, 1 + gap + 2 * segment), generator=gen)
    tokens[:, 0] = bos
    starts = 1 + torch.randint(0, gap + 1, (n,), generator=gen)
    source = starts[:, None] + torch.arange(segment)
    tokens[:, 1 + gap + segment:] = tokens.gather(1, source)
    return tokens


def copies_at_one_lag(n: int, vocab: int, gen: torch.Generator, segment: int = 12, gap: int = 8, bos: int = 1,
                      first: int = 3) -> torch.Tensor:
    """As :func:`copies_at_several_lags`, but the second copy follows the first at once: ``k`` random tokens, the
    segment, the segment again, ``gap - k`` random tokens. The copy moves, its lag (``segment``) does not, so
    copying from a fixed distance back predicts it as well as copying by content."""
    tokens = torch.randint(first, vocab, (n, 1 + gap + 2 * segment), generator=gen)
    tokens[:, 0] = bos
    starts = 1 + torch.randint(0, gap + 1, (n,), generator=gen)
    source = starts[:, None] + torch.arange(segment)
    tokens.scatter_(1, source + segment, tokens.gather(1, source))
    return tokens


def save_word_tokenizer(folder: Path, vocab: int, bos: int = 1, eos: int = 2, pad: int = 0) -> None:
    """A word-level tokenizer (``w3`` .. ``w{vocab-1}``) with ``<pad>``, ``<s>`` and ``</s>`` at ``pad``, ``bos`` and
    ``eos``, saved as the Trainer saves one beside a checkpoint."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    special = {pad: "<pad>", bos: "<s>", eos: "</s>"}
    words = {special.get(i, f"w{i}"): i for i in range(vocab)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<pad>")),
                                        bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>")
    tokenizer.save_pretrained(folder)


def train_llama_induction_series(out: Path, steps: int = 800, save_every: int = 20, seed: int = 0, lr: float = 5e-3,
                                 vocab: int = 64, one_lag: bool = False) -> list[int]:
    """A 2-layer, 2-head Llama (BOS 1, EOS 2, PAD 0: its tokenizer saved beside each checkpoint) trained by a
    plain loop on :func:`copies_at_several_lags` (``one_lag``: :func:`copies_at_one_lag`), saved as ``out/step-N/``
    every ``save_every`` steps. On copies at several lags both layer-1 heads become induction heads (near step 500
    with these settings); at one lag the model copies from that distance back. Returns the saved steps."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    saved = []
    for step in range(steps + 1):
        if step % save_every == 0:
            model.save_pretrained(out / f"step-{step}")
            save_word_tokenizer(out / f"step-{step}", vocab)
            saved.append(step)
        if step == steps:
            break
        tokens = (copies_at_one_lag if one_lag else copies_at_several_lags)(32, vocab, gen)
        loss = model(tokens, labels=tokens).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return saved


SMALL_ANALYSIS = ["--probe-length", "6", "--n-examples", "16", "--ablation-groups", "2", "--n-exact", "2",
                  "--circuit-pairs", "8", "--n-exact-edges", "8", "--no-progress", "--workers", "1", "--threads", "1"]
"""``plateauscope analyze`` options of a whole analysis of a tiny series in seconds, on one thread (so that
processes that share it make the same bytes)."""


def analysis_files(run: Path) -> dict[str, bytes]:
    """Every file of a run's analysis folder, by name, but its lock file."""
    return {p.name: p.read_bytes() for p in sorted((run / "analysis").iterdir()) if p.is_file() and p.name != ".lock"}
