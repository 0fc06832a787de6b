"""``plateauscope hessian``: the command line of :mod:`plateauscope.analysis.hessian`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

import plateauscope.analysis.hessian as _module
from plateauscope.analysis.hessian import (
    DEFAULT_BATCH,
    DEFAULT_N_BATCHES,
    analyze_series,
    default_escape,
    displacement,
    geometry,
    hessian_path,
    log,
)
from plateauscope.analysis.hessian_engine import (
    DEFAULT_K,
    DEFAULT_MAX_ITER,
    DEFAULT_N_BOTTOM,
    DEFAULT_TOL,
    METHODS,
)
from plateauscope.analysis.results import settings_key
from plateauscope.cli.common import CliError, resolve_ckpt, run_cli, write_json
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.analysis import format_record
from plateauscope.runs.series import is_imported


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope hessian``."""
    p = OneLineParser(prog="plateauscope hessian", description=_module.__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--ckpt", type=Path, help="a checkpoint file, or a run directory (with --step)")
    where.add_argument("--run", type=Path, help="a run directory: analyse --steps, cached in RUN/analysis/")
    p.add_argument("--step", type=int, help="with --ckpt DIR: the step (default: the last)")
    p.add_argument("--steps", type=int, nargs="+", help="with --run: the steps (default: the escape endpoints)")
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"top eigenvalues (default {DEFAULT_K})")
    p.add_argument("--n-bottom", type=int, default=DEFAULT_N_BOTTOM,
                   help=f"most negative eigenvalues (default {DEFAULT_N_BOTTOM})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"Hessian batch size (default {DEFAULT_BATCH})")
    p.add_argument("--n-batches", type=int, default=DEFAULT_N_BATCHES,
                   help=f"Hessian batches for the stability statistics (default {DEFAULT_N_BATCHES})")
    p.add_argument("--seed", type=int, default=0, help="seed of the first batch and of the Lanczos start")
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help=f"relative residual tolerance (default {DEFAULT_TOL})")
    p.add_argument("--max-iter", type=int, default=DEFAULT_MAX_ITER,
                   help=f"Lanczos steps at most (default {DEFAULT_MAX_ITER})")
    p.add_argument("--escape-from", type=int, help="plateau step of the displacement (default: mid plateau)")
    p.add_argument("--escape-to", type=int, help="post-transition step of the displacement (default: the last)")
    p.add_argument("--method", choices=METHODS, default="vjp", help="HVP: vjp of grad (default) or jvp of grad")
    p.add_argument("--json", type=Path, help="also write the result(s) as JSON to this file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads (default: torch's; 1 is much faster on a loaded machine)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be at least 1, got {args.threads}")
    for name in ("k", "n_bottom", "batch", "n_batches", "max_iter"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.tol < 1:
        raise CliError(f"--tol must lie in (0, 1), got {args.tol}")
    if args.ckpt is not None and args.steps:
        raise CliError("--steps goes with --run; use --step with --ckpt")
    if args.run is not None and args.step is not None:
        raise CliError("--step goes with --ckpt; use --steps with --run")


def main(argv: list[str] | None = None) -> int:
    """``plateauscope hessian``: geometry of one checkpoint or a cached series."""
    def body(args: argparse.Namespace) -> None:
        _check_args(args)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        if args.threads:
            torch.set_num_threads(args.threads)
        opts = dict(k=args.k, n_bottom=args.n_bottom, batch=args.batch, n_batches=args.n_batches, seed=args.seed,
                    tol=args.tol, max_iter=args.max_iter, escape_from=args.escape_from, escape_to=args.escape_to,
                    method=args.method, device=args.device, progress=not args.no_progress)
        if args.run is not None:
            records = analyze_series(args.run, args.steps, **opts)
            print("\n".join(format_record(r) for r in records))
            print(f"results in {hessian_path(args.run)}")
            write_json(args.json, records)
            return
        run, step = resolve_ckpt(args.ckpt, args.step)
        if is_imported(run.path):
            raise run.needs_training("the Hessian (of the training loss)")
        d_from, d_to = default_escape(run)
        e_from = d_from if args.escape_from is None else args.escape_from
        e_to = d_to if args.escape_to is None else args.escape_to
        for s in (e_from, e_to):
            if s is not None:
                run.checkpoint_path(s)
        if e_from is None:
            log.warning("%s: no plateau stretch in the summary and no --escape-from: displacement direction skipped",
                        run.path)
        disp = displacement(run, e_from, e_to, args.device) if e_from is not None else None
        settings = {k: v for k, v in opts.items() if k not in ("device", "progress")}
        rec = {"step": step, "settings": settings_key({**settings, "escape_from": e_from, "escape_to": e_to}),
               **geometry(run.model(step, args.device), run.task(), k=args.k, n_bottom=args.n_bottom,
                          batch=args.batch, n_batches=args.n_batches, seed=args.seed, tol=args.tol,
                          max_iter=args.max_iter, displacement=disp, method=args.method,
                          progress=not args.no_progress)}
        print(format_record(rec))
        write_json(args.json, rec)

    return run_cli(body, argv, build_parser())
