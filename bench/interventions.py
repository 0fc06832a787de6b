"""Benchmark (not a test): what the intervention experiment cost, against issue 19's budget.

    .venv/bin/python bench/interventions.py [--sweep sweeps/plateau-interventions] [--workers 2]

Reads the sweep directory that ``python -m training.sweep --preset plateau-interventions`` trained:
each run's training wall time (the ``wall_s`` of its last evaluation) and steps, per kind of
condition. The sweep's wall time is the run time divided by the workers that trained side by side
(the local executor: 2 workers of 1 thread on 2 cores), printed next to the target of 90 minutes
for the whole experiment (the unmodified runs included), with how much of the sweep is complete.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interp.dynamics.interventions import condition_label
from training import run as rd
from training.machine import describe, machine_record
from training.sweep import expand, get_sweep, is_complete

TARGET_MIN = 90.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", type=Path, default=Path("sweeps/plateau-interventions"))
    p.add_argument("--preset", default="plateau-interventions", help="the sweep preset the directory holds")
    p.add_argument("--workers", type=int, default=2, help="runs that trained side by side")
    args = p.parse_args()
    points = expand(get_sweep(args.preset))
    by_kind: dict[str, list[float]] = {}
    steps, done = 0, 0
    for point in points:
        run_dir = args.sweep / point.name
        if not is_complete(run_dir):
            continue
        done += 1
        last = rd.read_jsonl(run_dir / rd.METRICS_FILE)[-1]
        steps += json.loads((run_dir / rd.SUMMARY_FILE).read_text())["final_step"]
        kind = condition_label(point.options).split(" until ")[0].split(": only")[0]
        by_kind.setdefault(kind, []).append(last["wall_s"])
    total = sum(sum(v) for v in by_kind.values())
    print(f"machine: {describe(machine_record('cpu'))}")
    print(f"{args.sweep}: {done} of {len(points)} runs complete, {steps} steps")
    for kind, walls in by_kind.items():
        print(f"  {kind:28s} {len(walls):3d} runs  {sum(walls) / 60:6.1f} run-minutes")
    wall = total / 60 / args.workers
    print(f"run time {total / 60:.1f} min; with {args.workers} workers side by side: {wall:.1f} min "
          f"(target: the whole experiment in <= {TARGET_MIN:.0f} min: "
          f"{'met' if wall <= TARGET_MIN and done == len(points) else 'not met' if done == len(points) else 'incomplete'})")
    if 0 < done < len(points):
        print(f"extrapolated to all {len(points)} runs: {wall * len(points) / done:.0f} min")


if __name__ == "__main__":
    main()
