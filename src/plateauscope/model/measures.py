"""Built-in measures of a model: quantities any run has, whatever its task.

Each is a function of the model (and, for those that read activations, a batch of full sequences and
the positions the loss counts); the analysis computes them at every analysed checkpoint
(:mod:`plateauscope.analysis.measures`).

* :func:`weight_norms`: the L2 norm of the trainable parameters (the model's own, whatever its family:
  :func:`plateauscope.model.families.parameters_by_layer`), per layer (the parameters of each block) and in
  total (every parameter once, embeddings and unembedding included), the quantity weight decay shrinks
  (Nanda et al. 2023).
* :func:`effective_rank`: the entropy-based effective rank of a matrix (Roy & Vetterli 2007): with
  ``p_i = s_i / sum(s)`` the normalised singular values, ``exp(-sum p_i log p_i)``; between 1 (rank
  one) and ``min(rows, cols)`` (all singular values equal). Applied to the token embedding.
* :func:`representation_collapse`: per layer, the cosine similarity of the residual stream
  (``hook_resid_post``) between every pair of distinct loss positions of a sequence, averaged over
  the pairs and then the sequences: Gopalani & Hu (2025)'s mean pairwise cosine similarity of the
  hidden states at the output positions (they read it before the unembedding; here each layer's
  output, the last layer's being the state before the final LayerNorm). Near 1: every position
  holds the same representation (collapse).
* :func:`repetition_bias`: the share of consecutive loss positions whose greedy predictions (the
  argmax of the logits) are the same token, averaged over sequences: Gopalani & Hu's repeat
  frequency (the share of adjacent output tokens that are equal), on the model's teacher-forced
  predictions instead of a generation.
* the attention patterns (:func:`activation_measures`) and :func:`pattern_distance`: each head's attention pattern on
  fixed sequences, and its distance to another pattern (the final checkpoint's): the total-variation
  distance ``0.5 * sum_k |a_k - b_k|`` between the two rows of each query position, averaged over
  queries and sequences, per head; in [0, 1], 0 for the same pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.model.backend import Model
from plateauscope.model.families import embedding_matrix, parameters_by_layer


def weight_norms(model: Model) -> tuple[float, list[float]]:
    """The L2 norm of all trainable parameters (each once: a tied embedding and unembedding once), and of each
    layer's parameters (the modules of ``model.blocks[l]``), whatever the model's layout
    (:func:`plateauscope.model.families.parameters_by_layer`)."""
    squares = [(float(p.detach().double().square().sum()), layer) for _, p, layer in parameters_by_layer(model)]
    per_layer = [sum(v for v, at in squares if at == layer) for layer in range(model.cfg.n_layers)]
    return sum(v for v, _ in squares) ** 0.5, [v ** 0.5 for v in per_layer]


def effective_rank(matrix: Float[Tensor, "rows cols"]) -> float:
    """Roy & Vetterli's entropy-based effective rank of ``matrix`` (1 for a zero matrix)."""
    s = torch.linalg.svdvals(matrix.detach().double())
    total = s.sum()
    if total <= 0:
        return 1.0
    p = s / total
    return float(torch.exp(torch.special.entr(p).sum()))


def embedding_effective_rank(model: Model) -> float:
    """:func:`effective_rank` of the token embedding ``[d_vocab, d_model]`` (the model's own tensor)."""
    return effective_rank(embedding_matrix(model))


@dataclass
class ActivationMeasures:
    """The measures of :func:`activation_measures`, from one forward."""

    collapse: list[float]
    """Per layer: :func:`representation_collapse`."""
    repetition: float | None
    """:func:`repetition_bias` (None: fewer than two loss positions)."""
    patterns: Float[Tensor, "N n_layers n_heads q k"]
    """Every head's attention pattern (float64, CPU), for :func:`pattern_distance`."""


