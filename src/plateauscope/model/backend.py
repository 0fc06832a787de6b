"""The TransformerLens backend seam: the one module that imports a TransformerLens model class.

Two backends build, load and save the same model (the ``hooked_transformer_config`` of a run):

* ``hooked``: TransformerLens 3.x ``HookedTransformer`` (the default where 3.x is installed).
* ``bridge``: TransformerLens 4.x ``TransformerBridge.boot_native(TransformerBridgeConfig)``, its
  weights converted from the checkpoint with
  ``transformer_lens.utilities.tl_checkpoint_conversion.convert_tl_checkpoint``, and
  ``enable_compatibility_mode(no_processing=True)`` so that it has HookedTransformer's hook names
  and shapes (``blocks.L.attn.hook_z`` [batch, pos, head, d_head], ``hook_resid_pre``,
  ``hook_attn_out``, ``hook_mlp_out``, ``attn.hook_pattern``) in HookedTransformer's unprocessed
  coordinates (no LayerNorm folding or centring: our HookedTransformers are built from a config,
  never ``from_pretrained``, so they are unprocessed too).

Only one TransformerLens can be installed at a time (both are the distribution
``transformer-lens``), so the other backend is unavailable; asking for it raises
:class:`BackendError`, one line that the CLIs print before exiting with code 2.

Checkpoints are always written in HookedTransformer's state-dict layout (``blocks.0.attn.W_Q``
[head, d_model, d_head], ..., ``unembed.b_U``, plus the ``mask`` / ``IGNORE`` buffers):
:func:`hooked_state_dict` converts a bridge's weights back, so a series trained on either
backend opens on both.

One difference the bridge needs patched: ``boot_native`` builds the unembedding without a
bias and the bridge replaces it by a fixed zero buffer, while HookedTransformer trains
``unembed.b_U``. :func:`build_model` turns that buffer into a trainable parameter, so the bridge
trains the same parameters as HookedTransformer (see the README).
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import re
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import einops
import numpy as np
import torch

BACKENDS: tuple[str, ...] = ("hooked", "bridge")
"""``hooked``: TransformerLens 3.x HookedTransformer; ``bridge``: TransformerLens 4.x TransformerBridge."""

_NEEDS = {"hooked": (3, "transformer-lens>=3.5,<4"), "bridge": (4, "transformer-lens>=4.3,<5")}

_HT_BUFFERS = (".attn.mask", ".attn.IGNORE")

Model: TypeAlias = torch.nn.Module
"""What the analyses take: a HookedTransformer or a TransformerBridge in compatibility mode. Both
have ``cfg`` (n_layers, n_heads, device), ``run_with_cache``, ``run_with_hooks`` and ``hooks``
with HookedTransformer's hook names; the alias names no backend class, so nothing outside this
module imports one."""


class BackendError(ValueError):
    """The requested backend is unknown or its TransformerLens is not installed (one line)."""


@functools.cache
def installed_transformer_lens() -> str | None:
    """The installed ``transformer-lens`` version, or None (read once: evaluation asks on every pass)."""
    try:
        return importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        return None


def available_backends() -> tuple[str, ...]:
    """The backends this environment's TransformerLens provides (one of them, or none)."""
    version = installed_transformer_lens()
    if version is None:
        return ()
    major = int(version.split(".")[0])
    return tuple(b for b in BACKENDS if _NEEDS[b][0] == major)


def default_backend() -> str:
    """``hooked`` where TransformerLens 3.x is installed, ``bridge`` where 4.x is."""
    have = available_backends()
    return have[0] if have else "hooked"


def resolve_backend(backend: str | None) -> str:
    """``backend`` (None: the default) checked to be known and installed, else a BackendError."""
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise BackendError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend not in available_backends():
        version = installed_transformer_lens()
        have = f"transformer-lens {version} is installed" if version else "transformer-lens is not installed"
        raise BackendError(f"--backend {backend} needs TransformerLens {_NEEDS[backend][0]}.x "
                           f"({_NEEDS[backend][1]}), but {have} in this environment")
    return backend


# ---- building ------------------------------------------------------------------------------


def build_hooked_transformer(cfg_dict: dict[str, Any], seed: int | None = None,
                             device: str | torch.device = "cpu") -> Model:
    """A HookedTransformer from a config dict; weights initialised from ``seed`` when given.

    TransformerLens 3.x warns that HookedTransformer is deprecated each time one is built;
    that one warning is silenced here, where all our models are built.
    """
    resolve_backend("hooked")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        cfg = HookedTransformerConfig(**cfg_dict, device=str(device))
        if seed is None:
            return HookedTransformer(cfg)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return HookedTransformer(cfg)


def bridge_config(cfg_dict: dict[str, Any]) -> Any:
    """The ``TransformerBridgeConfig`` of a run's HookedTransformerConfig kwargs (same field names)."""
    resolve_backend("bridge")
    from transformer_lens import TransformerBridgeConfig

    return TransformerBridgeConfig(**cfg_dict)


