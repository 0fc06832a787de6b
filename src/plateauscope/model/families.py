"""One adapter per architecture family: what the analyses ask of a model, whatever its layout.

A model is either one the toolkit builds (a HookedTransformer, or a ``boot_native`` bridge: its parameters in
HookedTransformer's layout, :func:`plateauscope.model.backend.hooked_parameters`) or a bridge of another trainer's
Hugging Face model (:func:`plateauscope.model.backend.boot_causal_lm`: Llama, Mistral, Qwen, Gemma, OLMo, Phi,
GPT-J, OPT, Bloom, ...). :class:`Family` describes either as data, read from the model itself (its config and its
own modules), never from a table of parameter names:

* :func:`parameters_by_layer`: every trainable parameter once (tied ones once), each with its layer or None, from
  the modules of each block (``model.blocks[L]``), so the built-in measures read the model's own parameters;
* :func:`embedding_matrix`: the token embedding ``[d_vocab, d_model]``;
* :func:`head_input` and :func:`mlp_input`: a receiver's input computed from copies of the residual stream through
  the model's own norm and projection modules (the edges' per-head inputs on a bridge that cannot split them):
  under RMSNorm, LayerNorm or none (OLMo 2's post-norm blocks), and with grouped keys, one key and value input
  per key/value head (as TransformerLens's ``use_split_qkv_input`` does for grouped-query attention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from plateauscope.model.backend import Model, hf_tensors, hooked_parameters, is_causal_lm

NORMS = {"LN": "LayerNorm", "LNPre": "LayerNorm", "RMS": "RMSNorm", "RMSPre": "RMSNorm", None: "none"}
"""TransformerLens's ``normalization_type`` -> the family's norm, in words."""


@dataclass(frozen=True)
class Family:
    """An architecture family as the analyses see it."""

    name: str
    """Hugging Face's ``model_type`` (``llama``, ``gpt_neox``, ...), or ``plateauscope`` for a model built here."""
    architecture: str
    """Hugging Face's class (``LlamaForCausalLM``), or ``HookedTransformer``."""
    norm: str
    """``LayerNorm``, ``RMSNorm`` or ``none``."""
    mlp: str
    """``plain``, ``gated``, ``experts`` (a mixture of experts) or ``none`` (attention only)."""
    n_heads: int
    n_kv_heads: int
    """Key/value heads: ``n_heads``, or fewer where several query heads share one (grouped-query attention)."""
    parallel: bool
    """Attention and MLP read the same block input (GPT-NeoX, GPT-J, Phi)."""
    positions: str
    """``standard`` (learned), ``rotary``, ``alibi`` ... (TransformerLens's ``positional_embedding_type``)."""

    @property
    def grouped(self) -> bool:
        """Several query heads share each key/value head."""
        return self.n_kv_heads != self.n_heads

    def describe(self) -> str:
        """One phrase: ``llama (LlamaForCausalLM: RMSNorm, gated MLP, 4 query / 2 key-value heads, rotary)``."""
        heads = f"{self.n_heads} query / {self.n_kv_heads} key-value heads" if self.grouped else f"{self.n_heads} heads"
        block = ", parallel block" if self.parallel else ""
        return f"{self.name} ({self.architecture}: {self.norm}, {self.mlp} MLP, {heads}, {self.positions}{block})"


def _hf_config(model: Model):
    return model.original_model.config


def family_of(model: Model) -> Family:
    """The family of ``model`` (module docstring)."""
    cfg = model.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    if not is_causal_lm(model):
        return Family("plateauscope", "HookedTransformer", NORMS.get(cfg.normalization_type, "none"),
                      "none" if cfg.attn_only else "plain", cfg.n_heads, n_kv, False, cfg.positional_embedding_type)
    hf = _hf_config(model)
    experts = any(getattr(hf, k, None) for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    mlp = "experts" if experts else "gated" if getattr(cfg, "gated_mlp", False) else "plain"
    norm_module = next((getattr(model.blocks[0], n).original_component for n in ("ln1", "ln1_post")
                        if hasattr(model.blocks[0], n)), None)
    norm = "RMSNorm" if norm_module is not None and "RMSNorm" in type(norm_module).__name__ else \
        NORMS.get(cfg.normalization_type, "none")
    arch = (getattr(hf, "architectures", None) or [type(model.original_model).__name__])[0]
    return Family(hf.model_type, arch, norm, mlp, cfg.n_heads, n_kv, _parallel(model),
                  str(cfg.positional_embedding_type))


def _parallel(model: Model) -> bool:
    """Attention and MLP read the block's input: TransformerLens's flag, else a block with one pre-norm only
    (GPT-J, Phi: both read ``ln1``'s output)."""
    if getattr(model.cfg, "parallel_attn_mlp", False):
        return True
    block = model.blocks[0]
    return is_causal_lm(model) and not model.cfg.attn_only and hasattr(block, "ln1") and not hasattr(block, "ln2") \
        and not hasattr(block, "ln2_post")


def parameters_by_layer(model: Model) -> list[tuple[str, Tensor, int | None]]:
    """Every trainable parameter once (a tied embedding and unembedding once): ``(name, tensor, layer)``, the
    layer None outside the blocks. HookedTransformer's names for a model built here, Hugging Face's for another
    trainer's (its blocks' own modules say which parameters each layer holds)."""
    if not is_causal_lm(model):
        out = []
        for name, p in hooked_parameters(model).items():
            layer = int(name.split(".")[1]) if name.startswith("blocks.") else None
            out.append((name, p, layer))
        return out
    layer_of = {id(p): layer for layer, block in enumerate(model.blocks)
                for p in block.original_component.parameters()}
    seen: set[int] = set()
    out = []
    for name, p in hf_tensors(model).items():  # the model's own (the bridge adds split copies of a joint QKV)
        if not isinstance(p, torch.nn.Parameter) or id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p, layer_of.get(id(p))))
    return out


