"""Benchmark (not a test): what a long experiment's sweeps cost, against its issue's budget.

    .venv/bin/python bench/sweep_budget.py --preset plateau-interventions [--sweep DIR] [--demo-sweep DIR]
    .venv/bin/python bench/sweep_budget.py --preset paper-noise-grid [--sweep DIR] [--workers 2]
    .venv/bin/python bench/sweep_budget.py --preset clamps [--sweep DIR] [--demo-sweep DIR]

Reads each sweep directory that ``plateauscope sweep --preset NAME`` trained (default
``sweeps/NAME``): each run's training wall time (the ``wall_s`` of its last evaluation) and steps,
per kind of point (an intervention's condition; else the point's options without its seed). A
sweep's wall time is its run time divided by the workers that trained side by side (the local
executor: 2 workers of 1 thread on 2 cores). Issue 19's experiment is two sweeps, the ``ci`` model's
``plateau-interventions`` and its confirmation on the demo model, ``plateau-interventions-demo``:
their sum is printed against its 90 minutes (issue 20: the paper's noise grid, one sweep, in 150),
with how much of each sweep is complete and, when one is not, the runs left estimated from the
complete runs of their kind. Issue 43's budget of 60 minutes holds the ``clamps`` sweep on ``ci`` and
the graft bisections of its unmodified runs (``plateauscope graft --sweep``: the trials under each
run's ``grafts/``, trained one at a time); its demo-model arm, ``clamps-demo``, is reported with its
cost beside it, outside the budget.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from record import row, save

from plateauscope.dynamics.graft import GRAFTS_DIR
from plateauscope.dynamics.interventions import condition_label
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import INTERVENTION_OPTIONS
from plateauscope.runs.machine import describe, machine_record
from plateauscope.sweeps.catalogue import get_sweep
from plateauscope.sweeps.spec import expand, is_complete, run_name

TARGETS_MIN = {"plateau-interventions": 90.0, "paper-noise-grid": 150.0, "clamps": 60.0}
"""Each experiment's budget in minutes on 2 cores, by its first sweep."""
CONFIRMATIONS = {"plateau-interventions": "plateau-interventions-demo"}
"""The sweep that completes an experiment (issue 19: its main contrasts again on the demo model)."""
REPORTED_BESIDE = {"clamps": "clamps-demo"}
"""A demo-model arm whose cost is printed beside an experiment, outside its budget (issue 43)."""
WITH_GRAFTS = ("clamps",)
"""Experiments whose budget also holds the graft bisections of the sweep's unmodified runs."""


def graft_minutes(sweep: Path) -> tuple[float, int]:
    """The graft trials' training time under the sweep's runs (one at a time), in minutes, and their count."""
    walls = [rd.read_jsonl(m)[-1]["wall_s"] for m in sorted(sweep.glob(f"*/{GRAFTS_DIR}/*/step_*/{rd.METRICS_FILE}"))
             if rd.read_jsonl(m)]
    return sum(walls) / 60, len(walls)


@dataclass
class SweepCost:
    """What one sweep directory cost, in minutes of wall time with its workers side by side."""

    runs: int
    complete: int
    minutes: float
    """The complete runs."""
    as_run: float
    """The complete runs and the time spent on unfinished ones."""
    left: float
    """The unfinished runs of a measured kind, at that kind's mean (0 when complete)."""
    unmeasured: int
    """Unfinished runs of a kind with no complete run to estimate them from."""


def point_kind(options: dict) -> str:
    """What a point is, seeds aside: its intervention's condition, or its other options."""
    if any(k in INTERVENTION_OPTIONS for k in options):
        return condition_label(options).split(" until ")[0].split(": only")[0]
    rest = {k: v for k, v in options.items() if k not in ("seed", "data_seed")}
    return run_name(rest) if rest else "unmodified"


