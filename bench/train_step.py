"""Benchmark (not a test): ms per training step of our loop against a plain HookedTransformer
loop on the same preset, in one process, printed as ratios; the evaluation and checkpoint
overhead as a share of training time; GFLOP/s; and the options (threads, fused AdamW,
bf16 autocast) with their effect.

Evaluation share (issue 10, target < 10% of wall time): one ``training.tasks.selector_metrics.evaluate``
(shared prefixes scored once) against scoring every evaluation sequence in full (the old
computation, ``target_logprobs`` on all candidate and tracked sequences), and the share of the
wall time evaluation takes on the ``demo`` run (``--demo-steps``, its length at 1.5 tau) and on
the first 400 steps of the ``paper`` preset, each with its preset's evaluation schedule
(training steps at the measured ms/step, plus the evaluations and checkpoints); then the first
400 steps of ``paper`` trained for real, every evaluation timed.

    .venv/bin/python bench/train_step.py --preset paper --steps 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from training.config import RunConfig
from training.tasks.selector_metrics import EvalSet, evaluate
from training.scoring import target_logprobs
from training.model import build_hooked_transformer, hooked_config_dict
from training.presets import get_preset
from training.tasks.selector import SelectorTask
from training import run as rd
from training.schedule import scheduled_steps
from training.train import train


def plain_loop(cfg: RunConfig, steps: int, fused: bool = False, bf16: bool = False) -> float:
    """Seconds per step of a bare TransformerLens loop: random minibatches, target-token CE."""
    task = SelectorTask.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                            fused=fused or None)
    gen = torch.Generator().manual_seed(0)
    batches = [task.tokens[torch.randint(0, task.cfg.D, (cfg.train.batch_size,), generator=gen)]
               for _ in range(steps + 5)]
    for i, batch in enumerate(batches):
        if i == 5:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch[:, : task.input_len])
        loss = task.loss(logits, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def our_loop(cfg: RunConfig, steps: int) -> float:
    """Seconds per step of training.train with evaluation and checkpoints off: the time of a
    2N-step run minus that of an N-step run, over N, so set-up and the end-point evaluation cancel."""
    cfg = cfg.replace(eval_every=10**9, ckpt_every=10**9, early_log_points=0)

    def run(n: int) -> float:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            train(cfg.replace(max_steps=n), Path(d) / "run", device="cpu", progress=False)
            return time.perf_counter() - t0

    return (run(2 * steps) - run(steps)) / steps


def best_of(rounds: int, fn, *args, **kw) -> float:
    """The fastest of ``rounds`` calls: load from other processes only ever adds time."""
    return min(fn(*args, **kw) for _ in range(rounds))


def eval_seconds(cfg: RunConfig, full: bool = False) -> float:
    """Seconds of one evaluation with the preset's evaluation set; ``full``: every sequence scored
    in full, the computation before prefixes were shared (the same numbers)."""
    task = SelectorTask.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task), seed=0).eval()
    evalset = EvalSet.build(task, cfg.train.eval_groups, cfg.train.tracked_groups, 0)

    def run() -> None:
        if full:
            target_logprobs(model, evalset.candidate_seqs, task, cfg.train.eval_batch_size)
            target_logprobs(model, evalset.tracked_seqs, task, cfg.train.eval_batch_size)
        else:
            evaluate(model, task, evalset, cfg.train.eval_batch_size)

    run()  # warm-up

    def once() -> float:
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    return best_of(3, once)


def eval_share(cfg: RunConfig, steps: int, step_s: float, eval_s: float, ckpt_s: float) -> tuple[int, float]:
    """(evaluations, share of the wall time) of a ``steps``-step run with ``cfg``'s schedule."""
    tc = cfg.train
    n_eval = len(scheduled_steps(tc.eval_every, steps, tc.early_log_points))
    n_ckpt = len(scheduled_steps(tc.ckpt_every, steps, tc.early_log_points))
    wall = steps * step_s + n_eval * eval_s + n_ckpt * ckpt_s
    return n_eval, n_eval * eval_s / wall


def checkpoint_seconds(cfg: RunConfig) -> float:
    """One checkpoint: the safetensors weights plus the resume state (optimiser, data order, RNGs)."""
    task = SelectorTask.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task), seed=0)
    opt = torch.optim.AdamW(model.parameters())
    model(task.tokens[:8, : task.layout.input_len]).sum().backward()
    opt.step()

    def once() -> float:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            rd.save_checkpoint(Path(d) / "w.safetensors", model.state_dict(), 1)
            rd.save_resume_state(Path(d) / "r.pt", {"optimizer": opt.state_dict(), "perm": torch.randperm(task.cfg.D)})
            return time.perf_counter() - t0

    return best_of(3, once)


def measured_eval_share(cfg: RunConfig, steps: int) -> tuple[int, float, float]:
    """Train ``cfg`` for ``steps`` steps (its own schedule, no early stop) with every evaluation timed:
    (evaluations, seconds in evaluation, wall seconds of the whole run)."""
    import training.train as train_module

    spent: list[float] = []
    inner = train_module.evaluate

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t0)

    train_module.evaluate = timed
    try:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            train(cfg.replace(max_steps=steps, stop_after_tau=None), Path(d) / "run", device="cpu", progress=False)
            wall = time.perf_counter() - t0
    finally:
        train_module.evaluate = inner
    return len(spent), sum(spent), wall


