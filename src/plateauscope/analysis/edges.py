"""Edges of the residual-stream graph: attribution of every edge, exact patching of single edges,
and the smallest faithful circuit.

Graph (:class:`EdgeGraph`). *Senders* write into the residual stream: the embeddings (token plus
position, one node), every attention head (its output ``z @ W_O``; the attention output bias is
the same in every run and belongs to no edge) and every MLP. *Receivers* read it: each head's
query, key and value inputs (three receivers), each MLP's input and the logits (the final
residual stream). An edge joins a sender to every receiver downstream of it: a head of layer l
reads the embeddings and every head and MLP of the layers before l; the MLP of layer l also reads
the heads of layer l (not where attention and MLP run in parallel, GPT-NeoX's: there it reads what
the heads read); the logits read every sender. An attention-only model has no MLP nodes.

Patching edges (:func:`patch_edges`, the one generic function). Run a *base* prompt set; at each
receiver, for every sender whose edge to it is patched, replace what the receiver reads from
that sender (its output in this run) by its output in a *source* run. Nothing else changes, so
downstream senders see the consequences. Two uses, both thin wrappers:

* exact patching of one edge (:func:`patch_each_edge`): base = the corrupted prompts, source = the
  clean run, one edge patched. The receiver sees the sender as in the clean run and every other
  path stays corrupted (path patching of that edge alone);
* faithfulness of a circuit C (:func:`faithfulness`): base = the clean prompts, source = the
  corrupted run, every edge outside C patched. All edges in C give 1, no edge gives 0.

Metric and sign: as in :mod:`plateauscope.analysis.patch`, the task's logit difference (clean answer minus
corrupted answer) at the prediction position, averaged over pairs; normalised as
``(patched - corrupt) / (clean - corrupt)`` (1 = clean, 0 = corrupted; NaN when the two differ by
less than 1e-6).

Attribution (:func:`edge_attribution`; edge attribution patching, Syed et al. 2023). The first-order
term of the exact single-edge patch: ``(clean - corrupted sender output) . d metric / d receiver
input`` on the corrupted run, summed over positions and pairs (the metric is the pair mean). One
clean forward and one corrupted forward and backward give every edge. Exact where the metric is
linear in the receiver's input; otherwise its error is second order (through LayerNorm, softmax
attention and the MLP), so the strongest edges are also patched exactly and the agreement reported.

The circuit at a checkpoint (:func:`faithful_circuit`): the k edges of largest |attribution|, with
k the smallest whose faithfulness reaches the target (0.8 by default). Faithfulness is not monotone
in k (edges ranked by |attribution| include edges that push the wrong way), so no bisection: the
search doubles k until the target is met, then measures the k below that first hit from 1 upwards,
side by side in batches, until a batch holds a hit: the smallest k that reaches the target. The record says whether the measured
curve was monotone (``monotone``: it never falls by more than :data:`MONOTONE_TOL` as k grows).

Both backends (``use_split_qkv_input`` gives each head its own query, key and value
input; ``use_hook_mlp_in`` the MLP's); both flags are set for the call and restored after it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.attribution import (
    _spearman,
    attribution_results,
    contributions,
    target_specs,
)
from plateauscope.analysis.inputs import PromptPairs, last_logit_diff
from plateauscope.analysis.prefix import (
    RunCache,
    cached_run,
    first_difference,
    forward_from,
    savers,
)
from plateauscope.analysis.results import median
from plateauscope.model.backend import (
    Model,
    hooked_parameters,
    is_causal_lm,
    runs_from_layer,
    shares_hf_cache,
    shares_prefixes,
)
from plateauscope.model.families import family_of, head_input, mlp_input, mlp_reads
from plateauscope.model.fused import layer_norm
from plateauscope.model.heads import head_label
from plateauscope.runs.files import RunError

HEAD_INPUTS = ("q", "k", "v")
"""The three receivers of a head, in the order of :attr:`EdgeGraph.receivers`."""
FAITHFULNESS_TARGET = 0.8
"""Default share of the clean-corrupted metric gap a circuit must recover."""
CIRCUIT_PAIRS = 64
"""Default number of pairs the circuit search measures faithfulness on (each of its ~15 patched
runs costs a forward of these; the ranking it searches comes from all the pairs)."""
MAX_BATCH = 4096
"""Sequences per forward pass when several patches run side by side (copies of the prompt set)."""
PASS_BYTES = 128 * 2**20
"""At most this much for the senders' outputs and their differences that a pass of side-by-side patches holds (two per
patch, sender, sequence, position and width): an imported model's width and prompt lengths would make
:data:`MAX_BATCH` copies take many gigabytes. The pass's own activations grow with it (``bench/imported_analysis.py``
measures the peak)."""



def first_pairs(pairs: PromptPairs, n: int) -> PromptPairs:
    """The first ``n`` pairs (all of them when there are fewer)."""
    return replace(pairs, clean=pairs.clean[:n], corrupt=pairs.corrupt[:n], clean_answer=pairs.clean_answer[:n],
                   corrupt_answer=pairs.corrupt_answer[:n], examples=pairs.examples[:n])


@dataclass(frozen=True)
class EdgeGraph:
    """The nodes and edges of a model's residual-stream graph (module docstring)."""

    n_layers: int
    n_heads: int
    has_mlp: bool
    parallel: bool = False
    """Attention and MLP in parallel (GPT-NeoX, GPT-J): a layer's MLP reads the layer's input, as its heads do,
    so no head of its own layer sends to it."""
    n_kv_heads: int | None = None
    """Grouped keys (Mistral, Qwen2, Gemma 2): the key/value heads, each shared by ``n_heads // n_kv_heads`` query
    heads; None: one per query head. A key or value receiver is then a key/value head, as in TransformerLens's
    ``use_split_qkv_input``: its node is the first query head of its group (``L1H2 (k)`` with groups of two is the
    key input that ``L1H2`` and ``L1H3`` read)."""

    @classmethod
    def of(cls, model: Model) -> EdgeGraph:
        """The graph of ``model``."""
        family = family_of(model)
        return cls(model.cfg.n_layers, model.cfg.n_heads, family.mlp != "none", family.parallel,
                   family.n_kv_heads if family.grouped else None)

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without grouped keys)."""
        return self.n_heads // (self.n_kv_heads or self.n_heads)

    def reads_keys(self, head: int) -> bool:
        """Whether ``head`` stands for a key/value head's receivers (the first query head of its group)."""
        return head % self.group == 0

    @cached_property
    def senders(self) -> list[tuple[str, int]]:
        """``(node id, rank)`` in forward order; a sender is upstream of a receiver of lower rank."""
        out = [("embed", -1)]
        for layer in range(self.n_layers):
            out += [(head_label(layer, h), 2 * layer) for h in range(self.n_heads)]
            out += [(f"MLP{layer}", 2 * layer + 1)] if self.has_mlp else []
        return out

    @cached_property
    def receivers(self) -> list[tuple[str, str, int]]:
        """``(node id, input, rank)``: input ``q`` / ``k`` / ``v`` of a head, ``mlp`` or ``logits``."""
        out = []
        for layer in range(self.n_layers):
            out += [(head_label(layer, h), x, 2 * layer) for h in range(self.n_heads) for x in HEAD_INPUTS
                    if x == "q" or self.reads_keys(h)]
            out += [(f"MLP{layer}", "mlp", 2 * layer + (0 if self.parallel else 1))] if self.has_mlp else []
        return out + [("logits", "logits", 2 * self.n_layers)]

    @cached_property
    def edges(self) -> list[tuple[int, int]]:
        """``(sender index, receiver index)`` of every edge, receivers in forward order."""
        return [(s, r) for r, (_, _, r_rank) in enumerate(self.receivers)
                for s, (_, s_rank) in enumerate(self.senders) if s_rank < r_rank]

    def edge_names(self) -> list[dict[str, str]]:
        """``{"sender", "receiver", "input"}`` of every edge, in order."""
        return [{"sender": self.senders[s][0], "receiver": self.receivers[r][0], "input": self.receivers[r][1]}
                for s, r in self.edges]

    def nodes(self) -> list[dict[str, Any]]:
        """Every node with its kind, layer (embeddings -1, logits ``n_layers``) and head (or None)."""
        out: list[dict[str, Any]] = [{"id": "embed", "kind": "embed", "layer": -1, "head": None}]
        for layer in range(self.n_layers):
            out += [{"id": head_label(layer, h), "kind": "head", "layer": layer, "head": h} for h in range(self.n_heads)]
            out += [{"id": f"MLP{layer}", "kind": "mlp", "layer": layer, "head": None}] if self.has_mlp else []
        return out + [{"id": "logits", "kind": "logits", "layer": self.n_layers, "head": None}]

    def upstream(self, rank: int) -> list[int]:
        """Indices of the senders a receiver of ``rank`` reads."""
        return [s for s, (_, s_rank) in enumerate(self.senders) if s_rank < rank]

    def dense(self, patched: Bool[Tensor, "M E"]) -> Bool[Tensor, "M S R"]:
        """Edge masks as sender x receiver matrices."""
        out = torch.zeros(patched.shape[0], len(self.senders), len(self.receivers), dtype=torch.bool)
        s, r = torch.tensor(self.edges).T
        out[:, s, r] = patched.cpu()
        return out


