"""Forward passes that skip what a clean / corrupted pair has in common (shared by exact and
attribution patching).

Method. A clean prompt and its corrupted twin agree on every token before the first position
where any pair differs (:func:`first_difference`; the selector z in this task). Attention is
causal, so every activation at those positions is identical in the two runs, at every layer.
A run of the corrupted prompts therefore only has to compute the positions from there on,
reading the keys and values of the earlier positions from the clean run
(``TransformerLensKeyValueCacheEntry``, frozen); and a run that changes activations only
from layer ``l`` and position ``s`` on can start there (:func:`plateauscope.model.hooked_forward.run_blocks`
on the cached residual stream: HookedTransformer's own ``forward(..., start_at_layer=l)``, or the
same blocks through the bridge's hook points), with the keys and values of the positions before
``s`` taken from the run it modifies. Only the prediction position's logits are read, so only
that position is unembedded.

Both backends run this way (:func:`plateauscope.model.backend.shares_prefixes`, the one place the choice
is made). A bridge of an imported series runs its own forward, so that rotary positions, grouped-query
attention and parallel blocks stay the model's own: from block ``l`` on the residual stream entering it,
the blocks below passed through (:func:`plateauscope.model.backend.runs_from_layer`,
:func:`~plateauscope.model.backend.run_causal_lm`), and, where the bridge keeps Hugging Face's cache
(:func:`plateauscope.model.backend.shares_hf_cache`), over the positions from ``s`` on, the earlier
positions' keys and values given as that cache (the bridge's ``past_key_values``); where it does not, over
every position. Any other model (the tests' plain-torch reference) runs every position from layer 0
with the same hooks (:func:`forward_from`, :func:`cached_run`, :func:`suffix_run`): exact, just
slower. The hooks therefore see the positions from ``start`` (prefix sharing) or all of them (full
forwards); they align on the last positions of the activation they get.

No metric and no sign of its own: the helpers return activations and last-position logits;
:mod:`plateauscope.analysis.patch` and :mod:`plateauscope.analysis.attribution` state their metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache_entry import (
    TransformerLensKeyValueCacheEntry,
)
from transformer_lens.utilities import get_act_name

from plateauscope.model.backend import (
    Model,
    hooks_added,
    run_causal_lm,
    runs_from_layer,
    shares_hf_cache,
    shares_prefixes,
)
from plateauscope.model.hooked_forward import embed_at, run_blocks

Hook = tuple[str, Callable]


def first_difference(clean: Int[Tensor, "N pos"], corrupt: Int[Tensor, "N pos"]) -> int:
    """The first position where any pair's prompts differ (``pos`` when none does)."""
    differs = (clean != corrupt).any(0)
    return int(differs.nonzero()[0, 0]) if differs.any() else clean.shape[1]


@dataclass
class RunCache:
    """Activations of one run at every position: the residual stream before each block, each
    attention layer's keys and values (empty lists where nothing reads them), and any other hooked
    activations by full hook name."""

    resid_pre: list[Float[Tensor, "N pos d_model"]]
    """The residual stream entering each block, where a run may start at a block
    (:func:`~plateauscope.model.backend.runs_from_layer`), else empty."""
    keys: list[Float[Tensor, "N pos kv_head d_head"]]
    """Each layer's keys: TransformerLens's (prefix sharing), or the Hugging Face cache's
    (:func:`~plateauscope.model.backend.shares_hf_cache`, its ``[N, kv_head, pos, d_head]`` transposed)."""
    values: list[Float[Tensor, "N pos kv_head d_head"]]
    acts: dict[str, Tensor]
    last_logits: Float[Tensor, "N vocab"]
    """Logits at the prediction position."""


def _names(model: Model, act_names: Iterable[str]) -> list[str]:
    shared = ("resid_pre", "k", "v") if shares_prefixes(model) else ("resid_pre",) if runs_from_layer(model) else ()
    kinds = shared + tuple(sorted(set(act_names)))
    return [get_act_name(a, layer) for a in kinds for layer in range(model.cfg.n_layers)]


def _check(model: Model) -> None:
    if shares_prefixes(model) and model.cfg.positional_embedding_type != "standard":
        raise ValueError("prefix-sharing runs need absolute (standard) positional embeddings, "
                         f"the model has {model.cfg.positional_embedding_type!r}")


