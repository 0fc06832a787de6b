"""A fused forward pass over a HookedTransformer's own parameters: the training step's fast path.

HookedTransformer's forward is written to be read and hooked: every activation passes a hook
point, LayerNorm is five elementwise kernels, and attention materialises its scores, masks and
softmaxes them in separate kernels. On a small model and a CPU those launches, not the
arithmetic, are most of a training step. :func:`fused_logits` computes the same function from
the same parameter tensors with fused kernels: ``F.layer_norm``, one matmul for the queries,
keys and values of all heads, and ``F.scaled_dot_product_attention``.

It owns no parameter. The optimiser steps ``model.parameters()`` as in an eager run, checkpoints
are ``model.state_dict()`` in HookedTransformer's layout, and evaluation and every analysis run
the hooked forward of the same module. Only the rounding differs: the fused kernels add in another
order, so logits agree with the hooked forward to about 1e-6, not to the last bit, and a run in
one forward diverges from a run in the other as runs on two CPU types do
(``tests/model/test_fused.py`` checks logits and gradients against the hooked forward at 1e-5).

Supported: what :class:`plateauscope.model.config.ModelConfig` builds with learned absolute positions
(``LN``, ``LNPre`` or no normalisation; ``gelu``, ``gelu_new``, ``relu`` or ``silu``; MLPs or
attention only), on either backend (the bridge's parameters are read through views in
HookedTransformer's layout, ``plateauscope.model.backend.hooked_parameters``). :func:`unsupported_reason`
says why another model is not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.model.protocols import AttentionEdit

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
"""TransformerLens ``act_fn`` names and their fused kernels (``gelu_new`` is the tanh form)."""


def unsupported_reason(cfg: object) -> str | None:
    """Why :func:`fused_logits` cannot train a model with this configuration (a ``ModelConfig``, or
    a model's HookedTransformerConfig or TransformerBridgeConfig); None: it can."""
    checks = [
        (cfg.positional_embedding_type != "standard", f"positional_embedding_type={cfg.positional_embedding_type}"),
        (cfg.normalization_type not in ("LN", "LNPre", None), f"normalization_type={cfg.normalization_type}"),
        (not cfg.attn_only and cfg.act_fn not in ACTIVATIONS, f"act_fn={cfg.act_fn}"),
        (getattr(cfg, "attention_dir", "causal") != "causal", "bidirectional attention"),
        (not getattr(cfg, "use_attn_scale", True), "use_attn_scale=False"),
        (getattr(cfg, "n_key_value_heads", None) not in (None, cfg.n_heads), "grouped-query attention"),
        (getattr(cfg, "original_architecture", None) is not None, "a pretrained architecture"),
        (any(getattr(cfg, flag, False) for flag in ("use_split_qkv_input", "use_attn_in", "use_qk_norm",
                                                    "use_normalization_before_and_after", "parallel_attn_mlp",
                                                    "gated_mlp")),
         "a non-standard block"),
    ]
    reasons = [why for failed, why in checks if failed]
    return ", ".join(reasons) or None


def layer_norm(x: Float[Tensor, "*batch d_model"], params: Mapping[str, Tensor], name: str, kind: str | None,
               eps: float) -> Float[Tensor, "*batch d_model"]:
    """HookedTransformer's ``LN`` (centre, scale, then ``w``, ``b``), ``LNPre`` (no ``w``, ``b``) or nothing."""
    if kind is None:
        return x
    weight, bias = (params[f"{name}.w"], params[f"{name}.b"]) if kind == "LN" else (None, None)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _in_projection(params: Mapping[str, Tensor], prefix: str, names: str, d_model: int
                   ) -> tuple[Float[Tensor, "d_model out"], Float[Tensor, " out"]]:
    """The weight and bias of the attention's input projections ``names`` (``"QKV"``, ``"Q"``, ``"KV"``)
    of every head, as one matmul: ``[d_model, len(names) * heads * d_head]``."""
    weight = torch.cat([params[f"{prefix}attn.W_{n}"] for n in names]).permute(1, 0, 2).reshape(d_model, -1)
    return weight, torch.cat([params[f"{prefix}attn.b_{n}"] for n in names]).flatten()


def mean_values(v: Float[Tensor, "*lead head d_head"], heads: Sequence[int], head_dim: int,
                mean_dims: tuple[int, ...]) -> Float[Tensor, "*lead head d_head"]:
    """``v`` with the values of ``heads`` (along ``head_dim``) replaced by their mean over ``mean_dims``."""
    keep = torch.ones(v.shape[head_dim], dtype=torch.bool, device=v.device)
    keep[list(heads)] = False
    shape = [1] * v.dim()
    shape[head_dim] = -1
    return torch.where(keep.view(shape), v, v.mean(mean_dims, keepdim=True).expand_as(v))


def by_layer(heads: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """(layer, head) pairs grouped by layer."""
    out: dict[int, list[int]] = {}
    for layer, head in heads:
        out.setdefault(layer, []).append(head)
    return out


def fused_logits(cfg: object, params: Mapping[str, Tensor], tokens: Int[Tensor, "batch pos"],
                 hidden_keys: Sequence[int] = (), zeroed_heads: Sequence[tuple[int, int]] = (),
                 positions: Sequence[int] | None = None, clamp: AttentionEdit | None = None,
                 mean_value_heads: Sequence[tuple[int, int]] = (),
                 start: tuple[int, Float[Tensor, "batch pos d_model"]] | None = None,
                 stop_at: int | None = None) -> Float[Tensor, "batch out_pos d_vocab_out"]:
    """The logits of a HookedTransformer with config ``cfg`` (``model.cfg``) and parameters ``params``
    (``plateauscope.model.backend.hooked_parameters(model)``, or a seed ensemble member's slices), with fused kernels.

    The interventions of :mod:`plateauscope.runs.interventions`: no head attends to the key positions
    ``hidden_keys``, the heads ``zeroed_heads`` ((layer, head) pairs) write nothing, the ``clamp``'s heads
    attend with its clamped pattern (their layer's attention then runs unfused, its pattern explicit),
    and the heads ``mean_value_heads`` carry their values' mean over the batch and positions.

    ``positions``: the logits at these positions only (``out_pos`` = ``len(positions)``; None: at every
    position). Nothing after the last block's keys and values reaches another position, so that block's
    queries, attention output and MLP, and the unembedding, run only there: the same logits for less
    work, the ``trimmed`` training forward's (its keys and values still cover every position).
    ``start`` = (layer, residual stream into that block, computed elsewhere for ``tokens``): the forward
    runs from that block on (the interventions then act from it on). ``stop_at``: the residual stream
    into that block is returned instead of the logits (``[batch, pos, d_model]``).
    No hook runs: use the hooked forward for anything that reads or edits activations.
    """
    n_heads, d_head, d_model, kind, eps = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.normalization_type, cfg.eps
    batch, n_pos = tokens.shape
    allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device).tril()  # [query, key]
    allowed[:, [k for k in hidden_keys if k < n_pos]] = False
    keep = {}
    for layer, head in zeroed_heads:
        keep.setdefault(layer, torch.ones(n_heads, 1, 1, dtype=params["embed.W_E"].dtype, device=tokens.device))
        keep[layer][head] = 0
    mean_by_layer = by_layer(mean_value_heads)
    first, x = start if start is not None else (0, params["embed.W_E"][tokens] + params["pos_embed.W_pos"][:n_pos])
    x = x.reshape(-1, d_model)  # [batch * pos, d]
    for layer in range(first, cfg.n_layers):
        if layer == stop_at:
            return x.view(batch, n_pos, d_model)
        p = f"blocks.{layer}."
        h = layer_norm(x, params, p + "ln1", kind, eps)
        mask = allowed if hidden_keys else None  # None: the causal kernel
        if positions is None or layer < cfg.n_layers - 1:
            # Queries, keys and values of every head from one matmul: [d_model, 3 * heads * d_head].
            w_qkv, b_qkv = _in_projection(params, p, "QKV", d_model)
            qkv = torch.addmm(b_qkv, h, w_qkv)
            q, k, v = qkv.view(batch, n_pos, 3 * n_heads, d_head).transpose(1, 2).split(n_heads, dim=1)
        else:
            # The last block, trimmed: keys and values at every position, queries (and all after) at ``positions``.
            at = lambda t: t.view(batch, n_pos, d_model)[:, positions].reshape(-1, d_model)
            w_q, b_q = _in_projection(params, p, "Q", d_model)
            w_kv, b_kv = _in_projection(params, p, "KV", d_model)
            q = torch.addmm(b_q, at(h), w_q).view(batch, len(positions), n_heads, d_head).transpose(1, 2)
            kv = torch.addmm(b_kv, h, w_kv)
            k, v = kv.view(batch, n_pos, 2 * n_heads, d_head).transpose(1, 2).split(n_heads, dim=1)
            mask, x = allowed[list(positions)], at(x)
        if layer in mean_by_layer:
            v = mean_values(v, mean_by_layer[layer], head_dim=1, mean_dims=(0, 2))  # v: [batch, heads, pos, d_head]
        if clamp is not None and layer in clamp.layers:
            # The pattern itself is clamped, so this layer's attention is computed step by step.
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d_head)
            scores = scores.masked_fill(~(allowed if mask is None else mask), float("-inf"))
            trimmed = positions is not None and layer == cfg.n_layers - 1
            z = clamp.apply(scores.softmax(-1), layer, positions if trimmed else None, tokens) @ v
        else:  # scale 1 / sqrt(d_head), as attn_scale
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        if layer in keep:
            z = z * keep[layer]  # [batch, heads, pos, d_head]
        z = z.transpose(1, 2).reshape(-1, n_heads * d_head)
        x = x + torch.addmm(params[p + "attn.b_O"], z, params[p + "attn.W_O"].reshape(n_heads * d_head, d_model))
        if not cfg.attn_only:
            hidden = torch.addmm(params[p + "mlp.b_in"], layer_norm(x, params, p + "ln2", kind, eps), params[p + "mlp.W_in"])
            x = x + torch.addmm(params[p + "mlp.b_out"], ACTIVATIONS[cfg.act_fn](hidden), params[p + "mlp.W_out"])
    x = layer_norm(x, params, "ln_final", kind, eps)
    logits = torch.addmm(params["unembed.b_U"], x, params["unembed.W_U"])
    return logits.view(batch, -1, logits.shape[-1])
