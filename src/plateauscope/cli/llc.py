"""``plateauscope llc``: the command line of :mod:`plateauscope.analysis.llc` (and, with ``--per-head``,
of :mod:`plateauscope.analysis.head_llc`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import plateauscope.analysis.llc as _module
from plateauscope.analysis.head_llc import HEAD_LLC_SETTINGS, head_llc_series
from plateauscope.analysis.llc import LLCSettings, MissingExtraError, llc_series, require_devinterp
from plateauscope.analysis.results import HEAD_LLC_SUMMARY_FILE, LLC_SUMMARY_FILE, analysis_dir
from plateauscope.cli.common import CliError, run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.analysis import format_head_summary
from plateauscope.cli.text.analysis import format_llc_summary as format_summary
from plateauscope.processes import available_cores, sigterm_as_interrupt


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope llc``."""
    d, h = LLCSettings(), HEAD_LLC_SETTINGS

    def default(name: str) -> str:
        a, b = getattr(d, name), getattr(h, name)
        return f"default {a}" if a == b else f"default {a}; with --per-head {b}"

    p = OneLineParser(prog="plateauscope llc", description=_module.__doc__.splitlines()[0]
                      + " With --per-head: the LLC restricted to each attention head's weights.")
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("--every", type=int, default=1, help="every N-th checkpoint (default 1: all)")
    p.add_argument("--steps", type=int, nargs="+", help="exactly these steps")
    p.add_argument("--per-head", action="store_true",
                   help="one LLC per attention head: SGLD moves only that head's W_Q, W_K, W_V, W_O and its "
                        "b_Q, b_K, b_V (the rest held at the checkpoint); prints a heads x steps table and the "
                        f"clusters of the heads' curves, and writes analysis/{HEAD_LLC_SUMMARY_FILE}")
    p.add_argument("--heads", nargs="+", metavar="LxHy", help="with --per-head: only these heads, e.g. L0H1 L2H3 "
                                                               "(default: all)")
    p.add_argument("--part", choices=("head", "qk", "ov"), default="head",
                   help="with --per-head: which of the head's weights move (head: all; qk: W_Q, b_Q, W_K, b_K; "
                        "ov: W_V, b_V, W_O; default head)")
    p.add_argument("--chains", type=int, help=f"SGLD chains ({default('num_chains')})")
    p.add_argument("--draws", type=int, help=f"draws per chain ({default('num_draws')})")
    p.add_argument("--burnin", type=int, help=f"burn-in steps ({default('num_burnin_steps')})")
    p.add_argument("--batch-size", type=int, help=f"SGLD minibatch ({default('batch_size')})")
    p.add_argument("--lr", type=float, help=f"SGLD step size epsilon ({default('lr')})")
    p.add_argument("--localization", type=float, help=f"gamma ({default('localization')})")
    p.add_argument("--nbeta", type=float, help=f"inverse temperature n*beta ({default('nbeta')})")
    p.add_argument("--seed", type=int)
    p.add_argument("--calib-step", type=int, nargs="+",
                   help="where the draws are doubled (default: the last chosen step; several with --per-head)")
    p.add_argument("--no-calibration", action="store_true", help="skip the doubled-draws check")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch intra-op threads of this process (default: torch's; 1 is often "
                                               "faster on a shared or busy machine); --per-head workers take an equal "
                                               "share of the cores")
    p.add_argument("--workers", type=int, help="processes for --per-head, each estimating whole checkpoints "
                                               "(default: this machine's cores)")
    p.add_argument("--no-progress", action="store_true")
    return p


def settings_from(args: argparse.Namespace) -> LLCSettings:
    """The SGLD settings of the flags, each unset one from the defaults (the per-head ones with --per-head)."""
    base = HEAD_LLC_SETTINGS if args.per_head else LLCSettings()
    given = {"num_chains": args.chains, "num_draws": args.draws, "num_burnin_steps": args.burnin,
             "batch_size": args.batch_size, "lr": args.lr, "localization": args.localization, "nbeta": args.nbeta,
             "seed": args.seed}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


@contextmanager
def interrupts_said(run: Path) -> Iterator[None]:
    """Ctrl-C or a kill (SIGTERM) as one line: what is cached stays, and the same command resumes."""
    with sigterm_as_interrupt():
        try:
            yield
        except KeyboardInterrupt:
            raise CliError(f"interrupted: every finished estimate is cached in {analysis_dir(run)}; run the same "
                           "command again to go on") from None


def main(argv: list[str] | None = None) -> int:
    """``plateauscope llc``: the LLC over the series, or one ``skipped:`` line without the extra."""
    def body(args: argparse.Namespace) -> None:
        settings = settings_from(args)
        if args.threads is not None:
            if args.threads < 1:
                raise CliError(f"--threads must be at least 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        if args.workers is not None and args.workers < 1:
            raise CliError(f"--workers must be at least 1, got {args.workers}")
        if not args.per_head:
            if args.heads or args.part != "head" or args.workers is not None:
                raise CliError("--heads, --part and --workers need --per-head")
            if args.calib_step and len(args.calib_step) > 1:
                raise CliError("--calib-step takes one step without --per-head")
            calib = args.calib_step[0] if args.calib_step else None
            with interrupts_said(args.run):
                result = llc_series(args.run, args.steps, args.every, settings, calib,
                                    not args.no_calibration, args.device, progress=not args.no_progress)
            print(format_summary(result))
            print(f"results in {analysis_dir(args.run) / LLC_SUMMARY_FILE}")
            return
        with interrupts_said(args.run):
            result = head_llc_series(args.run, args.steps, args.every, settings, heads=args.heads, part=args.part,
                                     calib_steps=args.calib_step, calibrate_check=not args.no_calibration,
                                     device=args.device, progress=not args.no_progress,
                                     workers=args.workers or available_cores())
        print(format_head_summary(result))
        print(f"results in {analysis_dir(args.run) / HEAD_LLC_SUMMARY_FILE}")

    parser = build_parser()
    try:
        require_devinterp()
    except MissingExtraError as e:
        parser.parse_args(argv)  # --help and bad flags behave as usual
        print(f"skipped: {e}", file=sys.stderr)
        return 2
    return run_cli(body, argv, parser)