def build_bridge(cfg_dict: dict[str, Any], seed: int | None = None, device: str | torch.device = "cpu") -> Model:
    """A ``TransformerBridge.boot_native`` model in compatibility mode (hook names and shapes of
    HookedTransformer, no weight processing), with a trainable unembedding bias, holding
    :func:`initial_hooked_state`: the weights HookedTransformer draws from ``seed``, so that one
    seed trains the same run on both backends."""
    resolve_backend("bridge")
    # boot_native builds the module tree and its hook registry (60 ms on the demo model); an analysis
    # builds one model per checkpoint, so each is a copy of one booted per config and device
    bridge = copy.deepcopy(_booted_bridge(cfg_dict, str(device)))
    load_hooked_state_dict(bridge, initial_hooked_state(cfg_dict, seed))
    if cfg_dict.get("dtype") is not None:  # boot_native builds float32 whatever the config says
        bridge.cfg.dtype = cfg_dict["dtype"]
        bridge.to(cfg_dict["dtype"])
    return bridge


_BOOTED: dict[tuple[str, str], Model] = {}


def _booted_bridge(cfg_dict: dict[str, Any], device: str) -> Model:
    """A ``boot_native`` bridge of a config in compatibility mode, with a trainable unembedding bias,
    kept for the next call with the same config (but ``dtype``, applied by the caller) and device; its
    weights are boot_native's own draw, replaced by every caller."""
    from transformer_lens import TransformerBridge

    fields = {k: v for k, v in cfg_dict.items() if k != "dtype"}
    key = (json.dumps(fields, sort_keys=True, default=str), device)
    if key in _BOOTED:
        return _BOOTED[key]
    cfg = bridge_config(fields)
    cfg.device = device  # the analyses read ``model.cfg.device``
    with torch.random.fork_rng(devices=[]):  # boot_native's own draw is replaced: it must not move the RNG
        bridge = TransformerBridge.boot_native(cfg, device=device)
    head = bridge.unembed.original_component
    bias = head._buffers.pop("bias")  # the bridge's fixed zero b_U -> a parameter, as in HookedTransformer
    head.bias = torch.nn.Parameter(bias.detach().clone())
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    if len(_BOOTED) >= 8:
        _BOOTED.pop(next(iter(_BOOTED)))
    _BOOTED[key] = bridge
    return bridge


