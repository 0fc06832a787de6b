"""``plateauscope verify``: check every checkpoint and resume state of runs against their checksums.

One pass over each run: a file listed in ``checksums.json`` that is missing, truncated or
altered, and a checkpoint that is not listed, each get one line naming the file
(``plateauscope.runs.files.verify_run``); an imported run's checkpoints are checked against the
SHA-256 of its ``series.json``. Exit code 0 when every run verifies, 1 when one
does not, 2 on a usage error.

    plateauscope verify checkpoints/demo [more runs ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plateauscope.cli.common import run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.runs.run import Run
from plateauscope.runs.series import verify_checkpoints


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope verify``."""
    p = OneLineParser(prog="plateauscope verify", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories (a sweep's: SWEEP/*/)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope verify``: one line per problem, one summary line per run; exit 1 on any problem."""
    bad = []

    def body(args: argparse.Namespace) -> None:
        runs = [Run(path).path for path in args.runs]  # every path is a run, before any checking
        for run in runs:
            problems, n = verify_checkpoints(run)
            for name, problem in problems:
                print(f"{name}: {problem}")
            print(f"{run}: {n} files, {'all verified' if not problems else f'{len(problems)} problem(s)'}")
            bad.extend(problems)

    code = run_cli(body, argv, build_parser())
    if code == 0 and bad:
        print(f"error: {len(bad)} file(s) failed verification", file=sys.stderr)
        return 1
    return code
