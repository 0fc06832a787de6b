"""Benchmark (not a test): what the built-in measures add to the cheap pass of the analysis (issue 65).

    .venv/bin/python bench/measures_cost.py                        # the demo's model and task, 200 steps
    .venv/bin/python bench/measures_cost.py --run checkpoints/demo # a run already trained

In one process: train the preset for ``--max-steps`` steps into a fresh directory (the demo's model,
task and analysis settings; fewer checkpoints than a whole demo run, which changes the number of
steps analysed, not the cost of one: the measures and the cheap pass both cost a fixed amount per
checkpoint), or take ``--run``. Then, each on an empty analysis cache, time the cheap pass without the
measures (attention, attribution and edge attribution, the patterns of a few examples) at every
checkpoint, and the whole cheap pass with them (``plateauscope.analysis.measures``: one forward of the
last checkpoint for the reference patterns; at each checkpoint the attention analysis's forward also
keeps the residual stream, plus the weight norms, an SVD of the embedding and the pattern distances),
on the same workers. Printed and saved (``bench/record.py``): the time the measures add over the cheap
pass's time without them, against the target of at most 15%. After one untimed warm-up pass, the two
are timed in turn ``--repeats`` times (the order swapped each time), each on a fresh cache, and the
medians kept.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

from lean_analysis import empty_copy  # noqa: E402
from record import against, arguments, print_rows, row, save  # noqa: E402

from plateauscope.analysis.analyze import CHEAP, AnalysisSettings, SeriesAnalysis, default_workers  # noqa: E402
from plateauscope.runs.machine import describe, machine_record  # noqa: E402
from plateauscope.runs.presets import PRESETS, get_preset  # noqa: E402
from plateauscope.runs.run import Run  # noqa: E402
from plateauscope.training.train import train  # noqa: E402

TARGET = 0.15
"""Issue 65: the built-in measures add at most 15% to the cheap pass on the demo."""


def timed_pass(run_dir: Path, names: tuple[str, ...], workers: int) -> float:
    """Seconds of the cheap pass's analyses ``names`` at every checkpoint of ``run_dir``."""
    analysis = SeriesAnalysis(Run(run_dir), AnalysisSettings(), "cpu", None, workers, True, False)
    steps = analysis.run.steps
    t0 = time.perf_counter()
    analysis.run_pass({name: set(steps) for name in names}, "bench", workers)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--max-steps", type=int, default=200, help="steps to train (default 200)")
    parser.add_argument("--run", type=Path, help="a trained run instead of training one")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.preset not in PRESETS:
        print(f"error: --preset {args.preset!r}: choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    if args.run is not None and not (args.run / "config.json").is_file():
        print(f"error: --run {args.run}: not a run directory", file=sys.stderr)
        return 2
    without = tuple(name for name in CHEAP if name != "measures")
    workers = default_workers("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            run_dir = Path(tmp) / "run"
            t0 = time.perf_counter()
            train(get_preset(args.preset).replace(max_steps=args.max_steps), run_dir, device="cpu", progress=False)
            print(f"trained {args.preset} for {args.max_steps} steps in {time.perf_counter() - t0:.1f} s", flush=True)
        n_steps = len(Run(run_dir).steps)
        timed_pass(empty_copy(run_dir, Path(tmp) / "warm-up"), CHEAP, workers)  # first-call costs, not timed
        cheap, whole = [], []
        for i in range(args.repeats):  # in turn, the order swapped each time
            for names, out in ((without, cheap), (CHEAP, whole))[:: 1 if i % 2 == 0 else -1]:
                out.append(timed_pass(empty_copy(run_dir, Path(tmp) / f"{len(names)}-{i}"), names, workers))
            print(f"repeat {i}: cheap pass {cheap[-1]:.2f} s without the measures, {whole[-1]:.2f} s with them",
                  flush=True)
    t_cheap, t_whole = statistics.median(cheap), statistics.median(whole)
    rows = [row("cheap pass without measures", t_cheap, "s"), row("cheap pass with measures", t_whole, "s"),
            against("added by the measures / cheap pass", (t_whole - t_cheap) / t_cheap, "", "<=", TARGET)]
    print(f"{n_steps} checkpoints, {workers} workers, {describe(machine_record())}")
    print_rows(rows)
    saved = save("measures_cost", rows, arguments(args, checkpoints=n_steps, workers=workers,
                                                   note=("the demo's model, task and analysis settings, trained "
                                                         f"{args.max_steps} steps" if args.run is None else
                                                         "a run given with --run")))
    print(f"saved {saved}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