@contextmanager
def split_inputs(model: Model) -> Iterator[bool]:
    """Give each head its own q / k / v input hook and the MLP its input hook, for the duration.
    Yields whether the model's attention split its inputs itself (HookedTransformer); where it cannot
    (TransformerLens 4's ``boot_native`` bridge), :func:`emulated_head_inputs` stands in."""
    old = (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in)
    mlp = not model.cfg.attn_only  # TransformerLens refuses the MLP input hook without MLPs
    native = not is_causal_lm(model)  # another trainer's model: its own modules compute each input, emulated
    if native:
        try:
            model.set_use_split_qkv_input(True)
        except NotImplementedError:  # "none of this model's attention bridges support" the split
            native = False
    if mlp:
        model.set_use_hook_mlp_in(True)
    try:
        yield native
    finally:
        if native:
            model.set_use_split_qkv_input(old[0])
        if mlp:
            model.set_use_hook_mlp_in(old[1])


_HEAD_INPUT_HOOK = re.compile(r"blocks\.(\d+)\.hook_([qkv])_input")
_MLP_INPUT_HOOK = re.compile(r"blocks\.(\d+)\.hook_mlp_in")


def edges_refusal(model: Model) -> str | None:
    """Why the edge graph is undefined for ``model``'s family (None: it is defined). A block that normalises the
    attention's (or MLP's) output before adding it to the residual stream (Gemma 2's sandwich norms, OLMo 2's
    post-norm) makes the stream a nonlinear function of the heads' outputs: no head's output is a term of it,
    and an edge from a head has no meaning."""
    block = model.blocks[0]
    if is_causal_lm(model) and any(hasattr(block, n) for n in ("ln1_post", "ln2_post")):
        return (f"edges: {family_of(model).describe()} normalises each attention and MLP output before adding it to "
                "the residual stream, so no head's output is a term of the stream and its edges are undefined")
    return None


