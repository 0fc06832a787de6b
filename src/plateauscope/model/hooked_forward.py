"""The blocks of a model from one layer to another, on new positions after a frozen prefix: the
forward that the prefix-sharing fast paths take (:mod:`plateauscope.model.scoring`,
:mod:`plateauscope.analysis.prefix`), on either backend.

HookedTransformer runs it itself: ``forward(resid, start_at_layer=..., stop_at_layer=...,
past_kv_cache=...)``. TransformerLens 4's bridge has ``start_at_layer`` but silently ignores a
key/value cache, and its ``pos_embed`` takes no offset. On any other model this module computes
the same blocks from the model's parameters in HookedTransformer's layout
(:func:`plateauscope.model.backend.hooked_parameters`) and passes every activation through the model's own
hook points, under HookedTransformer's names and in its order: ``hook_resid_pre``, ``attn.hook_q``,
``hook_k``, ``hook_v``, ``attn.hook_attn_scores`` (after the causal mask), ``attn.hook_pattern``,
``attn.hook_z``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_in`` (when ``use_hook_mlp_in``),
``mlp.hook_pre``, ``mlp.hook_post``, ``hook_mlp_out``, ``hook_resid_post``. A hook added to the
model (``plateauscope.model.backend.hooks_added``, or an intervention's permanent hook) sees and changes
what it would on HookedTransformer, and gradients flow as there.

The earlier positions' keys and values come per row (a frozen TransformerLens cache entry) or as a
:class:`SharedPast`, read once by every row that continues the same prefix: a tree of candidates
(evaluation, head ablation) attends to its parent prefix's keys without a copy per candidate.

Supported: the models :func:`plateauscope.model.fused.unsupported_reason` accepts (the ones this
toolkit builds). Tested against each backend's full forward in float64 (``tests/model/test_backend.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache_entry import (
    TransformerLensKeyValueCacheEntry,
)

from plateauscope.model.backend import Model, backend_of, hook_point, hooked_parameters
from plateauscope.model.fused import ACTIVATIONS, layer_norm


def _hooked(model: Model, name: str) -> bool:
    """Whether any hook is on the model's hook point ``name``."""
    point = hook_point(model, name)
    return bool(point._forward_hooks or point._forward_pre_hooks or point._backward_hooks or point._backward_pre_hooks)


def _fire(model: Model, name: str, act: Tensor) -> Tensor:
    """``act`` through the model's hook point ``name`` (its hooks may replace it). A bridge's hook
    point holds its module's own layout (``hook_q``: [batch, pos, head * d_head]) and converts to
    HookedTransformer's for the hooks and back: ``act`` goes in and comes out in HookedTransformer's.
    A point with no hook is the identity, and is skipped with its two conversions."""
    if not _hooked(model, name):
        return act
    point = hook_point(model, name)
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


@dataclass(frozen=True)
class SharedPast:
    """Keys and values of the earlier positions, shared by rows of a batch without a copy per row:
    row ``b`` reads ``keys[(b // children) % len(keys)]``, then its own ``row_keys[b]`` (if any).

    ``children`` > 1: each run of that many consecutive rows continues one prefix (a tree of
    candidates); ``children`` = 1 with a batch of several times ``len(keys)`` rows: copies of one
    prompt set side by side (replica-major). Attention computes the scores against the shared keys
    per prefix, and is otherwise the same arithmetic as on the keys copied out per row, which
    :meth:`per_row` does (HookedTransformer's forward takes only that)."""

    keys: Float[Tensor, "prefix past_pos head d_head"]
    values: Float[Tensor, "prefix past_pos head d_head"]
    children: int = 1
    row_keys: Float[Tensor, "batch own_pos head d_head"] | None = None
    row_values: Float[Tensor, "batch own_pos head d_head"] | None = None

    @classmethod
    def own(cls, keys: Float[Tensor, "batch pos head d_head"], values: Float[Tensor, "batch pos head d_head"]
            ) -> SharedPast:
        """Each row's own keys and values, nothing shared."""
        return cls(keys[:, :0], values[:, :0], 1, keys, values)

    def rows(self, batch: int) -> Int[Tensor, " batch"]:
        """The shared row each of ``batch`` rows reads."""
        return torch.arange(batch, device=self.keys.device) // self.children % len(self.keys)

    def per_row(self, batch: int) -> TransformerLensKeyValueCacheEntry:
        """The same keys and values copied out for each of ``batch`` rows (a frozen TransformerLens entry)."""
        at = self.rows(batch)
        keys, values = self.keys[at], self.values[at]
        if self.row_keys is not None:
            keys, values = torch.cat([keys, self.row_keys], 1), torch.cat([values, self.row_values], 1)
        return TransformerLensKeyValueCacheEntry(keys, values, frozen=True)

    def then(self, keys: Float[Tensor, "batch pos head d_head"], values: Float[Tensor, "batch pos head d_head"]
             ) -> SharedPast:
        """These keys and values with each row's ``keys`` / ``values`` after them."""
        if self.row_keys is not None:
            keys, values = torch.cat([self.row_keys, keys], 1), torch.cat([self.row_values, values], 1)
        return replace(self, row_keys=keys, row_values=values)


