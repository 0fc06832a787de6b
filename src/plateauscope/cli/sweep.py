"""``plateauscope sweep``: the command line of :mod:`plateauscope.sweeps` (spec, executors, catalogue)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import plateauscope.sweeps.spec as _module
from plateauscope.cli.parser import OneLineParser
from plateauscope.errors import ConfigError
from plateauscope.model.config import CHECKPOINT_POLICIES
from plateauscope.processes import sigterm_as_interrupt
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.sweeps.catalogue import SWEEPS, get_sweep
from plateauscope.sweeps.executors import run_sweep
from plateauscope.sweeps.spec import EXECUTORS, SweepSpec, expand, is_complete


def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def _parse_assignment(text: str, flag: str) -> tuple[str, list[Any]]:
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ConfigError(f"{flag} expects KEY=VALUE[,VALUE...], got {text!r}")
    return key.strip(), [_parse_value(v.strip()) for v in values.split(",")]


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The sweep a command line asks for: a shipped preset, or ``--base`` with ``--grid``/``--set``."""
    if args.preset and (args.grid or args.base):
        raise ConfigError("give either --preset or --base/--grid, not both")
    if args.preset:
        spec = get_sweep(args.preset)
    elif args.grid:
        get_preset(args.base or "ci")
        grid = dict(_parse_assignment(g, "--grid") for g in args.grid)
        spec = SweepSpec(name="custom", base=args.base or "ci", grids=({k: tuple(v) for k, v in grid.items()},),
                         description="a grid given on the command line")
    else:
        raise ConfigError("give --preset NAME (see --list) or --grid KEY=V1,V2 [--base PRESET]")
    extra = {}
    for s in args.set or []:
        key, values = _parse_assignment(s, "--set")
        if len(values) != 1:
            raise ConfigError(f"--set {s!r}: one value only (use --grid for several)")
        extra[key] = values[0]
    if args.checkpoints:
        extra["checkpoints"] = args.checkpoints
    if extra:
        spec = SweepSpec(spec.name, spec.base, spec.grids, {**spec.fixed, **extra}, spec.description, spec.cost)
    return spec


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope sweep``."""
    p = OneLineParser(prog="plateauscope sweep", description=_module.__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Then: plateauscope dynamics --sweep OUT")
    p.add_argument("--list", action="store_true", help="list the shipped sweeps with their expected cost, and exit")
    p.add_argument("--preset", help="a shipped sweep (see --list)")
    p.add_argument("--base", help="with --grid: the run preset every point starts from (default ci)")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2", help="an axis of a custom grid (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="an option for every point (repeatable)")
    p.add_argument("--seeds", help="comma-separated seeds replacing the sweep's seed axis, e.g. 0,1,2")
    p.add_argument("--out", type=Path, help="sweep directory (default sweeps/<name>)")
    p.add_argument("--executor", default="local", choices=EXECUTORS, help="where the runs train (default local)")
    p.add_argument("--workers", type=int, help="parallel jobs (default: the cores; slurm: array parallelism)")
    p.add_argument("--threads", type=int, help="torch threads per job (default: cores // workers)")
    p.add_argument("--checkpoints", choices=CHECKPOINT_POLICIES,
                   help="which checkpoints every run keeps (train --checkpoints): dense or adaptive")
    p.add_argument("--ensemble", action="store_true",
                   help="train the seeds of each configuration as one vectorised model")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--dry-run", action="store_true", help="print the points and what is left to train, and exit")
    p.add_argument("--slurm-partition", help="slurm: partition")
    p.add_argument("--cpus-per-task", type=int, help="slurm: cores (and torch threads) per job (default 2)")
    p.add_argument("--timeout-min", type=int, default=240, help="submitit: time limit per job in minutes (default 240)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``plateauscope sweep``: plan and train a sweep, one line per run; a kill (SIGTERM) stops the
    workers as Ctrl-C does, and the same command resumes."""
    with sigterm_as_interrupt():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for spec in SWEEPS.values():
            n = len(expand(spec))
            print(f"{spec.name:16s} {n:3d} runs  {spec.cost}\n{'':22s}{spec.description}")
        return 0
    try:
        spec = spec_from_args(args)
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        out = args.out or Path("sweeps") / spec.name
        if args.dry_run:
            for point in expand(spec, seeds):
                print(f"{'complete' if is_complete(out / point.name) else 'to train':9s} {out / point.name}")
            return 0
        slurm = {"partition": args.slurm_partition, "cpus_per_task": args.cpus_per_task,
                 "timeout_min": args.timeout_min}
        t0 = time.perf_counter()
        outcomes = run_sweep(spec, out, args.executor, args.workers, args.ensemble, seeds, args.device,
                             progress=not args.no_progress, slurm=slurm, threads=args.threads)
    except (ConfigError, rd.RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # --seeds that are not integers
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to resume the sweep in {out}", file=sys.stderr)
        return 130
    for o in outcomes:
        detail = o.get("error") or (f"tau {o.get('tau')}, {o.get('final_step')} steps, {o.get('seconds')} s"
                                    if o["status"] == "done" else "")
        print(f"{o['status']:8s} {o['name']:40s} {detail}")
    failed = sum(o["status"] == "failed" for o in outcomes)
    print(f"sweep {spec.name} in {out}: {len(outcomes) - failed} of {len(outcomes)} runs complete "
          f"({time.perf_counter() - t0:.0f} s); next: plateauscope dynamics --sweep {out}")
    return 1 if failed else 0