def unembed_last(model: Model, resid: Float[Tensor, "N d_model"]) -> Float[Tensor, "N vocab"]:
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
    model: Model,
    resid: Float[Tensor, "N new_pos d_model"],
    start_layer: int,
    past: list[TransformerLensKeyValueCacheEntry | None] | None,
    pred_index: int,
    fwd_hooks: list[Hook] | None = None,
) -> Float[Tensor, "N vocab"]:
    """Run the blocks from ``start_layer`` on the residual stream of the new positions (keys and
    values of the earlier ones from ``past``) and return the logits at ``pred_index`` (an index
    into the new positions)."""
    with hooks_added(model, fwd_hooks or []):
        out = run_blocks(model, resid, start_layer, model.cfg.n_layers, past)
    return unembed_last(model, out[:, pred_index])


def cached_run(model: Model, tokens: Int[Tensor, "N pos"], pred_pos: int,
               act_names: Iterable[str] = (), hooks: Iterable[Hook] = ()) -> RunCache:
    """A full run of ``tokens`` caching resid_pre, keys, values and the ``act_names`` activations
    of every layer (``hooks``: more hooks for the same pass, e.g. ones that record)."""
    _check(model)
    cache: dict[str, Tensor] = {}
    hooks = savers(_names(model, act_names), cache) + list(hooks)
    if shares_prefixes(model):
        last = run_from(model, embed_at(model, tokens), 0, None, pred_pos, hooks)
    elif shares_hf_cache(model) or runs_from_layer(model):  # a bridge of another trainer's model: its own forward
        last, keys, values = _hf_run(model, tokens, hooks, pred_pos)
        return RunCache(_resid(model, cache), keys, values, _acts(model, cache, act_names), last)
    else:
        last = model.run_with_hooks(tokens, fwd_hooks=hooks)[:, pred_pos]
    return _as_run_cache(model, cache, last, act_names)


def activations(model: Model, tokens: Int[Tensor, "N pos"], names: Iterable[str]) -> dict[str, Tensor]:
    """The activations ``names`` of a forward of ``tokens`` at every position: through the blocks'
    fast path where the model shares prefixes and its ``forward`` is its own (an intervention that
    watches the tokens wraps it), else ``run_with_cache``."""
    names = sorted(set(names))
    if shares_prefixes(model) and "forward" not in vars(model):
        cache: dict[str, Tensor] = {}
        with hooks_added(model, savers(names, cache)):
            run_blocks(model, embed_at(model, tokens), 0, model.cfg.n_layers)
        return cache
    wanted = set(names)
    return dict(model.run_with_cache(tokens, names_filter=lambda n: n in wanted)[1])


def savers(names: Iterable[str], cache: dict[str, Tensor]) -> list[Hook]:
    """Hooks that record each activation under the name asked for (on the bridge ``hook.name`` is
    the canonical name of an aliased hook) and return it (on the bridge, ``hook_z`` is a reshaped
    copy that stays on the autograd graph only when the hook returns it)."""
    def saver(name: str) -> Callable:
        def save(act: Tensor, hook) -> Tensor:
            cache[name] = act
            return act

        return save

    return [(n, saver(n)) for n in sorted(set(names))]


def forward_from(model: Model, tokens: Int[Tensor, "N pos"], base: RunCache, pred_pos: int,
                 fwd_hooks: list[Hook], start: int = 0, layer: int = 0, repeat: int = 1) -> Float[Tensor, "R vocab"]:
    """The logits at ``pred_pos`` of ``tokens`` repeated ``repeat`` times (replica-major, R = N *
    repeat) run with ``fwd_hooks``, which change nothing before position ``start`` or layer ``layer``.

    ``base`` is a run on prompts equal to ``tokens`` before ``start`` (and, when ``layer`` > 0, a run
    of ``tokens`` itself). Prefix sharing: the blocks from ``layer`` on over the positions from
    ``start`` on, reading ``base``'s keys and values of the earlier positions. A bridge of another
    trainer's model: its own forward from block ``layer`` where it may start there, over the positions
    from ``start`` where it shares them through a Hugging Face cache. Otherwise the full forward.
    The hooks see the positions from ``start`` or all of them (align on the last ones)."""
    if not shares_prefixes(model):
        layer = layer if runs_from_layer(model) else 0
        start = start if shares_hf_cache(model) else 0
        if not (start or runs_from_layer(model)):  # any other model: the plain forward
            return model.run_with_hooks(tokens.repeat(repeat, 1), fwd_hooks=fwd_hooks)[:, pred_pos]
        resid = base.resid_pre[layer][:, start:].repeat(repeat, 1, 1) if layer else None
        past = _hf_past(model, base, start, repeat) if start else None
        # the cache after the run is not read: the blocks below ``layer`` left their entries unset
        return run_causal_lm(model, tokens[:, start:].repeat(repeat, 1), pred_pos - start, fwd_hooks, past, layer,
                             resid)[0]
    resid = (embed_at(model, tokens) if layer == 0 else base.resid_pre[layer])[:, start:]
    if repeat > 1:
        resid = resid.repeat(repeat, 1, 1)
    past = kv_entries(base.keys, base.values, start, layer, repeat)
    return run_from(model, resid, layer, past, pred_pos - start, fwd_hooks)


