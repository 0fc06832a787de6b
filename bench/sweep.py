"""Benchmark (not a test): S seeds trained as one vectorised ensemble against the same S seeds
trained one after the other, in one process, printed as ratios.

    .venv/bin/python bench/sweep.py [--preset ci] [--seeds 8] [--steps 200] [--threads N]
    .venv/bin/python bench/sweep.py --preset paper --steps 100

Both sides run the preset's configuration for ``--steps`` steps with an evaluation every
``--steps / 4`` steps, a checkpoint at the end and no early stop, so they do the same work
(the solo runs with ``plateauscope.training.train.train``, the ensemble with
``plateauscope.training.ensemble.train_ensemble``). The target (issue 10) is 8 ``ci`` seeds at least 2x
faster than 8 sequential solo runs; the largest difference between the members' final metrics
and the solo runs' is printed as a check. A profile of one training step follows: forward,
backward and AdamW of the vectorised S-member step against S solo steps, then the roofline: the step's
GFLOP/s against this machine's best matmul, and the time its matrix products take alone, so a
missed target comes with the reason. ``--compile`` also times the vectorised loss through
``torch.compile`` (not used for training: ``bench/train_step.py``'s docstring says why).
``--forward`` picks the training forward of both sides (default ``fused``, where a member runs its
solo run's kernels one member after another; the profile and roofline are of the ``hooked``
forward's one vmapped pass). The figures
are saved (``bench/record.py``; another preset than ``ci`` or another forward than ``fused`` as a
part of their own).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from record import against, arguments, row, save

from plateauscope.model.backend import build_model, default_backend, hooked_parameter_shapes
from plateauscope.runs.presets import PRESETS, get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.selector import SelectorTask
from plateauscope.training.ensemble import ensemble_loss, stack_members, train_ensemble
from plateauscope.training.train import train

TARGET = 2.0
"""Issue 10: 8 ``ci`` seeds as one ensemble at least this many times faster than 8 sequential solo runs."""


def max_metric_diff(a: Path, b: Path) -> float:
    """Largest absolute difference between two runs' last evaluation (numeric fields)."""
    ra, rb = Run(a).metrics()[-1], Run(b).metrics()[-1]
    return max(abs(ra[k] - rb[k]) for k in ra if isinstance(ra[k], float) and k != "wall_s")


def profile_step(cfg, seeds: int, steps: int = 20) -> dict[str, tuple[float, float]]:
    """Seconds per training step, split into forward, backward and AdamW: ``{part: (S solo steps
    one after the other, one vectorised S-member step)}``, each the median over ``steps`` steps."""
    task = SelectorTask.generate(cfg.task)
    hooked = task.hooked_config(cfg.model)
    B = cfg.train.batch_size
    gen = torch.Generator().manual_seed(0)
    batches = task.tokens[torch.randint(0, task.cfg.D, (steps + 3, seeds, B), generator=gen)]
    solos = [build_model(hooked, seed=s) for s in range(seeds)]
    opts = [torch.optim.AdamW(m.parameters(), lr=cfg.train.lr) for m in solos]
    template = build_model(hooked)
    buffers = dict(template.named_buffers())
    params, opt = stack_members(list(hooked_parameter_shapes(hooked)), [m.state_dict() for m in solos], None, cfg)
    times: dict[str, list[tuple[float, float]]] = {"forward": [], "backward": [], "AdamW": []}

    def clock() -> float:
        return time.perf_counter()

    for i, batch in enumerate(batches):
        solo = [0.0, 0.0, 0.0]
        for s, (m, o) in enumerate(zip(solos, opts)):
            t0 = clock()
            loss = task.loss(m(batch[s][:, : task.input_len]), batch[s])
            t1 = clock()
            o.zero_grad(set_to_none=True)
            loss.backward()
            t2 = clock()
            o.step()
            t3 = clock()
            solo = [solo[0] + t1 - t0, solo[1] + t2 - t1, solo[2] + t3 - t2]
        t0 = clock()
        losses = ensemble_loss(template, params, buffers, batch, task)
        t1 = clock()
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        if i >= 3:  # warm-up
            for part, a, b in zip(times, solo, (t1 - t0, t2 - t1, t3 - t2)):
                times[part].append((a, b))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {part: (med([a for a, _ in v]), med([b for _, b in v])) for part, v in times.items()}


