"""Attention to the selector: which heads look at z when the target is predicted.

Method: run the model on seeded examples (the input tokens ``tokens[:, :layout.input_len]``),
caching only the attention patterns (``hook_pattern`` of every layer), and read, for every
(layer, head):

* ``to_z_first``: the attention weight from the position that predicts the first target token
  (``layout.first_target_pred_pos``) to the z positions (``layout.z_span``), summed over the z
  positions and averaged over examples;
* ``to_z_all_targets``: the same, averaged over every target-predicting position
  (``layout.target_pred_positions``) as well;
* ``entropy_first``: the entropy (nats) of the attention distribution at the first-target
  position, averaged over examples.

Sign and range: ``to_z_*`` lie in [0, 1]; 1 means the head attends only to z (a selector-routing
head), 0 that it ignores z. The entropy lies in [0, log(first_target_pred_pos + 1)]; low means
focused. Only the backward task has a selector.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from interp.cli import add_ckpt_args, format_table, resolve_ckpt, run_cli, write_json
from training.backend import Model
from training.layout import Layout
from training.task import Task


@dataclass
class AttentionToZ:
    """Per-head attention-to-z statistics, each ``[n_layers, n_heads]``."""

    to_z_first: Float[Tensor, "n_layers n_heads"]
    to_z_all_targets: Float[Tensor, "n_layers n_heads"]
    entropy_first: Float[Tensor, "n_layers n_heads"]
    n_examples: int

    def ranking(self) -> list[tuple[int, int]]:
        """(layer, head) pairs by decreasing ``to_z_first``."""
        n_heads = self.to_z_first.shape[1]
        order = self.to_z_first.flatten().argsort(descending=True, stable=True).tolist()
        return [(i // n_heads, i % n_heads) for i in order]

    def top_head(self) -> tuple[int, int]:
        """The head that attends most to z from the first-target position."""
        return self.ranking()[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: every per-head tensor as nested lists."""
        return {
            "n_examples": self.n_examples,
            "to_z_first": self.to_z_first.tolist(),
            "to_z_all_targets": self.to_z_all_targets.tolist(),
            "entropy_first": self.entropy_first.tolist(),
            "top_head": list(self.top_head()),
        }


def _check_layout(layout: Layout) -> tuple[int, int]:
    if layout.z_span is None:
        raise ValueError("attention to z needs a selector in the prompt (the forward task and no_z have none)")
    return layout.z_span


@torch.inference_mode()
def attention_patterns(
    model: Model, tokens: Int[Tensor, "N seq"], layout: Layout
) -> Float[Tensor, "N n_layers n_heads q k"]:
    """Attention patterns of every layer and head on the model's inputs (cached, nothing else)."""
    names = [get_act_name("pattern", layer) for layer in range(model.cfg.n_layers)]
    wanted = set(names)
    device = next(model.parameters()).device
    _, cache = model.run_with_cache(tokens[:, : layout.input_len].to(device), names_filter=lambda n: n in wanted)
    return torch.stack([cache[n] for n in names], dim=1).float().cpu()


def attention_stats_from_patterns(
    patterns: Float[Tensor, "N n_layers n_heads q k"], layout: Layout
) -> AttentionToZ:
    """The statistics of the module docstring from already computed patterns."""
    z0, z1 = _check_layout(layout)
    first = patterns[..., layout.first_target_pred_pos, :]  # [N, L, H, k]
    targets = patterns[..., layout.target_pred_positions, :]  # [N, L, H, T, k]
    return AttentionToZ(
        to_z_first=einops.reduce(first[..., z0:z1], "n l h k -> l h", "sum") / len(patterns),
        to_z_all_targets=einops.reduce(targets[..., z0:z1], "n l h t k -> l h", "sum")
        / (len(patterns) * targets.shape[-2]),
        entropy_first=einops.reduce(torch.special.entr(first), "n l h k -> l h", "sum") / len(patterns),
        n_examples=len(patterns),
    )


def attention_stats(
    model: Model, tokens: Int[Tensor, "N seq"], layout: Layout, batch_size: int = 1024
) -> AttentionToZ:
    """Attention-to-z statistics over the given full sequences (chunked; exact example average)."""
    _check_layout(layout)
    parts = [attention_stats_from_patterns(attention_patterns(model, chunk, layout), layout)
             for chunk in tokens.split(batch_size)]
    n = torch.tensor([p.n_examples for p in parts], dtype=torch.float32)[:, None, None]

    def avg(field: str) -> Float[Tensor, "n_layers n_heads"]:
        return (torch.stack([getattr(p, field) for p in parts]) * n).sum(0) / n.sum()

    return AttentionToZ(avg("to_z_first"), avg("to_z_all_targets"), avg("entropy_first"), len(tokens))


def sample_examples(task: Task, n_examples: int, seed: int) -> Int[Tensor, " n"]:
    """``n_examples`` seeded example indices of the task (all of them if it has fewer)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(task.cfg.D, generator=gen)[: min(n_examples, task.cfg.D)]


def attention_to_z(model: Model, task: Task, n_examples: int = 256, seed: int = 0) -> AttentionToZ:
    """Attention-to-z statistics of every head on ``n_examples`` seeded examples of ``task``."""
    _check_layout(task.layout)
    if n_examples < 1:
        raise ValueError(f"n_examples must be at least 1, got {n_examples}")
    return attention_stats(model, task.tokens[sample_examples(task, n_examples, seed)], task.layout)


def head_table(values: Float[Tensor, "n_layers n_heads"]) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of a layers x heads table for ``interp.cli.format_table``."""
    rows = [[f"L{layer}", *[float(v) for v in row]] for layer, row in enumerate(values.tolist())]
    return rows, ["layer", *[f"H{h}" for h in range(values.shape[1])]]


def main(argv: list[str] | None = None) -> int:
    """``python -m interp.attention``: attention to z per head at one checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m interp.attention", description=__doc__.splitlines()[0])
    add_ckpt_args(parser)

    def body(args: argparse.Namespace) -> None:
        run, step = resolve_ckpt(args.ckpt, args.step)
        model = run.load_model(step, device=args.device, backend=args.backend)
        res = attention_to_z(model, run.task(), args.n_examples, args.seed)
        print(f"{run.path} step {step}: attention from the first-target position to z "
              f"({res.n_examples} examples); top head L{res.top_head()[0]}H{res.top_head()[1]}")
        for title, values in (("attention to z, first target position", res.to_z_first),
                              ("attention to z, all target positions", res.to_z_all_targets),
                              ("attention entropy (nats), first target position", res.entropy_first)):
            print(f"\n{title}")
            print(format_table(*head_table(values)))
        write_json(args.json, {"run": str(run.path), "step": step, "seed": args.seed, **res.to_dict()})

    return run_cli(body, argv, parser)


if __name__ == "__main__":
    raise SystemExit(main())