def emulated_head_inputs(model: Model, hooks: list[tuple[str, Callable]]) -> list[tuple[str, Callable]]:
    """``hooks`` with every per-head input hook (``blocks.L.hook_q_input`` [batch, pos, head,
    d_model], and ``k``, ``v``) done by hand, for a model whose attention cannot split its inputs.

    As in HookedTransformer with ``use_split_qkv_input``: the layer's residual stream
    (``hook_resid_pre``) is copied per head, the hook sees and may change the copies, and each head's
    query (key, value) is computed from its own copy through ``ln1`` and its ``W_Q``, ``b_Q``; the
    result replaces the model's own at ``attn.hook_q`` (``hook_k``, ``hook_v``). Gradients flow from
    the query back to the copies, so attribution reads them as on HookedTransformer."""
    cfg = model.cfg
    refusal = edges_refusal(model)
    if refusal is not None:
        raise RunError(refusal)
    if is_causal_lm(model):
        return _emulated_inputs_of_modules(model, hooks)
    if family_of(model).grouped:
        raise RunError("edges: grouped keys in a model built here are not emulated; analyse it with --no-edges")
    params = hooked_parameters(model)
    resid: dict[int, Tensor] = {}
    out: list[tuple[str, Callable]] = []
    layers: set[int] = set()

    def save_resid(layer: int) -> Callable:
        def save(act: Tensor, hook) -> None:
            resid[layer] = act
        return save

    def recompute(layer: int, x: str, fn: Callable) -> Callable:
        p = f"blocks.{layer}."
        w, b = params[f"{p}attn.W_{x.upper()}"], params[f"{p}attn.b_{x.upper()}"]

        def replace_projection(act: Tensor, hook) -> Tensor:
            copies = resid[layer][:, :, None, :].expand(-1, -1, cfg.n_heads, -1)
            changed = fn(copies, hook)
            copies = copies if changed is None else changed
            normed = layer_norm(copies, params, p + "ln1", cfg.normalization_type, cfg.eps)
            return torch.einsum("bphm,hmd->bphd", normed, w) + b
        return replace_projection

    for name, fn in hooks:
        match = _HEAD_INPUT_HOOK.fullmatch(name)
        if match is None:
            out.append((name, fn))
            continue
        layer = int(match[1])
        if layer not in layers:
            layers.add(layer)
            out.insert(0, (get_act_name("resid_pre", layer), save_resid(layer)))
        out.append((get_act_name(match[2], layer), recompute(layer, match[2], fn)))
    return out


def _emulated_inputs_of_modules(model: Model, hooks: list[tuple[str, Callable]]) -> list[tuple[str, Callable]]:
    """:func:`emulated_head_inputs` for a bridge of another trainer's model, through its own modules
    (:func:`plateauscope.model.families.head_input` and :func:`~plateauscope.model.families.mlp_input`): each head's
    (key/value head's) input is its own copy of ``hook_resid_pre``, replaced at ``attn.hook_q`` (``hook_k``,
    ``hook_v``); the MLP's is the stream it reads (``hook_resid_pre`` in a parallel block, else
    ``hook_resid_mid``), replaced at ``mlp.hook_in`` after the MLP's norm."""
    family = family_of(model)
    resid: dict[str, Tensor] = {}
    saved: set[str] = set()
    out: list[tuple[str, Callable]] = []

    def save(name: str) -> Callable:
        def keep(act: Tensor, hook) -> None:
            resid[name] = act
        return keep

    def replaced(source: str, n: int | None, compute: Callable[[Tensor], Tensor], fn: Callable) -> Callable:
        def replace_input(act: Tensor, hook) -> Tensor:
            x = resid[source]
            copies = x if n is None else x[:, :, None, :].expand(-1, -1, n, -1)
            changed = fn(copies, hook)
            return compute(copies if changed is None else changed)
        return replace_input

    for name, fn in hooks:
        head, mlp = _HEAD_INPUT_HOOK.fullmatch(name), _MLP_INPUT_HOOK.fullmatch(name)
        if head is None and mlp is None:
            out.append((name, fn))
            continue
        layer = int((head or mlp)[1])
        source = get_act_name("resid_pre" if head else mlp_reads(model), layer)
        if source not in saved:
            saved.add(source)
            out.insert(0, (source, save(source)))
        if head:
            x = head[2]
            n = family.n_heads if x == "q" else family.n_kv_heads
            out.append((get_act_name(x, layer), replaced(source, n, head_input(model, layer, x), fn)))
        else:
            out.append((f"blocks.{layer}.mlp.hook_in", replaced(source, None, mlp_input(model, layer), fn)))
    return out


