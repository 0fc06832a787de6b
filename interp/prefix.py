"""Forward passes that skip what a clean / corrupted pair has in common (shared by exact and
attribution patching).

Method. A clean prompt and its corrupted twin agree on every token before the first position
where any pair differs (:func:`first_difference`; the selector z in this task). Attention is
causal, so every activation at those positions is identical in the two runs, at every layer.
A run of the corrupted prompts therefore only has to compute the positions from there on,
reading the keys and values of the earlier positions from the clean run
(``TransformerLensKeyValueCacheEntry``, frozen); and a run that changes activations only
from layer ``l`` and position ``s`` on can start there (``HookedTransformer.forward(...,
start_at_layer=l)`` on the cached residual stream), with the keys and values of the positions
before ``s`` taken from the run it modifies. Only the prediction position's logits are read,
so only that position is unembedded.

No metric and no sign of its own: the helpers return activations and last-position logits;
:mod:`interp.patch` and :mod:`interp.attribution` state their metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.utilities import get_act_name

Hook = tuple[str, Callable]


def first_difference(clean: Int[Tensor, "N pos"], corrupt: Int[Tensor, "N pos"]) -> int:
    """The first position where any pair's prompts differ (``pos`` when none does)."""
    differs = (clean != corrupt).any(0)
    return int(differs.nonzero()[0, 0]) if differs.any() else clean.shape[1]


@dataclass
class RunCache:
    """Activations of one run at every position: the residual stream before each block, each
    attention layer's keys and values, and any other hooked activations by full hook name."""

    resid_pre: list[Float[Tensor, "N pos d_model"]]
    keys: list[Float[Tensor, "N pos kv_head d_head"]]
    values: list[Float[Tensor, "N pos kv_head d_head"]]
    acts: dict[str, Tensor]
    last_logits: Float[Tensor, "N vocab"]
    """Logits at the prediction position."""


def _names(model: HookedTransformer, act_names: Iterable[str]) -> list[str]:
    kinds = ("resid_pre", "k", "v", *sorted(set(act_names)))
    return [get_act_name(a, layer) for a in kinds for layer in range(model.cfg.n_layers)]


def _check(model: HookedTransformer) -> None:
    if model.cfg.positional_embedding_type != "standard":
        raise ValueError("prefix-sharing runs need absolute (standard) positional embeddings, "
                         f"the model has {model.cfg.positional_embedding_type!r}")


def unembed_last(model: HookedTransformer, resid: Float[Tensor, "N d_model"]) -> Float[Tensor, "N vocab"]:
    """The logits of one position from its final residual stream (final LayerNorm + unembed)."""
    x = resid[:, None]
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    logits = model.unembed(x)[:, 0]
    if model.cfg.output_logits_soft_cap > 0.0:
        cap = model.cfg.output_logits_soft_cap
        logits = cap * torch.tanh(logits / cap)
    return logits


def kv_entries(keys: list[Tensor], values: list[Tensor], stop: int, start_layer: int = 0, repeat: int = 1
               ) -> list[TransformerLensKeyValueCacheEntry | None] | None:
    """Frozen key/value cache entries of positions ``< stop`` for the layers from ``start_layer``
    (earlier layers: None, never read), the batch repeated ``repeat`` times (replica-major);
    None when ``stop`` is 0 (nothing to cache)."""
    if stop == 0:
        return None
    out: list[TransformerLensKeyValueCacheEntry | None] = [None] * len(keys)
    for layer in range(start_layer, len(keys)):
        k, v = keys[layer][:, :stop], values[layer][:, :stop]
        if repeat > 1:
            k, v = k.repeat(repeat, 1, 1, 1), v.repeat(repeat, 1, 1, 1)
        out[layer] = TransformerLensKeyValueCacheEntry(k, v, frozen=True)
    return out


def run_from(
    model: HookedTransformer,
    resid: Float[Tensor, "N new_pos d_model"],
    start_layer: int,
    past: list[TransformerLensKeyValueCacheEntry | None] | None,
    pred_index: int,
    fwd_hooks: list[Hook] | None = None,
) -> Float[Tensor, "N vocab"]:
    """Run the blocks from ``start_layer`` on the residual stream of the new positions (keys and
    values of the earlier ones from ``past``) and return the logits at ``pred_index`` (an index
    into the new positions)."""
    out = model.run_with_hooks(resid, fwd_hooks=fwd_hooks or [], start_at_layer=start_layer,
                               stop_at_layer=model.cfg.n_layers, past_kv_cache=past)
    return unembed_last(model, out[:, pred_index])


def cached_run(model: HookedTransformer, tokens: Int[Tensor, "N pos"], pred_pos: int,
               act_names: Iterable[str] = ()) -> RunCache:
    """A full run of ``tokens`` caching resid_pre, keys, values and the ``act_names`` activations
    of every layer."""
    _check(model)
    names = set(_names(model, act_names))
    cache: dict[str, Tensor] = {}

    def save(act: Tensor, hook) -> None:
        cache[hook.name] = act

    resid = model.input_to_embed(tokens)[0]
    last = run_from(model, resid, 0, None, pred_pos, [(n, save) for n in names])
    return _as_run_cache(model, cache, last, act_names)


def suffix_run(model: HookedTransformer, tokens: Int[Tensor, "N pos"], prefix: RunCache, start: int,
               pred_pos: int, act_names: Iterable[str] = ()) -> RunCache:
    """A run of ``tokens`` that computes only positions ``>= start``, taking everything before from
    ``prefix`` (a run on prompts equal to ``tokens`` before ``start``); returns every position."""
    _check(model)
    names = set(_names(model, act_names))
    cache: dict[str, Tensor] = {}

    def save(act: Tensor, hook) -> None:
        cache[hook.name] = act

    resid = model.input_to_embed(tokens)[0][:, start:]
    last = run_from(model, resid, 0, kv_entries(prefix.keys, prefix.values, start), pred_pos - start,
                    [(n, save) for n in names])
    head = {**{get_act_name("resid_pre", i): prefix.resid_pre[i] for i in range(model.cfg.n_layers)},
            **{get_act_name("k", i): prefix.keys[i] for i in range(model.cfg.n_layers)},
            **{get_act_name("v", i): prefix.values[i] for i in range(model.cfg.n_layers)},
            **prefix.acts}
    full = {n: torch.cat([head[n][:, :start], a], dim=1) for n, a in cache.items()}
    return _as_run_cache(model, full, last, act_names)


def _as_run_cache(model: HookedTransformer, cache: dict[str, Tensor], last: Tensor, act_names: Iterable[str]
                  ) -> RunCache:
    L = range(model.cfg.n_layers)
    acts = {get_act_name(a, i): cache[get_act_name(a, i)] for a in set(act_names) for i in L}
    return RunCache([cache[get_act_name("resid_pre", i)] for i in L], [cache[get_act_name("k", i)] for i in L],
                    [cache[get_act_name("v", i)] for i in L], acts, last)
