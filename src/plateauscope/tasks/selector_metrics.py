"""The selector task's evaluation: candidate, set and first-token losses, delta_z, exact match.

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
  selector of the task (j shifted by a seeded 1..K-1, fixed per (group, j): never the true one)
  minus the candidate loss with the true z. ~0 while z is ignored, large (positive) once z is used.
  It needs no extra forward pass: the prefix (B_g, z_j') is another example of group g.
* ``first_token_set_loss`` = -log of the total probability that the first target token is one
  of the group's first characters (its K candidates' first characters, each counted once): the
  cheapest marginal. ~0 when the model has learned which characters start a candidate, about
  log(36 / K) when it knows nothing. It tells a marginal over first characters apart from a
  marginal over whole strings (``set_loss``).
* ``exact match``: greedy decoding reproduces the target iff, under teacher forcing, the
  argmax at every target position is the correct token.

The plateau verdict's **know-nothing reference** (``know_nothing_reference``) is the set loss of a
model that is uniform over the alphabet at every target position, computed exactly from the
task's candidate sets. "Uniform over the alphabet" means over the characters targets are made of
(not over ``<BOS>``/``<SEP>``, which never follow ``<SEP>`` in a target and which a model stops
predicting there within a few steps): 4 ln 36 - ln 10 = 12.03 nats for the paper's task.

The **global-marginal reference** (``global_marginal_reference``) is the set loss of a model that knows
the data set's distribution of targets exactly, p(A) over all D examples, but nothing of B or z,
and the same for the first character alone. It is what a cheap, shared marginal is worth: log(M / K)
nats with a pool of M targets (``target_pool``), about log n_b when every target differs. A
plateau that sits there has learned the global marginal, not nothing.

The forward task (A -> B) has no candidates and no selector: its candidate fields are None
and its tau is defined on exact-match accuracy (first evaluated step above 50%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from plateauscope.model.backend import shares_prefixes
from plateauscope.model.scoring import shared_prefix_logprobs, target_logprobs
from plateauscope.tasks.base import Task


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
    groups: Int[Tensor, " G"] | None = None
    """The evaluation groups (sorted): the plateau verdict's references average over these."""

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
                   task.tokens[task.example_ids(tracked).flatten()], eval_groups)


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
    # either backend scores shared prefixes once; any other module scores every sequence in full
    shared = shares_prefixes(model) and layout.z_span is not None
    if evalset.candidate_seqs is not None:
        G = evalset.shift.shape[0]
        if shared:
            logp, exact = shared_prefix_logprobs(model, evalset.candidate_seqs.view(G, K, K, -1),
                                                 (layout.z_span[0], layout.target_span[0]), task, batch_size)
        else:
            logp, exact = target_logprobs(model, evalset.candidate_seqs, task, batch_size)
            logp, exact = logp.view(G, K, K, -1), exact.view(G, K, K)
        scores = logp.sum(-1)  # [group, selector j (prefix), candidate k]
        out.update(candidate_metrics(scores, evalset.shift))
        diag = torch.arange(K)
        true_logp = logp[:, diag, diag]  # [G, K, T]
        out["accuracy"] = exact[:, diag, diag].float().mean().item()
        first_chars = evalset.candidate_seqs.view(G, K, K, -1)[:, 0, :, layout.target_span[0]]  # [G, K]
        out["first_token_set_loss"] = first_token_set_loss(logp[..., 0], first_chars)
    else:
        true_logp, exact = target_logprobs(model, evalset.eval_seqs, task, batch_size)
        out.update(candidate_loss=None, candidate_acc=None, set_loss=None, delta_z=None, first_token_set_loss=None,
                   seq_nll=-true_logp.sum(-1).mean().item())
        out["accuracy"] = exact.float().mean().item()
    out["loss"] = -true_logp.mean().item()
    out["first_token_loss"] = -true_logp[..., 0].mean().item()
    tracked = evalset.tracked_seqs
    if not len(tracked):  # an evaluation between two tracked_every steps
        return out
    if shared:  # a tracked group's K sequences share <BOS> B <SEP>; one whose first target token is
        # already missed is not run further (only exact matches are read)
        _, tracked_exact = shared_prefix_logprobs(model, tracked.view(-1, K, 1, tracked.shape[-1]),
                                                  (layout.z_span[0], layout.target_span[0]), task, batch_size,
                                                  prune=True)
    else:
        _, tracked_exact = target_logprobs(model, tracked, task, batch_size)
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


