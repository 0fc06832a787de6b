"""``plateauscope llc``: the command line of :mod:`plateauscope.analysis.llc`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import plateauscope.analysis.llc as _module
from plateauscope.analysis.llc import (
    LLCSettings,
    MissingExtraError,
    format_summary,
    llc_series,
    require_devinterp,
)
from plateauscope.analysis.results import LLC_SUMMARY_FILE, analysis_dir
from plateauscope.cli.common import run_cli
from plateauscope.training.train import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope llc``."""
    d = LLCSettings()
    p = OneLineParser(prog="plateauscope llc", description=_module.__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("--every", type=int, default=1, help="every N-th checkpoint (default 1: all)")
    p.add_argument("--steps", type=int, nargs="+", help="exactly these steps")
    p.add_argument("--chains", type=int, default=d.num_chains, help=f"SGLD chains (default {d.num_chains})")
    p.add_argument("--draws", type=int, default=d.num_draws, help=f"draws per chain (default {d.num_draws})")
    p.add_argument("--burnin", type=int, default=d.num_burnin_steps, help=f"burn-in steps (default {d.num_burnin_steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"SGLD minibatch (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"SGLD step size epsilon (default {d.lr})")
    p.add_argument("--localization", type=float, default=d.localization, help=f"gamma (default {d.localization})")
    p.add_argument("--nbeta", type=float, default=d.nbeta, help=f"inverse temperature n*beta (default {d.nbeta})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--calib-step", type=int, help="where the draws are doubled (default: the last chosen step)")
    p.add_argument("--no-calibration", action="store_true", help="skip the doubled-draws check")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope llc``: the LLC over the series, or one ``skipped:`` line without the extra."""
    def body(args: argparse.Namespace) -> None:
        settings = LLCSettings(num_chains=args.chains, num_draws=args.draws, num_burnin_steps=args.burnin,
                               batch_size=args.batch_size, lr=args.lr, localization=args.localization,
                               nbeta=args.nbeta, seed=args.seed)
        result = llc_series(args.run, args.steps, args.every, settings, args.calib_step,
                            not args.no_calibration, args.device, progress=not args.no_progress)
        print(format_summary(result))
        print(f"results in {analysis_dir(args.run) / LLC_SUMMARY_FILE}")

    parser = build_parser()
    try:
        require_devinterp()
    except MissingExtraError as e:
        parser.parse_args(argv)  # --help and bad flags behave as usual
        print(f"skipped: {e}", file=sys.stderr)
        return 2
    return run_cli(body, argv, parser)
