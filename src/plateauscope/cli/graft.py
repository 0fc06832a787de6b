"""``plateauscope graft``: the earliest checkpoint whose part, grafted into the run's own step-0
weights, makes the plateau short (``plateauscope.dynamics.graft``).

    plateauscope graft --run checkpoints/ci --part layer0
    plateauscope graft --sweep sweeps/seeds-ci --part 0.0:qk --criterion 0.5

One line per trial, then the boundary (the last insufficient and the first sufficient checkpoint)
and each t_form rule's step beside it (from ``plateauscope analyze``, where it ran). Over several
runs, the medians as fractions of tau_0 with intervals of stated coverage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plateauscope.cli.common import run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.tables import format_table
from plateauscope.dynamics.graft import bisection_dir, boundary_table, graft_bisection
from plateauscope.model.config import PART_FORMS
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import has_interventions


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope graft``."""
    p = OneLineParser(prog="plateauscope graft", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--run", type=Path, nargs="+", metavar="RUN", help="trained, complete run directories")
    where.add_argument("--sweep", type=Path, help="a sweep directory: every complete run without an intervention")
    p.add_argument("--part", required=True, help=f"what is grafted: {PART_FORMS}")
    p.add_argument("--criterion", type=float, default=0.5,
                   help="the part suffices when the grafted run's tau is at most this fraction of tau_0 (default 0.5)")
    p.add_argument("--json", type=Path, help="also write the results (one per run) to this JSON file")
    return p


def sweep_runs(sweep: Path) -> list[Path]:
    """The complete runs of a sweep without an intervention, in its manifest's order."""
    points = rd.read_json(sweep / rd.MANIFEST_FILE).get("points", [])
    runs = [sweep / p["name"] for p in points if (sweep / p["name"] / rd.SUMMARY_FILE).exists()]
    runs = [r for r in runs if not has_interventions(rd.Run(r).config.train)]
    if not runs:
        raise rd.RunError(f"{sweep}: no complete run without an intervention")
    return runs


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Bisect each run; errors are one line, before any trial."""

    def body(args: argparse.Namespace) -> None:
        runs = sweep_runs(args.sweep) if args.sweep else [rd.Run(r).path for r in args.run]
        results = []
        for run in runs:
            print(f"{run}: grafting {args.part} from its checkpoints into its step-0 weights "
                  f"(sufficient: tau <= {args.criterion:g} tau_0); trials in {bisection_dir(run, args.part, args.criterion)}")
            result = graft_bisection(run, args.part, args.criterion, on_trial=lambda t: print(
                f"  step {t['step']:>6}: tau {t['tau'] if t['tau'] is not None else 'not reached'}"
                f" ({_fraction(t['tau_over_tau_0'])} tau_0) -> {'sufficient' if t['passes'] else 'not sufficient'}",
                flush=True))
            first, last = result["first_sufficient_step"], result["last_insufficient_step"]
            boundary = ("no checkpoint suffices" if first is None else
                        f"sufficient from step {first} ({_fraction(result['boundary_over_tau_0'])} tau_0)"
                        + (f", not at step {last}" if last is not None else ", already at the first checkpoint"))
            t_forms = ", ".join(f"{rule} {t}" for rule, t in result["t_form"].items() if t is not None)
            print(f"  {boundary}; {len(result['trials'])} trials of at most {result['max_trials']} "
                  f"over {result['candidates']} checkpoints; tau_0 {result['tau_0']}"
                  + (f"; t_form: {t_forms}" if t_forms else "; t_form: not analysed (plateauscope analyze)"))
            results.append(result)
        if len(results) > 1:
            rows = []
            for row in boundary_table(results):
                ci = row["interval"]
                gap = row.get("gap_interval")
                rows.append([row["signal"], row["n"], _fraction(row["median"]),
                             f"{ci.text()} {ci.label}" if ci else "-",
                             _fraction(row.get("gap_median")) if "gap_median" in row else "",
                             gap.text() if gap else ""])
            print(format_table(rows, ["signal (/ tau_0)", "runs", "median", "interval", "t_form - graft", "interval"]))
        write_json(args.json, results)

    return run_cli(body, argv, build_parser())
