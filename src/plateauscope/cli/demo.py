"""``plateauscope demo``: train the demo run (the paper's model and data, stopped at 1.5 tau), analyse
every second checkpoint, and write its report and time view. Run again, it resumes and reuses the cache."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from plateauscope.cli import analyze, report, train, view
from plateauscope.cli.parser import OneLineParser
from plateauscope.runs import run as rd
from plateauscope.runs.machine import machine_record

DEFAULT_OUT = Path("checkpoints/demo")


def target_seconds(machine: dict) -> tuple[float, str] | None:
    """The demo's time target after the install on this kind of host, and the host's name
    (issue 40: 5 minutes on an AMD EPYC with AVX-512 and VNNI, 7 without AVX-512); None elsewhere."""
    if "AMD EPYC" not in machine.get("cpu", ""):
        return None
    isa = set(machine.get("isa") or [])
    if {"avx512f", "avx512_vnni"} <= isa:
        return 300.0, "an AMD EPYC with AVX-512 and VNNI"
    return (420.0, "an AMD EPYC without AVX-512") if "avx512f" not in isa else None


def against_target(seconds: float, machine: dict) -> str:
    """One line: the demo's time, and its target on this host (or that this host has none)."""
    target = target_seconds(machine)
    if target is None:
        return f"demo {seconds:.0f} s (no time target for {machine.get('cpu')})"
    bound, host = target
    return f"demo {seconds:.0f} s (target on {host}: <= {bound:.0f} s: {'met' if seconds <= bound else 'NOT met'})"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``plateauscope demo``."""
    p = OneLineParser(prog="plateauscope demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"run directory (default {DEFAULT_OUT})")
    p.add_argument("--preset", default="demo", help="the preset to train (default demo; tiny or ci for a quick look)")
    p.add_argument("--every", type=int, default=2, help="analyse every N-th checkpoint (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    """Each stage in turn; stop at the first that fails (its one-line error and exit code)."""
    args = build_parser().parse_args(argv)
    quiet = ["--no-progress"] if args.no_progress else []
    run = str(args.out)
    stages = [("train", train.main, ["--preset", args.preset, "--out", run, "--resume", *quiet]),
              ("analyse", analyze.main, ["--run", run, "--every", str(args.every), *quiet]),
              ("report", report.main, ["--run", run]),
              ("view", view.main, ["--run", run])]
    fresh = not (args.out / rd.CONFIG_FILE).exists()
    times, started = [], time.perf_counter()
    for name, stage, stage_argv in stages:
        t0 = time.perf_counter()
        rc = stage(stage_argv)
        if rc != 0:
            return rc
        times.append(f"{name} {time.perf_counter() - t0:.0f} s")
    print(f"demo run: {run}; open {run}/report.html and {run}/view.html in a browser (no network needed)")
    print("stage times: " + ", ".join(times), file=sys.stderr)
    if args.preset == "demo":
        print(against_target(time.perf_counter() - started, machine_record()) if fresh
              else "demo resumed: its time is not compared with the target", file=sys.stderr)
    return 0
