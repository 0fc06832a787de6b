"""Benchmark (not a test): what the stages instruments cost a trained run (``docs/pages/stages.md``).

For each ``--run`` (a trained run of a task with a ladder of reference predictors), in one process:

* building the ladder (:meth:`ReferenceLadder.build`, once per run);
* one evaluation with and without the ladder's KLs (``evaluation_record`` on the run's last
  checkpoint and its first evaluation set, the median of ``--repeats``), and the difference;
* the ladder's share of the run's training: (evaluations logged with the KLs) x (the difference)
  over the run's own wall clock (the last record's ``wall_s``, so the same machine only when the
  run was trained here: the machine record of the run is printed beside it);
* ``plateauscope moved_first`` on the run (its signals read from the analysis cache; nothing written).

There is no numeric target in issue 44 for these; they are the costs the findings cite.

    .venv/bin/python bench/stages.py --run sweeps/seeds-demo/ds0_seed0 --run sweeps/markov-seeds/seed0 [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
from record import arguments, print_rows, row, save

from plateauscope.analysis.changepoint import moved_first
from plateauscope.runs.references import ReferenceLadder, kl_key
from plateauscope.runs.run import Run, RunError
from plateauscope.training.train import evaluation_record, evaluation_sets


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up: the first call pays for allocations
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(run_dir: Path, repeats: int) -> list[dict]:
    """The rows of one run (named by its folder)."""
    run = Run(run_dir)
    task, tc = run.task(), run.config.train
    evalset = evaluation_sets(task, tc, tc.seed)[0]
    t = time.perf_counter()
    ladder = ReferenceLadder.build(task, evalset)
    build_s = time.perf_counter() - t
    if ladder is None:
        raise SystemExit(f"{run_dir}: its task declares no ladder of reference predictors")
    model = run.model(run.steps[-1])
    model.eval()
    bare = _median_s(lambda: evaluation_record(model, task, evalset, 0, tc, 0.0), repeats)
    with_ladder = _median_s(lambda: evaluation_record(model, task, evalset, 0, tc, 0.0, ladder), repeats)
    records = run.metrics()
    n_kl = sum(kl_key(ladder.names[0]) in r for r in records)
    wall = float(records[-1]["wall_s"])
    t = time.perf_counter()
    result = moved_first(run.path, write=False)
    moved_s = time.perf_counter() - t
    name = f"{run.path.parent.name}/{run.path.name}"
    print(f"{name}: trained on {[m.get('cpu') for m in (run.summary or {}).get('machines', [])] or 'n/a'}; "
          f"{n_kl} evaluations with the ladder, {wall:.0f} s of training; moved_first read "
          f"{len(result['order'])} signals")
    return [row(f"{name}: ladder build (once per run)", build_s * 1e3, "ms"),
            row(f"{name}: one evaluation without the ladder", bare * 1e3, "ms"),
            row(f"{name}: the ladder's KLs per evaluation", (with_ladder - bare) * 1e3, "ms"),
            row(f"{name}: the ladder's share of the run's training wall", 100 * n_kl * (with_ladder - bare) / wall,
                "%"),
            row(f"{name}: plateauscope moved_first --run", moved_s, "s")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, action="append", required=True, help="a trained (and analysed) run; repeatable")
    p.add_argument("--repeats", type=int, default=5, help="timed evaluations per measure (the median is kept)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    for path in args.run:
        if not path.is_dir():
            raise SystemExit(f"--run {path}: no such run directory")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        rows = [r for path in args.run for r in measure(path, args.repeats)]
    except RunError as e:
        raise SystemExit(f"--run: {e}") from None
    print_rows(rows)
    print(f"saved {save('stages', rows, arguments(args, run=[str(path) for path in args.run]))}")


if __name__ == "__main__":
    main()