def _sender_hooks(model: Model, graph: EdgeGraph, out: dict[int, Tensor]) -> list[tuple[str, Callable]]:
    """Hooks that store each sender's output ``[batch, pos, d_model]`` in ``out`` by sender index."""
    index = {name: i for i, (name, _) in enumerate(graph.senders)}

    def embed(act: Tensor, hook) -> None:
        out[0] = act

    def heads(layer: int) -> Callable:
        def save(z: Tensor, hook) -> None:  # [batch, pos, head, d_head] -> each head's output
            result = torch.einsum("bphd,hdm->hbpm", z, model.blocks[layer].attn.W_O)
            for h in range(graph.n_heads):
                out[index[head_label(layer, h)]] = result[h]
        return save

    def mlp(layer: int) -> Callable:
        def save(act: Tensor, hook) -> None:
            out[index[f"MLP{layer}"]] = act
        return save

    hooks = [(get_act_name("resid_pre", 0), embed)]
    for layer in range(graph.n_layers):
        hooks.append((get_act_name("z", layer), heads(layer)))
        if graph.has_mlp:
            hooks.append((get_act_name("mlp_out", layer), mlp(layer)))
    return hooks


def _receiver_hook_names(graph: EdgeGraph) -> list[tuple[str, list[int]]]:
    """``(hook name, receiver indices)`` for every receiver input: per layer q, k, v (one index per
    head), the MLP input, and the final residual stream (the logits)."""
    index = {(name, x): i for i, (name, x, _) in enumerate(graph.receivers)}
    out = []
    for layer in range(graph.n_layers):
        for x in HEAD_INPUTS:
            out.append((get_act_name(f"{x}_input", layer), [index[(head_label(layer, h), x)] for h in range(graph.n_heads)
                                                            if x == "q" or graph.reads_keys(h)]))
        if graph.has_mlp:
            out.append((get_act_name("mlp_in", layer), [index[(f"MLP{layer}", "mlp")]]))
    return out + [(get_act_name("resid_post", graph.n_layers - 1), [index[("logits", "logits")]])]


