"""``plateauscope analyze``: the command line of :mod:`plateauscope.analysis.analyze`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

import plateauscope.analysis.analyze as _module
from plateauscope.analysis.ablate import KINDS
from plateauscope.analysis.analyze import MAX_WORKERS, AnalysisSettings, analyze_run
from plateauscope.analysis.edges import CIRCUIT_PAIRS, FAITHFULNESS_TARGET
from plateauscope.analysis.follow import POLL_S, follow
from plateauscope.analysis.landmarks import DEFAULT_BUDGET
from plateauscope.analysis.probe_pass import analyze_series
from plateauscope.analysis.results import analysis_dir
from plateauscope.analysis.shards import SHARD_EXECUTORS, run_shards, shard_executor
from plateauscope.cli.common import CliError, add_backend_arg, run_cli
from plateauscope.cli.import_ import format_probe_series
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.analysis import format_summary
from plateauscope.runs.run import Run
from plateauscope.runs.series import is_imported
from plateauscope.sources.hf_hub import analysis_fetch
from plateauscope.views.pages import live_status


def write_pages(run_dir: Path, live: str | None = None) -> None:
    """The run's report and time view (``live``: the banner of a run still being followed)."""
    from plateauscope.views.report import write_report  # the pages need the views' extras
    from plateauscope.views.view import write_view

    write_report(run_dir, live=live)
    write_view(run_dir, live=live)


