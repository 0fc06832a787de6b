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

import functools
import importlib.metadata
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import einops
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
    HookedTransformer, no weight processing), with a trainable unembedding bias; weights
    initialised from ``seed`` when given (boot_native's GPT-2 style init)."""
    resolve_backend("bridge")
    from transformer_lens import TransformerBridge

    cfg = bridge_config(cfg_dict)
    cfg.seed, cfg.device = seed, str(device)  # the analyses read ``model.cfg.device``
    bridge = TransformerBridge.boot_native(cfg, device=str(device))
    head = bridge.unembed.original_component
    bias = head._buffers.pop("bias")  # the bridge's fixed zero b_U -> a parameter, as in HookedTransformer
    head.bias = torch.nn.Parameter(bias.detach().clone())
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge


def build_model(cfg_dict: dict[str, Any], backend: str | None = None, seed: int | None = None,
                device: str | torch.device = "cpu") -> Model:
    """A freshly initialised model of a run's config on ``backend`` (None: the default)."""
    if resolve_backend(backend) == "hooked":
        return build_hooked_transformer(cfg_dict, seed=seed, device=device)
    return build_bridge(cfg_dict, seed=seed, device=device)


def backend_of(model: Model) -> str:
    """``hooked`` or ``bridge``: which backend built ``model``."""
    return "bridge" if hasattr(model, "original_model") else "hooked"


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes the prefix-sharing fast paths (``plateauscope.training.scoring.shared_prefix_logprobs``,
    :mod:`plateauscope.analysis.prefix`): a forward from a given layer over the new positions only, reading the
    earlier positions' keys and values from frozen TransformerLens key/value cache entries
    (``forward(start_at_layer=..., past_kv_cache=...)``, ``embed`` / ``pos_embed`` / ``input_to_embed``).

    True only for a HookedTransformer with learned absolute positions. The bridge (TransformerLens 4.3) has ``input_to_embed`` and
    ``start_at_layer``, but its forward silently ignores a ``past_kv_cache`` (it takes a Hugging Face
    ``past_key_values``) and its ``pos_embed`` takes no offset, so it (and any
    other module, e.g. the ensemble's functional template) runs full sequences from layer 0 and
    position 0 with the same hooks: exact, just slower. The one place that choice is made.
    """
    if "hooked" not in available_backends():
        return False
    from transformer_lens import HookedTransformer

    # the prefix paths add learned absolute positions (``pos_embed`` at an offset) themselves
    return isinstance(model, HookedTransformer) and model.cfg.positional_embedding_type == "standard"


@contextmanager
def hooks_added(model: Model, hooks: list[tuple[str, Callable]]) -> Iterator[None]:
    """``run_with_hooks``'s hooks for the forward passes inside, removed from those hook points only
    at the end (``run_with_hooks`` resets every hook point of the model after each pass: on the
    prefix-sharing paths, many small passes, that was 4% of an evaluation)."""
    points = [model.mod_dict[name] for name, _ in hooks]
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
    (the bridge). What :func:`plateauscope.training.fused.fused_logits` reads."""
    if backend_of(model) == "hooked":
        return dict(model.named_parameters())
    # the bridge's state_dict names (``blocks.0.attn.q.weight``); keep_vars: the parameters themselves
    return _bridge_in_hooked_layout(model.state_dict(keep_vars=True).items(), model.cfg.n_heads)


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
    # HookedTransformer's attention buffers, as TransformerLens 3.9 saves them: an empty causal-mask
    # cache (rebuilt on use) and the masked-score fill value.
    for layer in range(cfg.n_layers):
        out[f"blocks.{layer}.attn.mask"] = torch.empty((0, 0), dtype=torch.bool)
        out[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-torch.inf)
    return {k: v.contiguous() for k, v in out.items()}
