"""A plain-torch re-implementation of our HookedTransformer's forward, for the backend tests.

Neither TransformerLens model class is used: the maths (embeddings, LayerNorm, causal attention,
GELU MLP, unembedding, in HookedTransformer's unprocessed coordinates) is written out here from
the checkpoint's HookedTransformer-layout tensors, ``blocks.L.attn.W_Q`` [head, d_model, d_head]
and so on. Only the hook plumbing (``HookPoint`` / ``HookedRootModule``: ``run_with_cache``,
``run_with_hooks``, ``hooks``) comes from ``transformer_lens.hook_points``, which both
TransformerLens 3.x and 4.x ship, so the same reference runs in both test environments and the
analyses in ``interp`` run on it unchanged. It has the hooks the analyses use, with
HookedTransformer's names and shapes: ``hook_resid_pre``, ``attn.hook_pattern`` [batch, head,
q, k], ``attn.hook_z`` [batch, pos, head, d_head], ``hook_attn_out``, ``hook_mlp_out``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

LN_EPS = 1e-5
"""HookedTransformerConfig's default ``eps``."""


def _layer_norm(x: Float[Tensor, "... d"], w: Tensor, b: Tensor) -> Float[Tensor, "... d"]:
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + LN_EPS).sqrt() * w + b


class RefAttention(nn.Module):
    """Causal multi-head attention with per-head weights, hooks ``hook_pattern`` and ``hook_z``."""

    def __init__(self):
        super().__init__()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()


class RefBlock(nn.Module):
    """Pre-LN block: resid_pre -> + attention -> + MLP."""

    def __init__(self):
        super().__init__()
        self.attn = RefAttention()
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_mlp_out = HookPoint()


class ReferenceModel(HookedRootModule):
    """The forward of a run's model from its HookedTransformer-layout weights (read-only)."""

    def __init__(self, cfg_dict: dict[str, Any], state: dict[str, Tensor]):
        super().__init__()
        assert cfg_dict["act_fn"] == "gelu" and cfg_dict["normalization_type"] == "LN"
        self.cfg = SimpleNamespace(n_layers=cfg_dict["n_layers"], n_heads=cfg_dict["n_heads"],
                                   d_head=cfg_dict["d_head"], device="cpu")
        expected = self.expected_keys(cfg_dict["n_layers"])
        if set(state) != expected:
            raise ValueError(f"not a HookedTransformer-layout state dict: {sorted(set(state) ^ expected)}")
        # Parameters (the analyses ask ``next(model.parameters())`` for the device; attribution
        # patching differentiates through them, as through any model); the
        # attention buffers ``mask`` / ``IGNORE`` are not needed: the causal mask is built below.
        self.w = {k: nn.Parameter(v.detach().float().clone())
                  for k, v in state.items() if not k.endswith((".mask", ".IGNORE"))}
        self.weights = nn.ParameterList(self.w.values())
        self.blocks = nn.ModuleList([RefBlock() for _ in range(cfg_dict["n_layers"])])
        self.setup()

    @staticmethod
    def expected_keys(n_layers: int) -> set[str]:
        """The keys of HookedTransformer.state_dict() for our model (LN, GELU MLP, learned positions)."""
        per_block = ["ln1.w", "ln1.b", "ln2.w", "ln2.b", "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out",
                     *[f"attn.{p}" for p in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "mask", "IGNORE")]]
        return ({f"blocks.{i}.{k}" for i in range(n_layers) for k in per_block}
                | {"embed.W_E", "pos_embed.W_pos", "ln_final.w", "ln_final.b", "unembed.W_U", "unembed.b_U"})

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
        w = self.w
        n_pos = tokens.shape[1]
        x = w["embed.W_E"][tokens] + w["pos_embed.W_pos"][:n_pos]
        causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
        for i, block in enumerate(self.blocks):
            p = f"blocks.{i}."
            x = block.hook_resid_pre(x)
            h = _layer_norm(x, w[p + "ln1.w"], w[p + "ln1.b"])
            q = torch.einsum("bpm,hmd->bphd", h, w[p + "attn.W_Q"]) + w[p + "attn.b_Q"]
            k = torch.einsum("bpm,hmd->bphd", h, w[p + "attn.W_K"]) + w[p + "attn.b_K"]
            v = torch.einsum("bpm,hmd->bphd", h, w[p + "attn.W_V"]) + w[p + "attn.b_V"]
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.cfg.d_head)
            pattern = block.attn.hook_pattern(scores.masked_fill(~causal, float("-inf")).softmax(-1))
            z = block.attn.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
            x = x + block.hook_attn_out(torch.einsum("bqhd,hdm->bqm", z, w[p + "attn.W_O"]) + w[p + "attn.b_O"])
            h = _layer_norm(x, w[p + "ln2.w"], w[p + "ln2.b"])
            mlp = F.gelu(h @ w[p + "mlp.W_in"] + w[p + "mlp.b_in"]) @ w[p + "mlp.W_out"] + w[p + "mlp.b_out"]
            x = x + block.hook_mlp_out(mlp)
        return _layer_norm(x, w["ln_final.w"], w["ln_final.b"]) @ w["unembed.W_U"] + w["unembed.b_U"]