def hooked_parameter_shapes(cfg_dict: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HookedTransformer's trainable parameters for a run's config: name -> shape, in its
    ``named_parameters`` order (LayerNorm weights and biases, per head Q / K / V / O, MLP, unembedding)."""
    c = dict(cfg_dict)
    d, h, dh, d_vocab = c["d_model"], c["n_heads"], c["d_head"], c["d_vocab"]
    ln = c.get("normalization_type") == "LN"  # LNPre and None have no parameters
    shapes: dict[str, tuple[int, ...]] = {"embed.W_E": (d_vocab, d)}
    if c.get("positional_embedding_type", "standard") == "standard":
        shapes["pos_embed.W_pos"] = (c["n_ctx"], d)
    for layer in range(c["n_layers"]):
        p = f"blocks.{layer}."
        for norm in ("ln1",) if c.get("attn_only") else ("ln1", "ln2"):
            if ln:
                shapes |= {p + norm + ".w": (d,), p + norm + ".b": (d,)}
        shapes |= {p + "attn.W_Q": (h, d, dh), p + "attn.W_O": (h, dh, d), p + "attn.b_Q": (h, dh),
                   p + "attn.b_O": (d,), p + "attn.W_K": (h, d, dh), p + "attn.W_V": (h, d, dh),
                   p + "attn.b_K": (h, dh), p + "attn.b_V": (h, dh)}
        if not c.get("attn_only"):
            m = c["d_mlp"]
            shapes |= {p + "mlp.W_in": (d, m), p + "mlp.b_in": (m,), p + "mlp.W_out": (m, d), p + "mlp.b_out": (d,)}
    if ln:
        shapes |= {"ln_final.w": (d,), "ln_final.b": (d,)}
    return shapes | {"unembed.W_U": (d, c.get("d_vocab_out", d_vocab)), "unembed.b_U": (c.get("d_vocab_out", d_vocab),)}


def initial_hooked_state(cfg_dict: dict[str, Any], seed: int | None = None) -> dict[str, torch.Tensor]:
    """The weights a HookedTransformer of this config starts from, without TransformerLens 3
    (``init_mode="gpt2"``, its default and ours): each ``W_`` matrix drawn from
    N(0, initializer_range^2) in ``named_parameters`` order, initializer_range = 0.8 / sqrt(d_model),
    LayerNorm weights 1, biases 0; from the global RNG seeded with ``seed`` (not moved), or from the
    global RNG as it stands (None). In HookedTransformer's state-dict layout with its attention
    buffers. Equal to ``HookedTransformer(cfg)``'s own draw bit for bit (``tests/model/test_cross_major.py``)."""
    if cfg_dict.get("init_mode", "gpt2") != "gpt2" or cfg_dict.get("initializer_range", -1.0) >= 0:
        raise BackendError("only init_mode='gpt2' with the default initializer_range is supported")
    std = 0.8 / np.sqrt(cfg_dict["d_model"])
    state: dict[str, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        for name, shape in hooked_parameter_shapes(cfg_dict).items():
            leaf = name.rsplit(".", 1)[1]
            if leaf.startswith("W_"):
                state[name] = torch.nn.init.normal_(torch.empty(shape), std=std)
            else:
                state[name] = torch.ones(shape) if leaf == "w" else torch.zeros(shape)
    return state | _attention_buffers(cfg_dict["n_layers"])


def _attention_buffers(n_layers: int) -> dict[str, torch.Tensor]:
    """HookedTransformer's attention buffers, as TransformerLens 3.9 saves them: an empty causal-mask
    cache (rebuilt on use) and the masked-score fill value."""
    out: dict[str, torch.Tensor] = {}
    for layer in range(n_layers):
        out[f"blocks.{layer}.attn.mask"] = torch.empty((0, 0), dtype=torch.bool)
        out[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-torch.inf)
    return out


def build_model(cfg_dict: dict[str, Any], backend: str | None = None, seed: int | None = None,
                device: str | torch.device = "cpu") -> Model:
    """A freshly initialised model of a run's config on ``backend`` (None: the default)."""
    if resolve_backend(backend) == "hooked":
        return build_hooked_transformer(cfg_dict, seed=seed, device=device)
    return build_bridge(cfg_dict, seed=seed, device=device)


def model_from_hooked_state(cfg_dict: dict[str, Any], state: dict[str, torch.Tensor], backend: str | None = None,
                            device: str | torch.device = "cpu") -> Model:
    """A model of a run's config on ``backend`` (None: the default) holding ``state``, weights in
    HookedTransformer's layout (a checkpoint, or weights set by hand)."""
    return load_hooked_state_dict(build_model(cfg_dict, backend=backend, device=device), state)


def backend_of(model: Model) -> str:
    """``hooked`` or ``bridge``: which backend built ``model``."""
    return "bridge" if hasattr(model, "original_model") else "hooked"


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes the prefix-sharing fast paths (``plateauscope.model.scoring.shared_prefix_logprobs``,
    :mod:`plateauscope.analysis.prefix`): a forward from a given layer over the new positions only, reading the
    earlier positions' keys and values from frozen TransformerLens key/value cache entries
    (:mod:`plateauscope.model.hooked_forward`).

    True for a HookedTransformer with learned absolute positions (it runs them itself) and for a
    bridge of a model the toolkit builds (``hooked_forward`` runs them through the bridge's hook
    points: its own forward silently ignores a ``past_kv_cache``); not for a bridge of an imported series
    (:func:`boot_causal_lm`: any architecture, in Hugging Face's layout), which runs its own forward, sharing
    positions through Hugging Face's cache (:func:`shares_hf_cache`) and starting at a block
    (:func:`runs_from_layer`). Any other module (e.g. the tests' plain-torch reference) runs full sequences from
    layer 0 and position 0 with the same hooks: exact, just slower. The one place that choice is made.
    """
    from plateauscope.model.fused import unsupported_reason

    if "hooked" in available_backends():
        from transformer_lens import HookedTransformer

        if isinstance(model, HookedTransformer):  # the prefix paths add learned absolute positions themselves
            return model.cfg.positional_embedding_type == "standard"
    # a bridge of another trainer's model (boot_causal_lm) keeps Hugging Face's layout: its own forward
    return hasattr(model, "original_model") and model not in _HF_PARAMETERS and unsupported_reason(model.cfg) is None


def is_causal_lm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a bridge of another trainer's Hugging Face model (:func:`boot_causal_lm`), in its
    layout, rather than a model the toolkit builds (HookedTransformer's layout)."""
    return model in _HF_PARAMETERS


def hf_tensors(model: Model) -> dict[str, torch.Tensor]:
    """A bridge of another trainer's model: its Hugging Face parameters and buffers under their own names, as the
    model held them before the bridge wrapped its modules (without the bridge's split copies of a joint QKV)."""
    return _HF_PARAMETERS[model]


def shares_hf_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a bridge of another trainer's model (:func:`boot_causal_lm`): its runs share a
    prefix of positions through Hugging Face's own key/value cache (the bridge's ``past_key_values``), every
    block run and hooked, so any architecture the bridge loads (rotary positions, grouped-query attention,
    parallel attention and MLP) keeps its own forward."""
    return _HF_CACHE_EXACT.get(model, False)


_HF_CACHE_EXACT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per booted bridge: whether a run after a Hugging Face cache equals the full forward (:func:`_hf_cache_is_exact`)."""


@torch.no_grad()
def _hf_cache_is_exact(bridge: Model, atol: float = 1e-4) -> bool:
    """Whether the bridge's forward honours Hugging Face's key/value cache and ``logits_to_keep``: the logits of
    the fifth of six tokens, run after a cache of the first three and unembedded alone, equal those of the full
    run (some bridge attention components leave the cache empty). Checked once per model, when it is booted; the weights do not change the answer."""
    device = next(bridge.parameters()).device
    tokens = torch.arange(12, device=device).reshape(2, 6) % bridge.cfg.d_vocab
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
        try:
            full = bridge(tokens)
            _, cache = bridge(tokens[:, :3], return_type="logits_and_cache")
            if cache is None or any(getattr(layer, "keys", None) is None for layer in getattr(cache, "layers", [None])):
                return False
            suffix = bridge(tokens[:, 3:], past_key_values=cache, logits_to_keep=torch.tensor([1], device=device))
        except (TypeError, ValueError, RuntimeError, NotImplementedError, AttributeError):
            return False
    return suffix.shape[1] == 1 and bool((suffix - full[:, 4:5]).abs().max() <= atol * max(1.0, float(full.abs().max())))


def runs_from_layer(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` may start at a block, on the residual stream entering it, and equal the full
    forward: every model that shares prefixes (:func:`shares_prefixes`), and a bridge of another trainer's model
    (:func:`boot_causal_lm`) whose own forward passed :func:`_from_layer_is_exact` when it was booted
    (:func:`run_causal_lm`: the blocks below passed through, every other module its own). The one place that choice
    is made; any other model runs every block."""
    return shares_prefixes(model) or _FROM_LAYER_EXACT.get(model, False)


_FROM_LAYER_EXACT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per booted bridge: whether a run started at a block equals the full forward (:func:`_from_layer_is_exact`)."""

_BLOCK_OUTPUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per booted bridge: how many elements its blocks return (0: a bare tensor), seen in a real call: it differs
between families and Transformers versions (Bloom's blocks return ``(hidden_states, attentions)``)."""


@contextmanager
def blocks_from(model: Model, layer: int) -> Iterator[None]:
    """Inside, the blocks of a bridge of another trainer's model below ``layer`` return their input unchanged, in
    the structure the real block returns, and run no hooks. (The bridge's own ``start_at_layer`` runs them all and
    discards what they produce.)"""
    width = _BLOCK_OUTPUT.get(model, 0)

    def passed_through(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return (hidden_states,) + (None,) * (width - 1) if width else hidden_states

    skipped = list(model.blocks)[:layer]
    try:
        for block in skipped:
            # on the instance, past the bridge's __setattr__ (which would set the wrapped module's forward)
            object.__setattr__(block, "forward", passed_through)
        yield
    finally:
        for block in skipped:
            vars(block).pop("forward", None)


def run_causal_lm(model: Model, tokens: torch.Tensor, pred_index: int, hooks: Iterable[tuple[str, Callable]] = (),
                  past: Any = None, layer: int = 0, resid: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
    """A run of a bridge of another trainer's model on ``tokens`` with ``hooks``, after the positions ``past`` holds
    (a Hugging Face cache, or None): the logits ``[batch, vocab]`` at ``pred_index`` (an index into ``tokens``'
    positions; only that one is unembedded) and the Hugging Face cache after the run. With ``resid`` ``[batch, pos,
    d_model]``, the run starts at block ``layer``, whose input (``hook_resid_pre``, before ``hooks`` there) it is;
    only the embedding runs below it (:func:`blocks_from`: their cache entries stay as ``past`` had them, and
    nothing reads them), and the model's own forward computes positions, masks and rotary tables."""
    from transformer_lens.utilities import get_act_name

    enter = [] if resid is None else [(get_act_name("resid_pre", layer), lambda act, hook: resid)]  # first
    with warnings.catch_warnings(), blocks_from(model, layer):  # transformers renames the argument the bridge passes
        warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
        logits, cache = model.run_with_hooks(tokens, fwd_hooks=enter + list(hooks), return_type="logits_and_cache",
                                             past_key_values=past,
                                             logits_to_keep=torch.tensor([pred_index], device=tokens.device))
    return logits[:, 0], cache


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` and unembeds only those positions: a bridge of another
    trainer's model that passed :func:`_hf_cache_is_exact` or :func:`_from_layer_is_exact` when it was booted."""
    return is_causal_lm(model) and (shares_hf_cache(model) or runs_from_layer(model))


def logits_at(model: Model, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The logits ``[batch, len(positions), vocab]`` of a forward of ``tokens`` at ``positions`` (one index tensor
    for every row): only those are unembedded where the model keeps logits (:func:`keeps_logits`); any other model
    unembeds every position, and they are picked."""
    if keeps_logits(model):
        return model(tokens, logits_to_keep=positions.to(tokens.device))
    return model(tokens)[:, positions.to(tokens.device)]


@contextmanager
def replayed_from(model: Model, layer: int, streams: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside, each forward of a bridge of another trainer's model (:func:`runs_from_layer`) starts at block
    ``layer``: the blocks below pass their input through (:func:`blocks_from`), and the residual stream entering
    ``layer`` is the next of ``streams``, one per forward in order (what an earlier run of the same inputs saw
    there). A forward whose stream is missing or of another shape is a RuntimeError."""
    from transformer_lens.utilities import get_act_name

    feed = iter(streams)

    def put(act: torch.Tensor, hook: Any) -> torch.Tensor:
        given = next(feed, None)
        if given is None or given.shape != act.shape:
            raise RuntimeError(f"no recorded residual stream of shape {tuple(act.shape)} for block {layer}")
        return given.to(act)

    with blocks_from(model, layer), hooks_added(model, [(get_act_name("resid_pre", layer), put)]):
        yield


@torch.no_grad()
def _from_layer_is_exact(bridge: Model, atol: float = 1e-4) -> bool:
    """Whether :func:`run_causal_lm` from the last block gives the logits of the fifth of six tokens of the full
    forward with the same residual stream put in at that block (an arbitrary one: at random initialisation a real
    one is close to a normalised embedding, which would hide a norm or position added to it); also after a Hugging
    Face cache of the first three, where the bridge shares positions through one; and, afterwards, the full
    forward's own logits from the first block (the blocks are whole again). So the blocks take the residual stream
    as their first input and return it first, and nothing else passes between them. Records the blocks' output
    structure (:data:`_BLOCK_OUTPUT`). Checked once per model, when it is booted."""
    from transformer_lens.utilities import get_act_name

    weight = next(bridge.parameters())
    tokens = torch.arange(12, device=weight.device).reshape(2, 6) % bridge.cfg.d_vocab
    last = bridge.cfg.n_layers - 1
    resid = torch.randn(2, 6, bridge.cfg.d_model, generator=torch.Generator().manual_seed(0)).to(weight) * 3 + 1
    seen: dict[str, Any] = {}

    def output(module: torch.nn.Module, args: Any, out: Any) -> None:
        seen.setdefault("out", out)

    def reference(after: int) -> torch.Tensor:  # the full forward, ``resid`` put in at the positions from ``after``
        put = (get_act_name("resid_pre", last), lambda act, hook: torch.cat([act[:, :after], resid[:, after:]], 1))
        with hooks_added(bridge, [put]):
            return bridge(tokens)[:, 4]

    handle = bridge.blocks[0].register_forward_hook(output)
    try:
        full = bridge(tokens)[:, 4]
        _BLOCK_OUTPUT[bridge] = len(seen["out"]) if isinstance(seen["out"], tuple) else 0
        pairs = [(run_causal_lm(bridge, tokens, 4, layer=last, resid=resid)[0], reference(0))]
        if shares_hf_cache(bridge):
            past = run_causal_lm(bridge, tokens[:, :3], 2)[1]
            pairs.append((run_causal_lm(bridge, tokens[:, 3:], 1, past=past, layer=last, resid=resid[:, 3:])[0],
                          reference(3)))
        pairs.append((run_causal_lm(bridge, tokens, 4)[0], full))
    except (TypeError, ValueError, RuntimeError, NotImplementedError, AttributeError, KeyError, IndexError):
        return False
    finally:
        handle.remove()
    return all(ours.shape == theirs.shape
               and bool((ours - theirs).abs().max() <= atol * max(1.0, float(theirs.abs().max())))
               for ours, theirs in pairs)


_HOOK_POINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hook_point(model: Model, name: str) -> Any:
    """The model's hook point ``name`` (HookedTransformer's names on either backend). The bridge
    builds its ``hook_dict`` afresh, aliases included, at every access; the points themselves are
    fixed when the model is built, so they are looked up once per model."""
    if backend_of(model) == "hooked":
        return model.mod_dict[name]
    points = _HOOK_POINTS.get(model)
    if points is None:
        points = _HOOK_POINTS[model] = model.hook_dict
    return points[name]


@contextmanager
def hooks_added(model: Model, hooks: list[tuple[str, Callable]]) -> Iterator[None]:
    """``run_with_hooks``'s hooks for the forward passes inside, removed from those hook points only
    at the end (``run_with_hooks`` resets every hook point of the model after each pass: on the
    prefix-sharing paths, many small passes, that was 4% of an evaluation)."""
    points = [hook_point(model, name) for name, _ in hooks]
    try:
        for point, (_, fn) in zip(points, hooks):
            point.add_hook(fn)
        yield
    finally:
        for point in {id(p): p for p in points}.values():
            point.remove_hooks("fwd")


# ---- weights in HookedTransformer's layout -------------------------------------------------


def load_hooked_state_dict(model: Model, state: dict[str, torch.Tensor]) -> Model:
    """Load a checkpoint in HookedTransformer's layout into ``model`` (either backend)."""
    if backend_of(model) == "hooked":  # the attention buffers are rebuilt from the config, whatever their saved shape
        model.load_state_dict({k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}, strict=False)
        return model
    params = hooked_parameters(model)  # views of the bridge's own parameters, in this layout
    weights = {k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}
    if weights.keys() == params.keys() and all(params[k].shape == v.shape for k, v in weights.items()):
        with torch.no_grad():  # copied through the views: a tenth of the time of converting the whole dict
            for k, v in weights.items():
                params[k].copy_(v)
        return model
    from transformer_lens.utilities.tl_checkpoint_conversion import (
        convert_tl_checkpoint,
    )

    converted = convert_tl_checkpoint(state, model.cfg)
    device = next(model.parameters()).device
    model.load_state_dict({k: v.to(device) for k, v in converted.items()}, strict=True)
    return model


def _ht_suffix(suffix: str, t: torch.Tensor, h: int) -> tuple[str, torch.Tensor]:
    """One bridge parameter (key suffix after the module path, tensor) in HookedTransformer's layout:
    the inverse of ``convert_tl_checkpoint`` for the parameters our model has."""
    per_head_in = {"q.weight": "W_Q", "k.weight": "W_K", "v.weight": "W_V"}
    per_head_bias = {"q.bias": "b_Q", "k.bias": "b_K", "v.bias": "b_V"}
    if suffix in per_head_in:
        return per_head_in[suffix], einops.rearrange(t, "(h d) m -> h m d", h=h)
    if suffix in per_head_bias:
        return per_head_bias[suffix], einops.rearrange(t, "(h d) -> h d", h=h)
    if suffix == "o.weight":
        return "W_O", einops.rearrange(t, "m (h d) -> h d m", h=h)
    if suffix.endswith(".weight"):  # in / out: nn.Linear [out, in] -> HookedTransformer [in, out]
        return {"in.weight": "W_in", "out.weight": "W_out"}[suffix], t.T
    return {"o.bias": "b_O", "in.bias": "b_in", "out.bias": "b_out"}[suffix], t


def hooked_parameters(model: Model) -> dict[str, torch.Tensor]:
    """The model's trainable parameters under HookedTransformer's names and in its layout: the
    parameters themselves (HookedTransformer), or views of them that gradients flow through
    (the bridge). What :func:`plateauscope.model.fused.fused_logits` reads."""
    if backend_of(model) == "hooked":
        return dict(model.named_parameters())
    return _bridge_in_hooked_layout(_bridge_parameters(model).items(), model.cfg.n_heads)


_BRIDGE_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bridge_parameters(model: Model) -> dict[str, torch.Tensor]:
    """The bridge's parameters under its ``state_dict`` names (``blocks.0.attn.q.weight``), looked up
    once per model: the bridge's ``state_dict`` walks its whole module tree (8 ms on the demo model),
    and the fast paths ask for the parameters at every block. Loading weights, ``.to`` and the
    optimiser change the parameters in place, so the same objects stay valid."""
    named = _BRIDGE_PARAMETERS.get(model)
    if named is None:
        named = _BRIDGE_PARAMETERS[model] = dict(model.state_dict(keep_vars=True))
    return named


def _bridge_in_hooked_layout(named: Iterable[tuple[str, torch.Tensor]], n_heads: int) -> dict[str, torch.Tensor]:
    """A bridge's ``state_dict`` items renamed and rearranged into HookedTransformer's layout (views
    where the layout allows)."""
    top = {"embed.weight": "embed.W_E", "pos_embed.weight": "pos_embed.W_pos",
           "ln_final.weight": "ln_final.w", "ln_final.bias": "ln_final.b"}
    out: dict[str, torch.Tensor] = {}
    for key, t in named:
        if key in top:
            out[top[key]] = t
        elif key == "unembed.weight":
            out["unembed.W_U"] = t.T
        elif key == "unembed.bias":
            out["unembed.b_U"] = t
        else:  # blocks.L.<module>.<param>
            _, layer, module, rest = key.split(".", 3)
            prefix = f"blocks.{layer}.{module}."
            if module.startswith("ln"):
                out[prefix + {"weight": "w", "bias": "b"}[rest]] = t
            else:
                name, value = _ht_suffix(rest, t, n_heads)
                out[prefix + name] = value
    return out


def hooked_state_dict(model: Model) -> dict[str, torch.Tensor]:
    """The model's weights in HookedTransformer's state-dict layout (what checkpoints hold)."""
    if backend_of(model) == "hooked":
        return model.state_dict()
    cfg = model.cfg
    out = _bridge_in_hooked_layout(((k, t.detach()) for k, t in model.state_dict().items()), cfg.n_heads)
    out |= _attention_buffers(cfg.n_layers)
    return {k: v.contiguous() for k, v in out.items()}


# ---- optimiser states in HookedTransformer's layout ----------------------------------------

_CONFIG_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab", "d_vocab_out",
                  "normalization_type", "positional_embedding_type", "attn_only")


def _bridge_keys(model: Model) -> list[str]:
    """The bridge's ``state_dict`` key of each of ``model.parameters()``, in that order."""
    key_of = {id(t): key for key, t in _bridge_parameters(model).items()}
    return [key_of[id(p)] for p in model.parameters()]


def hooked_parameter_names(model: Model) -> list[str]:
    """The HookedTransformer name of each of ``model.parameters()``, in that order."""
    if backend_of(model) == "hooked":
        return [name for name, _ in model.named_parameters()]
    return [next(iter(_bridge_in_hooked_layout([(key, p)], model.cfg.n_heads)))
            for key, p in zip(_bridge_keys(model), model.parameters())]


def _hooked_order(model: Model) -> dict[str, int]:
    """HookedTransformer's parameter index of each name (its ``named_parameters`` order)."""
    cfg = {name: getattr(model.cfg, name) for name in _CONFIG_FIELDS}
    return {name: i for i, name in enumerate(hooked_parameter_shapes(cfg))}


def hooked_optimizer_state(model: Model, state: dict) -> dict:
    """An optimiser ``state_dict`` over ``model.parameters()`` (one parameter group) with its
    per-parameter tensors in HookedTransformer's order and layout: what resume states hold, so that a
    run resumes on either backend (:func:`backend_optimizer_state` is the inverse)."""
    if backend_of(model) == "hooked":
        return state
    (group,) = state["param_groups"]
    names, order, keys = hooked_parameter_names(model), _hooked_order(model), _bridge_keys(model)
    moved: dict[int, dict] = {}
    for i, per_param in state["state"].items():
        moved[order[names[i]]] = {k: _bridge_in_hooked_layout([(keys[i], v)], model.cfg.n_heads)[names[i]].contiguous()
                                  if torch.is_tensor(v) and v.dim() else v for k, v in per_param.items()}
    return {"state": moved, "param_groups": [{**group, "params": sorted(order[names[i]] for i in group["params"])}]}


def backend_optimizer_state(model: Model, state: dict) -> dict:
    """The inverse of :func:`hooked_optimizer_state`: a state in HookedTransformer's order and layout,
    for an optimiser over ``model.parameters()``."""
    if backend_of(model) == "hooked":
        return state
    (group,) = state["param_groups"]
    names, order, keys = hooked_parameter_names(model), _hooked_order(model), _bridge_keys(model)
    params = list(model.parameters())
    moved: dict[int, dict] = {}
    for i, p in enumerate(params):
        per_param = state["state"].get(order[names[i]])
        if per_param is None:
            continue
        converted = {}
        for k, v in per_param.items():
            if torch.is_tensor(v) and v.dim():
                out = torch.empty_like(p, dtype=v.dtype)  # written through its view in HookedTransformer's layout
                _bridge_in_hooked_layout([(keys[i], out)], model.cfg.n_heads)[names[i]].copy_(v)
                v = out
            converted[k] = v
        moved[i] = converted
    return {"state": moved, "param_groups": [{**group, "params": list(range(len(params)))}]}


# ---- causal language models of other trainers (imported series) ----------------------------


_NOT_ATTENTION_LMS = ("Mamba", "Mamba2", "FalconMamba", "Bamba", "Jamba", "Zamba2", "Rwkv", "RWKV7", "RecurrentGemma",
                      "HyenaDNA", "NemotronH", "FalconH1", "GraniteMoeHybrid", "OlmoHybrid", "Qwen3Next", "Lfm2",
                      "Lfm2Moe", "DreamModel", "LLaDA", "GiddForDiffusionLM", "BD3LM", "T5")
"""Architectures of TransformerLens 4's bridge that are not causal attention transformers (state-space,
recurrent and hybrid models, diffusion language models): the analyses' hooks assume attention in every block."""


def supported_causal_lms() -> tuple[str, ...]:
    """The Hugging Face architectures (``config.json``'s ``architectures``) an imported series may have: the
    decoder-only causal attention language models that TransformerLens 4's bridge supports."""
    resolve_backend("bridge")
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return tuple(sorted(name for name in SUPPORTED_ARCHITECTURES
                        if name.endswith(("ForCausalLM", "LMHeadModel")) and name != "BertLMHeadModel"
                        and not name.startswith(_NOT_ATTENTION_LMS)))


_HF_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""A booted bridge's Hugging Face tensors under their Hugging Face names (the bridge wraps each module)."""


def load_tokenizer(folder: str | None) -> Any:
    """The Hugging Face tokenizer saved in ``folder`` (offline), or None for None; a folder whose tokenizer
    files cannot be read is a one-line BackendError naming it."""
    if folder is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise BackendError(f"{folder}: the tokenizer cannot be read ({' '.join(str(e).split())[:200]})") from None


def boot_causal_lm(config_dir: str, device: str | torch.device = "cpu", tokenizer_dir: str | None = None) -> Model:
    """A TransformerLens 4 bridge of the Hugging Face causal language model whose ``config.json`` is in
    ``config_dir``, with freshly initialised weights (the caller loads a checkpoint's into
    ``model.original_model``), in compatibility mode (HookedTransformer's hook names, no weight processing).
    ``tokenizer_dir``: a folder with the model's tokenizer files, or None (token ids only). Offline: nothing
    is fetched from a hub. Built once per series; each checkpoint's weights are loaded into it."""
    resolve_backend("bridge")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir, local_files_only=True)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # the draw is replaced: keep the RNG
        warnings.simplefilter("ignore")
        hf_model = AutoModelForCausalLM.from_config(config).to(device)
        _add_lm_head_bias(hf_model, config)
        hf_tensors = dict(hf_model.state_dict(keep_vars=True))  # before the bridge wraps the modules
        tokenizer = load_tokenizer(tokenizer_dir)
        with _no_tokenizer_search(tokenizer is None):
            bridge = TransformerBridge.boot_transformers(str(config_dir), hf_model=hf_model, tokenizer=tokenizer,
                                                         device=device)
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    bridge.cfg.device = str(device)
    _HF_PARAMETERS[bridge] = hf_tensors
    _HF_RENAME[bridge] = _checkpoint_renaming(hf_model, hf_tensors)
    _HF_CACHE_EXACT[bridge] = _hf_cache_is_exact(bridge.eval())
    _FROM_LAYER_EXACT[bridge] = _from_layer_is_exact(bridge)
    return bridge


LM_HEAD_BIAS = "plateauscope_lm_head_bias"
"""A config field of an imported series: the unembedding has a bias, which Hugging Face's GPT-2 lacks
(TransformerLens trains ``unembed.b_U``; :mod:`plateauscope.sources.tl_checkpoint`)."""


def _add_lm_head_bias(hf_model: torch.nn.Module, config: Any) -> None:
    """Give the model's ``lm_head`` a trainable bias (zeros) where its config's :data:`LM_HEAD_BIAS` asks for one;
    the bridge runs ``lm_head``'s own forward, so the bias reaches the logits."""
    head = hf_model.get_output_embeddings()
    if getattr(config, LM_HEAD_BIAS, False) and isinstance(head, torch.nn.Linear) and head.bias is None:
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features, device=head.weight.device,
                                                   dtype=head.weight.dtype))


_HF_RENAME: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""A booted bridge's renaming of checkpoint keys into its Hugging Face names."""


def _checkpoint_renaming(hf_model: torch.nn.Module, names: dict[str, torch.Tensor]) -> Callable[[str], str]:
    """The renaming ``from_pretrained`` applies to a checkpoint's keys (legacy names, e.g. GPT-NeoX's
    ``embed_out`` -> ``lm_head``; the base model's prefix added or dropped)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [t for t in get_model_conversion_mapping(hf_model) if isinstance(t, WeightRenaming)]
    prefix = getattr(hf_model, "base_model_prefix", None)
    return lambda key: key if key in names else rename_source_key(key, renamings, [], prefix, names)[0]


@contextmanager
def _no_tokenizer_search(skip: bool) -> Iterator[None]:
    """Without a tokenizer (a model of token ids), stop ``boot_transformers`` from looking for one in the
    config folder (a Llama folder without tokenizer files fails there): it skips the search for audio and
    vision models, and here for this boot too."""
    if not skip:
        yield
        return
    from unittest import mock

    from transformer_lens.model_bridge.sources.transformers import source

    with mock.patch.object(source, "skip_tokenizer_for_modality", lambda cfg: True):
        yield


def load_causal_lm_state(model: Model, state: dict[str, torch.Tensor]) -> Model:
    """Copy a Hugging Face state dict (``model.safetensors`` names) into a bridge from :func:`boot_causal_lm`,
    in place (no new tensors: a series loaded checkpoint after checkpoint keeps its memory flat). A tied
    ``lm_head.weight`` may be absent from the file; buffers (masks, rotary tables) keep the model's own."""
    params, rename = _HF_PARAMETERS[model], _HF_RENAME[model]
    state = merged_experts({rename(k): v for k, v in state.items()})
    check_causal_lm_shapes(model, {k: tuple(v.shape) for k, v in state.items()})
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)
        _resplit_joint_qkv(model)
    return model


