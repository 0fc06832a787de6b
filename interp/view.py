"""Write a run's time view: one offline HTML page that moves the circuit through training.

One slider (also play/pause and the arrow keys) over the analysed checkpoints moves together the
circuit graph (edges by attribution, the faithful circuit highlighted), the heads x layers
heatmaps, the attention pattern of a chosen head and a marker on the loss curves
(:mod:`interp.views.time_view`). The page needs no network and no server.

    python -m interp.view --run checkpoints/demo [--out FILE] [--analyze --every 2]

The run must have been analysed with edges (``python -m interp.analyze``); ``--analyze`` does that
first when its cache has no edge records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp.analyze import analyze_run, load_analysis
from interp.cli import CliError, run_cli
from interp.results import VIEW_FILE
from interp.views.time_data import time_view_data
from interp.views.time_view import render_time_view
from training.run import Run, write_text_atomic


def write_view(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the view (default ``RUN/view.html``) from the run's cached analyses; return its path."""
    path = Path(out) if out is not None else Path(run_dir) / VIEW_FILE
    write_text_atomic(path, render_time_view(time_view_data(run_dir)))
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m interp.view``."""
    p = argparse.ArgumentParser(prog="python -m interp.view", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory (analysed by python -m interp.analyze)")
    p.add_argument("--out", type=Path, help=f"output file (default RUN/{VIEW_FILE})")
    p.add_argument("--analyze", action="store_true", help="run the analysis first if it has no edge records")
    p.add_argument("--every", type=int, default=1, help="with --analyze: analyse every N-th checkpoint (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m interp.view``: write the run's time view and print its path and size."""
    def body(args: argparse.Namespace) -> None:
        if args.every < 1:
            raise CliError(f"--every must be at least 1, got {args.every}")
        if args.out is not None and args.out.is_dir():
            raise CliError(f"--out {args.out} is a directory; give a file name")
        run = Run(args.run)
        if args.analyze and not load_analysis(run.path)["edges"]:
            print(f"no edge analysis in {run.path}: analysing every {args.every}. checkpoint first", file=sys.stderr)
            analyze_run(run.path, every=args.every)
        path = write_view(run.path, args.out)
        print(f"view: {path} ({path.stat().st_size / 1e6:.1f} MB; open it in a browser, it needs no network)")

    return run_cli(body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
