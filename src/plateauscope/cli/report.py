"""``plateauscope report``: the command line of :mod:`plateauscope.views.report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import plateauscope.views.report as _module
from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.probe_pass import analyze_series
from plateauscope.analysis.results import REPORT_FILE, analysis_dir, routing_summary_path
from plateauscope.cli.common import run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.runs.imported import ImportedRun, read_probe_choice
from plateauscope.runs.run import Run, RunError
from plateauscope.views.probe_report import read_probe_record
from plateauscope.views.report import write_report


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope report``."""
    p = OneLineParser(prog="plateauscope report", description=_module.__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory (analysed by plateauscope analyze)")
    p.add_argument("--out", type=Path, help=f"output file (default RUN/{REPORT_FILE})")
    p.add_argument("--examples", type=int, default=2, help="examples shown as attention patterns (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example sample (default 0)")
    p.add_argument("--analyze", action="store_true", help="run the analysis first if its cache is missing")
    p.add_argument("--every", type=int, default=1, help="with --analyze: analyse every N-th checkpoint (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope report``: write the run's report."""
    def body(args: argparse.Namespace) -> None:
        if args.examples < 1:
            raise RunError(f"--examples must be at least 1, got {args.examples}")
        run = Run(args.run)
        imported = isinstance(run, ImportedRun)
        if args.analyze and not routing_summary_path(run.path).exists() and not (
                imported and read_probe_record(run.path) is not None):  # a probe that is no task: its pass is all
            print(f"no analysis cache in {analysis_dir(run.path)}: analysing every {args.every}. checkpoint first",
                  file=sys.stderr)
            if imported:
                choice = read_probe_choice(run.path)
                analyze_series(run.path, choice["probe"], choice["options"], every=max(args.every, 1), progress=True)
            else:
                analyze_run(run.path, every=max(args.every, 1), progress=True)
        print(f"report: {write_report(run.path, args.out, args.examples, args.seed)}")

    return run_cli(body, argv, build_parser())
