"""Benchmark (not a test): what a long sweep cost, against its issue's budget.

    .venv/bin/python bench/sweep_budget.py --preset plateau-interventions [--sweep DIR] [--workers 2]
    .venv/bin/python bench/sweep_budget.py --preset paper-noise-grid

Reads the sweep directory that ``python -m training.sweep --preset NAME`` trained (default
``sweeps/NAME``): each run's training wall time (the ``wall_s`` of its last evaluation) and steps,
per kind of point (an intervention's condition; else the point's options without its seed). The
sweep's wall time is the run time divided by the workers that trained side by side (the local
executor: 2 workers of 1 thread on 2 cores), printed next to the budget (issue 19: the intervention
experiment in 90 minutes; issue 20: the paper's noise grid in 150), with how much of the sweep is
complete and, when it is not, the runs left estimated from the complete runs of their kind.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interp.dynamics.interventions import condition_label
from training import run as rd
from training.interventions import INTERVENTION_OPTIONS
from training.machine import describe, machine_record
from training.sweep import expand, get_sweep, is_complete, run_name

TARGETS_MIN = {"plateau-interventions": 90.0, "paper-noise-grid": 150.0}


def point_kind(options: dict) -> str:
    """What a point is, seeds aside: its intervention's condition, or its other options."""
    if any(k in INTERVENTION_OPTIONS for k in options):
        return condition_label(options).split(" until ")[0].split(": only")[0]
    rest = {k: v for k, v in options.items() if k not in ("seed", "data_seed")}
    return run_name(rest) if rest else "unmodified"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="plateau-interventions", choices=sorted(TARGETS_MIN),
                   help="the sweep preset the directory holds")
    p.add_argument("--sweep", type=Path, help="the sweep directory (default sweeps/PRESET)")
    p.add_argument("--workers", type=int, default=2, help="runs that trained side by side")
    args = p.parse_args()
    sweep, target = args.sweep or Path("sweeps") / args.preset, TARGETS_MIN[args.preset]
    points = expand(get_sweep(args.preset))
    walls: dict[str, list[float]] = {}
    partial, missing, steps = 0.0, [], 0
    for point in points:
        run_dir = sweep / point.name
        kind = point_kind(point.options)
        metrics = rd.read_jsonl(run_dir / rd.METRICS_FILE) if (run_dir / rd.METRICS_FILE).exists() else []
        if is_complete(run_dir):
            walls.setdefault(kind, []).append(metrics[-1]["wall_s"])
            steps += json.loads((run_dir / rd.SUMMARY_FILE).read_text())["final_step"]
            continue
        partial += metrics[-1]["wall_s"] if metrics else 0.0
        missing.append(kind)
    done = len(points) - len(missing)
    total = sum(sum(v) for v in walls.values())
    print(f"machine: {describe(machine_record('cpu'))}")
    print(f"{sweep}: {done} of {len(points)} runs complete, {steps} steps")
    for kind, ws in walls.items():
        print(f"  {kind:32s} {len(ws):3d} runs  {sum(ws) / 60:6.1f} run-minutes  ({sum(ws) / len(ws) / 60:.1f} each)")
    wall = total / 60 / args.workers
    verdict = ("met" if wall <= target else "not met") if not missing else "incomplete"
    print(f"run time {total / 60:.1f} min; with {args.workers} workers side by side: {wall:.1f} min "
          f"(target: the whole sweep in <= {target:.0f} min: {verdict})")
    if missing:
        as_run = (total + partial) / 60 / args.workers
        print(f"as run (the complete runs and the time spent on unfinished ones): {as_run:.1f} min "
              f"(the budget of {target:.0f} min: {'within' if as_run <= target else 'over'})")
        known = [k for k in missing if k in walls]
        left = sum(sum(walls[k]) / len(walls[k]) for k in known) / 60 / args.workers
        print(f"runs left: {len(missing)} ({partial / 60:.1f} run-minutes already spent on unfinished runs); "
              f"the {len(known)} of a measured kind at its mean: {left:.0f} min more, "
              f"{wall + left:.0f} min in all" + (f", and {len(missing) - len(known)} of an unmeasured kind"
                                                  if len(known) < len(missing) else ""))


if __name__ == "__main__":
    main()
