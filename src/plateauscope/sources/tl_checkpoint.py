"""TransformerLens checkpoints: a folder of state dicts of a GPT-2-style model, with its config beside them.

What TransformerLens writes: 3.x users ``torch.save(model.state_dict(), ...)`` a ``HookedTransformer``
(``blocks.0.attn.W_Q`` ``[n_heads, d_model, d_head]``, ``embed.W_E``, ``unembed.W_U``, ...), and
TransformerLens 4's ``transformer_lens.tools.training.train`` saves ``model_{step}.pt`` files holding its model's
``state_dict()`` (for a ``TransformerBridge.boot_native`` model: ``blocks.0.attn.q.weight`` ``[d_model, d_model]``,
``embed.weight``, ...). Neither writes the config: the folder must hold it as ``cfg.json`` (or ``config.json``),
the ``HookedTransformerConfig`` / ``TransformerBridgeConfig`` fields as JSON (``d_model``, ``n_layers``, ``n_heads``,
``d_head``, ``d_mlp``, ``n_ctx``, ``d_vocab``, ``act_fn``, ...; missing fields take HookedTransformerConfig's
defaults). Each file (``.pt``/``.pth``, read with ``torch.load(weights_only=True)``, or ``.safetensors``) is one
checkpoint, its step the last number in its name (``model_300.pt``).

A GPT-2-style model (LayerNorm with weights, learned absolute positions, an MLP in every block, one key and
value per head, GELU/ReLU/SiLU) maps exactly onto Hugging Face's ``GPT2LMHeadModel`` (untied, with an unembedding
bias: TransformerLens trains ``b_U``); its weights are converted on every read
(:func:`plateauscope.runs.series.transformer_lens_to_gpt2`). Rotary or other positions, RMSNorm, grouped keys and
values, gated or absent MLPs, parallel blocks and a folded model (``fold_ln``: ``LNPre``, no LayerNorm weights) are a
one-line SourceError naming the file and the field.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from plateauscope.model.backend import LM_HEAD_BIAS
from plateauscope.runs.files import RunError
from plateauscope.runs.series import decode_weights
from plateauscope.sources.found import FoundCheckpoint, SourceError, read_source_json

CONFIG_FILES = ("cfg.json", "config.json")
"""Where a folder of TransformerLens checkpoints keeps its config, by preference."""
WEIGHT_SUFFIXES = {".pt": "transformer_lens", ".pth": "transformer_lens", ".safetensors": "transformer_lens.safetensors"}
"""A TransformerLens checkpoint's file suffix -> its weights format (:data:`plateauscope.runs.series.WEIGHT_FORMATS`)."""
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_pytorch_tanh", "relu": "relu",
               "silu": "silu"}
"""TransformerLens's ``act_fn`` -> Hugging Face's ``activation_function`` of the same function."""
_NUMBER = re.compile(r"(\d+)(?!.*\d)")

_MUST_BE: tuple[tuple[str, Any, str], ...] = (
    ("normalization_type", "LN", "GPT-2 has LayerNorm with weights ('LN'); 'LNPre' is a folded model (fold_ln), "
                                 "whose trained LayerNorm weights are not in the file: save the unfolded model"),
    ("positional_embedding_type", "standard", "GPT-2 has learned absolute positions ('standard'), not rotary, "
                                              "shortformer or ALiBi"),
    ("attn_only", False, "GPT-2 has an MLP in every block"),
    ("gated_mlp", False, "GPT-2's MLP has no gate"),
    ("parallel_attn_mlp", False, "GPT-2's blocks run attention, then the MLP"),
    ("final_rms", False, "GPT-2's final norm is a LayerNorm"),
    ("attention_dir", "causal", "the analyses need causal attention"),
    ("use_local_attn", False, "GPT-2's attention is global"),
    ("num_experts", None, "GPT-2 has one MLP per block"),
    ("use_attn_scale", True, "GPT-2 scales attention scores by 1/sqrt(d_head)"),
    ("use_qk_norm", False, "GPT-2 has no query/key norm"),
    ("post_embedding_ln", False, "GPT-2 has no LayerNorm after the embedding"),
    ("use_normalization_before_and_after", False, "GPT-2 has one LayerNorm before each sublayer"),
)
"""Config fields that must keep HookedTransformerConfig's default for the model to be GPT-2, and why."""


def config_file(folder: Path) -> Path | None:
    """The TransformerLens config in ``folder``: ``cfg.json`` or ``config.json`` holding ``d_model`` and
    ``n_layers`` and no Hugging Face ``model_type``; None if there is none."""
    for name in CONFIG_FILES:
        path = folder / name
        if path.is_file():
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(raw, dict) and "d_model" in raw and "n_layers" in raw and "model_type" not in raw:
                return path
    return None