def run_blocks(model: Model, resid: Float[Tensor, "batch pos d_model"], start_layer: int, stop_layer: int,
               past_kv_cache: Sequence | None = None) -> Float[Tensor, "batch pos d_model"]:
    """The residual stream after blocks ``start_layer`` .. ``stop_layer - 1`` of the positions in
    ``resid``, whose attention also reads the keys and values of the earlier positions in
    ``past_kv_cache`` (per layer: a frozen TransformerLens cache entry, a :class:`SharedPast`, or None)."""
    if backend_of(model) == "hooked":
        if past_kv_cache is not None:
            past_kv_cache = [e.per_row(len(resid)) if isinstance(e, SharedPast) else e for e in past_kv_cache]
        return model(resid, start_at_layer=start_layer, stop_at_layer=stop_layer, past_kv_cache=past_kv_cache)
    params = hooked_parameters(model)
    x = resid
    for layer in range(start_layer, stop_layer):
        entry = past_kv_cache[layer] if past_kv_cache is not None else None
        past = entry if entry is None or isinstance(entry, SharedPast) else SharedPast.own(entry.past_keys,
                                                                                            entry.past_values)
        x = _block(model, params, layer, x, past)
    return x


def _attention(q: Float[Tensor, "batch q_pos head d_head"], k: Float[Tensor, "batch pos head d_head"],
               v: Float[Tensor, "batch pos head d_head"], past: SharedPast | None, fire, plain: bool
               ) -> Float[Tensor, "batch q_pos head d_head"]:
    """Causal attention of the new positions over the shared past, each row's own past and the new
    positions, with the scores, pattern and z through the hook points (``fire``). ``plain``: no hook
    reads or changes the scores or the pattern, so where nothing is shared torch's fused attention
    computes z (the same numbers, up to float rounding)."""
    batch, n_q, n_heads, d_head = q.shape
    shared = 0
    if past is not None:
        if past.row_keys is not None:
            k, v = torch.cat([past.row_keys, k], dim=1), torch.cat([past.row_values, v], dim=1)
        shared = past.keys.shape[1] if batch and n_q else 0  # (no row or no query: nothing to attend)
        groups = (batch // max(1, len(past.keys) * past.children), len(past.keys), past.children)
    if plain and not shared:
        z = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             attn_mask=_causal(n_q, k.shape[1], q.device))
        return fire("attn.hook_z", z.transpose(1, 2))
    if plain:
        return fire("attn.hook_z", _attention_over_shared(q, k, v, past, groups))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
    if shared:  # [tile, prefix, child] rows: each prefix's children against its keys in one product
        on_shared = torch.einsum("tpcqhd,pkhd->tpchqk", q.reshape(*groups, n_q, n_heads, d_head), past.keys)
        scores = torch.cat([on_shared.reshape(batch, n_heads, n_q, shared), scores], dim=-1)
    scores = scores / math.sqrt(d_head)
    scores = fire("attn.hook_attn_scores", scores.masked_fill(~_causal(n_q, scores.shape[-1], q.device), float("-inf")))
    pattern = scores.softmax(-1)
    pattern = fire("attn.hook_pattern", torch.where(torch.isnan(pattern), 0, pattern))
    z = torch.einsum("bhqk,bkhd->bqhd", pattern[..., shared:], v)
    if shared:
        z = z + torch.einsum("tpchqk,pkhd->tpcqhd", pattern[..., :shared].reshape(*groups, n_heads, n_q, shared),
                             past.values).reshape(batch, n_q, n_heads, d_head)
    return fire("attn.hook_z", z)


def _causal(n_q: int, n_k: int, device: torch.device) -> Bool[Tensor, "q_pos k_pos"]:
    """Which of ``n_k`` keys each of the last ``n_q`` positions may attend to (itself and before)."""
    return torch.arange(n_k, device=device)[None, :] <= torch.arange(n_q, device=device)[:, None] + (n_k - n_q)


