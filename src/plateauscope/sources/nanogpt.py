"""nanoGPT checkpoints: ``ckpt.pt`` files (GPT-2 layout), read with ``torch.load(weights_only=True)``.

A series is a folder of ``.pt`` files, or of subfolders each holding a ``ckpt.pt``; each file's step is
its ``iter_num``. The model is Hugging Face's GPT-2 with nanoGPT's choices: exact GELU, LayerNorm
epsilon 1e-5, no dropout, tied embeddings; a model trained with ``bias=False`` gets zero biases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plateauscope.runs.series import decode_weights
from plateauscope.sources.found import FoundCheckpoint, SourceError


def nanogpt_hf_config(model_args: dict[str, Any], file: Path) -> dict[str, Any]:
    """The Hugging Face GPT-2 config of nanoGPT's ``model_args``."""
    try:
        n_layer, n_head, n_embd = model_args["n_layer"], model_args["n_head"], model_args["n_embd"]
        block_size, vocab_size = model_args["block_size"], model_args["vocab_size"]
    except (KeyError, TypeError):
        raise SourceError(f"{file}: not a nanoGPT checkpoint (no model_args with n_layer, n_head, n_embd, "
                          "block_size, vocab_size)") from None
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab_size,
            "n_positions": block_size, "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head,
            "activation_function": "gelu", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None}


def read_nanogpt_file(file: Path) -> FoundCheckpoint:
    """One ``ckpt.pt``: its step (``iter_num``) and model (``model_args``)."""
    import io

    import torch

    decode_weights(file.read_bytes(), "nanogpt", file)  # refuses a file that needs code to unpickle
    raw = torch.load(io.BytesIO(file.read_bytes()), map_location="cpu", weights_only=True)
    step = raw.get("iter_num")
    if not isinstance(step, int):
        raise SourceError(f"{file}: no iter_num (an integer) to read the step from")
    return FoundCheckpoint(step, file, "nanogpt", nanogpt_hf_config(raw.get("model_args"), file), file)


def nanogpt_files(source: Path) -> list[Path]:
    """The ``.pt`` files of a nanoGPT series: ``source`` itself, its ``.pt`` files, or its subfolders' ``ckpt.pt``."""
    if source.is_file():
        return [source]
    return sorted({*source.glob("*.pt"), *source.glob("*/ckpt.pt")})


def read_nanogpt(source: Path) -> list[FoundCheckpoint]:
    """Every checkpoint of a nanoGPT series, in step order; two files with one step are a SourceError."""
    by_step: dict[int, FoundCheckpoint] = {}
    for file in nanogpt_files(source):
        c = read_nanogpt_file(file)
        if c.step in by_step:
            raise SourceError(f"{file}: step {c.step} again (also {by_step[c.step].file}); the steps cannot be read")
        by_step[c.step] = c
    return [by_step[s] for s in sorted(by_step)]
