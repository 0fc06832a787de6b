"""A hand-built HookedTransformer with one known selector-routing head, for known-answer tests.

The task (:func:`handbuilt_task`): n_b = 4 groups, K = 4, B of 2, z of 2 and A of 2 characters,
so a sequence is ``<BOS> b b <SEP> z z <SEP> a a``. Target k of group g is ``A_gk = (c_k, d_g)``:
the first target character depends on the selector only (c_k is shared by all groups, distinct
within a group) and the second on the group only, so all targets are unique. The two characters of
selector z_j (``x_j``, ``y_j``) are used by no other string.

The model (:func:`selector_copy_model`): 2 layers x 2 heads, no LayerNorm, MLPs zeroed, every
weight set by hand on named residual dimensions (``DIMS``):

* embeddings: z characters write the one-hot "selector j" direction ``sel_in[j]``; BOS writes a
  flag; every alphabet token writes a small token-id pattern nobody reads; positions are one-hot;
* **L0H1** (:data:`SELECTOR_HEAD`): query = "I am the first-target-prediction position" (a
  positional one-hot), key = "I am a z position", score 40 (after the 1/sqrt(d_head) scale), so
  at that position it puts ~1/2 on each z position and ~0 elsewhere; at other positions its query
  is 0, i.e. uniform causal attention. OV copies ``sel_in`` to ``sel_out``;
* L0H0 attends to BOS and copies the BOS flag to a "prior" direction; L1H0 attends to BOS and
  writes where the unembedding never reads; L1H1 (the "group head") attends to the first B
  character, which is d_g, and copies its token id;
* unembedding: ``logit[c_k] = ALPHA * sel_out[k] + BETA * prior`` and ``logit[d_g] = GAMMA *
  (token id of d_g)``; nothing else is read. So greedy decoding gets both target tokens right.

Hence at the first-target position logit[c_j] - logit[c_k] = ALPHA for the true selector j, so
the candidate loss is ~(K - 1) exp(-ALPHA) ~ 0 and delta_z ~ ALPHA. Every other target
prediction reads only z (through L0H1's uniform attention) and BOS, never the candidate's own
tokens, so it adds the same score to all K candidates and cancels in the candidate loss. With L0H1
zero- or mean-ablated the K candidates' first tokens get equal logits: candidate loss = log K
exactly (the marginal). Ablating any other head leaves the candidate loss unchanged (zero-ablating
L0H0 or L1H1 only moves the set loss).

With ``split=True`` (:data:`SPLIT_HEADS`) the copy is split between two heads: L0H0 is built like
L0H1 (first-target position -> z positions) and each of the two copies ``sel_in`` to ``sel_out``
with weight 1/2 (no prior direction). Patching either head alone moves the logit difference
halfway (each holds half the effect), and ablating either alone leaves a margin of about
ALPHA / 2: the candidate loss stays far below log K; only ablating both returns it to log K. Any
one of them will do: *redundant*.

With ``conjunctive=True`` both layer-0 heads copy with weight 1, and L1H0 (:data:`COUNTER_HEAD`)
attends from the first-target position to z too and writes ``-sel_out``: the model's margin is
(1 + 1 - 1) ALPHA. Mean-ablating either layer-0 head (its mean output is the same for every
candidate) leaves 1 - 1 = 0: candidate loss log K. So each is needed and neither is enough:
*conjunctive*. Patching either one alone from the clean run into the corrupted one restores the
clean answer fully, so they hold half the positive effect each; the counter head's effect is
negative.

With ``damage=True`` (:data:`DAMAGE_HEAD`) the model also carries B's information in a way that
only cancels while two heads are intact: L1H0 attends from every position to the first B
character and copies its token id into a ``b_copy`` direction, L1H1 (which copies the same token
id anyway) adds its copy with the opposite sign, and the candidates' first tokens read both with
``logit[c_k] += DAMAGE * (b_copy - l1h1_out)[id of d_g] * [k == g]``. Intact, the two cancel:
nothing changes. Mean-ablating L1H0 (its mean over every example) leaves the mean copy minus the
group's own, which pulls candidate c_g down by about DAMAGE: the candidate loss goes far past
log K, with no z involved. Ablating it by the cue's mean (its mean over the group's K selectors)
changes nothing, because its output does not depend on z.
"""

from __future__ import annotations

from typing import Any

import torch

