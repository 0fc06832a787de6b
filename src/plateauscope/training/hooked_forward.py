"""The blocks of a model from one layer to another, on new positions after a frozen prefix: the
forward that the prefix-sharing fast paths take (:mod:`plateauscope.training.scoring`,
:mod:`plateauscope.analysis.prefix`), on either backend.

HookedTransformer runs it itself: ``forward(resid, start_at_layer=..., stop_at_layer=...,
past_kv_cache=...)``. TransformerLens 4's bridge has ``start_at_layer`` but silently ignores a
key/value cache, and its ``pos_embed`` takes no offset. On any other model this module computes
the same blocks from the model's parameters in HookedTransformer's layout
(:func:`plateauscope.backend.hooked_parameters`) and passes every activation through the model's own
hook points, under HookedTransformer's names and in its order: ``hook_resid_pre``, ``attn.hook_q``,
``hook_k``, ``hook_v``, ``attn.hook_attn_scores`` (after the causal mask), ``attn.hook_pattern``,
``attn.hook_z``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_in`` (when ``use_hook_mlp_in``),
``mlp.hook_pre``, ``mlp.hook_post``, ``hook_mlp_out``, ``hook_resid_post``. A hook added to the
model (``plateauscope.backend.hooks_added``, or an intervention's permanent hook) sees and changes
what it would on HookedTransformer, and gradients flow as there.

Supported: the models :func:`plateauscope.training.fused.unsupported_reason` accepts (the ones this
toolkit builds). Tested against each backend's full forward in float64 (``tests/test_backend.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.backend import Model, backend_of, hook_point, hooked_parameters
from plateauscope.training.fused import ACTIVATIONS, layer_norm


def _fire(model: Model, name: str, act: Tensor) -> Tensor:
    """``act`` through the model's hook point ``name`` (its hooks may replace it). A bridge's hook
    point holds its module's own layout (``hook_q``: [batch, pos, head * d_head]) and converts to
    HookedTransformer's for the hooks and back: ``act`` goes in and comes out in HookedTransformer's.
    A point with no hook is the identity, and is skipped with its two conversions."""
    point = hook_point(model, name)
    if not (point._forward_hooks or point._forward_pre_hooks or point._backward_hooks or point._backward_pre_hooks):
        return act
    conversion = getattr(point, "hook_conversion", None)
    if conversion is None:
        return point(act)
    return conversion.convert(point(conversion.revert(act)))


def embed_at(model: Model, tokens: Int[Tensor, "batch pos"], offset: int = 0) -> Float[Tensor, "batch pos d_model"]:
    """The residual stream before the first block of ``tokens`` placed at positions ``offset`` on
    (token plus learned position embeddings)."""
    if backend_of(model) == "hooked":
        return model.embed(tokens) + model.pos_embed(tokens, offset)
    params = hooked_parameters(model)
    pos = params["pos_embed.W_pos"][offset: offset + tokens.shape[1]].expand(tokens.shape[0], -1, -1)
    return _fire(model, "hook_embed", params["embed.W_E"][tokens]) + _fire(model, "hook_pos_embed", pos)


def run_blocks(model: Model, resid: Float[Tensor, "batch pos d_model"], start_layer: int, stop_layer: int,
               past_kv_cache: Sequence | None = None) -> Float[Tensor, "batch pos d_model"]:
    """The residual stream after blocks ``start_layer`` .. ``stop_layer - 1`` of the positions in
    ``resid``, whose attention also reads the keys and values of the earlier positions in
    ``past_kv_cache`` (one frozen TransformerLens cache entry per layer, or None)."""
    if backend_of(model) == "hooked":
        return model(resid, start_at_layer=start_layer, stop_at_layer=stop_layer, past_kv_cache=past_kv_cache)
    params = hooked_parameters(model)
    x = resid
    for layer in range(start_layer, stop_layer):
        entry = past_kv_cache[layer] if past_kv_cache is not None else None
        past = None if entry is None else (entry.past_keys, entry.past_values)
        x = _block(model, params, layer, x, past)
    return x


def block_keys_values(model: Model, resid: Float[Tensor, "batch pos d_model"], layer: int
                      ) -> tuple[Float[Tensor, "batch pos head d_head"], Float[Tensor, "batch pos head d_head"]]:
    """The keys and values of block ``layer`` for the residual stream before it (no hook runs)."""
    if backend_of(model) == "hooked":
        block = model.blocks[layer]
        x = block.ln1(resid)
        _, keys, values = block.attn.calculate_qkv_matrices(x, x, x)
        return keys, values
    params = hooked_parameters(model)
    p = f"blocks.{layer}."
    h = layer_norm(resid, params, p + "ln1", model.cfg.normalization_type, model.cfg.eps)
    return tuple(torch.einsum("bpm,hmd->bphd", h, params[f"{p}attn.W_{x}"]) + params[f"{p}attn.b_{x}"]
                 for x in "KV")


def _block(model: Model, params: dict[str, Tensor], layer: int, x: Float[Tensor, "batch pos d_model"],
           past: tuple[Tensor, Tensor] | None) -> Float[Tensor, "batch pos d_model"]:
    """One pre-norm block, as HookedTransformer computes it, through the model's hook points."""
    cfg = model.cfg
    p = f"blocks.{layer}."
    fire = lambda name, act: _fire(model, p + name, act)  # noqa: E731
    x = fire("hook_resid_pre", x)
    h = layer_norm(x, params, p + "ln1", cfg.normalization_type, cfg.eps)
    q, k, v = (fire(f"attn.hook_{n.lower()}", torch.einsum("bpm,hmd->bphd", h, params[f"{p}attn.W_{n}"])
                    + params[f"{p}attn.b_{n}"]) for n in "QKV")
    offset = 0
    if past is not None:
        offset = past[0].shape[1]
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(cfg.d_head)
    query_pos = torch.arange(q.shape[1], device=x.device)[:, None] + offset
    causal = torch.arange(k.shape[1], device=x.device)[None, :] <= query_pos
    scores = fire("attn.hook_attn_scores", scores.masked_fill(~causal, float("-inf")))
    pattern = scores.softmax(-1)
    pattern = fire("attn.hook_pattern", torch.where(torch.isnan(pattern), 0, pattern))
    z = fire("attn.hook_z", torch.einsum("bhqk,bkhd->bqhd", pattern, v))
    attn_out = fire("hook_attn_out", torch.einsum("bqhd,hdm->bqm", z, params[p + "attn.W_O"]) + params[p + "attn.b_O"])
    if cfg.attn_only:
        return fire("hook_resid_post", x + attn_out)
    mid = fire("hook_resid_mid", x + attn_out)
    mlp_in = fire("hook_mlp_in", mid.clone()) if cfg.use_hook_mlp_in else mid
    pre = fire("mlp.hook_pre", layer_norm(mlp_in, params, p + "ln2", cfg.normalization_type, cfg.eps)
               @ params[p + "mlp.W_in"] + params[p + "mlp.b_in"])
    post = fire("mlp.hook_post", ACTIVATIONS[cfg.act_fn](pre))
    mlp_out = fire("hook_mlp_out", post @ params[p + "mlp.W_out"] + params[p + "mlp.b_out"])
    return fire("hook_resid_post", mid + mlp_out)