def weight_files(source: Path) -> list[Path]:
    """The checkpoint files of a TransformerLens series: ``source`` itself, or its ``.pt``/``.pth``/``.safetensors``."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def _looks_like_transformer_lens(file: Path) -> bool:
    """Whether ``file`` holds a TransformerLens state dict (HookedTransformer's or a TransformerBridge's keys);
    False for anything else, a file that needs code to unpickle included (its own reader refuses it)."""
    try:
        state = decode_weights(file.read_bytes(), "safetensors" if file.suffix == ".safetensors" else "torch", file)
    except (RunError, OSError):
        return False
    return "embed.W_E" in state or ("embed.weight" in state and any(k.startswith("blocks.") for k in state))


def is_transformer_lens_source(source: Path) -> bool:
    """Whether ``source`` is a TransformerLens series: a folder (or a file in one) with a TransformerLens
    config, or a folder of files whose first is a TransformerLens state dict (its config then missing)."""
    folder = source.parent if source.is_file() else source
    if source.is_file() and source.suffix not in WEIGHT_SUFFIXES:
        return False
    files = weight_files(source)
    if not files:
        return False
    return config_file(folder) is not None or (not (folder / "config.json").is_file()
                                               and _looks_like_transformer_lens(files[0]))


def gpt2_config(cfg: dict[str, Any], file: Path) -> dict[str, Any]:
    """The Hugging Face GPT-2 config of a TransformerLens config (HookedTransformerConfig fields, its defaults
    where absent), or a one-line SourceError naming ``file`` and the field that GPT-2 cannot hold."""
    try:
        d_model, n_layers, n_ctx = int(cfg["d_model"]), int(cfg["n_layers"]), int(cfg["n_ctx"])
        d_head = int(cfg["d_head"])
        d_vocab = int(cfg["d_vocab"])
    except KeyError as e:
        raise SourceError(f"{file}: no {e.args[0]} (the config needs d_model, n_layers, n_ctx, d_head, d_vocab, "
                          "act_fn)") from None
    except (TypeError, ValueError) as e:
        raise SourceError(f"{file}: not a TransformerLens config ({' '.join(str(e).split())})") from None
    n_heads = int(cfg.get("n_heads", -1))
    n_heads = d_model // d_head if n_heads == -1 else n_heads
    for field, default, why in _MUST_BE:
        if cfg.get(field, default) != default:
            raise SourceError(f"{file}: {field}={cfg[field]!r} is not supported ({why}); only GPT-2-style "
                              "TransformerLens models import")
    act = cfg.get("act_fn")
    if act not in ACTIVATIONS:
        raise SourceError(f"{file}: act_fn={act!r} is not supported (one of {', '.join(ACTIVATIONS)})")
    kv = cfg.get("n_key_value_heads")
    if kv is not None and kv != n_heads:
        raise SourceError(f"{file}: n_key_value_heads={kv} is not supported (grouped keys and values; GPT-2 has one "
                          "key and value per head)")
    if d_vocab <= 0 or cfg.get("d_vocab_out", -1) not in (-1, d_vocab):
        raise SourceError(f"{file}: d_vocab={d_vocab}, d_vocab_out={cfg.get('d_vocab_out')}: GPT-2 reads and "
                          "writes one vocabulary (give d_vocab)")
    if n_heads * d_head != d_model:
        raise SourceError(f"{file}: n_heads * d_head = {n_heads * d_head}, d_model = {d_model}: GPT-2 needs them equal")
    scale = cfg.get("attn_scale", -1.0)
    if scale not in (-1, -1.0) and not math.isclose(scale, math.sqrt(d_head), rel_tol=1e-6):
        raise SourceError(f"{file}: attn_scale={scale} is not supported (GPT-2 divides by sqrt(d_head) = "
                          f"{math.sqrt(d_head):g})")
    for cap in ("output_logits_soft_cap", "attn_scores_soft_cap"):
        if (cfg.get(cap) or -1) > 0:
            raise SourceError(f"{file}: {cap}={cfg[cap]} is not supported (GPT-2 does not cap)")
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": d_vocab, "n_positions": n_ctx,
            "n_embd": d_model, "n_layer": n_layers, "n_head": n_heads, "n_inner": int(cfg.get("d_mlp") or 4 * d_model),
            "activation_function": ACTIVATIONS[act], "layer_norm_epsilon": float(cfg.get("eps", 1e-5)),
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
            "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, LM_HEAD_BIAS: True}


def file_step(file: Path) -> int:
    """A checkpoint's step: the last number in its file's name (``model_300.pt`` -> 300). TransformerLens's
    ``tools.training`` numbers its files by the batch within the epoch, not by optimiser steps since the start."""
    match = _NUMBER.search(file.stem)
    if match is None:
        raise SourceError(f"{file}: cannot read its step (no number in the file's name, e.g. model_300.pt)")
    return int(match.group(1))


def read_transformer_lens(source: Path) -> list[FoundCheckpoint]:
    """Every checkpoint of a TransformerLens series, in step order, each with the GPT-2 config of the folder's
    TransformerLens config; a missing config, an unsupported model or two files of one step are a SourceError."""
    folder = source.parent if source.is_file() else source
    cfg_file = config_file(folder)
    if cfg_file is None:
        raise SourceError(f"{folder}: TransformerLens state dicts without their config: write the model's "
                          "HookedTransformerConfig (or TransformerBridgeConfig) fields as JSON to "
                          f"{folder / 'cfg.json'} (d_model, n_layers, n_heads, d_head, d_mlp, n_ctx, d_vocab, act_fn)")
    raw = read_source_json(cfg_file)
    hf_config = gpt2_config(raw, cfg_file)
    by_step: dict[int, FoundCheckpoint] = {}
    for file in weight_files(source):
        step = file_step(file)
        if step in by_step:
            raise SourceError(f"{file}: step {step} again (also {by_step[step].file}); the steps cannot be read")
        by_step[step] = FoundCheckpoint(step, file, WEIGHT_SUFFIXES[file.suffix], hf_config, cfg_file)
    return [by_step[s] for s in sorted(by_step)]