def print_eval_shares(args: argparse.Namespace, step_s: float, ckpt_s: float) -> None:
    """Evaluation against the full-scoring baseline, and its share of the demo and paper-400 runs
    (``step_s``: seconds per training step of the paper model, which the demo shares)."""
    print("evaluation (target: under 10% of wall time)")
    for name, steps in [("demo", args.demo_steps), ("paper", args.paper_steps)]:
        cfg = get_preset(name)
        ev, old = eval_seconds(cfg), eval_seconds(cfg, full=True)
        n, share = eval_share(cfg, steps, step_s, ev, ckpt_s)
        _, old_share = eval_share(cfg, steps, step_s, old, ckpt_s)
        print(f"  {name:<6} {steps:>5} steps, {n:>3} evaluations: one evaluation {ev * 1e3:6.1f} ms "
              f"(every sequence in full {old * 1e3:6.1f} ms, {old / ev:.1f}x); share of wall time "
              f"{share:5.1%} (was {old_share:5.1%}; target < 10%: {'met' if share < 0.10 else 'NOT met'})")
    n, ev_s, wall = measured_eval_share(get_preset("paper"), args.paper_steps)
    print(f"  paper  {args.paper_steps:>5} steps trained (measured, not estimated): {n} evaluations took "
          f"{ev_s:.2f} s of {wall:.1f} s = {ev_s / wall:5.1%} (target < 10%: {'met' if ev_s / wall < 0.10 else 'NOT met'})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument("--steps", type=int, default=60, help="steps per timed loop")
    p.add_argument("--rounds", type=int, default=3, help="each loop is timed this many times; the fastest counts")
    p.add_argument("--run-steps", type=int, default=2200, help="length of the run the overhead is estimated for")
    p.add_argument("--demo-steps", type=int, default=2300, help="length of the demo run (default 2300 = 1.5 tau)")
    p.add_argument("--paper-steps", type=int, default=400, help="first steps of the paper preset (default 400)")
    p.add_argument("--only-eval", action="store_true", help="only the evaluation shares")
    args = p.parse_args()
    cfg = get_preset(args.preset)
    task = SelectorTask.generate(cfg.task)
    model = build_hooked_transformer(hooked_config_dict(cfg.model, task), seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = cfg.train.batch_size * task.layout.input_len
    print(f"preset {args.preset}: {n_params / 1e6:.2f}M parameters, batch {cfg.train.batch_size}, "
          f"{torch.get_num_threads()} threads; best of {args.rounds} rounds of {args.steps} steps")

    if args.only_eval:
        base = best_of(args.rounds, plain_loop, get_preset("paper"), args.steps)
        print(f"plain HookedTransformer loop (paper model): {base * 1e3:.1f} ms/step")
        print_eval_shares(args, base, checkpoint_seconds(get_preset("paper")))
        return
    base = bare = float("inf")
    for _ in range(args.rounds):  # interleaved, so a burst of load hits both alike
        base = min(base, plain_loop(cfg, args.steps))
        bare = min(bare, our_loop(cfg, args.steps))
    gflops = 6 * n_params * tokens_per_step / base / 1e9
    print(f"plain HookedTransformer loop : {base * 1e3:7.1f} ms/step  ({gflops:.1f} GFLOP/s, 6*N*tokens)")
    print(f"training.train (no schedule) : {bare * 1e3:7.1f} ms/step  ratio {bare / base:.2f}x")

    tc = cfg.train
    ev, ck = eval_seconds(cfg), checkpoint_seconds(cfg)
    n_eval = len(scheduled_steps(tc.eval_every, args.run_steps, tc.early_log_points))
    n_ckpt = len(scheduled_steps(tc.ckpt_every, args.run_steps, tc.early_log_points))
    train_s = args.run_steps * base
    print(f"one evaluation               : {ev * 1e3:7.1f} ms = {ev / base:.1f} training steps")
    print(f"one checkpoint (+resume)     : {ck * 1e3:7.1f} ms = {ck / base:.2f} training steps")
    print(f"over a {args.run_steps}-step run      : {n_eval} evaluations = {n_eval * ev / train_s:.1%} and "
          f"{n_ckpt} checkpoints = {n_ckpt * ck / train_s:.1%} of the training time")
    print_eval_shares(args, base, ck)
    for label, kw in [("fused AdamW", {"fused": True}), ("bf16 autocast", {"bf16": True})]:
        t = best_of(args.rounds, plain_loop, cfg, args.steps, **kw)
        print(f"{label:<29}: {t * 1e3:7.1f} ms/step  ratio {t / base:.2f}x")
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
        one = best_of(args.rounds, plain_loop, cfg, args.steps)
        torch.set_num_threads(threads)
        print(f"1 thread instead of {threads}        : {one * 1e3:7.1f} ms/step  ratio {one / base:.2f}x")


if __name__ == "__main__":
    main()