from plateauscope.model.backend import Model, initial_hooked_state, model_from_hooked_state
from plateauscope.model.config import ModelConfig
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_layout import BOS, SPECIAL_TOKENS

SELECTOR_HEAD: tuple[int, int] = (0, 1)
"""(layer, head) of the one head that routes the selector."""
SPLIT_HEADS: tuple[tuple[int, int], ...] = ((0, 0), (0, 1))
"""With ``split=True``: the two heads that share the copy, half each."""
COUNTER_HEAD: tuple[int, int] = (1, 0)
"""With ``conjunctive=True``: the layer-1 head that writes ``-sel_out``, against the two copies."""
DAMAGE_HEAD: tuple[int, int] = (1, 0)
"""With ``damage=True``: the layer-1 head whose B copy the other layer-1 head cancels."""
DAMAGE = 40.0
"""Logit by which a broken cancellation pulls one candidate down (``damage=True``)."""
BOS_HEAD: tuple[int, int] = (0, 0)
"""A layer-0 head that attends to BOS (changes the set loss when zero-ablated, never the candidates)."""
ALPHA = 10.0
"""Logit margin of the correct first target token when the selector head is intact."""
BETA = 5.0
"""Logit given to every candidate first token through the BOS head."""
GAMMA = 12.0
"""Logit of the group's second target character d_g (from the group head L1H1), at every position."""
SCORE = 40.0
"""Attention score (after scaling) of the keys a head is built to attend to; all others get 0."""

N_B, K = 4, 4
ALPHABET = "abcdefghijklmnop"
D_MODEL, N_HEADS, D_HEAD = 48, 2, 8
N_TOKEN_ID = 8


class HookedWeights:
    """HookedTransformer's attribute paths (``W_E``, ``W_pos``, ``W_U``, ``blocks[l].attn.W_Q``, ...)
    over a state dict in its layout, so that a model is built by hand on either backend: set the
    tensors, then :meth:`model`."""

    ALIASES = {"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos", "W_U": "unembed.W_U"}

    def __init__(self, cfg_dict: dict[str, Any], state: dict[str, torch.Tensor] | None = None, prefix: str = ""):
        self._cfg = cfg_dict
        self._state = {k: torch.zeros_like(v) if v.is_floating_point() and v.dim() else v
                       for k, v in initial_hooked_state(cfg_dict, seed=0).items()} if state is None else state
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        key = self._prefix + name if self._prefix else self.ALIASES.get(name, name)
        return self._state[key] if key in self._state else HookedWeights(self._cfg, self._state, key + ".")

    def __getitem__(self, index: int) -> HookedWeights:
        return HookedWeights(self._cfg, self._state, f"{self._prefix}{index}.")

    def model(self) -> Model:
        """The model holding these weights, on the installed backend, in eval mode."""
        return model_from_hooked_state(self._cfg, self._state).eval()


def handbuilt_task() -> SelectorTask:
    """The task described in the module docstring (targets (c_k, d_g), selectors (x_j, y_j))."""
    cfg = TaskConfig(n_b=N_B, K=K, b_len=2, z_len=2, a_len=2, alphabet=ALPHABET, seed=0)
    cfg.validate()
    off = len(SPECIAL_TOKENS)
    g, j = torch.arange(N_B), torch.arange(K)
    c = off + j  # a b c d: first target characters, one per selector
    d = off + K + g  # e f g h: second target characters, one per group
    b = torch.stack([off + K + g, off + g], -1)  # B_g = (d_g, c_g): distinct, never read
    z = torch.stack([off + 2 * K + j, off + 3 * K + j], -1)  # i j k l / m n o p: only in z
    a = torch.stack(torch.broadcast_tensors(c[None, :], d[:, None]), -1)  # [n_b, K, 2]
    return SelectorTask.from_token_arrays(cfg, b.numpy(), z.numpy(), a.numpy())


def _dims(n_ctx: int) -> dict[str, slice]:
    names = [("sel_in", K), ("sel_out", K), ("bos", 1), ("prior", 1), ("pos", n_ctx),
             ("tok_id", N_TOKEN_ID), ("l1h0_out", 1), ("l1h1_out", N_TOKEN_ID), ("b_copy", N_TOKEN_ID)]
    out, start = {}, 0
    for name, width in names:
        out[name] = slice(start, start + width)
        start += width
    assert start <= D_MODEL
    return out