def best_matmul_gflops(n: int = 1024, reps: int = 10) -> float:
    """This machine's float32 matmul speed (an n x n product, best of ``reps``): the roofline."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def vectorised_step(cfg, seeds: int, compiled: bool = False) -> Callable[[], None]:
    """One training step of a fresh S-member vectorised model on a fixed batch (``compiled``: its
    loss through ``torch.compile``)."""
    task = SelectorTask.generate(cfg.task)
    hooked = task.hooked_config(cfg.model)
    template = build_model(hooked)
    members = [build_model(hooked, seed=s) for s in range(seeds)]
    params, opt = stack_members(list(hooked_parameter_shapes(hooked)), [m.state_dict() for m in members], None, cfg)
    buffers = dict(template.named_buffers())
    batch = task.tokens[torch.randint(0, task.cfg.D, (seeds, cfg.train.batch_size))]

    def loss(p: dict[str, torch.Tensor], b: torch.Tensor) -> torch.Tensor:
        return ensemble_loss(template, p, buffers, b, task).sum()

    fn = torch.compile(loss) if compiled else loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        fn(params, batch).backward()
        opt.step()

    return step


def compiled_speed(cfg, seeds: int, steps: int = 20) -> tuple[float, float, float]:
    """(seconds of the first compiled step, ms per eager step, ms per compiled step)."""
    out = []
    for compiled in (False, True):
        step = vectorised_step(cfg, seeds, compiled)
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        out.append((first, (time.perf_counter() - t0) / steps * 1e3))
    return out[1][0], out[0][1], out[1][1]


def matmul_seconds(cfg, seeds: int, steps: int = 5) -> tuple[float, float]:
    """(seconds in matmul kernels, total seconds) per vectorised S-member training step (torch profiler)."""
    from torch.profiler import profile

    step = vectorised_step(cfg, seeds)
    step()
    t0 = time.perf_counter()
    with profile() as prof:
        for _ in range(steps):
            step()
    total = (time.perf_counter() - t0) / steps
    mm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in ("aten::bmm", "aten::mm", "aten::addmm"))
    return mm / 1e6 / steps, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="ci", choices=sorted(PRESETS))
    p.add_argument("--seeds", type=int, default=8, help="ensemble size S (default 8)")
    p.add_argument("--steps", type=int, default=200, help="training steps per run (default 200)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, i.e. the cores)")
    p.add_argument("--forward", default="fused", choices=("fused", "hooked"),
                   help="the training forward of both sides (default fused, the runs' default)")
    p.add_argument("--compile", action="store_true",
                   help="also time the vectorised step through torch.compile (about a minute more)")
    args = p.parse_args()
    if default_backend() != "hooked":
        sys.exit("the vectorised step profiled here is a vmap over HookedTransformer: run this bench in the "
                 "TransformerLens 3 environment (.venv-tl3/bin/python bench/sweep.py)")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset).replace(max_steps=args.steps, eval_every=max(args.steps // 4, 1),
                                          ckpt_every=args.steps, early_log_points=0, stop_after_tau=None,
                                          forward=args.forward)
    cfgs = [cfg.replace(seed=s) for s in range(args.seeds)]
    print(f"preset {args.preset}: {args.seeds} seeds x {args.steps} steps, batch {cfg.train.batch_size}, "
          f"{torch.get_num_threads()} torch threads, --forward {args.forward}")
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
    speedup = sequential / ensemble
    print(f"one solo run (mean)          : {one:7.2f} s  ({one / args.steps * 1e3:.1f} ms/step)")
    print(f"{args.seeds} solo runs, sequential    : {sequential:7.2f} s")
    print(f"ensemble of {args.seeds}                : {ensemble:7.2f} s  = {ensemble / one:.2f}x one solo run")
    print(f"speed-up over sequential     : {speedup:.2f}x  (target >= 2x for 8 ci seeds: "
          f"{'met' if speedup >= TARGET else 'NOT met'})")
    print(f"members vs solo, last eval   : max |difference| {diff:.2e}")
    runs = f"{args.preset}, {args.seeds} seeds x {args.steps} steps, --forward {args.forward}"
    speedup_row = f"{runs}: ensemble speed-up over sequential solo runs"
    rows = [row(f"{runs}: one solo run (mean)", one, "s"), row(f"{runs}: solo runs, sequential", sequential, "s"),
            row(f"{runs}: ensemble", ensemble, "s"),
            # the target is issue 10's, for 8 ci seeds
            against(speedup_row, speedup, "x", ">=", TARGET) if (args.preset, args.seeds) == ("ci", 8)
            else row(speedup_row, speedup, "x"),
            row(f"{runs}: members vs solo runs, last evaluation, largest difference", diff, "")]
    print(f"profile of one training step with the hooked forward ({args.seeds} solo steps vs one vmapped step, "
          "median ms):")
    prof = profile_step(cfg, args.seeds)
    for part, (a, b) in prof.items():
        print(f"  {part:<9} {a * 1e3:8.1f} ms  vs {b * 1e3:8.1f} ms  ({a / b:.2f}x)")
    a, b = (sum(v[i] for v in prof.values()) for i in (0, 1))
    print(f"  {'step':<9} {a * 1e3:8.1f} ms  vs {b * 1e3:8.1f} ms  ({a / b:.2f}x)")
    rows += [row(f"{args.seeds} solo steps (hooked forward, median)", a * 1e3, "ms"),
             row(f"one vmapped {args.seeds}-member step (hooked forward, median)", b * 1e3, "ms"),
             row(f"{args.seeds} solo steps / one vmapped step", a / b, "x")]
    # The reason, in numbers: a vectorised step does the members' arithmetic; at 2x it would have to
    # run at twice the solo steps' speed, and its matrix products alone already run near this
    # machine's best matmul speed.
    task = SelectorTask.generate(cfg.task)
    n_params = sum(p.numel() for p in build_model(
        task.hooked_config(cfg.model)).parameters())
    flop = 6 * n_params * cfg.train.batch_size * task.layout.input_len * args.seeds  # 6 N tokens, all members
    peak = best_matmul_gflops()
    mm, total = matmul_seconds(cfg, args.seeds)
    print(f"roofline: {args.seeds} members' step = {flop / 1e9:.2f} GFLOP (6 x parameters x tokens); "
          f"best matmul on this machine {peak:.0f} GFLOP/s")
    print(f"  solo steps       : {flop / a / 1e9:6.1f} GFLOP/s")
    print(f"  vectorised step  : {flop / b / 1e9:6.1f} GFLOP/s; its matrix products {mm * 1e3:.1f} of "
          f"{total * 1e3:.1f} ms (profiled), {flop / mm / 1e9:.0f} GFLOP/s")
    print(f"  2x over solo     : {2 * flop / a / 1e9:6.1f} GFLOP/s for the whole step = {a / 2 * 1e3:.1f} ms, "
          f"{a / 2 / mm:.2f}x the time its matrix products take alone")
    rows += [row("best matmul on this machine", peak, "GFLOP/s"),
             row(f"one vmapped {args.seeds}-member step (hooked forward)", flop / b / 1e9, "GFLOP/s")]
    if args.compile:
        first, eager, fused = compiled_speed(cfg, args.seeds)
        print(f"torch.compile of the vectorised loss: {eager:.1f} -> {fused:.1f} ms/step ({eager / fused:.2f}x; "
              f"8 solo steps {a * 1e3:.1f} ms), after {first:.0f} s compiling its first step")
        rows += [row(f"torch.compile, vmapped {args.seeds}-member step", fused, "ms"),
                 row("torch.compile, eager / compiled step", eager / fused, "x"),
                 row("torch.compile, its first step (compiling)", first, "s")]
    part = [args.preset] if args.preset != "ci" else []
    part += [args.forward] if args.forward != "fused" else []
    print(f"saved {save('sweep', rows, arguments(args), '-'.join(part) or None)}")


if __name__ == "__main__":
    main()