def global_marginal_reference(task: Task, groups: Int[Tensor, " G"] | None = None) -> dict:
    """Losses of a model that knows p(A), the targets' distribution over all D examples (B and z
    ignored), exactly, from the task.

    Per group: set loss = -log sum over its distinct candidates a of p(a); first-token set loss =
    -log sum over its distinct first characters c of p1(c), p1 the first characters' distribution;
    averaged over ``groups`` (default: every group).
    """
    every = task.a_tokens.reshape(-1, task.a_tokens.shape[-1])  # [D, a_len]: every example's target
    strings, string_of = every.unique(dim=0, return_inverse=True)
    p_string = torch.bincount(string_of, minlength=len(strings)).double() / len(every)
    p_first = torch.bincount(every[:, 0], minlength=len(task.vocab)).double() / len(every)
    string_of = string_of.view(task.a_tokens.shape[:2])  # [n_b, K]
    cand = task.a_tokens if groups is None else task.a_tokens[groups]
    string_of = string_of if groups is None else string_of[groups]
    keep, keep_first = first_occurrence(cand), first_occurrence(cand[..., 0])
    set_mass = (p_string[string_of] * keep).sum(-1)
    first_mass = (p_first[cand[..., 0]] * keep_first).sum(-1)
    return {"set_loss": (-set_mass.log()).mean().item(), "first_token_set_loss": (-first_mass.log()).mean().item()}


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


# ---- the ladder of reference predictors (Task.reference_predictors) -------------------------


def next_token_given(keys: Int[Tensor, "D c"], nexts: Int[Tensor, " D"], queries: Int[Tensor, "N c"], vocab: int
                     ) -> Float[Tensor, "N vocab"]:
    """The distribution of the next token among the data rows whose key equals each query's key,
    every row weighted the same (a query whose key no row has gets all zeros)."""
    rows = torch.cat([keys, queries])
    rows = torch.cat([torch.zeros(len(rows), 1, dtype=rows.dtype), rows], 1)  # an empty key is one key
    _, ids = rows.unique(dim=0, return_inverse=True)
    data_ids, query_ids = ids[: len(keys)], ids[len(keys):]
    counts = torch.zeros(int(ids.max()) + 1, vocab, dtype=torch.float64)
    counts.index_put_((data_ids, nexts), torch.ones(len(nexts), dtype=torch.float64), accumulate=True)
    rows = counts[query_ids]
    return rows / rows.sum(-1, keepdim=True).clamp_min(1.0)


def target_ladder(task: Task, tokens: Int[Tensor, "N seq"]) -> dict[str, Float[Tensor, "N T vocab"]]:
    """The selector task's four references at the target positions, under teacher forcing (each target
    token predicted after the true ones before it):

    * ``uniform``: uniform over the alphabet, knowing nothing;
    * ``global_marginal``: p(A), the targets' distribution over all D examples, B and z ignored;
    * ``group_marginal``: p(A | B), uniform over the K candidates of the sequence's group;
    * ``conditional``: p(A | B, z), all mass on the true target.
    """
    layout, V = task.layout, len(task.vocab)
    start, stop = layout.target_span
    T = stop - start
    every = task.tokens[:, start:stop]  # [D, T]: every example's target
    group_key = task.tokens[:, slice(*layout.b_span)]  # the group is its B
    target, query_group = tokens[:, start:stop], tokens[:, slice(*layout.b_span)]
    alphabet = torch.zeros(V, dtype=torch.float64)
    alphabet[len(task.vocab) - len(task.cfg.alphabet):] = 1.0 / len(task.cfg.alphabet)
    out = {name: torch.zeros(len(tokens), T, V, dtype=torch.float64)
           for name in ("uniform", "global_marginal", "group_marginal", "conditional")}
    for t in range(T):
        out["uniform"][:, t] = alphabet
        out["global_marginal"][:, t] = next_token_given(every[:, :t], every[:, t], target[:, :t], V)
        out["group_marginal"][:, t] = next_token_given(torch.cat([group_key, every[:, :t]], 1), every[:, t],
                                                       torch.cat([query_group, target[:, :t]], 1), V)
        out["conditional"][torch.arange(len(tokens)), t, target[:, t]] = 1.0
    return out