def embedding_matrix(model: Model) -> Tensor:
    """The token embedding ``[d_vocab, d_model]`` (its own tensor)."""
    if is_causal_lm(model):
        return model.original_model.get_input_embeddings().weight
    return hooked_parameters(model)["embed.W_E"]


def _module(model: Model, layer: int, *names: str) -> torch.nn.Module | None:
    """The Hugging Face module under the first of ``names`` the block has (None: none of them)."""
    block = model.blocks[layer]
    for name in names:
        part = block
        for attr in name.split("."):
            part = getattr(part, attr, None)
            if part is None:
                break
        if part is not None:
            return getattr(part, "original_component", part)
    return None


def _norm(module: torch.nn.Module | None) -> Callable[[Tensor], Tensor]:
    return (lambda x: x) if module is None else module


def head_input(model: Model, layer: int, which: str) -> Callable[[Tensor], Tensor]:
    """For a bridge of another trainer's model: ``[batch, pos, n, d_model]`` copies of the residual stream -> the
    ``which`` (``q``, ``k`` or ``v``) projection of each of the ``n`` heads from its own copy, ``[batch, pos, n,
    d_head]``: through the block's attention norm (``ln1``; none where the block normalises only after attention,
    OLMo 2) and the projection module the bridge hooks (``attn.q``; a joint QKV weight is the bridge's split
    copy). ``n`` is the query heads for ``q`` and the key/value heads for ``k`` and ``v``. What the bridge's
    ``attn.hook_q`` (``hook_k``, ``hook_v``) sees, head by head."""
    norm = _norm(_module(model, layer, "ln1"))
    proj = _module(model, layer, f"attn.{which}")
    if not isinstance(proj, torch.nn.Linear):
        raise TypeError(f"attn.{which} of layer {layer} is a {type(proj).__name__}, not a linear projection")
    fam = family_of(model)
    n = fam.n_heads if which == "q" else fam.n_kv_heads
    weight = proj.weight.view(n, -1, proj.weight.shape[-1])  # [n, d_head, d_model]
    bias = None if proj.bias is None else proj.bias.view(n, -1)

    def compute(copies: Tensor) -> Tensor:
        out = torch.einsum("bpnm,ndm->bpnd", norm(copies), weight)
        return out if bias is None else out + bias
    return compute


def mlp_input(model: Model, layer: int) -> Callable[[Tensor], Tensor]:
    """For a bridge of another trainer's model: the residual stream the MLP reads -> what its module takes
    (``mlp.hook_in``): through ``ln2`` (``ln1`` in a parallel block with one norm, nothing in a post-norm block)."""
    names = ("ln2",) if hasattr(model.blocks[layer], "ln2") else ("ln1",) if _parallel(model) else ()
    return _norm(_module(model, layer, *names))


def mlp_reads(model: Model) -> str:
    """The hook kind of the residual stream each MLP reads: ``resid_pre`` in a parallel block, else ``resid_mid``."""
    return "resid_pre" if _parallel(model) else "resid_mid"


def head_weights(model: Model, layer: int, head: int, names: tuple[str, ...]) -> list[tuple[Tensor, tuple]]:
    """For a bridge of another trainer's model: ``(parameter, index)`` of each of one head's weights ``names``
    (HookedTransformer's names: ``W_Q``, ``b_Q``, ``W_K``, ``b_K``, ``W_V``, ``b_V``, ``W_O``) in the modules the
    forward runs (``attn.q`` ... ``attn.o``; a joint QKV's split copies): the head's rows of its query projection,
    its key/value head's rows of the key and value projections (under grouped keys, shared by the query heads of
    its group), and its columns of the output projection. A bias the model lacks is left out."""
    family = family_of(model)
    kv = head // (family.n_heads // family.n_kv_heads)
    out: list[tuple[Tensor, tuple]] = []
    for name in names:
        kind, which = name.split("_")
        proj = _module(model, layer, f"attn.{which.lower()}")
        n = family.n_heads if which in "QO" else family.n_kv_heads
        index = head if which in "QO" else kv
        tensor = proj.weight if kind == "W" else proj.bias
        if tensor is None:
            continue
        if which == "O" and kind == "b":
            continue  # b_O is shared by the layer's heads
        transposed = type(proj).__name__ == "Conv1D"  # GPT-2's: weight [in, out], not nn.Linear's [out, in]
        along = 0 if kind == "b" else int(transposed) if which != "O" else int(not transposed)  # the heads' axis
        size = tensor.shape[along] // n
        out.append((tensor, (slice(None),) * along + (slice(index * size, (index + 1) * size),)))
    return out