_EXPERT_KEY = re.compile(r"(.+\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight")
EXPERT_PARTS = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
"""A mixture of experts' per-expert weight names in a checkpoint (Mixtral's ``w1`` / ``w3`` / ``w2``; OLMoE's and
Qwen2-MoE's ``gate_proj`` / ``up_proj`` / ``down_proj``) -> the part of the expert each is."""


def merged_experts(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's per-expert tensors (``...experts.E.w1.weight``: how Transformers saves a mixture of experts)
    merged into the fused parameters its modules hold, as ``from_pretrained``'s converters do: ``experts.gate_up_proj``
    ``[E, 2 * I, H]`` (each expert's gate rows, then its up rows) and ``experts.down_proj`` ``[E, H, I]``. The values
    may be tensors or shapes (tuples); anything else passes unchanged."""
    parts: dict[str, dict[str, dict[int, Any]]] = {}
    out: dict[str, Any] = {}
    for key, value in state.items():
        match = _EXPERT_KEY.fullmatch(key)
        if match is None:
            out[key] = value
        else:
            parts.setdefault(match[1], {}).setdefault(EXPERT_PARTS[match[3]], {})[int(match[2])] = value
    for prefix, by_part in parts.items():
        if set(by_part) != {"gate", "up", "down"} or len({len(v) for v in by_part.values()}) != 1:
            raise BackendError(f"{prefix}: the experts' weights are incomplete (found {sorted(by_part)})")
        gate, up, down = ([by_part[p][e] for e in sorted(by_part[p])] for p in ("gate", "up", "down"))
        if isinstance(gate[0], tuple):
            out[f"{prefix}.gate_up_proj"] = (len(gate), gate[0][0] + up[0][0], gate[0][1])
            out[f"{prefix}.down_proj"] = (len(down), *down[0])
        else:
            out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
            out[f"{prefix}.down_proj"] = torch.stack(down)
    return out


def check_causal_lm_shapes(model: Model, shapes: dict[str, tuple[int, ...]]) -> None:
    """A BackendError (one line) unless a checkpoint of these tensor names and shapes (``model.safetensors``
    names, or the model's own) fits a bridge from :func:`boot_causal_lm`: every parameter present (a tied
    ``lm_head.weight`` may be absent), nothing unknown, every shape the model's."""
    params, rename = _HF_PARAMETERS[model], _HF_RENAME[model]
    shapes = merged_experts({rename(k): tuple(v) for k, v in shapes.items()})
    names = {k for k, t in params.items() if isinstance(t, torch.nn.Parameter)}
    unexpected = sorted(k for k in shapes if k not in params)
    tied = {"lm_head.weight"} if getattr(model.original_model.config, "tie_word_embeddings", False) else set()
    missing = sorted(names - set(shapes) - tied)
    if missing or unexpected:
        raise BackendError(f"the weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for k, shape in shapes.items():
        if tuple(params[k].shape) != shape:
            raise BackendError(f"the weights do not fit the model: {k} has shape {shape}, "
                               f"the model {tuple(params[k].shape)}")


def _resplit_joint_qkv(model: Model) -> None:
    """Refresh the separate q / k / v copies that the bridge cuts from a joint QKV weight (GPT-2's ``c_attn``,
    GPT-NeoX's ``query_key_value``) when it is booted: they are copies, not views, so new weights reach its
    forward only through them."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
        JointQKVAttentionBridge,
    )

    for module in model.modules():
        if isinstance(module, JointQKVAttentionBridge):
            for target, fresh in zip((module.q, module.k, module.v), module.split_qkv_matrix(module.original_component)):
                target.original_component.load_state_dict(fresh.state_dict())
