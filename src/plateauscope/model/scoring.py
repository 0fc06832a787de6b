"""Log-probabilities of the tokens a task's loss counts, with every shared prefix run once.

:func:`target_logprobs` scores sequences in full; :func:`shared_prefix_logprobs` scores a tree of
sequences that share prefixes (a group's ``<BOS> B <SEP>``, then each ``z <SEP>``, then the
candidates), running each prefix once on a frozen TransformerLens key/value cache. Evaluation
(``plateauscope.runs.metrics``) and head ablation (``plateauscope.analysis.ablate``) score candidates with them; the
positions are the task's (``Task.input_len``, ``Task.loss_positions``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens.utilities import get_act_name

from plateauscope.model.backend import Model, hooks_added, shares_prefixes
from plateauscope.model.hooked_forward import (
    SharedPast,
    block_keys_values,
    embed_at,
    run_blocks,
)
from plateauscope.model.protocols import TaskPositions


@torch.inference_mode()
def target_logprobs(
    model: nn.Module, seqs: Int[Tensor, "N seq"], task: TaskPositions, batch_size: int = 2048,
    hooks_for: Callable[[Tensor], list] | None = None,
) -> tuple[Float[Tensor, "N T"], Bool[Tensor, " N"]]:
    """Log-probability of each target token, and whether greedy decoding gets all of them.

    ``hooks_for(rows)``, if given, returns forward hooks (``run_with_hooks``) for the batch of
    sequences ``seqs[rows]``, their activations covering every position."""
    positions = torch.tensor(task.loss_positions)
    device = next(model.parameters()).device
    logps, exact = [], []
    for rows in torch.arange(len(seqs)).split(batch_size):
        chunk = seqs[rows].to(device)
        inputs = chunk[:, : task.input_len]
        logits = (model(inputs) if hooks_for is None
                  else model.run_with_hooks(inputs, fwd_hooks=hooks_for(rows)))[:, positions]  # [n, T, vocab]
        target = chunk[:, positions + 1]
        logp = logits.float().log_softmax(-1)
        logps.append(logp.gather(-1, target[..., None])[..., 0].cpu())
        exact.append((logits.argmax(-1) == target).all(-1).cpu())
    return torch.cat(logps), torch.cat(exact)


@torch.inference_mode()
def shared_prefix_logprobs(
    model: Model, seqs: Int[Tensor, "*tree seq"], splits: tuple[int, ...], task: TaskPositions,
    batch_size: int = 2048, hooks_for: Callable[[Tensor, int], list] | None = None,
    start_layer: int = 0, start_resid: Callable[[int, Tensor], Tensor] | None = None,
    save_resid: dict[tuple[int, int], Tensor] | None = None, prune: bool = False,
) -> tuple[Float[Tensor, "*tree T"], Bool[Tensor, " *tree"]]:
    """:func:`target_logprobs` of sequences that share prefixes, each prefix run once.

    ``seqs`` has one leading axis per level of the tree (``len(splits) + 1`` of them); the tokens
    before ``splits[i]`` depend only on the first ``i + 1`` indices (e.g. ``[group, selector,
    candidate]`` with splits ``(z_start, target_start)``). Level ``i`` runs the positions
    ``[splits[i-1], splits[i])`` of one representative per distinct prefix, its attention reading
    the keys and values of its parent prefix (a frozen TransformerLens key/value cache).

    ``hooks_for(roots, offset)``, if given, returns forward hooks for a batch whose rows descend
    from the given indices along the first tree axis and whose activations start at position
    ``offset`` (e.g. head ablations that differ per first-axis row).

    Runs that change nothing below a layer can start there: with ``start_layer`` > 0,
    ``start_resid(level, rows)`` gives the residual stream before that layer of the level's
    representative ``rows`` (e.g. from an unchanged run), and only the blocks from there on run.
    ``save_resid``, if given, receives that residual stream of a run: for each of its keys
    ``(level, layer)`` (the values are ignored), ``[representatives, level positions, d_model]``.

    With no hooks to feed, the top block runs only on the positions that predict a target (a
    level's others give it keys and values alone).

    ``prune``: for the exact match only. A prefix none of whose sequences can still be an exact
    match (greedy decoding already missed a target token) is not run further: its descendants'
    log-probabilities from there on are NaN, their exact match False (the same as without pruning).

    A model that cannot share prefixes (:func:`plateauscope.model.backend.shares_prefixes`: neither backend)
    scores every sequence in full (:func:`target_logprobs`, the hooks at offset 0): the same numbers.
    """
    dims = tuple(seqs.shape[:-1])
    if len(dims) != len(splits) + 1:
        raise ValueError(f"{len(dims)} tree axes need {len(dims) - 1} split points, got {len(splits)}")
    if not shares_prefixes(model):
        per_root = math.prod(dims[1:])
        logp, exact = target_logprobs(model, seqs.reshape(-1, seqs.shape[-1]), task, batch_size,
                                      None if hooks_for is None else lambda rows: hooks_for(rows // per_root, 0))
        return logp.view(*dims, -1), exact.view(dims)
    device = next(model.parameters()).device
    bounds = [0, *splits, task.input_len]
    pred = torch.tensor(task.loss_positions)
    targets = seqs[..., pred + 1]  # [*tree, T]
    L = model.cfg.n_layers
    if not 0 <= start_layer < L or (start_layer > 0) != (start_resid is not None):
        raise ValueError(f"start_layer {start_layer} needs 0 <= start_layer < {L}, and start_resid exactly when > 0")
    layers = range(start_layer, L)  # the blocks that run; keys and values of the others are never read
    names = [get_act_name(kind, layer) for kind in ("k", "v") for layer in layers]
    resid_names = {(lvl, get_act_name("resid_pre", layer)): layer for lvl, layer in (save_resid or {})}
    if prune and save_resid:
        raise ValueError("save_resid needs every prefix run: not with prune")
    # Keys then values per running layer of every position so far, [prefixes, pos, head, d_head],
    # kept only for the prefixes whose children run (pruning drops the others before any copy),
    # with each prefix's row in them (-1: none).
    past: tuple[list[Tensor], Tensor] | None = None
    exact = torch.ones(dims, dtype=torch.bool)  # every target token so far predicted by the argmax
    logps = []
    for lvl in range(len(dims)):
        rep = seqs[(slice(None),) * (lvl + 1) + (0,) * (len(dims) - lvl - 1)]
        tokens = rep.reshape(-1, seqs.shape[-1])[:, bounds[lvl]: bounds[lvl + 1]].to(device)
        here = [i for i, p in enumerate(pred.tolist()) if bounds[lvl] <= p < bounds[lvl + 1]]
        rel = pred[here] - bounds[lvl]
        last_level = lvl == len(dims) - 1
        n_pos = bounds[lvl + 1] - bounds[lvl]
        # Positions that predict no target only give keys and values to the top block: with no hooks
        # to feed, the top block runs on the predicting positions alone (they end the level).
        trim = (hooks_for is None and not save_resid and _plain_top_block(model) and len(rel) < n_pos
                and rel.tolist() == list(range(n_pos - len(rel), n_pos)))
        # the prefixes of this level to run: all, or (prune) those with a sequence still exact
        alive = exact.reshape(len(tokens), -1).any(-1).nonzero()[:, 0] if prune else torch.arange(len(tokens))
        new_kv, level_logits = [], []
        level_resid: dict[str, list[Tensor]] = {n: [] for at, n in resid_names if at == lvl}
        # batches of whole prefixes of the level above (their children share its keys: SharedPast)
        for rows in alive.split(batch_size // dims[lvl] * dims[lvl] or batch_size):
            saved: dict[str, Tensor] = {}

            def saver(name: str) -> Callable:  # by the name asked for: a bridge's hook.name may be an alias
                def save(act: Tensor, hook) -> None:
                    saved[name] = act
                return save

            if start_layer == 0:
                resid = embed_at(model, tokens[rows], bounds[lvl])
            else:
                resid = start_resid(lvl, rows).to(device)
            cache = None
            if past is not None:
                kv, row_of = past
                children = dims[lvl]
                if children > 1 and _whole_families(rows, children):  # the parents' keys once, not once per child
                    at = row_of[rows[::children] // children]
                    cache = [SharedPast(k[at], v[at], children) for k, v in zip(kv[: len(layers)], kv[len(layers):])]
                else:  # one child each, or (pruned) a parent's surviving children only: copied per row
                    at = row_of[rows // children]
                    cache = [SharedPast.own(k[at], v[at]) for k, v in zip(kv[: len(layers)], kv[len(layers):])]
                cache = [None] * start_layer + cache
            hooks = ([] if last_level else [(n, saver(n)) for n in names]) + [(n, saver(n)) for n in level_resid]
            if hooks_for is not None:
                hooks += hooks_for(rows // math.prod(dims[1: lvl + 1]), bounds[lvl])
            with hooks_added(model, hooks):
                if trim:
                    x = _top_block_on_suffix(model, resid, start_layer, cache, len(rel), saved)
                else:
                    x = run_blocks(model, resid, start_layer, L, cache)[:, rel]
            for n, chunks in level_resid.items():
                chunks.append(saved[n])
            if model.cfg.normalization_type is not None:
                x = model.ln_final(x)
            level_logits.append(model.unembed(x).float().cpu())
            if not last_level:
                new_kv.append([saved[n] for n in names])
        for n, chunks in level_resid.items():
            save_resid[(lvl, resid_names[(lvl, n)])] = torch.cat(chunks)
        if here:
            logits = torch.full((len(tokens), len(here), model.cfg.d_vocab_out), float("nan"))
            if len(alive):
                logits[alive] = torch.cat(level_logits)
            logits = logits.view(*dims[: lvl + 1], *(1,) * (len(dims) - lvl - 1), len(here), -1)
            tgt = targets[..., here]
            logps.append(logits.log_softmax(-1).expand(*dims, len(here), -1).gather(-1, tgt[..., None])[..., 0])
            exact &= (logits.argmax(-1).expand(*dims, len(here)) == tgt).all(-1)
        if not last_level:  # the keys and values the next level reads, for the prefixes it runs
            n_next = len(tokens) * dims[lvl + 1]
            needed = (exact.reshape(n_next, -1).any(-1).nonzero()[:, 0] // dims[lvl + 1]).unique() if prune else alive
            kv = [torch.cat(chunks) for chunks in zip(*new_kv)]
            if prune:  # keep the rows of the needed prefixes among those that ran
                kv = [own[_row_of(alive, len(tokens))[needed]] for own in kv]
            if past is not None:
                kv = [torch.cat([p[past[1][needed // dims[lvl]]], own], dim=1) for p, own in zip(past[0], kv)]
            past = (kv, _row_of(needed, len(tokens)))
    return torch.cat(logps, -1), exact


def _whole_families(rows: Int[Tensor, " n"], children: int) -> bool:
    """Whether ``rows`` are every child, in order, of consecutive parents with ``children`` each."""
    if len(rows) % children:
        return False
    family = rows.view(-1, children)
    return bool((family[:, 0] % children == 0).all()) and bool((family == family[:, :1] + torch.arange(children)).all())


def _row_of(indices: Int[Tensor, " n"], total: int) -> Int[Tensor, " total"]:
    """For each of ``total`` prefixes, its position in ``indices`` (-1: not there)."""
    rows = torch.full((total,), -1, dtype=torch.long)
    rows[indices] = torch.arange(len(indices))
    return rows


def _plain_top_block(model: Model) -> bool:
    """Whether the top block is a plain pre-norm attention block built from a config (no rotary,
    QK norm, split inputs or post-norm), whose keys and values are ``W_K`` / ``W_V`` of ``ln1``."""
    c = model.cfg
    return (c.original_architecture is None and c.positional_embedding_type == "standard" and not c.use_attn_in
            and not c.use_split_qkv_input and not c.use_qk_norm and not c.use_normalization_before_and_after
            and not c.load_in_4bit)


def _top_block_on_suffix(model: Model, resid: Float[Tensor, "N pos d_model"], start_layer: int,
                         cache: list | None, n_out: int, saved: dict[str, Tensor]
                         ) -> Float[Tensor, "N n_out d_model"]:
    """The blocks below the top on every position, the top block's keys and values of every
    position (into ``saved``), and the top block on the last ``n_out`` positions only; returns
    their final residual stream."""
    top = model.cfg.n_layers - 1
    resid = run_blocks(model, resid, start_layer, top, cache)
    keys, values = block_keys_values(model, resid, top)
    out = resid[:, :0]
    if n_out:
        first = resid.shape[1] - n_out
        past_k, past_v = keys[:, :first], values[:, :first]
        entry = SharedPast.own(past_k, past_v) if cache is None else cache[top].then(past_k, past_v)
        out = run_blocks(model, resid[:, first:], top, top + 1, [None] * top + [entry])
    # after the top block's run, whose key / value hooks saw the last positions only
    saved[get_act_name("k", top)], saved[get_act_name("v", top)] = keys, values
    return out