def format_shard(outcome: dict, shards: int) -> str:
    """One line per shard of ``analyze --executor``: what it wrote and what an earlier try had."""
    head = f"shard {outcome['index'] + 1} of {shards}"
    if "error" in outcome:
        return f"{head}: failed ({outcome['error'][:200]}); log: {outcome['log']}"
    earlier = f", {outcome['resumed']} found from an earlier try" if outcome["resumed"] else ""
    return f"{head}: {outcome['steps']} steps, {outcome['written']} records written{earlier}"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope analyze``."""
    p = OneLineParser(prog="plateauscope analyze", description=_module.__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("--every", type=int, default=1, help="analyse every N-th checkpoint (default 1: all)")
    p.add_argument("--steps", type=int, nargs="+", help="analyse exactly these steps")
    p.add_argument("--probe", default="induction",
                   help="an imported run (plateauscope import): the probe its analyses run on, induction (the "
                        "default) or file.py:Class, a plateauscope.Probe of your own (recorded in "
                        "RUN/analysis/probe.json for the report, the view and ps.Run)")
    p.add_argument("--probe-length", type=int,
                   help="the induction probe's copy length (default: 12, or less where the model is small)")
    p.add_argument("--bos", metavar="ID",
                   help="the induction probe's start token: a token id, or 'none' (default: the series' tokenizer's "
                        "BOS; none where it has none)")
    p.add_argument("--probe-only", action="store_true",
                   help="an imported run: the probe's pass alone (head scores, the loss gap's transition, head "
                        "patching), not every analysis on its data; a small part of the whole's time")
    p.add_argument("--keep", type=int, metavar="N",
                   help="a series imported from the hub (import hf:ORG/NAME): keep at most N of its revisions in the "
                        "Hugging Face cache, the least recently read evicted before each fetch (default: keep all); "
                        "each revision is fetched when it is read, and checked against its SHA-256")
    p.add_argument("--n-exact", type=int, default=DEFAULT_BUDGET,
                   help="budget of the expensive pass (exact patching, ablation, the circuits): the landmarks, then "
                        "the steps where the cheap signals change fastest, up to this many in all (default %(default)s)")
    p.add_argument("--full", action="store_true",
                   help="the exhaustive plan: the faithful edge circuit at every analysed step, and the rest of the "
                        "expensive pass at --n-exact evenly spaced steps plus the landmarks")
    p.add_argument("--n-examples", type=int, default=256, help="prompt pairs / examples per analysis")
    p.add_argument("--ablation-groups", type=int, default=8, help="eval groups scored per ablation")
    p.add_argument("--seed", type=int, default=0, help="seed of the example samples (default 0)")
    p.add_argument("--circuit-ablation", choices=KINDS, default="cue_mean",
                   help="ablation kind of the circuit's head sets (default cue_mean: each head's mean over the "
                        "examples that differ only in the cue; mean for a task without candidates)")
    p.add_argument("--smooth", type=int, default=1,
                   help="centred moving-mean window of the t_form rules' series (default 1: none)")
    p.add_argument("--edge-target", type=float, default=FAITHFULNESS_TARGET,
                   help="share of the metric the faithful edge circuit must recover (default 0.8)")
    p.add_argument("--circuit-pairs", type=int, default=CIRCUIT_PAIRS,
                   help=f"pairs the faithful edge circuit is measured on (default {CIRCUIT_PAIRS})")
    p.add_argument("--n-exact-edges", type=int, default=32,
                   help="strongest edges patched exactly at each exact step (default 32)")
    p.add_argument("--no-edges", action="store_true", help="skip the edge analyses (plateauscope.analysis.edges)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--workers", type=int,
                   help="checkpoints of the cheap pass analysed side by side, each on its own thread and model "
                        f"(default: one per torch thread on the CPU, at most {MAX_WORKERS}; one on a GPU)")
    p.add_argument("--threads", type=int,
                   help="torch threads of this process, and of each shard's job with --executor (default: torch's; "
                        "a shard's: 1)")
    p.add_argument("--executor", choices=tuple(SHARD_EXECUTORS),
                   help="an imported series: analyse its checkpoints in --shards jobs on Slurm (a job array) or in "
                        "submitit's local processes, merge their records, then the rest here (default: all here)")
    p.add_argument("--shards", type=int, help="with --executor: the jobs the checkpoints are split over")
    p.add_argument("--retries", type=int, default=1,
                   help="with --executor: times a shard whose job died is submitted again, resuming (default 1)")
    p.add_argument("--slurm-partition", help="with --executor slurm: the partition")
    p.add_argument("--timeout-min", type=int, default=240,
                   help="with --executor: each shard's time limit in minutes (default 240)")
    add_backend_arg(p)
    p.add_argument("--follow", action="store_true",
                   help="analyse the run while it trains: each new checkpoint's cheap pass, the report and the view "
                        "rewritten live; the whole analysis when summary.json says complete, then exit")
    p.add_argument("--poll", type=float,
                   help="with --follow: seconds between two looks at the run directory (default 2)")
    p.add_argument("--no-wait", action="store_true",
                   help="exit with one line, rather than wait, when another process is analysing the run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope analyze``: analyse the series, print the selector summary."""
    def body(args: argparse.Namespace) -> None:
        if args.every < 1:
            raise CliError(f"--every must be at least 1, got {args.every}")
        if args.n_exact < 0:
            raise CliError(f"--n-exact must be at least 0, got {args.n_exact}")
        if args.smooth < 1:
            raise CliError(f"--smooth must be at least 1, got {args.smooth}")
        if not 0 < args.edge_target <= 1:
            raise CliError(f"--edge-target must be in (0, 1], got {args.edge_target}")
        if args.circuit_pairs < 1:
            raise CliError(f"--circuit-pairs must be at least 1, got {args.circuit_pairs}")
        if args.n_exact_edges < 0:
            raise CliError(f"--n-exact-edges must be at least 0, got {args.n_exact_edges}")
        if args.workers is not None and args.workers < 1:
            raise CliError(f"--workers must be at least 1, got {args.workers}")
        for flag, value, least in (("--threads", args.threads, 1), ("--shards", args.shards, 1),
                                   ("--retries", args.retries, 0), ("--timeout-min", args.timeout_min, 1)):
            if value is not None and value < least:
                raise CliError(f"{flag} must be at least {least}, got {value}")
        if (args.executor is None) != (args.shards is None):
            raise CliError("--executor and --shards go together: --executor slurm --shards N")
        if args.executor and not is_imported(args.run):
            raise CliError(f"--executor: {args.run} is not an imported series (plateauscope import); a run trained "
                           "here is analysed in one process")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        settings = AnalysisSettings(args.n_examples, args.seed, args.ablation_groups,
                                    circuit_ablation=args.circuit_ablation, smooth=args.smooth,
                                    edge_target=args.edge_target, circuit_pairs=args.circuit_pairs,
                                    n_exact_edges=args.n_exact_edges)
        fetch, fetch_for = analysis_fetch(args.run, args.keep, not args.no_progress)
        if is_imported(args.run):  # a series trained elsewhere: the probe's pass, then every analysis on its data
            if args.follow:
                raise CliError(f"--follow: {args.run} is an imported series, not a run training here")
            options = {**({} if args.probe_length is None else {"segment_len": args.probe_length}),
                       **({} if args.bos is None else {"bos": args.bos})}
            if args.executor:  # the per-step passes in shards, merged into the cache; the rest below, here
                run_shards(args.run, args.shards, shard_executor(args.run, args.executor), args.probe, options,
                           args.steps, args.every, settings, args.threads or 1, args.retries, fetch_for, args.device,
                           not args.no_edges, args.probe_only,
                           {"partition": args.slurm_partition, "timeout_min": args.timeout_min},
                           on_shard=lambda outcome: print(format_shard(outcome, args.shards)), wait=not args.no_wait)
            passed, result = analyze_series(
                args.run, args.probe, options, args.steps, args.every, args.device, progress=not args.no_progress,
                n_exact=args.n_exact, settings=settings, backend=args.backend, edges=not args.no_edges, full=args.full,
                wait=not args.no_wait, workers=args.workers, probe_only=args.probe_only, fetch=fetch)
            print(format_probe_series(passed))
            if args.probe_only:
                return
            if result is None:
                print(f"--probe {args.probe} is a probe but not a plateauscope.Task (no evaluate): its pass above is "
                      "its analysis, and plateauscope report draws it; the patching sweep, ablation, circuit, stages "
                      "and view need a probe that subclasses a task too, as induction does")
                return
            # the probe's pass above is this run's summary (the task-run summary below speaks of tau and a plateau
            # of a run trained here); the rest is in the cache, which report, view and moved_first read
            print(f"every analysis on the probe's data: results in {analysis_dir(args.run)} (plateauscope report, "
                  "view and moved_first read them)")
            if result.get("refused"):  # what the family has none of: one line each, and exit code 2
                raise CliError("; ".join(result["refused"].values()))
            return
        elif args.probe_only:
            raise CliError(f"--probe-only: {args.run} is not an imported series (plateauscope import); a run trained "
                           "here is analysed on its own task")
        elif args.follow:
            if args.steps or args.every != 1 or args.full or args.workers is not None:
                raise CliError("--follow analyses every checkpoint with the adaptive plan and the default workers: "
                               "not with --steps, --every, --full or --workers")
            if args.poll is not None and args.poll <= 0:
                raise CliError(f"--poll must be positive, got {args.poll}")
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            try:
                result = follow(args.run, settings, args.n_exact, args.poll or POLL_S, device=args.device,
                                backend=args.backend, edges=not args.no_edges, wait=not args.no_wait,
                                on_refresh=lambda step, max_steps: write_pages(args.run, live_status(step, max_steps)),
                                on_complete=lambda: write_pages(args.run))
            except KeyboardInterrupt:
                raise CliError(f"stopped following {args.run}: every cache file is whole; analyze it again "
                               "to continue") from None
        else:
            result = analyze_run(args.run, args.steps, args.every, args.n_exact, settings, args.device,
                                 progress=not args.no_progress, backend=args.backend, edges=not args.no_edges,
                                 full=args.full, wait=not args.no_wait, workers=args.workers)
        print(format_summary(result, Run(args.run).progress))
        print(f"results in {analysis_dir(args.run)}")
        if result.get("refused"):  # the rest ran; what the family has none of is one line each, and exit code 2
            raise CliError("; ".join(result["refused"].values()))

    return run_cli(body, argv, build_parser())
