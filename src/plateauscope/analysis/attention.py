"""Attention to the cue: which heads look at what the routing must read when the answer is predicted.

The cue and the positions come from the task (``plateauscope.tasks.base.Task``): for the selector task
the cue is z, read from the last ``<SEP>``; for induction it is the token after the earlier
occurrence of the current token. Method: run the model on seeded examples (the input tokens
``tokens[:, :task.input_len]``), caching only the attention patterns (``hook_pattern`` of every
layer), and read, for every (layer, head):

* ``to_z_first``: the attention weight from the prediction position (``task.pred_pos``) to the
  cue positions (``task.cue_positions(tokens, pred_pos)``, per example), summed over them and
  averaged over examples
  (the name keeps the selector task's z, so that earlier caches load);
* ``to_z_all_targets``: the same, averaged over the cue rule's query positions (by default every
  position the loss counts, ``task.loss_positions``), each with its own cue positions;
* ``entropy_first``: the entropy (nats) of the attention distribution at the prediction
  position, averaged over examples;
* ``rules``: for a task with other named attention patterns (``task.attention_rules()``, e.g.
  ``previous token``), the attention from each rule's query positions to its key positions,
  averaged like ``to_z_all_targets``.

Sign and range: ``to_z_*`` lie in [0, 1]; 1 means the head attends only to the cue (a routing
head), 0 that it ignores it. The entropy lies in [0, log(pred_pos + 1)]; low means focused.
Only a task with a cue (capability ``cue``) has these.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.prefix import activations
from plateauscope.model.backend import Model
from plateauscope.runs.run import Run
from plateauscope.tasks.base import Task


@dataclass
class AttentionToZ:
    """Per-head attention-to-z statistics, each ``[n_layers, n_heads]``."""

    to_z_first: Float[Tensor, "n_layers n_heads"]
    to_z_all_targets: Float[Tensor, "n_layers n_heads"]
    entropy_first: Float[Tensor, "n_layers n_heads"]
    n_examples: int
    rules: dict[str, Float[Tensor, "n_layers n_heads"]] = field(default_factory=dict)
    """The task's other named attention patterns, each averaged over its query positions."""

    def ranking(self) -> list[tuple[int, int]]:
        """(layer, head) pairs by decreasing ``to_z_first``."""
        n_heads = self.to_z_first.shape[1]
        order = self.to_z_first.flatten().argsort(descending=True, stable=True).tolist()
        return [(i // n_heads, i % n_heads) for i in order]

    def top_head(self) -> tuple[int, int]:
        """The head that attends most to the cue from the prediction position."""
        return self.ranking()[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: every per-head tensor as nested lists."""
        out = {
            "n_examples": self.n_examples,
            "to_z_first": self.to_z_first.tolist(),
            "to_z_all_targets": self.to_z_all_targets.tolist(),
            "entropy_first": self.entropy_first.tolist(),
            "top_head": list(self.top_head()),
        }
        if self.rules:
            out["rules"] = {name: values.tolist() for name, values in self.rules.items()}
        return out


def chance_attention(task: Task) -> float:
    """The attention to the cue from the prediction position under a uniform pattern: the cue's keys
    over all the keys that position can attend to (causal: ``pred_pos + 1``), averaged over the data
    set. A head at or below it does not single the cue out."""
    keys = task.cue_positions(task.tokens, task.pred_pos)
    return float((keys >= 0).sum(-1).double().mean()) / (task.pred_pos + 1)


@torch.inference_mode()
def attention_patterns(
    model: Model, tokens: Int[Tensor, "N seq"], input_len: int
) -> Float[Tensor, "N n_layers n_heads q k"]:
    """Attention patterns of every layer and head on the model's inputs (cached, nothing else)."""
    names = [get_act_name("pattern", layer) for layer in range(model.cfg.n_layers)]
    cache = activations(model, tokens[:, :input_len].to(next(model.parameters()).device), names)
    return torch.stack([cache[n] for n in names], dim=1).float().cpu()


def example_patterns(run: Run, step: int, examples: Sequence[int]
                     ) -> tuple[list[list[str]], Float[Tensor, "N n_layers n_heads q k"]]:
    """The model at ``step`` on the run's examples ``examples``: each one's input as token strings, and every
    head's attention pattern on it (what the report's attention views show)."""
    task = run.task()
    tokens = task.tokens[list(examples)]
    patterns = attention_patterns(run.model(step), tokens, task.input_len)
    return [task.decode(row[: task.input_len]) for row in tokens], patterns


def pattern_record(model: Model, task: Task, n_examples: int = 3, seed: int = 0) -> dict[str, Any]:
    """Attention patterns of every head on ``n_examples`` seeded examples, compactly: ``values`` is the
    base64 of a uint8 array ``[n_layers, n_heads, example, query, key]`` (row-major; weight =
    byte / 255, so within 0.002), ``tokens`` each example's token labels (for the time view)."""
    idx = task.sample_examples(n_examples, seed)
    tokens = task.tokens[idx]
    patterns = attention_patterns(model, tokens, task.input_len).permute(1, 2, 0, 3, 4)  # [L, H, N, q, k]
    quantised = (patterns * 255).round().clamp(0, 255).to(torch.uint8).contiguous().numpy()
    return {"examples": idx.tolist(), "shape": list(quantised.shape),
            "tokens": [task.decode(t[: task.input_len]) for t in tokens],
            "values": base64.b64encode(quantised.tobytes()).decode("ascii")}


def attention_to_keys(patterns: Float[Tensor, "N n_layers n_heads q k"], tokens: Int[Tensor, "N seq"],
                      queries: list[int], keys_of: Callable[[Tensor, int], Tensor]) -> Float[Tensor, "n_layers n_heads"]:
    """Attention from each of ``queries`` to its ``keys_of(tokens, query)`` (``[N, C]`` positions per
    sequence; -1 pads a row with fewer), summed over the keys and averaged over the queries and the sequences."""
    index = torch.stack([keys_of(tokens, q) for q in queries], dim=1)  # [N, T, C]
    if index.shape[-1] == 0:
        raise ValueError("an attention rule gave no key position for a query")
    rows = patterns[..., queries, :]  # [N, L, H, T, k]
    first = index[0, 0]
    if (index == first).all() and torch.equal(first, torch.arange(int(first[0]), int(first[0]) + len(first))):
        picked = rows[..., int(first[0]): int(first[-1]) + 1]  # one span for every sequence and query: a slice
    else:
        expanded = index[:, None, None].expand(*rows.shape[:3], *index.shape[1:])
        picked = rows.gather(-1, expanded.clamp(min=0)) * (expanded >= 0)
    return einops.reduce(picked, "n l h t k -> l h", "sum") / (len(patterns) * len(queries))


def attention_stats_from_patterns(
    patterns: Float[Tensor, "N n_layers n_heads q k"], tokens: Int[Tensor, "N seq"], task: Task
) -> AttentionToZ:
    """The statistics of the module docstring from already computed patterns of ``tokens``."""
    task.require("cue", "attention to the cue")
    first = patterns[..., task.pred_pos, :]  # [N, L, H, k]
    cue = task.attention_rules()["cue"]
    return AttentionToZ(
        to_z_first=attention_to_keys(patterns, tokens, [task.pred_pos], cue.keys),
        to_z_all_targets=attention_to_keys(patterns, tokens, cue.queries, cue.keys),
        entropy_first=einops.reduce(torch.special.entr(first), "n l h k -> l h", "sum") / len(patterns),
        n_examples=len(patterns),
        rules={name: attention_to_keys(patterns, tokens, rule.queries, rule.keys)
               for name, rule in task.attention_rules().items() if name != "cue"},
    )


def attention_stats(
    model: Model, tokens: Int[Tensor, "N seq"], task: Task, batch_size: int = 1024
) -> AttentionToZ:
    """Attention-to-cue statistics over the given full sequences (chunked; exact example average)."""
    task.require("cue", "attention to the cue")
    parts = [attention_stats_from_patterns(attention_patterns(model, chunk, task.input_len), chunk, task)
             for chunk in tokens.split(batch_size)]
    n = torch.tensor([p.n_examples for p in parts], dtype=torch.float32)[:, None, None]

    def avg(values: list[Tensor]) -> Float[Tensor, "n_layers n_heads"]:
        return (torch.stack(values) * n).sum(0) / n.sum()

    fields_ = ("to_z_first", "to_z_all_targets", "entropy_first")
    return AttentionToZ(*(avg([getattr(p, f) for p in parts]) for f in fields_), len(tokens),
                        {name: avg([p.rules[name] for p in parts]) for name in parts[0].rules})


def attention_to_z(model: Model, task: Task, n_examples: int = 256, seed: int = 0) -> AttentionToZ:
    """Attention-to-cue statistics of every head on ``n_examples`` seeded examples of ``task``."""
    task.require("cue", "attention to the cue")
    if n_examples < 1:
        raise ValueError(f"n_examples must be at least 1, got {n_examples}")
    return attention_stats(model, task.tokens[task.sample_examples(n_examples, seed)], task)


def head_table(values: Float[Tensor, "n_layers n_heads"]) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of a layers x heads table for ``plateauscope.cli.text.tables.format_table``."""
    rows = [[f"L{layer}", *[float(v) for v in row]] for layer, row in enumerate(values.tolist())]
    return rows, ["layer", *[f"H{h}" for h in range(values.shape[1])]]