def _attention_over_shared(q: Float[Tensor, "batch q_pos head d_head"], k: Float[Tensor, "batch pos head d_head"],
                           v: Float[Tensor, "batch pos head d_head"], past: SharedPast, groups: tuple[int, int, int]
                           ) -> Float[Tensor, "batch q_pos head d_head"]:
    """Causal attention over a shared past then each row's own keys ``k`` (its own past and the new
    positions), with nothing to hook: the softmax over the two blocks of scores with one maximum per
    query, so that neither the scores nor the pattern of the shared block is ever copied out per row.
    ``groups``: the rows as ``[tile, prefix, child]``."""
    tiles, prefixes, children = groups
    batch, n_q, n_heads, d_head = q.shape
    scale = 1 / math.sqrt(d_head)
    # each prefix's children's queries against its keys, in one product: [tile, prefix, head, child * q, shared]
    grouped = q.reshape(tiles, prefixes, children, n_q, n_heads, d_head)
    grouped = grouped.permute(0, 1, 4, 2, 3, 5).reshape(tiles, prefixes, n_heads, children * n_q, d_head)
    on_shared = torch.matmul(grouped, past.keys.permute(0, 2, 3, 1)).mul_(scale)
    own = torch.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1)).mul_(scale)  # [batch, head, q, own keys]
    own.masked_fill_(~_causal(n_q, k.shape[1], q.device), float("-inf"))

    def by_row(t: Tensor) -> Tensor:  # [tile, prefix, head, child * q, x] -> [batch, head, q, x]
        return t.unflatten(3, (children, n_q)).permute(0, 1, 3, 2, 4, 5).reshape(batch, n_heads, n_q, t.shape[-1])

    def by_prefix(t: Tensor) -> Tensor:  # the inverse of by_row
        return t.view(tiles, prefixes, children, n_heads, n_q, t.shape[-1]).permute(0, 1, 3, 2, 4, 5).reshape(
            tiles, prefixes, n_heads, children * n_q, t.shape[-1])

    top = torch.maximum(by_row(on_shared.amax(-1, keepdim=True)), own.amax(-1, keepdim=True))  # [batch, head, q, 1]
    on_shared = on_shared.sub_(by_prefix(top)).exp_()
    own = own.sub_(top).exp_()
    total = by_row(on_shared.sum(-1, keepdim=True)) + own.sum(-1, keepdim=True)
    z = by_row(torch.matmul(on_shared, past.values.permute(0, 2, 1, 3))) + torch.matmul(own, v.transpose(1, 2))
    return z.div_(total).transpose(1, 2)


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
    return tuple(_linear(h, params[f"{p}attn.W_{x}"].permute(1, 0, 2).flatten(1), params[f"{p}attn.b_{x}"].flatten())
                 .unflatten(-1, (model.cfg.n_heads, model.cfg.d_head)) for x in "KV")


def _linear(x: Float[Tensor, "... d_in"], weight: Float[Tensor, "d_in d_out"], bias: Float[Tensor, " d_out"]
            ) -> Float[Tensor, "... d_out"]:
    """``x @ weight + bias`` as one matrix product with the bias added in it."""
    return torch.addmm(bias, x.flatten(0, -2), weight).view(*x.shape[:-1], weight.shape[-1])


def _block(model: Model, params: dict[str, Tensor], layer: int, x: Float[Tensor, "batch pos d_model"],
           past: SharedPast | None) -> Float[Tensor, "batch pos d_model"]:
    """One pre-norm block, as HookedTransformer computes it, through the model's hook points."""
    cfg = model.cfg
    p = f"blocks.{layer}."
    fire = lambda name, act: _fire(model, p + name, act)  # noqa: E731
    x = fire("hook_resid_pre", x)
    h = layer_norm(x, params, p + "ln1", cfg.normalization_type, cfg.eps)
    # queries, keys and values from one matrix product ([d_model, 3 * heads * d_head])
    weights = torch.cat([params[f"{p}attn.W_{n}"].permute(1, 0, 2).flatten(1) for n in "QKV"], 1)
    bias = torch.cat([params[f"{p}attn.b_{n}"].flatten() for n in "QKV"])
    qkv = _linear(h, weights, bias).view(*h.shape[:-1], 3, cfg.n_heads, cfg.d_head)
    q, k, v = (fire(f"attn.hook_{n}", t) for n, t in zip("qkv", qkv.unbind(-3)))
    plain = not (_hooked(model, p + "attn.hook_attn_scores") or _hooked(model, p + "attn.hook_pattern"))
    z = _attention(q, k, v, past, fire, plain)
    attn_out = fire("hook_attn_out", _linear(z.flatten(-2), params[p + "attn.W_O"].flatten(0, 1), params[p + "attn.b_O"]))
    if cfg.attn_only:
        return fire("hook_resid_post", x + attn_out)
    mid = fire("hook_resid_mid", x + attn_out)
    mlp_in = fire("hook_mlp_in", mid.clone()) if cfg.use_hook_mlp_in else mid
    pre = fire("mlp.hook_pre", _linear(layer_norm(mlp_in, params, p + "ln2", cfg.normalization_type, cfg.eps),
                                       params[p + "mlp.W_in"], params[p + "mlp.b_in"]))
    post = fire("mlp.hook_post", ACTIVATIONS[cfg.act_fn](pre))
    mlp_out = fire("hook_mlp_out", _linear(post, params[p + "mlp.W_out"], params[p + "mlp.b_out"]))
    return fire("hook_resid_post", mid + mlp_out)
