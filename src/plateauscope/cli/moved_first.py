"""``plateauscope moved_first``: which signal moved first, by one change-point rule for every signal.

One run (``--run``): every signal's change point (the loss, the progress measure, its cue effect, the
KL to each reference predictor; from the analysis cache where it exists, attention, shares, the edge
circuit, the LLC) as a fraction of tau, in order; written to ``RUN/analysis/moved_first.json``.
A sweep (``--sweep``): the same for each run, then per signal the median over seeds with the
order-statistic interval of the median and how many seeds agree with each adjacent pair of the order.
The rule: ``plateauscope.analysis.changepoint``.

    plateauscope moved_first --run checkpoints/demo
    plateauscope moved_first --sweep sweeps/seeds-ci --json seeds-ci-moved-first.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plateauscope.analysis.changepoint import DIRECTIONS, ChangePointRule, moved_first
from plateauscope.analysis.results import MOVED_FIRST_FILE, analysis_dir
from plateauscope.cli.common import CliError, run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.analysis import moved_first_text
from plateauscope.cli.text.dynamics import over_seeds_text
from plateauscope.dynamics.moved_first import over_seeds, sweep_moved_first
from plateauscope.runs.run import METRICS_FILE
from plateauscope.runs.series import is_imported


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope moved_first``."""
    d = ChangePointRule()
    p = OneLineParser(prog="plateauscope moved_first",
                      description="Which signal moved first: one change-point rule for every signal of a run, "
                                  "or over a sweep's seeds.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--run", type=Path, help="a run directory (trained; analysed for the cache's signals)")
    where.add_argument("--sweep", type=Path, help="a sweep directory: every run, then the table over seeds")
    p.add_argument("--n-sd", type=float, default=d.n_sd,
                   help=f"half-width of the noise band in robust sd of the plateau's first half (default {d.n_sd:g})")
    p.add_argument("--k", type=int, default=d.k,
                   help=f"consecutive checkpoints beyond the band that make a change (default {d.k})")
    p.add_argument("--smooth", type=int, default=d.smooth,
                   help=f"centred moving-mean window before the rule (default {d.smooth}: none)")
    p.add_argument("--floor", type=float, default=d.floor,
                   help=f"least half-width of the band, as a fraction of the signal's range (default {d.floor:g})")
    p.add_argument("--min-baseline", type=int, default=d.min_baseline,
                   help=f"fewest checkpoints in the band's window to read a signal (default {d.min_baseline})")
    p.add_argument("--direction", choices=DIRECTIONS, default=d.direction,
                   help="which departures count (default either: the first, up or down)")
    p.add_argument("--no-write", action="store_true",
                   help=f"do not write RUN/analysis/{MOVED_FIRST_FILE} (of the run, or of each run of the sweep)")
    p.add_argument("--json", type=Path,
                   help="also write the result (a sweep: the table over seeds) as JSON to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope moved_first``: the table of one run, or of a sweep's seeds."""
    def body(args: argparse.Namespace) -> None:
        rule = ChangePointRule(n_sd=args.n_sd, k=args.k, smooth=args.smooth, floor=args.floor,
                               min_baseline=args.min_baseline, direction=args.direction)
        rule.validate()
        if args.run is not None:
            if not args.run.is_dir():
                raise CliError(f"{args.run}: no such run directory")
            if not (args.run / METRICS_FILE).exists() and not is_imported(args.run):  # an imported run: the probe's
                raise CliError(f"{args.run}: no {METRICS_FILE} (train the run first)")
            result = moved_first(args.run, rule, write=not args.no_write)
            print(moved_first_text(result))
            if not args.no_write:
                print(f"results in {analysis_dir(args.run) / MOVED_FIRST_FILE}")
            write_json(args.json, result)
            return
        if not args.sweep.is_dir():
            raise CliError(f"{args.sweep}: no such sweep directory")
        summary = over_seeds(sweep_moved_first(args.sweep, rule, write=not args.no_write))
        print(over_seeds_text(summary))
        write_json(args.json, summary)

    return run_cli(body, argv, build_parser())
