"""Benchmark (not a test): the LLC over the demo series, projected against its 10-minute target.

Measures in one process, with the default ``LLCSettings`` (or the flags):

* the baseline: one LLC estimate at checkpoints of a trained ``ci`` run (the 2-layer model),
  and the time to load one checkpoint;
* one LLC estimate of a freshly initialised ``paper``-preset model (0.8M parameters, D = 10,000:
  the demo's model and data set; random weights cost the same as trained ones);
* the ratio paper / ci per checkpoint, and the projected time of ``plateauscope llc --run
  checkpoints/demo --every 4``: (checkpoints / every + 1) x (estimate + load), plus the
  doubled-draws calibration at one checkpoint. Target: at most 10 minutes on 2 cores.

Wall times move with the machine's load (printed before and after); the process CPU time of the
estimate is printed next to it, and equals the wall time a single thread takes on an idle core.
The figures are saved (``bench/record.py``).

    .venv/bin/python bench/llc.py [--ci-run /tmp/llc_ci] [--n-checkpoints 240] [--every 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings
from pathlib import Path

import torch

from plateauscope.analysis.llc import LLCSettings, estimate_llc
from plateauscope.tasks.selector import SelectorTask
from plateauscope.backend import build_model
from plateauscope.training.model import hooked_config_dict
from plateauscope.training.presets import get_preset
from plateauscope.training.run import Run
from record import against, arguments, row, save

TARGET_S = 600.0


def timed_estimate(model: torch.nn.Module, tokens: torch.Tensor, task, settings: LLCSettings) -> tuple[float, float, float]:
    """(wall seconds, process CPU seconds, LLC) of one estimate."""
    w0, c0 = time.perf_counter(), time.process_time()
    res = estimate_llc(model, tokens, task, settings)
    return time.perf_counter() - w0, time.process_time() - c0, res["llc"]


def main() -> None:
    d = LLCSettings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ci-run", type=Path, default=Path("/tmp/llc_ci"), help="a trained ci run (plateauscope train --preset ci)")
    p.add_argument("--n-checkpoints", type=int, default=240, help="checkpoints in the demo series")
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chains", type=int, default=d.num_chains)
    p.add_argument("--draws", type=int, default=d.num_draws)
    p.add_argument("--burnin", type=int, default=d.num_burnin_steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    settings = LLCSettings(num_chains=args.chains, num_draws=args.draws, num_burnin_steps=args.burnin,
                           batch_size=args.batch_size)
    print(f"threads {torch.get_num_threads()}, load average before {os.getloadavg()[0]:.2f}; settings {settings}")

    run = Run(args.ci_run)
    tokens = run.task().tokens
    steps = run.steps
    probe = [steps[len(steps) // 3], steps[-1]]
    t0 = time.perf_counter()
    models = [run.model(s) for s in probe]
    load_s = (time.perf_counter() - t0) / len(probe)
    ci = [timed_estimate(m, tokens, run.task(), settings) for m in models]
    ci_wall, ci_cpu = sum(c[0] for c in ci) / len(ci), sum(c[1] for c in ci) / len(ci)
    print(f"ci model ({sum(p.numel() for p in models[0].parameters()):,} params, D = {len(tokens):,}): "
          f"{ci_wall:.2f} s wall, {ci_cpu:.2f} s CPU per checkpoint; load {load_s:.3f} s "
          f"(LLC {', '.join(f'{c[2]:.1f}' for c in ci)} at steps {probe})")

    cfg = get_preset("paper")
    task = SelectorTask.generate(cfg.task)
    model = build_model(hooked_config_dict(cfg.model, task), seed=0)
    wall, cpu, _ = timed_estimate(model, task.tokens, task, settings)
    print(f"paper model ({sum(p.numel() for p in model.parameters()):,} params, D = {len(task.tokens):,}): "
          f"{wall:.2f} s wall, {cpu:.2f} s CPU per checkpoint; ratio paper / ci {wall / ci_wall:.2f} (wall), "
          f"{cpu / ci_cpu:.2f} (CPU)")

    rows = [row("ci model, one LLC estimate, wall", ci_wall, "s"), row("ci model, one LLC estimate, CPU", ci_cpu, "s"),
            row("loading one checkpoint", load_s, "s"),
            row("paper model, one LLC estimate, wall", wall, "s"), row("paper model, one LLC estimate, CPU", cpu, "s"),
            row("paper / ci, one LLC estimate, wall", wall / ci_wall, "x"),
            row("paper / ci, one LLC estimate, CPU", cpu / ci_cpu, "x")]
    n = math.ceil(args.n_checkpoints / args.every) + 1
    calib = (2 * settings.num_draws + settings.num_burnin_steps) / (settings.num_draws + settings.num_burnin_steps)
    for kind, per in (("wall", wall), ("CPU (1 thread, idle core)", cpu)):
        total = n * (per + load_s) + calib * per
        verdict = "meets" if total <= TARGET_S else "MISSES"
        print(f"projected demo series, {n} checkpoints (every {args.every} of {args.n_checkpoints}) + calibration, "
              f"by {kind}: {total:.0f} s = {total / TARGET_S:.2f} x the {TARGET_S:.0f} s target: {verdict}")
        rows.append(against(f"projected demo series, {n} checkpoints + calibration, by {kind}", total, "s", "<=",
                            TARGET_S))
    print(f"load average after {os.getloadavg()[0]:.2f}")
    print(f"saved {save('llc', rows, arguments(args))}")


if __name__ == "__main__":
    main()
