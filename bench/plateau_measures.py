"""Benchmark (not a test): which measure moves first relative to the drop, on the selector (``ci``),
induction and Markov presets over their seed sets, and whether the selector's plateau shows
representation collapse (Gopalani & Hu 2025).

    plateauscope sweep --preset seeds-ci --out sweeps/seeds-ci      # likewise induction-seeds, markov-seeds
    .venv/bin/python bench/plateau_measures.py --sweep sweeps/seeds-ci --sweep sweeps/induction-seeds \
        --sweep sweeps/markov-seeds [--every 4]

Per sweep, every run gets the cheap pass (``plateauscope analyze --every N --n-exact 0 --no-edges``; the
built-in measures and the task's own are part of it) and ``moved_first``'s one change-point rule; over
the seeds, each signal's median change point / tau with the order-statistic interval of the median
(``plateauscope.dynamics.moved_first.over_seeds``: the range at 3 seeds, 75%; 93.75% at 5). The rows:
the first measure (``measure:*``) by median, and each measure read in at least half the seeds.

Representation collapse, read on the last layer's residual stream (``collapse[L<last>]``, the mean
pairwise cosine similarity over the loss positions): the median over the analysed steps inside the
plateau (from its start to half of tau), against its value at the run's last step. The rule: the
plateau shows collapse when that median is at least 0.9 (the representations nearly one direction)
and at least 0.2 above the last step's, in every seed; no collapse when either fails in every seed;
mixed otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from record import print_rows, row, save

import plateauscope as ps
from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.changepoint import moved_first
from plateauscope.analysis.measures import measure_series
from plateauscope.analysis.results import median
from plateauscope.dynamics.moved_first import over_seeds
from plateauscope.dynamics.sweep import sweep_runs

COLLAPSED, ABOVE_END = 0.9, 0.2
"""The collapse rule's two thresholds (module docstring)."""


def collapse_reading(run: ps.Run, measures: list[dict]) -> tuple[float, float] | None:
    """The last layer's collapse: its median on the plateau (plateau start to tau / 2) and at the last step."""
    series = measure_series(measures)
    key = f"collapse[L{run.config.model.n_layers - 1}]"
    tau, span = run.summary.get("tau"), run.plateau_stretch()
    if key not in series or tau is None or not span:
        return None
    steps, values = series[key]["steps"], series[key]["values"]
    inside = [v for s, v in zip(steps, values) if v is not None and span[0] <= s <= tau / 2]
    if not inside or values[-1] is None:
        return None
    return median(inside), values[-1]


def bench_sweep(path: Path, every: int) -> tuple[list[dict], dict]:
    """The cheap pass and moved_first on every run of a sweep; the rows and the over-seeds record."""
    _, names = sweep_runs(path)
    results, collapse = [], []
    for name in names:
        run_dir = path / name
        ps.analyze(run_dir, every=every, n_exact=0, edges=False, progress=False)
        results.append(moved_first(run_dir))
        run = ps.Run(run_dir)
        reading = collapse_reading(run, load_analysis(run_dir).get("measures") or [])
        if reading is not None:
            collapse.append(reading)
    seeds = over_seeds(results)
    label = path.name
    rows = []
    measures = [n for n in seeds["order"] if n.startswith("measure:")]
    if measures:
        first = seeds["signals"][measures[0]]
        rows.append(row(f"{label}: first measure to move, {measures[0]} (median / tau, {first['n']} seeds)",
                        first["median"], "tau"))
    for name in measures:
        sig = seeds["signals"][name]
        ci = sig["interval"]
        where = "" if ci is None else f" [{ci.low:.3f}, {ci.high:.3f}] ({ci.method}" + (
            f", {ci.coverage:.0%})" if ci.coverage else ")")
        rows.append(row(f"{label}: {name} change point{where}, {sig['n']} of {sig['n_runs']} seeds",
                        sig["median"], "tau"))
    progress = [n for n in seeds["order"] if n.startswith("progress")]
    if progress:
        rows.append(row(f"{label}: {progress[0]} change point", seeds["signals"][progress[0]]["median"], "tau"))
    if collapse:
        plateau = [c[0] for c in collapse]
        end = [c[1] for c in collapse]
        yes = [p >= COLLAPSED and p - e >= ABOVE_END for p, e in collapse]
        verdict = "collapse" if all(yes) else "no collapse" if not any(yes) else "mixed"
        rows.append(row(f"{label}: last layer's collapse on the plateau, median of {len(plateau)} seeds "
                        f"(range {min(plateau):.3f}-{max(plateau):.3f}); verdict: {verdict}", median(plateau), ""))
        rows.append(row(f"{label}: last layer's collapse at the last step, median (range {min(end):.3f}-"
                        f"{max(end):.3f})", median(end), ""))
    return rows, {"sweep": label, "order": seeds["order"], "pairs": [p["text"] for p in seeds["pairs"]],
                  "unread": seeds["unread"], "sparse": seeds["sparse"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="append", required=True, type=Path, help="a trained sweep directory (repeatable)")
    p.add_argument("--every", type=int, default=4, help="analyse every N-th checkpoint (default 4)")
    args = p.parse_args()
    for path in args.sweep:
        if not path.is_dir():
            p.error(f"--sweep {path}: no such directory (train it with plateauscope sweep --preset NAME --out {path})")
    rows, orders = [], []
    for path in args.sweep:
        sweep_rows, order = bench_sweep(path, args.every)
        rows += sweep_rows
        orders.append(order)
        print(f"{order['sweep']}: order {' < '.join(order['order'])}")
        for text in order["pairs"]:
            print(f"  {text}")
    print_rows(rows)
    save("plateau_measures", rows, settings={"sweeps": [str(s) for s in args.sweep], "every": args.every,
                                              "orders": orders})


if __name__ == "__main__":
    main()
