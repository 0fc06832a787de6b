"""A hand-built 2-layer attention-only model that does induction, for known-answer tests.

The task (:func:`handbuilt_induction_task`): V = 12 tokens, segments of L = 4, gaps up to F = 2, so
a sequence has 1 + F + 2L = 11 tokens. The model (:func:`induction_model`): 2 layers x 2 heads,
no LayerNorm, every weight set by hand on named residual subspaces: ``tok`` (the token, one-hot),
``pos`` (the position, one-hot), ``prev`` (the previous token, one-hot) and ``out`` (the token to
predict, one-hot). Only these two heads do anything:

* **L0H0** (:data:`PREVIOUS_TOKEN_HEAD`): query "I am at position i", key "I am at position i - 1",
  score 40 after the scale: it attends to the previous token and copies its ``tok`` to ``prev``;
* **L1H1** (:data:`INDUCTION_HEAD`): query = the current token (``tok``), key = the previous token
  (``prev``): it attends to the position after the earlier occurrence of the current token and
  copies that position's ``tok`` to ``out``, which the unembedding reads.

L0H1 and L1H0 have zero weights (uniform attention, zero output). So on a repeat sequence the
argmax predicts every repeated token after the first (r_2 .. r_L) and the loss there is ~0.
"""

from __future__ import annotations

import torch

from plateauscope.model.backend import Model
from plateauscope.model.config import ModelConfig
from plateauscope.tasks.induction import InductionConfig, InductionTask
from tests.handbuilt import HookedWeights

PREVIOUS_TOKEN_HEAD = (0, 0)
INDUCTION_HEAD = (1, 1)
SCORE = 40.0
UNEMBED = 20.0
"""Logit of the copied token (the others get 0): a loss of about V exp(-20) on the repeat."""


def handbuilt_induction_task(n_sequences: int = 64, repeat_fraction: float = 1.0) -> InductionTask:
    """The small induction task the hand-built model is built for."""
    return InductionTask.generate(InductionConfig(vocab_size=12, segment_len=4, max_gap=2, n_sequences=n_sequences,
                                                  repeat_fraction=repeat_fraction))


@torch.no_grad()
def induction_model(task: InductionTask | None = None) -> Model:
    """The model of the module docstring."""
    task = handbuilt_induction_task() if task is None else task
    n_vocab, n_ctx = len(task.vocab), task.seq_len
    tok, pos, prev, out = (range(start, start + n) for start, n in
                           ((0, n_vocab), (n_vocab, n_ctx), (n_vocab + n_ctx, n_vocab), (2 * n_vocab + n_ctx, n_vocab)))
    d_model, d_head = 3 * n_vocab + n_ctx, max(n_vocab, n_ctx)
    mcfg = ModelConfig(n_layers=2, d_model=d_model, n_heads=2, d_head=d_head, d_mlp=4, normalization_type=None,
                       attn_only=True)
    model = HookedWeights(task.hooked_config(mcfg))  # every weight zero
    scale = SCORE * d_head ** 0.5  # HookedTransformer divides the scores by sqrt(d_head)
    model.embed.W_E[torch.arange(n_vocab), list(tok)] = 1.0
    model.pos_embed.W_pos[torch.arange(n_ctx), list(pos)] = 1.0
    # L0H0: the previous token. Query at position i -> e_i; key at position j -> e_{j+1}.
    attn0 = model.blocks[0].attn
    l0, h0 = PREVIOUS_TOKEN_HEAD
    for i in range(n_ctx):
        attn0.W_Q[h0, pos[i], i] = scale
        if i + 1 < d_head:
            attn0.W_K[h0, pos[i], i + 1] = 1.0
    for t in range(n_vocab):
        attn0.W_V[h0, tok[t], t] = 1.0
        attn0.W_O[h0, t, prev[t]] = 1.0
    # L1H1: induction. Query: the current token; key: the previous token; value: the token there.
    attn1 = model.blocks[1].attn
    _, h1 = INDUCTION_HEAD
    for t in range(n_vocab):
        attn1.W_Q[h1, tok[t], t] = scale
        attn1.W_K[h1, prev[t], t] = 1.0
        attn1.W_V[h1, tok[t], t] = 1.0
        attn1.W_O[h1, t, out[t]] = 1.0
        model.unembed.W_U[out[t], t] = UNEMBED
    return model.model()
