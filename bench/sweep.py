"""Benchmark (not a test): S seeds trained as one vectorised ensemble against the same S seeds
trained one after the other, in one process, printed as ratios.

    .venv/bin/python bench/sweep.py [--preset ci] [--seeds 8] [--steps 200] [--threads N]
    .venv/bin/python bench/sweep.py --preset paper --steps 100

Both sides run the preset's configuration for ``--steps`` steps with an evaluation every
``--steps / 4`` steps, a checkpoint at the end and no early stop, so they do the same work
(the solo runs with ``training.train.train``, the ensemble with
``training.ensemble.train_ensemble``). The target on the small presets is an ensemble of 8
seeds in under 3x the wall time of one solo run; the largest difference between the members'
final metrics and the solo runs' is printed as a check.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from training.ensemble import train_ensemble
from training.presets import PRESETS, get_preset
from training.run import Run
from training.train import train


def max_metric_diff(a: Path, b: Path) -> float:
    """Largest absolute difference between two runs' last evaluation (numeric fields)."""
    ra, rb = Run(a).metrics()[-1], Run(b).metrics()[-1]
    return max(abs(ra[k] - rb[k]) for k in ra if isinstance(ra[k], float) and k != "wall_s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="ci", choices=sorted(PRESETS))
    p.add_argument("--seeds", type=int, default=8, help="ensemble size S (default 8)")
    p.add_argument("--steps", type=int, default=200, help="training steps per run (default 200)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, i.e. the cores)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset).replace(max_steps=args.steps, eval_every=max(args.steps // 4, 1),
                                          ckpt_every=args.steps, early_log_points=0, stop_after_tau=None)
    cfgs = [cfg.replace(seed=s) for s in range(args.seeds)]
    print(f"preset {args.preset}: {args.seeds} seeds x {args.steps} steps, batch {cfg.train.batch_size}, "
          f"{torch.get_num_threads()} torch threads")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        solo = []
        for i, c in enumerate(cfgs):
            t0 = time.perf_counter()
            train(c, d / f"solo{i}", device="cpu", progress=False)
            solo.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        train_ensemble(cfgs, [d / f"ens{i}" for i in range(args.seeds)], device="cpu", progress=False)
        ensemble = time.perf_counter() - t0
        diff = max(max_metric_diff(d / f"solo{i}", d / f"ens{i}") for i in range(args.seeds))
    one, sequential = sum(solo) / len(solo), sum(solo)
    print(f"one solo run (mean)          : {one:7.2f} s  ({one / args.steps * 1e3:.1f} ms/step)")
    print(f"{args.seeds} solo runs, sequential    : {sequential:7.2f} s")
    print(f"ensemble of {args.seeds}                : {ensemble:7.2f} s  = {ensemble / one:.2f}x one solo run "
          f"(target < 3x for 8 seeds on the small presets)")
    print(f"speed-up over sequential     : {sequential / ensemble:.2f}x")
    print(f"members vs solo, last eval   : max |difference| {diff:.2e}")


if __name__ == "__main__":
    main()
