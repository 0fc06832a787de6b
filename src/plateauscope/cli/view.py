"""``plateauscope view``: the command line of :mod:`plateauscope.views.view`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import plateauscope.views.view as _module
from plateauscope.analysis.analyze import analyze_run, load_analysis
from plateauscope.analysis.results import VIEW_FILE, read_routing_summary
from plateauscope.cli.common import CliError, run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.runs.run import Run
from plateauscope.views.view import write_view


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope view``."""
    p = OneLineParser(prog="plateauscope view", description=_module.__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory (analysed by plateauscope analyze)")
    p.add_argument("--out", type=Path, help=f"output file (default RUN/{VIEW_FILE})")
    p.add_argument("--analyze", action="store_true", help="run the analysis first if it has no edge records")
    p.add_argument("--every", type=int, default=1, help="with --analyze: analyse every N-th checkpoint (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope view``: write the run's time view and print its path and size."""
    def body(args: argparse.Namespace) -> None:
        if args.every < 1:
            raise CliError(f"--every must be at least 1, got {args.every}")
        if args.out is not None and args.out.is_dir():
            raise CliError(f"--out {args.out} is a directory; give a file name")
        run = Run(args.run)
        if args.analyze and not load_analysis(run.path)["edges"] and not (read_routing_summary(run.path) or {}).get(
                "refused"):
            print(f"no edge analysis in {run.path}: analysing every {args.every}. checkpoint first", file=sys.stderr)
            analyze_run(run.path, every=args.every)
        path = write_view(run.path, args.out)
        print(f"view: {path} ({path.stat().st_size / 1e6:.1f} MB; open it in a browser, it needs no network)")

    return run_cli(body, argv, build_parser())