@torch.no_grad()
def selector_copy_model(task: SelectorTask | None = None, split: bool = False,
                        conjunctive: bool = False, damage: bool = False) -> Model:
    """The hand-built model of the module docstring, for ``handbuilt_task()`` (the default);
    ``split``: the copy shared by :data:`SPLIT_HEADS`, half each; ``conjunctive``: both copy in full
    and :data:`COUNTER_HEAD` subtracts one copy; ``damage``: :data:`DAMAGE_HEAD` carries B in a
    cancellation that mean ablation breaks."""
    if damage and conjunctive:
        raise ValueError("damage uses L1H0, which conjunctive uses as its counter head")
    task = handbuilt_task() if task is None else task
    lay, vocab = task.layout, task.vocab
    if task.z_tokens.shape[0] != K or lay.seq_len != 9 or len(vocab) != len(SPECIAL_TOKENS) + len(ALPHABET):
        raise ValueError("selector_copy_model is built for handbuilt_task()")
    mcfg = ModelConfig(n_layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=16,
                       act_fn="relu", normalization_type=None)
    model = HookedWeights(task.hooked_config(mcfg))  # every weight zero
    dims = _dims(lay.seq_len)
    sel_in, sel_out, pos = (torch.arange(D_MODEL)[dims[n]] for n in ("sel_in", "sel_out", "pos"))
    bos_d, prior_d = dims["bos"].start, dims["prior"].start
    tok_id = torch.arange(D_MODEL)[dims["tok_id"]]
    q_scale = SCORE * D_HEAD**0.5  # undo TransformerLens' 1/sqrt(d_head) on the scores

    # Embeddings.
    model.W_E[vocab.index(BOS), bos_d] = 1.0
    for t in range(len(SPECIAL_TOKENS), len(vocab)):
        model.W_E[t, tok_id[t % N_TOKEN_ID]] = 1.0
    for jj, row in enumerate(task.z_tokens.tolist()):
        for t in row:
            model.W_E[t, sel_in[jj]] = 1.0
    model.W_pos[torch.arange(lay.seq_len), pos] = 1.0

    def attend(layer: int, head: int, query_pos: list[int], key_pos: list[int]) -> None:
        """Queries at ``query_pos`` score ``SCORE`` on keys at ``key_pos`` and 0 elsewhere."""
        model.blocks[layer].attn.W_Q[head, pos[query_pos], 0] = q_scale
        model.blocks[layer].attn.W_K[head, pos[key_pos], 0] = 1.0

    every = list(range(lay.seq_len))
    z_pos = list(range(*lay.z_span))
    # L0H1, the selector head: first-target position -> z positions; OV: sel_in -> sel_out.
    for L, H in SPLIT_HEADS if split or conjunctive else (SELECTOR_HEAD,):
        attend(L, H, [lay.first_target_pred_pos], z_pos)
        model.blocks[L].attn.W_V[H, sel_in, torch.arange(K)] = 1.0
        model.blocks[L].attn.W_O[H, torch.arange(K), sel_out] = 1.0 / len(SPLIT_HEADS) if split else 1.0
    if not (split or conjunctive):  # L0H0: every position -> BOS; OV: bos flag -> prior.
        L, H = BOS_HEAD
        attend(L, H, every, [0])
        model.blocks[L].attn.W_V[H, bos_d, 0] = 1.0
        model.blocks[L].attn.W_O[H, 0, prior_d] = 1.0
    # Layer 1: H0 -> BOS, writing where the unembedding does not read (conjunctive: first-target
    # position -> z, writing -sel_out); H1 -> first B character.
    if conjunctive:
        L, H = COUNTER_HEAD
        attend(L, H, [lay.first_target_pred_pos], z_pos)
        model.blocks[L].attn.W_V[H, sel_in, torch.arange(K)] = 1.0
        model.blocks[L].attn.W_O[H, torch.arange(K), sel_out] = -1.0
    elif damage:  # L1H0 -> first B character; OV: its token id -> b_copy
        attend(1, 0, every, [lay.b_span[0]])
        model.blocks[1].attn.W_V[0, tok_id, torch.arange(N_TOKEN_ID)] = 1.0
        model.blocks[1].attn.W_O[0, torch.arange(N_TOKEN_ID), torch.arange(D_MODEL)[dims["b_copy"]]] = 1.0
    else:
        attend(1, 0, every, [0])
        model.blocks[1].attn.W_V[0, bos_d, 0] = 1.0
        model.blocks[1].attn.W_O[0, 0, dims["l1h0_out"].start] = 1.0
    attend(1, 1, every, [lay.b_span[0]])
    model.blocks[1].attn.W_V[1, tok_id, torch.arange(N_TOKEN_ID)] = 1.0
    model.blocks[1].attn.W_O[1, torch.arange(N_TOKEN_ID), torch.arange(D_MODEL)[dims["l1h1_out"]]] = 1.0

    # Unembedding: candidate first tokens c_k read sel_out[k] and the prior.
    first = task.a_tokens[0, :, 0]  # c_k, the same in every group
    if not bool((task.a_tokens[:, :, 0] == first).all()):
        raise ValueError("the first target character must depend on the selector only")
    model.W_U[sel_out, first] = ALPHA
    model.W_U[prior_d, first] = BETA
    # ... and the second target characters d_g read the token id L1H1 copied from B_g[0] = d_g.
    second = task.a_tokens[:, 0, 1]
    if not bool((task.a_tokens[:, :, 1] == second[:, None]).all() & (task.b_tokens[:, 0] == second).all()):
        raise ValueError("the second target character must be the group's first B character")
    model.W_U[torch.arange(D_MODEL)[dims["l1h1_out"]][second % N_TOKEN_ID], second] = GAMMA
    if damage:  # candidate c_g reads group g's B copy from L1H0 and, negated, from L1H1: they cancel
        ids = second % N_TOKEN_ID  # the token id of d_g, group by group
        model.W_U[torch.arange(D_MODEL)[dims["b_copy"]][ids], first[: len(ids)]] = DAMAGE
        model.W_U[torch.arange(D_MODEL)[dims["l1h1_out"]][ids], first[: len(ids)]] = -DAMAGE
    return model.model()


