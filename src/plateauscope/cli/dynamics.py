"""``plateauscope dynamics``: the command line of :mod:`plateauscope.views.sweep_report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.landmarks import DEFAULT_BUDGET
from plateauscope.analysis.llc import LLCSettings, llc_series, require_devinterp
from plateauscope.analysis.results import (
    DYNAMICS_CSV_FILE,
    SWEEP_REPORT_FILE,
    VARIANTS_CSV_FILE,
)
from plateauscope.cli.common import CliError, run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.dynamics import (
    intervention_table_text,
    lead_table_text,
    llc_summary_lines,
    llc_table_text,
    noise_lines,
    reading,
    seed_lines,
    table_text,
    variant_table_text,
)
from plateauscope.dynamics.fits import analyze_sweep
from plateauscope.dynamics.interventions import intervention_rows, intervention_table
from plateauscope.dynamics.llc import llc_rows, llc_summary
from plateauscope.dynamics.sweep import load_sweep, sweep_runs, table_csv
from plateauscope.dynamics.variants import variant_table
from plateauscope.runs import run as rd
from plateauscope.runs.run import Run, write_text_atomic
from plateauscope.views.pages import write_page
from plateauscope.views.phrases import summary_lines
from plateauscope.views.sweep_report import build_sweep_report


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope dynamics``."""
    p = OneLineParser(prog="plateauscope dynamics", description="A sweep's per-run table, the fits across runs and (--report) its HTML page.")
    p.add_argument("--sweep", required=True, type=Path, help="a sweep directory (plateauscope sweep --out)")
    p.add_argument("--csv", type=Path, help=f"where to write the table (default SWEEP/{DYNAMICS_CSV_FILE})")
    p.add_argument("--json", type=Path, help="also write the fits as JSON to this file")
    p.add_argument("--report", action="store_true", help=f"also write SWEEP/{SWEEP_REPORT_FILE}")
    p.add_argument("--analyze", action="store_true",
                   help="first analyse every run of the sweep with a cue (plateauscope analyze; cached)")
    p.add_argument("--every", type=int, default=10, help="with --analyze: every N-th checkpoint (default 10)")
    p.add_argument("--n-exact", type=int, default=DEFAULT_BUDGET,
                   help="with --analyze: checkpoints with exact patching, ablation and the circuit (default %(default)s)")
    p.add_argument("--compare", type=Path, metavar="SWEEP",
                   help="another sweep (e.g. quick-noise on ci) whose reading of the noise claims is printed next to this one's")
    p.add_argument("--llc", type=int, metavar="EVERY",
                   help="first run the LLC at every EVERY-th checkpoint of every run (plateauscope llc; cached)")
    return p


def llc_all(sweep_dir: Path, every: int, settings: LLCSettings = LLCSettings(), progress: bool = True) -> list[str]:
    """``plateauscope.analysis.llc`` at every ``every``-th checkpoint of every trained run of the sweep."""
    require_devinterp()  # without the extra: one line, before any work
    done = []
    for name in sweep_runs(sweep_dir)[1]:
        path = sweep_dir / name
        if (path / rd.METRICS_FILE).exists() and Run(path).steps:
            llc_series(path, every=every, settings=settings, progress=progress)
            done.append(name)
    return done


def analyze_all(sweep_dir: Path, every: int, n_exact: int) -> list[str]:
    """``plateauscope.analysis.analyze`` on every trained run of the sweep whose task has a cue and prompt pairs (the
    selector task going backward, induction, ...); the names of the runs analysed."""
    done = []
    for name in sweep_runs(sweep_dir)[1]:
        path = sweep_dir / name
        if not (path / rd.METRICS_FILE).exists() or not Run(path).steps:
            continue
        if not {"cue", "pairs"} <= Run(path).task().capabilities:
            continue
        analyze_run(path, every=every, n_exact=n_exact, progress=True, edges=False)  # the head-level summaries only
        done.append(name)
    return done


def main(argv: list[str] | None = None) -> int:
    """``plateauscope dynamics``: the sweep's table and fits (and, with --report, its page)."""
    def body(args: argparse.Namespace) -> None:
        if args.every < 1 or args.n_exact < 1:
            raise CliError("--every and --n-exact must be at least 1")
        if args.llc is not None and args.llc < 1:
            raise CliError(f"--llc must be at least 1, got {args.llc}")
        if args.analyze or args.llc:
            sweep_runs(args.sweep)  # a missing directory: one line, before any work
        other = load_sweep(args.compare) if args.compare else None  # likewise
        if args.analyze:
            analyze_all(args.sweep, args.every, args.n_exact)
        if args.llc:
            llc_all(args.sweep, args.llc)
        sweep = load_sweep(args.sweep)
        result = analyze_sweep(sweep.rows)
        csv_path = args.csv or sweep.path / DYNAMICS_CSV_FILE
        write_text_atomic(csv_path, table_csv(sweep.rows))
        print(table_text(sweep.rows))
        print()
        for what, text in summary_lines(result):
            print(f"{what}: {text}")
        m = result["main"]
        if m["batch"] or m["lr"] or other:
            compare = (f"{other.name} ({other.path})", analyze_sweep(other.rows)["main"]) \
                if other else None
            print()
            print("\n".join(noise_lines(m, compare)))
        variants = variant_table(sweep.rows)
        if variants:
            print("\nplateau kind per task variant (mean [seed range]):")
            print(variant_table_text(variants))
            write_text_atomic(sweep.path / VARIANTS_CSV_FILE, table_csv(variants))
            print(f"variants: {sweep.path / VARIANTS_CSV_FILE}")
        interventions = intervention_table(intervention_rows(sweep.path, with_baselines=True)) if \
            any(r["intervention"] for r in sweep.rows) else []
        if interventions:
            print("\nwhat the plateau waits for (interventions against each seed's unmodified run):")
            print(intervention_table_text(interventions))
            leads = lead_table_text(interventions)
            if leads:
                print("\nthe lead from the release, (tau - t_form) / (tau - S), by each t_form rule:")
                print(leads)
            print("\n".join(reading(interventions)))
        llc = llc_rows(sweep.path)
        if llc:
            print("\nthe LLC against the training loss, t_form and tau (plateauscope llc per run):")
            print(llc_table_text(llc))
            print("\n".join(llc_summary_lines(llc_summary(llc))))
        print()
        print("\n".join(seed_lines(result["seeds"])))
        print(f"\ntable: {csv_path}")
        if args.json:
            write_json(args.json, result)
            print(f"fits: {args.json}")
        if args.report:
            path = write_page(sweep.path / SWEEP_REPORT_FILE, build_sweep_report(sweep, result))
            print(f"report: {path}")

    return run_cli(body, argv, build_parser())
