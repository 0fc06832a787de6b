"""Benchmark (not a test): ms per training step of our loop against a plain HookedTransformer
loop on the same preset, in one process, printed as ratios; the evaluation and checkpoint
overhead as a share of training time; GFLOP/s; and the options (threads, fused AdamW,
bf16 autocast) with their effect.

    .venv/bin/python bench/train_step.py --preset paper --steps 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from training.config import RunConfig
from training.metrics import EvalSet, evaluate
from training.model import build_hooked_transformer, hooked_config_dict
from training.presets import get_preset
from training.task import Task
from training.train import train


def plain_loop(cfg: RunConfig, steps: int, fused: bool = False, bf16: bool = False) -> float:
    """Seconds per step of a bare TransformerLens loop: random minibatches, target-token CE."""
    task = Task.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task.layout, len(task.vocab)), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                            fused=fused or None)
    pos = torch.tensor(task.layout.target_pred_positions)
    gen = torch.Generator().manual_seed(0)
    batches = [task.tokens[torch.randint(0, task.cfg.D, (cfg.train.batch_size,), generator=gen)]
               for _ in range(steps + 5)]
    for i, batch in enumerate(batches):
        if i == 5:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch[:, : task.layout.input_len])[:, pos]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, pos + 1].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def our_loop(cfg: RunConfig, steps: int, with_eval: bool) -> float:
    """Seconds per step of training.train (with the preset's evaluation/checkpoint schedule, or none)."""
    if not with_eval:
        cfg = cfg.replace(eval_every=10**9, ckpt_every=10**9, early_log_points=0)
    cfg = cfg.replace(max_steps=steps)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(cfg, Path(d) / "run", device="cpu", progress=False)
        total = time.perf_counter() - t0
    return total / steps


def eval_seconds(cfg: RunConfig) -> float:
    task = Task.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task.layout, len(task.vocab)), seed=0)
    evalset = EvalSet.build(task, cfg.train.eval_groups, cfg.train.tracked_groups, 0)
    evaluate(model, task, evalset)
    t0 = time.perf_counter()
    evaluate(model, task, evalset)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args()
    cfg = get_preset(args.preset)
    task = Task.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task.layout, len(task.vocab)), seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = cfg.train.batch_size * task.layout.input_len
    print(f"preset {args.preset}: {n_params / 1e6:.2f}M parameters, batch {cfg.train.batch_size}, "
          f"{torch.get_num_threads()} threads")

    base = plain_loop(cfg, args.steps)
    ours_bare = our_loop(cfg, args.steps, with_eval=False)
    ours_full = our_loop(cfg, args.steps, with_eval=True)
    ev = eval_seconds(cfg)
    gflops = 6 * n_params * tokens_per_step / base / 1e9
    print(f"plain HookedTransformer loop : {base * 1e3:7.1f} ms/step  ({gflops:.1f} GFLOP/s, 6*N*tokens)")
    print(f"training.train, no eval/ckpt : {ours_bare * 1e3:7.1f} ms/step  ratio {ours_bare / base:.2f}x")
    print(f"training.train, preset sched.: {ours_full * 1e3:7.1f} ms/step  ratio {ours_full / base:.2f}x")
    per_interval = ev / (cfg.train.eval_every * base)
    print(f"one evaluation               : {ev * 1e3:7.1f} ms = {per_interval:.1%} of the "
          f"{cfg.train.eval_every} training steps between evaluations")
    print(f"eval + checkpoint overhead   : {(ours_full - ours_bare) / ours_full:.1%} of training wall time "
          f"over the first {args.steps} steps (the log-spaced early evaluations weigh most here)")
    fused = plain_loop(cfg, args.steps, fused=True)
    print(f"fused AdamW                  : {fused * 1e3:7.1f} ms/step  ratio {fused / base:.2f}x")
    bf16 = plain_loop(cfg, args.steps, bf16=True)
    print(f"bf16 autocast                : {bf16 * 1e3:7.1f} ms/step  ratio {bf16 / base:.2f}x")
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
        one = plain_loop(cfg, args.steps)
        torch.set_num_threads(threads)
        print(f"1 thread instead of {threads}        : {one * 1e3:7.1f} ms/step  ratio {one / base:.2f}x")


if __name__ == "__main__":
    main()