class UniformOverCandidates(torch.nn.Module):
    """Puts exactly uniform mass on the K candidate strings of the prompt's group (z ignored).

    At a target position with typed prefix t, p(next = c) = #{candidates starting t + c} /
    #{candidates starting t}, so the probability of a whole candidate is 1/K: set loss 0,
    candidate loss log K, the marginal. Built for any task variant (the group is read from B
    through the task's layout); a lookup in Python, for tests only.
    """

    def __init__(self, task: SelectorTask):
        super().__init__()
        self.task = task
        self.dummy = torch.nn.Parameter(torch.zeros(()))
        self.group_of = {tuple(b): g for g, b in enumerate(task.b_tokens.tolist())}

    def candidates(self, row: list[int]) -> list[list[int]]:
        """The strings whose counts set the probabilities: the K candidates of the row's group."""
        return self.task.a_tokens[self.group_of[tuple(row[slice(*self.task.layout.b_span)])]].tolist()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [N, pos, vocab]: log of the candidate-count ratios at the target positions."""
        lay, vocab = self.task.layout, len(self.task.vocab)
        logits = torch.full((*tokens.shape, vocab), -1e4)
        a0, a1 = lay.a_span
        for n, row in enumerate(tokens.tolist()):
            cands = self.candidates(row)
            for pos in range(a0 - 1, min(a1 - 1, tokens.shape[1])):
                typed = row[a0:pos + 1]
                counts: dict[int, int] = {}
                for cand in cands:
                    if cand[: len(typed)] == typed:
                        counts[cand[len(typed)]] = counts.get(cand[len(typed)], 0) + 1
                total = sum(counts.values())
                for tok, c in counts.items():
                    logits[n, pos, tok] = float(torch.tensor(c / total).log())
        return logits


class UniformOverAlphabet(torch.nn.Module):
    """Knows nothing: uniform over the alphabet's characters at every position (special tokens ~0)."""

    def __init__(self, task: SelectorTask):
        super().__init__()
        self.n_vocab = len(task.vocab)
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [N, pos, vocab]: 0 on every character, -1e4 on <BOS> and <SEP>."""
        logits = torch.zeros(*tokens.shape, self.n_vocab)
        logits[..., : len(SPECIAL_TOKENS)] = -1e4
        return logits


class GlobalMarginal(UniformOverCandidates):
    """Knows p(A), the targets' distribution over all D examples, and nothing of B or z: the counts
    are over every example's target (repeats counted), so a whole string a gets count(a) / D."""

    def candidates(self, row: list[int]) -> list[list[int]]:
        """Every example's target, whatever the prompt."""
        return self.task.a_tokens.reshape(-1, self.task.cfg.a_len).tolist()