@dataclass
class EdgeRuns:
    """What every edge computation on one prompt set shares: the graph, the clean run's cache (for
    prefix sharing: positions before ``start`` are the same in every run and are never recomputed,
    :mod:`plateauscope.analysis.prefix`), and the clean and corrupted senders' outputs from ``start`` on."""

    model: Model
    pairs: PromptPairs
    graph: EdgeGraph
    start: int
    base: RunCache
    clean_out: Float[Tensor, "S N new_pos d_model"]
    corrupt_out: Float[Tensor, "S N new_pos d_model"]
    clean: float
    corrupt: float
    corrupt_base: RunCache | None = None
    """The corrupted run as a prefix-sharing base (its residual stream before each layer; the keys
    and values before ``start``, the clean run's, are the same): where a patched run of the corrupted
    prompts starts above layer 0. None where a run cannot start at a block
    (:func:`~plateauscope.model.backend.runs_from_layer`)."""

    @classmethod
    def of(cls, model: Model, pairs: PromptPairs, act_names: tuple[str, ...] | list[str] = ()) -> EdgeRuns:
        """Two forwards (clean, with its cache, and corrupted) of the pairs; the clean cache also
        holds the ``act_names`` activations of every layer."""
        graph = EdgeGraph.of(model)
        pairs = replace(pairs, clean=pairs.clean.to(model.cfg.device), corrupt=pairs.corrupt.to(model.cfg.device))
        # positions shared where the model shares them (its own cache, or Hugging Face's); the corrupted run's
        # residual stream kept where a run may start at a block (forward_from makes the same two choices)
        start = (min(first_difference(pairs.clean, pairs.corrupt), pairs.pred_pos)
                 if shares_prefixes(model) or shares_hf_cache(model) else 0)
        from_layer = runs_from_layer(model)
        clean: dict[int, Tensor] = {}
        corrupt: dict[int, Tensor] = {}  # no receiver is hooked in these two: plain forwards
        resid: dict[str, Tensor] = {}
        names = [get_act_name("resid_pre", layer) for layer in range(graph.n_layers)] if from_layer else []
        with torch.no_grad():
            base = cached_run(model, pairs.clean, pairs.pred_pos, act_names, hooks=_sender_hooks(model, graph, clean))
            last = forward_from(model, pairs.corrupt, base, pairs.pred_pos,
                                _sender_hooks(model, graph, corrupt) + savers(names, resid), start)
        clean_out, corrupt_out = (torch.stack([outs[i] for i in range(len(graph.senders))]) for outs in (clean, corrupt))
        corrupt_base = replace(base, resid_pre=[torch.cat([before[:, :start], resid[n]], 1)
                                                for before, n in zip(base.resid_pre, names)]) if from_layer else None
        return cls(model, pairs, graph, start, base, clean_out[:, :, start:], corrupt_out,
                   last_logit_diff(base.last_logits, pairs).item(), last_logit_diff(last, pairs).item(), corrupt_base)

    def forward(self, tokens: Int[Tensor, "N pos"], hooks: list[tuple[str, Callable]], repeat: int = 1,
                layer: int = 0) -> Float[Tensor, "R vocab"]:
        """Logits at the prediction position of ``tokens`` (repeated) with ``hooks``, each head and
        MLP with its own input hooks; the hooks see the positions from ``start``. ``layer`` > 0:
        ``tokens`` are the corrupted prompts, and the blocks below ``layer`` are the corrupted run's."""
        with split_inputs(self.model) as native:
            hooks = hooks if native else emulated_head_inputs(self.model, hooks)
            return forward_from(self.model, tokens, self.corrupt_base if layer else self.base, self.pairs.pred_pos,
                                hooks, self.start, layer=layer, repeat=repeat)

    def metric(self, last: Float[Tensor, "MN vocab"]) -> Float[Tensor, " M"]:
        """The logit difference of each copy of the pairs in ``last`` (copy-major)."""
        return torch.stack([last_logit_diff(chunk, self.pairs) for chunk in last.split(self.pairs.clean.shape[0])])

    def normalise(self, effect: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        """``effect / (clean - corrupt)`` (an effect is a metric minus the corrupted one); NaN when
        the gap is under 1e-6."""
        gap = self.clean - self.corrupt
        return effect / gap if abs(gap) >= 1e-6 else torch.full_like(effect, math.nan)


def first_layers(graph: EdgeGraph, patched: Bool[Tensor, "M E"]) -> Int[Tensor, " M"]:
    """The first block each set of patched edges changes: the layer of its lowest receiver (the
    logits: the last block; no edge: the last block)."""
    last = graph.n_layers - 1
    layer = torch.tensor([min(graph.receivers[r][2] // 2, last) for _, r in graph.edges])
    return torch.where(patched, layer, last).min(1).values


def patch_edges(runs: EdgeRuns, tokens: Int[Tensor, "N pos"], source: Float[Tensor, "S N new_pos d_model"],
                patched: Bool[Tensor, "M E"], from_corrupt: bool = False) -> Float[Tensor, " M"]:
    """The metric of ``M`` runs of ``tokens``, each with its own set of patched edges: at every
    receiver, the patched senders are read from ``source`` instead of this run. The M runs go side
    by side as copies of the prompt set (at most ``MAX_BATCH`` sequences and ``PASS_BYTES`` of differences a pass).

    ``from_corrupt``: ``tokens`` are the corrupted prompts. Every block below a run's first patched
    receiver is then the corrupted run's, so the run starts at that block (prefix sharing), its
    lower senders read from the corrupted run: runs grouped by that block."""
    if from_corrupt and runs.corrupt_base is not None:
        first = first_layers(runs.graph, patched)
        out = torch.empty(patched.shape[0], dtype=source.dtype, device=source.device)
        for layer in first.unique().tolist():
            rows = first == layer
            out[rows] = _patch_edges_from(runs, tokens, source, patched[rows], layer)
        return out
    return _patch_edges_from(runs, tokens, source, patched, 0)


def _patch_edges_from(runs: EdgeRuns, tokens: Int[Tensor, "N pos"], source: Float[Tensor, "S N new_pos d_model"],
                      patched: Bool[Tensor, "M E"], layer: int) -> Float[Tensor, " M"]:
    """:func:`patch_edges` of runs that change nothing below ``layer`` (> 0: of the corrupted prompts)."""
    graph = runs.graph
    n = tokens.shape[0]
    per_patch = 2 * len(graph.senders) * source[0].numel() * source.element_size()  # its share of ``current`` and ``diff``
    per_pass = max(1, min(MAX_BATCH // n, PASS_BYTES // per_patch))
    if patched.shape[0] > per_pass:
        return torch.cat([_patch_edges_from(runs, tokens, source, chunk, layer) for chunk in patched.split(per_pass)])
    m = patched.shape[0]
    mask = graph.dense(patched).to(source.device, source.dtype)  # [M, S, R]
    # the senders below ``layer`` do not run: their outputs are the corrupted run's, in every copy
    current: dict[int, Tensor] = {s: runs.corrupt_out[s].repeat(m, 1, 1)
                                  for s, (_, rank) in enumerate(graph.senders) if rank < 2 * layer}

    # source minus this run, [M, S, N * pos * d], each sender's filled in once, when a receiver
    # first reads it; a receiver reads the senders before it, the first ones (in forward order)
    diff = torch.empty(m, len(graph.senders), source[0].numel(), dtype=source.dtype, device=source.device)
    filled: set[int] = set()

    def difference(upto: int) -> Tensor:
        for s in range(upto):
            if s not in filled:
                torch.sub(source[s].flatten(), current[s].reshape(m, -1), out=diff[:, s])
                filled.add(s)
        return diff[:, :upto]

    def receiver(indices: list[int], rank: int) -> Callable:
        up = graph.upstream(rank)
        weights = mask[:, up][:, :, indices].transpose(1, 2).contiguous()  # [M, R_here, S_up]
        if not weights.any():  # no sender patched into these receivers
            return lambda act, hook: None

        def patch(act: Tensor, hook) -> Tensor:
            corr = torch.bmm(weights, difference(len(up)))  # [M, R_here, N * pos * d]
            corr = corr.view(m, weights.shape[1], n, *source.shape[2:]).permute(0, 2, 3, 1, 4)  # [M, N, pos, R_here, d]
            if act.ndim == 3:
                return (act.reshape(m, n, *act.shape[1:]) + corr[:, :, :, 0]).flatten(0, 1)
            return (act.reshape(m, n, *act.shape[1:]) + corr).flatten(0, 1)
        return patch

    hooks = _sender_hooks(runs.model, graph, current)
    hooks += [(name, receiver(indices, graph.receivers[indices[0]][2])) for name, indices in _receiver_hook_names(graph)]
    with torch.no_grad():
        return runs.metric(runs.forward(tokens, hooks, repeat=m, layer=layer))


@dataclass
class EdgeScores:
    """Scores of every edge of a graph, from one method, on one prompt set."""

    effect: Float[Tensor, " E"]
    """Patched minus corrupted metric (logits), per edge (NaN: not computed)."""
    normalised: Float[Tensor, " E"]
    """``effect / (clean - corrupt)``: 1 = the whole gap (NaN when the gap is under 1e-6)."""
    method: str
    """``attribution`` or ``exact``."""

    def ranking(self) -> list[int]:
        """Edge indices by decreasing |effect| (ties in edge order)."""
        return self.effect.nan_to_num(0.0).abs().argsort(descending=True, stable=True).tolist()


def edge_attribution(runs: EdgeRuns, on: str = "corrupt") -> EdgeScores:
    """Attribution scores of every edge (module docstring): one forward and backward.

    ``on="corrupt"`` (the default) takes the gradient on the corrupted run: the first-order term of
    patching the edge into it from the clean run. ``on="clean"`` takes it on the clean run: the
    first-order term of corrupting the edge alone, negated (the convention of ``auto-circuit``'s
    mask-gradient scores). Both are exact for a linear metric; where they differ, the exact patch
    of :func:`patch_each_edge` is the one the default approximates."""
    return edge_and_site_attribution(runs, (), on)[0]


def edge_and_site_attribution(runs: EdgeRuns, act_names: tuple[str, ...] | list[str], on: str = "corrupt"
                              ) -> tuple[EdgeScores, dict[str, Float[Tensor, "layer ..."]]]:
    """:func:`edge_attribution`, and from the same backward the site contributions of attribution
    patching (:func:`plateauscope.analysis.attribution.contributions`) of the hook kinds ``act_names``,
    whose clean activations ``runs`` holds (:meth:`EdgeRuns.of`)."""
    if on not in ("corrupt", "clean"):
        raise ValueError(f"on must be 'corrupt' or 'clean', got {on!r}")
    if act_names and on != "corrupt":
        raise ValueError("site contributions are taken on the corrupted run")
    graph, pairs = runs.graph, runs.pairs
    inputs: dict[str, Tensor] = {}
    names = _receiver_hook_names(graph)
    sites = [get_act_name(a, layer) for a in act_names for layer in range(graph.n_layers)]
    saved: dict[str, Tensor] = {}

    def keep(name: str) -> Callable:
        def save(act: Tensor, hook) -> Tensor:
            # a copy that only this receiver reads: the bridge's MLP input hook passes the residual
            # stream itself (HookedTransformer a clone), whose gradient also holds the skip connection
            inputs[name] = act.clone()
            return inputs[name]
        return save

    with torch.enable_grad():
        last = runs.forward(pairs.corrupt if on == "corrupt" else pairs.clean,
                            [(name, keep(name)) for name, _ in names] + savers(sites, saved))
        grads = torch.autograd.grad(last_logit_diff(last, pairs), [inputs[name] for name, _ in names] +
                                    [saved[name] for name in sites], allow_unused=True)
    grads, site_grads = grads[: len(names)], grads[len(names):]
    contrib = contributions(list(act_names), graph.n_layers, runs.base.acts, saved, dict(zip(sites, site_grads)))
    delta = (runs.clean_out - runs.corrupt_out).flatten(1)  # [S, N * pos * d], read by every receiver in place
    score = torch.zeros(len(graph.senders), len(graph.receivers))
    for (name, indices), g in zip(names, grads):
        if g is None:
            continue
        up = len(graph.upstream(graph.receivers[indices[0]][2]))  # the first senders, in forward order
        g = g if g.ndim == 4 else g[:, :, None]  # [N, pos, R_here, d]
        score[:up, indices] = torch.mm(delta[:up], g.transpose(2, 3).reshape(-1, g.shape[2])).float().cpu()
    s, r = torch.tensor(graph.edges).T
    effect = score[s, r]
    return EdgeScores(effect, runs.normalise(effect), "attribution"), contrib


def patch_each_edge(runs: EdgeRuns, edges: list[int]) -> EdgeScores:
    """Exact patching of each of ``edges`` alone (corrupted run, that edge from the clean run); the
    other edges' effects are NaN."""
    effect = torch.full((len(runs.graph.edges),), math.nan)
    if edges:
        patched = torch.zeros(len(edges), len(runs.graph.edges), dtype=torch.bool)
        patched[torch.arange(len(edges)), torch.tensor(edges)] = True
        effect[edges] = (patch_edges(runs, runs.pairs.corrupt, runs.clean_out, patched, from_corrupt=True)
                         - runs.corrupt).float().cpu()
    return EdgeScores(effect, runs.normalise(effect), "exact")


def faithfulness(runs: EdgeRuns, circuits: Bool[Tensor, "M E"]) -> Float[Tensor, " M"]:
    """Normalised metric of the clean run with every edge outside each circuit patched to the
    corrupted run (1 = clean, 0 = corrupted; NaN when the two differ by less than 1e-6)."""
    return runs.normalise(patch_edges(runs, runs.pairs.clean, runs.corrupt_out, ~circuits) - runs.corrupt).float().cpu()


@dataclass
class Circuit:
    """The smallest faithful set of top-attribution edges found at one checkpoint."""

    edges: list[int]
    """Edge indices, by decreasing |attribution|."""
    faithfulness: float
    target: float
    evaluated: dict[int, float]
    """Faithfulness of the top-k edges for every k the search measured."""
    pairs: int
    """Pairs the faithfulness was measured on."""
    monotone: bool = True
    """Whether the measured faithfulness never fell (by more than :data:`MONOTONE_TOL`) as k grew."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return {"edges": self.edges, "size": len(self.edges), "faithfulness": self.faithfulness,
                "target": self.target, "pairs": self.pairs, "monotone": self.monotone,
                "evaluated": {str(k): v for k, v in sorted(self.evaluated.items())}}


EDGE_RECORD_VERSION = 3
"""Version of the edge records (2: the faithful circuit's search scans every k below its first hit,
and exact patching also checks a random sample outside the top edges; 3: the faithful circuit has
its own cache, apart from the attribution); part of their cache keys, so that older records are
recomputed."""
MONOTONE_TOL = 1e-3
"""A fall of the faithfulness curve smaller than this counts as noise, not as non-monotone."""
SCAN_BATCH = 64
"""Masks measured side by side when the search scans below its first hit."""


def faithful_circuit(runs: EdgeRuns, scores: EdgeScores, target: float = FAITHFULNESS_TARGET,
                     n_pairs: int | None = None) -> Circuit | None:
    """The top-k edges of ``scores`` with the smallest k found (module docstring) whose faithfulness
    reaches ``target``, measured on the first ``n_pairs`` pairs (None: all); None when faithfulness
    is undefined (clean and corrupted metrics equal)."""
    if n_pairs is not None and n_pairs < len(runs.pairs.clean):
        runs = EdgeRuns.of(runs.model, first_pairs(runs.pairs, n_pairs))
    if abs(runs.clean - runs.corrupt) < 1e-6:
        return None
    order = scores.ranking()
    n_edges = len(order)
    seen: dict[int, float] = {}

    def measure(ks: list[int]) -> None:
        masks = torch.zeros(len(ks), n_edges, dtype=torch.bool)
        for i, k in enumerate(ks):
            masks[i, order[:k]] = True
        seen.update(zip(ks, faithfulness(runs, masks).tolist()))

    grid = sorted({min(2 ** i, n_edges) for i in range(int(math.log2(n_edges)) + 2)})
    measure(grid)
    hi = next((k for k in grid if seen[k] >= target), n_edges)
    below = [k for k in range(1, hi) if k not in seen]  # every k below the first hit, not only a bisection's
    for i in range(0, len(below), SCAN_BATCH):  # upwards, in batches
        if min((k for k, f in seen.items() if f >= target), default=hi) < below[i]:
            break  # a hit with every k below it measured: the smallest
        measure(below[i: i + SCAN_BATCH])
    k = min((k for k, f in seen.items() if f >= target), default=n_edges)
    curve = [seen[k] for k in sorted(seen)]
    monotone = all(b >= a - MONOTONE_TOL for a, b in zip(curve, curve[1:]))
    return Circuit(order[:k], seen[k], target, seen, len(runs.pairs.clean), monotone)


def agreement_on(runs: EdgeRuns, scores: EdgeScores, edges: list[int], exact: EdgeScores | None = None
                 ) -> dict[str, Any]:
    """Exact patching of ``edges`` (``exact``: already patched, each alone) and how well attribution
    agrees there: rank correlation of the effects and the largest error (logits and normalised)."""
    exact = patch_each_edge(runs, edges) if exact is None else exact
    a, e = scores.effect[edges].double().numpy(), exact.effect[edges].double().numpy()
    gap = runs.clean - runs.corrupt
    err = float(np.abs(a - e).max()) if edges else 0.0
    return {"edges": edges, "effect": e.tolist(), "spearman": _spearman(e, a), "max_abs_err": err,
            "max_abs_err_normalised": err / abs(gap) if abs(gap) >= 1e-6 else None}


def agreement_top(runs: EdgeRuns, scores: EdgeScores, n: int, seed: int = 0) -> dict[str, Any]:
    """:func:`agreement_on` the ``n`` edges of largest |attribution|, and (``sample``) on ``n`` edges
    drawn at random (seeded) from the rest: the top alone would hide how attribution ranks the
    edges it calls weak."""
    order = scores.ranking()
    rest = order[n:]
    pick = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    sample = [rest[i] for i in pick]
    exact = patch_each_edge(runs, order[:n] + sample)  # both sets' patched runs side by side
    return {**agreement_on(runs, scores, order[:n], exact), "sample": agreement_on(runs, scores, sample, exact)}


STABLE_JACCARD = 0.8
"""A circuit is stable from the first step after which every circuit shares at least this Jaccard
similarity with the last step's."""


def jaccard_to_last(circuits: list[list[int] | None]) -> list[float | None]:
    """Each circuit's Jaccard similarity with the last one (None where a step, or the last, has none)."""
    last = set(circuits[-1]) if circuits and circuits[-1] else None
    return [None if c is None or last is None else len(last & set(c)) / len(last | set(c)) for c in circuits]


def stable_from(steps: list[int], circuits: list[list[int] | None], min_jaccard: float = STABLE_JACCARD) -> int | None:
    """The first step from which every circuit has Jaccard similarity at least ``min_jaccard`` with the
    last step's circuit; None when the last has none, or when only the last step itself qualifies
    (no evidence of stability)."""
    out = None
    for step, j in zip(reversed(steps[:-1]), reversed(jaccard_to_last(circuits)[:-1])):
        if j is None or j < min_jaccard:
            break
        out = step
    return out


def edge_record(model: Model, pairs: PromptPairs) -> dict[str, Any]:
    """One checkpoint's cached edge attribution: the graph's shape, the clean and corrupted metrics
    and every edge's attribution effect (logits) on ``pairs``. One clean forward and one corrupted
    forward and backward: the cheap pass runs it at every analysed step."""
    runs = EdgeRuns.of(model, pairs)
    return _edge_record(runs, edge_attribution(runs))


def _edge_record(runs: EdgeRuns, scores: EdgeScores) -> dict[str, Any]:
    g = runs.graph
    return {"graph": {"n_layers": g.n_layers, "n_heads": g.n_heads, "has_mlp": g.has_mlp,
                      **({"parallel": True} if g.parallel else {}),
                      **({"n_kv_heads": g.n_kv_heads} if g.n_kv_heads else {})},
            "clean": runs.clean, "corrupt": runs.corrupt, "effect": [round(x, 6) for x in scores.effect.tolist()]}


def edge_and_attribution_records(model: Model, pairs: PromptPairs, targets: tuple[str, ...] | list[str]
                                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`edge_record` and the attribution patching of the component sets ``targets``
    (:func:`plateauscope.analysis.attribution.attribute_all`, as its cached record) from the same
    clean forward and corrupted forward and backward: the numbers of the two apart, up to float rounding."""
    specs = target_specs(model, pairs, targets)
    sites = sorted({s.act_name for s in specs})
    runs = EdgeRuns.of(model, pairs, sites)
    scores, contrib = edge_and_site_attribution(runs, sites)
    found = attribution_results(pairs, specs, runs.clean, runs.corrupt, contrib)
    return _edge_record(runs, scores), {t: found[t].to_dict() for t in targets}


def _scores(runs: EdgeRuns, effect: list[float] | None) -> EdgeScores:
    """Edge attribution on ``runs``: ``effect`` when already computed on these pairs, else computed."""
    if effect is None:
        return edge_attribution(runs)
    return EdgeScores(torch.tensor(effect), runs.normalise(torch.tensor(effect)), "attribution")


def edge_circuit_record(model: Model, pairs: PromptPairs, effect: list[float] | None = None,
                        target: float = FAITHFULNESS_TARGET, circuit_pairs: int = CIRCUIT_PAIRS) -> dict[str, Any]:
    """One checkpoint's faithful circuit (None when undefined) of the ranking by ``effect`` (an
    :func:`edge_record`'s attribution on these pairs; None: computed), its faithfulness measured on
    the first ``circuit_pairs`` pairs. Many patched forwards: the expensive pass runs it."""
    runs = EdgeRuns.of(model, pairs)
    circuit = faithful_circuit(runs, _scores(runs, effect), target, circuit_pairs)
    return {"circuit": circuit.to_dict() if circuit else None}


def exact_edge_record(model: Model, pairs: PromptPairs, n: int, effect: list[float] | None = None) -> dict[str, Any]:
    """One exact-analysis checkpoint's agreement of attribution with exact patching of its ``n``
    strongest edges (:func:`agreement_top`); ``effect``: the attribution already computed on these
    pairs (an :func:`edge_record`'s), else it is computed."""
    runs = EdgeRuns.of(model, pairs)
    return agreement_top(runs, _scores(runs, effect), n)


def graph_of_record(record: dict[str, Any]) -> EdgeGraph:
    """The graph a cached edge record was made on."""
    return EdgeGraph(**record["graph"])


def edges_summary(records: list[dict[str, Any]], circuit_records: list[dict[str, Any]], exact: list[dict[str, Any]],
                  top: int = 5, tau: int | None = None) -> dict[str, Any] | None:
    """The circuit over time from cached edge records (:func:`edge_record`) and the faithful circuits
    searched (:func:`edge_circuit_record`, at every analysed step or at the landmarks only): its size
    and faithfulness at the last searched step, its strongest edges by name, the step from which it is
    stable over the searched steps (:func:`stable_from`), and the agreement of attribution with exact
    patching over the exact steps: on the top edges at every step, and on a random sample of the
    others from tau/2 on (on the plateau the clean-corrupted gap is under 0.01 logits and the ranks
    are noise)."""
    if not records:
        return None
    late = [a["sample"] for a in exact if a.get("sample") and tau is not None and a["step"] >= tau / 2]
    rho_late = [a["spearman"] for a in late if a.get("spearman") is not None]
    names = graph_of_record(records[-1]).edge_names()
    steps = [r["step"] for r in circuit_records]
    circuits = [r["circuit"]["edges"] if r.get("circuit") else None for r in circuit_records]
    last = circuit_records[-1].get("circuit") if circuit_records else None
    rho = [a["spearman"] for a in exact if a.get("spearman") is not None]
    return {
        "n_edges": len(names),
        "final_step": steps[-1] if steps else None,
        "searched_steps": len(steps),
        "final_circuit": None if not last else {
            "size": last["size"], "faithfulness": last["faithfulness"], "target": last["target"],
            "monotone": last.get("monotone"),  # None: an older record, searched by bisection
            "strongest": [f"{names[i]['sender']} -> {names[i]['receiver']} ({names[i]['input']})"
                          for i in last["edges"][:top]]},
        "sizes": [[s, c and len(c)] for s, c in zip(steps, circuits)],
        "jaccard_to_last": [[s, j] for s, j in zip(steps, jaccard_to_last(circuits))],
        "stable_from": stable_from(steps, circuits),
        "agreement": {"steps": len(exact), "spearman_median": median(rho), "spearman_min": min(rho) if rho else None,
                      "max_abs_err": max((a["max_abs_err"] for a in exact), default=None),
                      "n_edges": max((len(a["edges"]) for a in exact), default=0)},
        "sample_agreement": {"steps": len(late), "from_step": tau / 2 if tau is not None else None,
                             "spearman_median": median(rho_late), "spearman_min": min(rho_late) if rho_late else None,
                             "max_abs_err": max((a["max_abs_err"] for a in late), default=None),
                             "n_edges": max((len(a["edges"]) for a in late), default=0)},
    }
