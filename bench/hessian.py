"""Benchmark (not a test): the Hessian spectrum of the paper-sized model on the CPU.

Measures, in one process and on the same batch: the time of one gradient (the baseline), of one
HVP by each method (``vjp`` of grad with the graph built once, ``jvp`` of grad), HVPs per second,
the ratio HVP time / gradient time, and the wall time of the top-20 + bottom-5 eigenvalues by
Lanczos (target: under 5 minutes), with their iteration count and residual flags. The load
average is printed before and after: the machine may be shared, and absolute times move with it;
the ratios much less. The figures are saved (``bench/record.py``).

Uses ``checkpoints/demo`` (the paper model) at the checkpoint nearest mid-plateau when it exists,
else a freshly initialised ``paper``-preset model.

    .venv/bin/python bench/hessian.py [--run checkpoints/demo] [--step 350] [--batch 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import torch
from record import against, arguments, row, save
from torch.func import grad

from plateauscope.analysis.hessian import DEFAULT_BATCH, default_escape, hessian_batch
from plateauscope.analysis.hessian_engine import HessianOperator, lanczos, model_loss
from plateauscope.model.backend import build_model
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.selector import SelectorTask

DEMO_RUN = Path("checkpoints/demo")
TARGET_S = 300.0
"""The top-20 + bottom-5 eigenvalues in under 5 minutes."""


def timed(fn, repeat: int) -> float:
    """Seconds per call (one warm-up call first)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def load(run_dir: Path | None, step: int | None) -> tuple[torch.nn.Module, SelectorTask, str]:
    if run_dir is not None and (run_dir / "config.json").exists():
        run = Run(run_dir)
        if step is None:
            step = default_escape(run)[0] or run.steps[-1]
        return run.model(step), run.task(), f"{run_dir} step {step}"
    cfg = get_preset("paper")
    task = SelectorTask.generate(cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=0)
    return model, task, "freshly initialised paper-preset model"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, default=DEMO_RUN)
    p.add_argument("--step", type=int)
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--n-bottom", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: best on a shared machine)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    model, task, what = load(args.run, args.step)
    loss, theta, _ = model_loss(model, task)
    tokens = hessian_batch(task, args.batch, 0)
    print(f"model: {what}, {theta.numel():,} parameters; batch {len(tokens)}; {torch.get_num_threads()} thread(s); "
          f"load average before {load_before[0]:.2f} on {os.cpu_count()} CPUs")

    t_grad = timed(lambda: grad(lambda t: loss(t, tokens))(theta), args.repeat)
    v = torch.randn_like(theta)
    t0 = time.perf_counter()
    op = HessianOperator(loss, theta, tokens, "vjp")
    t_build = time.perf_counter() - t0
    t_vjp = timed(lambda: op(v), args.repeat)
    op_jvp = HessianOperator(loss, theta, tokens, "jvp")
    t_jvp = timed(lambda: op_jvp(v), args.repeat)
    print(f"gradient (baseline)      : {t_grad:7.3f} s")
    print(f"HVP vjp-of-grad          : {t_vjp:7.3f} s  ({1 / t_vjp:5.2f} HVP/s)  HVP / gradient = {t_vjp / t_grad:.2f}"
          f"   (graph build once: {t_build:.2f} s)")
    print(f"HVP jvp-of-grad          : {t_jvp:7.3f} s  ({1 / t_jvp:5.2f} HVP/s)  HVP / gradient = {t_jvp / t_grad:.2f}")
    del op_jvp

    op.n_hvp = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        sp = lanczos(op, theta.numel(), args.k, args.n_bottom, seed=0, dtype=theta.dtype)
        wall = time.perf_counter() - t0
    flagged = int((~sp.top.converged).sum() + (~sp.bottom.converged).sum())
    print(f"top-{args.k} + bottom-{args.n_bottom} (Lanczos, full reorth., verified): {wall:7.1f} s "
          f"({'under' if wall < TARGET_S else 'OVER'} the 5-minute target), {sp.n_iter} steps, {op.n_hvp} HVPs "
          f"({op.n_hvp / wall:.2f} HVP/s incl. reorthogonalisation), {flagged} flagged"
          f"{', warnings: ' + '; '.join(str(w.message) for w in caught) if caught else ''}")
    print(f"  = {wall / t_grad:.0f} gradient-equivalents; lambda_max {sp.lambda_max:.5g} "
          f"(rel residual {float(sp.top.rel_residuals[0]):.1e}), lambda_min {sp.lambda_min:+.5g} "
          f"(rel residual {float(sp.bottom.rel_residuals[0]):.1e}), "
          f"max rel residual {max(float(sp.top.rel_residuals.max()), float(sp.bottom.rel_residuals.max())):.1e}")
    load_after = os.getloadavg()
    print(f"load average after {load_after[0]:.2f} (1 min), {load_after[1]:.2f} (5 min)")
    rows = [row("gradient (baseline)", t_grad, "s"),
            row("HVP vjp-of-grad", t_vjp, "s"), row("HVP vjp-of-grad / gradient", t_vjp / t_grad, "x"),
            row("HVP jvp-of-grad", t_jvp, "s"), row("HVP jvp-of-grad / gradient", t_jvp / t_grad, "x"),
            against(f"top-{args.k} + bottom-{args.n_bottom} eigenvalues (Lanczos)", wall, "s", "<", TARGET_S),
            row("Lanczos eigenvalues flagged (not converged)", flagged, "")]
    print(f"saved {save('hessian', rows, arguments(args, model=what))}")


if __name__ == "__main__":
    main()
