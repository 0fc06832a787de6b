"""Evaluation metrics, and tau / plateau detection from ``metrics.jsonl`` records.

All scores are natural-log probabilities of the target tokens under teacher forcing.

For an example (B_g, z_j) with correct target A_gj, score every candidate A_gk of its
group: ``s_k = sum_t log p(A_gk[t] | B_g, z_j, A_gk[<t])``. Then

* ``seq_nll``        = -s_j, the training objective summed over the target tokens;
* ``candidate_loss`` = -log softmax(s)_j: log K when the K candidates are equally likely
  (z ignored), 0 when z picks the right one;
* ``set_loss``       = -logsumexp(s): 0 once all probability sits on the group's K targets
  (the marginal is learned), large when the model knows nothing;
* so ``seq_nll = set_loss + candidate_loss`` exactly, example by example;
* ``delta_z``        = candidate loss of the correct target with z replaced by another
  selector of the task (a fixed derangement: never the true one) minus the candidate loss
  with the true z. ~0 while z is ignored, large (positive) once z is used.
  It needs no extra forward pass: the prefix (B_g, z_j') is another example of group g.
* ``first_token_set_loss`` = -log of the total probability that the first target token is one
  of the group's first characters (its K candidates' first characters, each counted once): the
  cheapest marginal. ~0 when the model has learned which characters start a candidate, about
  log(36 / K) when it knows nothing. It tells a marginal over first characters apart from a
  marginal over whole strings (``set_loss``).
* ``exact match``: greedy decoding reproduces the target iff, under teacher forcing, the
  argmax at every target position is the correct token.

The plateau verdict (``plateau_verdict``, the ``plateau`` block of ``summary.json``) compares the
set loss on the plateau with two references: the **marginal floor** 0 (all mass on the group's
candidates) and the **know-nothing reference** (``know_nothing_reference``), the set loss of a
model that is uniform over the alphabet at every target position, computed exactly from the
task's candidate sets. "Uniform over the alphabet" means over the characters targets are made of
(not over ``<BOS>``/``<SEP>``, which never follow ``<SEP>`` in a target and which a model stops
predicting there within a few steps): 4 ln 36 - ln 10 = 12.03 nats for the paper's task. A plateau
evaluation is *marginal* when its set loss is below 0.1 log K, *shelf* when it is above 90% of the
know-nothing reference, and *between* otherwise; the verdict names the kind that holds at least
two thirds of the plateau's evaluations, or says ``mixed``.

The forward task (A -> B) has no candidates and no selector: its candidate fields are None
and its tau is defined on exact-match accuracy (first evaluated step above 50%).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch import nn
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.utilities import get_act_name

from training.backend import Model, hooks_added, shares_prefixes
from training.layout import Layout
from training.task import Task


def target_cross_entropy(
    logits: Float[Tensor, "N in_len vocab"], tokens: Int[Tensor, "N seq"], layout: Layout
) -> Float[Tensor, ""]:
    """The training objective: mean cross-entropy over the target tokens only."""
    pos = torch.tensor(layout.target_pred_positions, device=logits.device)
    return torch.nn.functional.cross_entropy(logits[:, pos].flatten(0, 1).float(), tokens[:, pos + 1].flatten())


@torch.inference_mode()
def target_logprobs(
    model: nn.Module, seqs: Int[Tensor, "N seq"], layout: Layout, batch_size: int = 2048,
    hooks_for: Callable[[Tensor], list] | None = None,
) -> tuple[Float[Tensor, "N T"], Bool[Tensor, " N"]]:
    """Log-probability of each target token, and whether greedy decoding gets all of them.

    ``hooks_for(rows)``, if given, returns forward hooks (``run_with_hooks``) for the batch of
    sequences ``seqs[rows]``, their activations covering every position."""
    positions = torch.tensor(layout.target_pred_positions)
    device = next(model.parameters()).device
    logps, exact = [], []
    for rows in torch.arange(len(seqs)).split(batch_size):
        chunk = seqs[rows].to(device)
        inputs = chunk[:, : layout.input_len]
        logits = (model(inputs) if hooks_for is None
                  else model.run_with_hooks(inputs, fwd_hooks=hooks_for(rows)))[:, positions]  # [n, T, vocab]
        target = chunk[:, positions + 1]
        logp = logits.float().log_softmax(-1)
        logps.append(logp.gather(-1, target[..., None])[..., 0].cpu())
        exact.append((logits.argmax(-1) == target).all(-1).cpu())
    return torch.cat(logps), torch.cat(exact)


@dataclass
class EvalSet:
    """The fixed, seeded examples every evaluation of a run looks at."""

    candidate_seqs: Int[Tensor, "N seq"] | None
    """Backward: all (group, selector, candidate) sequences of the eval groups, flattened."""
    shift: Int[Tensor, "G K"] | None
    """Backward: the replacement selector of (g, j) is (j + shift) mod K, shift in [1, K-1]."""
    eval_seqs: Int[Tensor, "E seq"]
    """The true sequences of the eval groups."""
    tracked_groups: Int[Tensor, " Gt"]
    tracked_seqs: Int[Tensor, "Et seq"]

    @classmethod
    def build(cls, task: Task, n_eval_groups: int, n_tracked_groups: int, seed: int) -> EvalSet:
        """The seeded evaluation groups, their candidate sequences, the selector shifts and the tracked groups."""
        gen = torch.Generator().manual_seed(seed + 1_000_003)  # not the training data order
        n_b, K = task.cfg.n_b, task.cfg.K
        eval_groups = torch.randperm(n_b, generator=gen)[: min(n_eval_groups, n_b)].sort().values
        tracked = torch.randperm(n_b, generator=gen)[: min(n_tracked_groups, n_b)].sort().values
        backward = task.cfg.direction == "backward" and K > 1
        shift = torch.randint(1, max(K, 2), (len(eval_groups), K), generator=gen) if backward else None
        cand = task.candidate_sequences(eval_groups).flatten(0, 2) if backward else None
        return cls(cand, shift, task.tokens[task.example_ids(eval_groups).flatten()], tracked,
                   task.tokens[task.example_ids(tracked).flatten()])


def evaluate(model: nn.Module, task: Task, evalset: EvalSet, batch_size: int = 512) -> dict:
    """All logged metrics of one model on the evaluation set (plain floats and lists).

    Backward task: each prefix is scored once (:func:`shared_prefix_logprobs`): a group's
    ``<BOS> B <SEP>`` once for its K x K candidate sequences and its K tracked sequences, each
    ``z_j <SEP>`` once for the K candidates after it. A tracked sequence, of which only the exact
    match is logged, stops at its first missed target token (``prune``). The numbers are those of
    scoring every sequence in full (:func:`target_logprobs`), up to float rounding.
    """
    layout, K = task.layout, task.cfg.K
    out: dict = {}
    # a HookedTransformer scores shared prefixes once; any other module scores every sequence in full
    shared = shares_prefixes(model) and layout.z_span is not None
    if evalset.candidate_seqs is not None:
        G = evalset.shift.shape[0]
        if shared:
            logp, exact = shared_prefix_logprobs(model, evalset.candidate_seqs.view(G, K, K, -1),
                                                 (layout.z_span[0], layout.target_span[0]), layout, batch_size)
        else:
            logp, exact = target_logprobs(model, evalset.candidate_seqs, layout, batch_size)
            logp, exact = logp.view(G, K, K, -1), exact.view(G, K, K)
        scores = logp.sum(-1)  # [group, selector j (prefix), candidate k]
        out.update(candidate_metrics(scores, evalset.shift))
        diag = torch.arange(K)
        true_logp = logp[:, diag, diag]  # [G, K, T]
        out["accuracy"] = exact[:, diag, diag].float().mean().item()
        first_chars = evalset.candidate_seqs.view(G, K, K, -1)[:, 0, :, layout.target_span[0]]  # [G, K]
        out["first_token_set_loss"] = first_token_set_loss(logp[..., 0], first_chars)
    else:
        true_logp, exact = target_logprobs(model, evalset.eval_seqs, layout, batch_size)
        out.update(candidate_loss=None, candidate_acc=None, set_loss=None, delta_z=None, first_token_set_loss=None,
                   seq_nll=-true_logp.sum(-1).mean().item())
        out["accuracy"] = exact.float().mean().item()
    out["loss"] = -true_logp.mean().item()
    out["first_token_loss"] = -true_logp[..., 0].mean().item()
    tracked = evalset.tracked_seqs
    if shared:  # a tracked group's K sequences share <BOS> B <SEP>; one whose first target token is
        # already missed is not run further (only exact matches are read)
        _, tracked_exact = shared_prefix_logprobs(model, tracked.view(-1, K, 1, tracked.shape[-1]),
                                                  (layout.z_span[0], layout.target_span[0]), layout, batch_size,
                                                  prune=True)
    else:
        _, tracked_exact = target_logprobs(model, tracked, layout, batch_size)
    out["group_acc"] = [round(x, 4) for x in tracked_exact.reshape(-1, K).float().mean(-1).tolist()]
    return out


def first_occurrence(items: Int[Tensor, "G K ..."]) -> Bool[Tensor, "G K"]:
    """Whether item k of each row is the first of its value in the row (duplicates are False)."""
    same = (items[:, :, None] == items[:, None, :])
    if same.dim() > 3:
        same = same.flatten(3).all(-1)
    K = items.shape[1]
    earlier = torch.ones(K, K, dtype=torch.bool).tril(-1)  # [k, k'] with k' < k
    return ~(same & earlier).any(-1)


def first_token_set_loss(first_logp: Float[Tensor, "G K K"], first_chars: Int[Tensor, "G K"]) -> float:
    """Mean over (group, prefix j) of -log sum over the group's distinct first characters of their
    probability; ``first_logp[g, j, k]`` is log p(first character of candidate k | prefix j)."""
    keep = first_occurrence(first_chars)  # [G, K]: count each first character once
    masked = first_logp.masked_fill(~keep[:, None, :], float("-inf"))
    return (-masked.logsumexp(-1)).mean().item()


def know_nothing_reference(task: Task, groups: Int[Tensor, " G"] | None = None) -> dict:
    """Losses of a model uniform over the alphabet at every target position, exactly, from the task.

    Per group: set loss = a_len log V - log(#distinct candidates), first-token set loss =
    log V - log(#distinct first characters), first-token loss = log V (V = alphabet size);
    averaged over ``groups`` (default: every group; every example of a group weighs the same).
    """
    cand = task.a_tokens if groups is None else task.a_tokens[groups]  # [G, K, a_len]
    log_v = math.log(len(task.cfg.alphabet))
    n_cand = first_occurrence(cand).sum(-1).double()
    n_first = first_occurrence(cand[..., 0]).sum(-1).double()
    return {
        "alphabet_size": len(task.cfg.alphabet),
        "set_loss": (cand.shape[-1] * log_v - n_cand.log()).mean().item(),
        "first_token_set_loss": (log_v - n_first.log()).mean().item(),
        "first_token_loss": log_v,
    }


@torch.inference_mode()
def shared_prefix_logprobs(
    model: Model, seqs: Int[Tensor, "*tree seq"], splits: tuple[int, ...], layout: Layout,
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

    A model that cannot share prefixes (:func:`training.backend.shares_prefixes`: the bridge)
    scores every sequence in full (:func:`target_logprobs`, the hooks at offset 0): the same numbers.
    """
    dims = tuple(seqs.shape[:-1])
    if len(dims) != len(splits) + 1:
        raise ValueError(f"{len(dims)} tree axes need {len(dims) - 1} split points, got {len(splits)}")
    if not shares_prefixes(model):
        per_root = math.prod(dims[1:])
        logp, exact = target_logprobs(model, seqs.reshape(-1, seqs.shape[-1]), layout, batch_size,
                                      None if hooks_for is None else lambda rows: hooks_for(rows // per_root, 0))
        return logp.view(*dims, -1), exact.view(dims)
    device = next(model.parameters()).device
    bounds = [0, *splits, layout.input_len]
    pred = torch.tensor(layout.target_pred_positions)
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
        for rows in alive.split(batch_size):
            saved: dict[str, Tensor] = {}

            def save(act: Tensor, hook) -> None:
                saved[hook.name] = act

            if start_layer == 0:
                resid = model.embed(tokens[rows]) + model.pos_embed(tokens[rows], bounds[lvl])
            else:
                resid = start_resid(lvl, rows).to(device)
            cache = None
            if past is not None:
                kv, row_of = past
                at = row_of[rows // dims[lvl]]  # each row's parent prefix
                cache = [None] * start_layer + [TransformerLensKeyValueCacheEntry(k[at], v[at], frozen=True)
                                                for k, v in zip(kv[: len(layers)], kv[len(layers):])]
            hooks = ([] if last_level else [(n, save) for n in names]) + [(n, save) for n in level_resid]
            if hooks_for is not None:
                hooks += hooks_for(rows // math.prod(dims[1: lvl + 1]), bounds[lvl])
            with hooks_added(model, hooks):
                if trim:
                    x = _top_block_on_suffix(model, resid, start_layer, cache, len(rel), saved)
                else:
                    x = model(resid, start_at_layer=start_layer, stop_at_layer=L, past_kv_cache=cache)[:, rel]
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
    resid = model(resid, start_at_layer=start_layer, stop_at_layer=top, past_kv_cache=cache)
    block = model.blocks[top]
    x = block.ln1(resid)
    _, keys, values = block.attn.calculate_qkv_matrices(x, x, x)
    out = resid[:, :0]
    if n_out:
        first = resid.shape[1] - n_out
        past_k, past_v = keys[:, :first], values[:, :first]
        if cache is not None:
            past_k = torch.cat([cache[top].past_keys, past_k], dim=1)
            past_v = torch.cat([cache[top].past_values, past_v], dim=1)
        entry = TransformerLensKeyValueCacheEntry(past_k, past_v, frozen=True)
        out = model(resid[:, first:], start_at_layer=top, stop_at_layer=top + 1, past_kv_cache=[None] * top + [entry])
    # after the top block's run, whose key / value hooks saw the last positions only
    saved[get_act_name("k", top)], saved[get_act_name("v", top)] = keys, values
    return out


def candidate_metrics(scores: Float[Tensor, "G K K"], shift: Int[Tensor, "G K"]) -> dict:
    """Candidate loss / accuracy, set loss, delta_z and seq NLL from a [group, prefix j, candidate k] score tensor."""
    G, K, _ = scores.shape
    diag = torch.arange(K)
    log_norm = scores.logsumexp(-1)  # [G, K]: log of the total probability on the K candidates
    correct = scores[:, diag, diag]  # [G, K]
    cand_loss = log_norm - correct
    # z replaced: prefix j' = (j + shift) mod K, still scoring the correct target j.
    j_prime = (diag[None, :] + shift) % K
    rows = scores[torch.arange(G)[:, None], j_prime]  # [G, K(j), K(k)]
    cand_loss_shuffled = rows.logsumexp(-1) - rows.gather(-1, diag.expand(G, K)[..., None])[..., 0]
    return {
        "candidate_loss": cand_loss.mean().item(),
        "candidate_acc": (scores.argmax(-1) == diag).float().mean().item(),
        "set_loss": (-log_norm).mean().item(),
        "seq_nll": (-correct).mean().item(),
        "delta_z": (cand_loss_shuffled - cand_loss).mean().item(),
    }


def compute_tau(records: list[dict], log_k: float, direction: str = "backward",
                threshold: float = 0.5) -> int | None:
    """tau: first evaluated step with candidate_loss < threshold * log K (backward), or with
    exact-match accuracy > threshold (forward: no candidates). None if it never happens."""
    for r in records:
        if direction == "backward":
            if r.get("candidate_loss") is not None and log_k > 0 and r["candidate_loss"] < threshold * log_k:
                return r["step"]
        elif r.get("accuracy") is not None and r["accuracy"] > threshold:
            return r["step"]
    return None


def plateau_span(records: list[dict], log_k: float, tau: int | None,
                 rel_tol: float = 0.1, dz_tol: float = 0.1) -> tuple[int, int] | None:
    """First and last evaluated step before tau with |candidate_loss - log K| <= rel_tol log K
    and delta_z < dz_tol log K (None if no step qualifies, or backward-only fields are absent)."""
    steps = [
        r["step"] for r in records
        if r.get("candidate_loss") is not None and r.get("delta_z") is not None
        and (tau is None or r["step"] < tau)
        and abs(r["candidate_loss"] - log_k) <= rel_tol * log_k and r["delta_z"] < dz_tol * log_k
    ]
    return (steps[0], steps[-1]) if steps else None


MARGINAL_REL = 0.1
"""An evaluation is *marginal* when its set loss is below this many log K."""
SHELF_REL = 0.9
"""An evaluation is *shelf* when its set loss is above this share of the know-nothing reference."""
VERDICT_MAJORITY = 2 / 3
"""The verdict names the kind that holds at least this share of the plateau, else ``mixed``."""


def t_marginal(records: list[dict], log_k: float, rel: float = MARGINAL_REL) -> int | None:
    """First evaluated step with set loss below ``rel`` log K (None: never)."""
    return next((r["step"] for r in records if r.get("set_loss") is not None and r["set_loss"] < rel * log_k), None)


def plateau_verdict(records: list[dict], log_k: float, span: tuple[int, int] | list[int] | None,
                    reference: dict, majority: float = VERDICT_MAJORITY) -> dict:
    """The ``plateau`` block: references, shares of the plateau by kind, the verdict, first-token set loss.

    ``reference`` is ``know_nothing_reference(task)``. The verdict is None when the run has no
    plateau (or no set loss: the forward task).
    """
    on = [r for r in records if span and span[0] <= r["step"] <= span[1] and r.get("set_loss") is not None]
    lo, hi = MARGINAL_REL * log_k, SHELF_REL * reference["set_loss"]
    n = len(on)
    share = {"marginal": sum(r["set_loss"] < lo for r in on) / n if n else None,
             "shelf": sum(r["set_loss"] > hi for r in on) / n if n else None}
    share["between"] = 1.0 - share["marginal"] - share["shelf"] if n else None
    verdict = None
    if n:
        verdict = "marginal" if share["marginal"] >= majority else "shelf" if share["shelf"] >= majority else "mixed"
    fts = [r["first_token_set_loss"] for r in on if r.get("first_token_set_loss") is not None]
    return {
        "verdict": verdict,
        "know_nothing": reference,
        "marginal_floor": 0.0,
        "marginal_threshold": lo,
        "shelf_threshold": hi,
        "n_evaluations": n,
        "share": share,
        "median_set_loss": _median([r["set_loss"] for r in on]) if on else None,
        "median_first_token_set_loss": _median(fts) if fts else None,
        "t_marginal": t_marginal(records, log_k),
    }


def summarize(records: list[dict], log_k: float, direction: str, reference: dict | None = None) -> dict:
    """The contents of ``summary.json`` (without run bookkeeping); ``reference`` (the task's
    ``know_nothing_reference``) adds the ``plateau`` verdict block (backward runs)."""
    tau = compute_tau(records, log_k, direction)
    span = plateau_span(records, log_k, tau)
    on_plateau = [r for r in records if span and span[0] <= r["step"] <= span[1]]
    final = {k: v for k, v in records[-1].items() if k != "group_acc"} if records else {}
    return {
        "log_k": log_k,
        "tau": tau,
        "tau_by_threshold": {str(t): compute_tau(records, log_k, direction, t) for t in (0.3, 0.5, 0.7)},
        "plateau_span": list(span) if span else None,
        "plateau_fraction_of_tau": (span[1] - span[0]) / tau if span and tau else None,
        "plateau_median_set_loss": _median([r["set_loss"] for r in on_plateau]) if on_plateau else None,
        "plateau": plateau_verdict(records, log_k, span, reference)
        if reference is not None and direction == "backward" else None,
        "final": final,
    }


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