def suffix_run(model: Model, tokens: Int[Tensor, "N pos"], prefix: RunCache, start: int,
               pred_pos: int, act_names: Iterable[str] = ()) -> RunCache:
    """A run of ``tokens`` that computes only positions ``>= start``, taking everything before from
    ``prefix`` (a run on prompts equal to ``tokens`` before ``start``); returns every position."""
    _check(model)
    if shares_hf_cache(model) and start > 0:
        cache = {}
        last, keys, values = _hf_run(model, tokens[:, start:], savers(_names(model, act_names), cache),
                                     pred_pos - start, _hf_past(model, prefix, start))
        acts = {n: torch.cat([prefix.acts[n][:, :start], a], dim=1) for n, a in _acts(model, cache, act_names).items()}
        resid = [torch.cat([before[:, :start], r], dim=1) for before, r in zip(prefix.resid_pre, _resid(model, cache))]
        return RunCache(resid, keys, values, acts, last)
    if not shares_prefixes(model):
        return cached_run(model, tokens, pred_pos, act_names)
    cache: dict[str, Tensor] = {}
    last = forward_from(model, tokens, prefix, pred_pos, savers(_names(model, act_names), cache), start)
    head = {**{get_act_name("resid_pre", i): prefix.resid_pre[i] for i in range(model.cfg.n_layers)},
            **{get_act_name("k", i): prefix.keys[i] for i in range(model.cfg.n_layers)},
            **{get_act_name("v", i): prefix.values[i] for i in range(model.cfg.n_layers)},
            **prefix.acts}
    full = {n: torch.cat([head[n][:, :start], a], dim=1) for n, a in cache.items()}
    return _as_run_cache(model, full, last, act_names)


def _acts(model: Model, cache: dict[str, Tensor], act_names: Iterable[str]) -> dict[str, Tensor]:
    """The ``act_names`` activations of every layer from a run's recorded ``cache``."""
    return {get_act_name(a, i): cache[get_act_name(a, i)] for a in set(act_names) for i in range(model.cfg.n_layers)}


def _hf_run(model: Model, tokens: Int[Tensor, "N pos"], hooks: list[Hook], pred_index: int, past=None
            ) -> tuple[Float[Tensor, "N vocab"], list[Tensor], list[Tensor]]:
    """A bridge run (:func:`~plateauscope.model.backend.run_causal_lm`) with ``hooks`` after the positions
    ``past`` holds (a Hugging Face cache, or None): the logits at ``pred_index`` (an index into ``tokens``'
    positions; only that one is unembedded), and, where the model shares positions through the cache, each
    layer's keys and values at every position (``past``'s and the new ones; else empty lists)."""
    logits, cache = run_causal_lm(model, tokens, pred_index, hooks, past)
    if not shares_hf_cache(model):
        return logits, [], []
    return (logits, [entry.keys.transpose(1, 2) for entry in cache.layers],
            [entry.values.transpose(1, 2) for entry in cache.layers])


def _hf_past(model: Model, base: RunCache, stop: int, repeat: int = 1):
    """A Hugging Face cache of ``base``'s keys and values at the positions ``< stop``, the batch repeated
    ``repeat`` times (replica-major); a new one per run (a run appends to it)."""
    from transformers import DynamicCache

    data = [(k[:, :stop].transpose(1, 2).repeat(repeat, 1, 1, 1), v[:, :stop].transpose(1, 2).repeat(repeat, 1, 1, 1))
            for k, v in zip(base.keys, base.values)]
    return DynamicCache(data, config=model.original_model.config)


def _resid(model: Model, cache: dict[str, Tensor]) -> list[Tensor]:
    """The residual stream entering each block from a run's recorded ``cache``, where a run may start at
    a block (else nothing reads it: an empty list)."""
    return [cache[get_act_name("resid_pre", i)] for i in range(model.cfg.n_layers)] if runs_from_layer(model) else []


def _as_run_cache(model: Model, cache: dict[str, Tensor], last: Tensor, act_names: Iterable[str]
                  ) -> RunCache:
    L = range(model.cfg.n_layers)
    acts = _acts(model, cache, act_names)
    if not shares_prefixes(model):
        return RunCache(_resid(model, cache), [], [], acts, last)
    return RunCache([cache[get_act_name("resid_pre", i)] for i in L], [cache[get_act_name("k", i)] for i in L],
                    [cache[get_act_name("v", i)] for i in L], acts, last)