def sweep_cost(preset: str, sweep: Path, workers: int) -> SweepCost:
    """Print the sweep's runs per kind and return its cost."""
    points = expand(get_sweep(preset))
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
    total = sum(sum(v) for v in walls.values())
    print(f"{sweep} ({preset}): {len(points) - len(missing)} of {len(points)} runs complete, {steps} steps")
    for kind, ws in walls.items():
        print(f"  {kind:32s} {len(ws):3d} runs  {sum(ws) / 60:6.1f} run-minutes  ({sum(ws) / len(ws) / 60:.1f} each)")
    known = [k for k in missing if k in walls]
    left = sum(sum(walls[k]) / len(walls[k]) for k in known)
    cost = SweepCost(len(points), len(points) - len(missing), total / 60 / workers,
                     (total + partial) / 60 / workers, left / 60 / workers, len(missing) - len(known))
    print(f"  run time {total / 60:.1f} min; with {workers} workers side by side: {cost.minutes:.1f} min")
    if missing:
        print(f"  runs left: {len(missing)} ({partial / 60:.1f} run-minutes already spent on them); "
              f"the {len(known)} of a measured kind at its mean: {cost.left:.0f} min more"
              + (f"; {cost.unmeasured} of an unmeasured kind" if cost.unmeasured else ""))
    return cost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="plateau-interventions", choices=sorted(TARGETS_MIN),
                   help="the experiment's first sweep preset")
    p.add_argument("--sweep", type=Path, help="its sweep directory (default sweeps/PRESET)")
    p.add_argument("--demo-sweep", type=Path,
                   help="plateau-interventions: the demo model's confirmation (default sweeps/plateau-interventions-demo)")
    p.add_argument("--workers", type=int, default=2, help="runs that trained side by side")
    p.add_argument("--demo-workers", type=int, help="the same for the demo-model sweep (default: --workers)")
    args = p.parse_args()
    parts = [(args.preset, args.sweep or Path("sweeps") / args.preset)]
    if args.preset in CONFIRMATIONS:
        parts.append((CONFIRMATIONS[args.preset], args.demo_sweep or Path("sweeps") / CONFIRMATIONS[args.preset]))
    elif args.demo_sweep and args.preset not in REPORTED_BESIDE:
        p.error(f"--demo-sweep: {args.preset} has no demo confirmation")
    for flag, given in (("--sweep", args.sweep), ("--demo-sweep", args.demo_sweep)):
        if given and not given.is_dir():
            p.error(f"{flag}: {given} is not a directory")
    print(f"machine: {describe(machine_record('cpu'))}")
    costs = [sweep_cost(preset, sweep, args.workers) for preset, sweep in parts]
    target, wall = TARGETS_MIN[args.preset], sum(c.minutes for c in costs)
    if args.preset in WITH_GRAFTS:
        minutes, trials = graft_minutes(parts[0][1])
        print(f"graft bisections in {parts[0][1]}: {trials} trials, {minutes:.1f} min")
        wall += minutes
        parts.append(("graft bisections", parts[0][1]))
    beside = REPORTED_BESIDE.get(args.preset)
    if beside:
        demo = args.demo_sweep or Path("sweeps") / beside
        if demo.is_dir():
            cost = sweep_cost(beside, demo, args.demo_workers or args.workers)
            print(f"{beside} (outside the budget): {cost.complete} of {cost.runs} runs, {cost.as_run:.1f} min as run")
        else:
            print(f"{beside}: not trained (no {demo})")
    whole = " + ".join(preset for preset, _ in parts)
    settings = {"preset": args.preset, "workers": args.workers, "runs": sum(c.runs for c in costs),
                "complete": sum(c.complete for c in costs)}
    if all(c.complete == c.runs for c in costs):
        print(f"{whole}: {wall:.1f} min (target: the whole experiment in <= {target:.0f} min: "
              f"{'met' if wall <= target else 'not met'})")
        saved = save("sweep_budget", [row(f"{whole}, wall time", round(wall, 1), "min",
                                                         f"<= {target:.0f}", wall <= target)], settings)
        print(f"saved: {saved}")
        return
    as_run = sum(c.as_run for c in costs)
    estimate = wall + sum(c.left for c in costs)
    unmeasured = sum(c.unmeasured for c in costs)
    print(f"{whole}: incomplete; as run (the complete runs and the time spent on unfinished ones) "
          f"{as_run:.1f} min, {'within' if as_run <= target else 'over'} the budget of {target:.0f} min; "
          f"estimated {estimate:.0f} min in all" + (f", and {unmeasured} runs of an unmeasured kind" if unmeasured else ""))
    saved = save("sweep_budget",
                 [row(f"{whole}, {settings['complete']} of {settings['runs']} runs, wall time as run", round(as_run, 1),
                      "min", f"<= {target:.0f}", as_run <= target)], settings)
    print(f"saved: {saved}")


if __name__ == "__main__":
    main()