def _pairwise_cosine(resid: Float[Tensor, "N P d"]) -> float:
    """Mean cosine similarity over the distinct pairs of positions of each sequence, then sequences: with
    ``u`` the unit vectors, the sum over pairs ``i != j`` of ``u_i . u_j`` is ``|sum_i u_i|^2 - sum_i |u_i|^2``."""
    unit = torch.nn.functional.normalize(resid.double(), dim=-1)
    n_pos = resid.shape[1]
    off_diagonal = unit.sum(1).square().sum(-1) - unit.square().sum((1, 2))  # [N]
    return float(off_diagonal.mean() / (n_pos * (n_pos - 1)))


def collapse_positions(loss_positions: list[int], input_len: int) -> list[int]:
    """The positions representation collapse compares: the loss positions, or every input position
    when the loss counts fewer than two."""
    return list(loss_positions) if len(loss_positions) >= 2 else list(range(input_len))


def resid_names(n_layers: int) -> list[str]:
    """The hook names :func:`measures_from_activations` reads the residual stream from."""
    return [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]


def pattern_names(n_layers: int) -> list[str]:
    """The hook names :func:`measures_from_activations` reads the attention patterns from."""
    return [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]


def measures_from_activations(cache: dict[str, Tensor], logits_at_loss: Float[Tensor, "N P vocab"] | None,
                              n_layers: int, loss_positions: list[int], input_len: int) -> ActivationMeasures:
    """Representation collapse, repetition bias and the patterns from one forward's activations
    (``cache``: :func:`resid_names` and :func:`pattern_names`) and its logits at the loss positions."""
    positions = collapse_positions(loss_positions, input_len)
    repetition = None
    if len(loss_positions) >= 2 and logits_at_loss is not None:
        predicted = logits_at_loss.argmax(-1)  # [N, P]
        repetition = float((predicted[:, 1:] == predicted[:, :-1]).double().mean())
    return ActivationMeasures(collapse=[_pairwise_cosine(cache[n][:, positions]) for n in resid_names(n_layers)],
                              repetition=repetition,
                              patterns=torch.stack([cache[n] for n in pattern_names(n_layers)], dim=1).double().cpu())


@torch.inference_mode()
def activation_measures(model: Model, tokens: Int[Tensor, "N seq"], loss_positions: list[int]) -> ActivationMeasures:
    """Representation collapse, repetition bias and the attention patterns of the inputs of ``tokens``
    (full sequences; the model reads ``tokens[:, :-1]``), from one ``run_with_cache``."""
    n_layers = model.cfg.n_layers
    wanted = set(resid_names(n_layers) + pattern_names(n_layers))
    inputs = tokens[:, :-1].to(next(model.parameters()).device)
    logits, cache = model.run_with_cache(inputs, names_filter=lambda n: n in wanted)
    return measures_from_activations({n: cache[n] for n in wanted}, logits[:, loss_positions], n_layers,
                                     loss_positions, inputs.shape[1])


def representation_collapse(model: Model, tokens: Int[Tensor, "N seq"], loss_positions: list[int]) -> list[float]:
    """Per layer, the mean pairwise cosine similarity of ``hook_resid_post`` over the positions of
    :func:`collapse_positions` (module docstring)."""
    return activation_measures(model, tokens, loss_positions).collapse


def repetition_bias(model: Model, tokens: Int[Tensor, "N seq"], loss_positions: list[int]) -> float | None:
    """The share of consecutive loss positions whose argmax predictions are equal (None: fewer than two)."""
    return activation_measures(model, tokens, loss_positions).repetition


def pattern_distance(patterns: Float[Tensor, "N n_layers n_heads q k"],
                     reference: Float[Tensor, "N n_layers n_heads q k"]) -> Float[Tensor, "n_layers n_heads"]:
    """Per head, the total-variation distance between the rows of ``patterns`` and ``reference``
    (same sequences), averaged over query positions and sequences."""
    if patterns.shape != reference.shape:
        raise ValueError(f"patterns of shape {tuple(patterns.shape)} and {tuple(reference.shape)} cannot be compared")
    tv = 0.5 * (patterns.double() - reference.double()).abs().sum(-1)  # [N, L, H, q]
    return tv.mean(dim=(0, 3))
