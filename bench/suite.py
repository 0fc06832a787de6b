"""Benchmark (not a test): the test suite and CI against issue 40's budgets.

    .venv/bin/python bench/suite.py                  # a fresh clone of this checkout's HEAD, .ci/run in it
    .venv/bin/python bench/suite.py --log ci.log     # the stage times of a .ci/run log from this machine

``.ci/run`` prints the wall time of each of its stages (``ci stage test: N s``): the two
environments' install, ``make test`` (the suite on TransformerLens 4), ``make test-tl3``, ``make docs``
and the total. This prints them against the budgets: ``make test`` in 8 minutes and ``.ci/run`` in 20
on the reference host, an AMD EPYC with AVX-512, and within twice those on any other host (the
issue's bound for the slowest host seen). Without ``--log`` it clones the checkout into a temporary
directory and runs ``.ci/run`` there, as CI does (about 20 minutes; nothing else should run beside it).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from record import against, arguments, print_rows, row, save

from plateauscope.runs.machine import describe, machine_record

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = {"test": 480.0, "total": 1200.0}
"""Issue 40: ``make test`` and ``.ci/run`` on the reference host (an AMD EPYC with AVX-512)."""
SLOWEST_FACTOR = 2.0
"""Issue 40: on any other host, within this multiple of the reference host's budgets."""
STAGE = re.compile(r"^ci stage (\S+): (\d+) s$", re.MULTILINE)


def reference_host(machine: dict) -> bool:
    """Whether this is the host the budgets are set on: an AMD EPYC with AVX-512."""
    return "AMD EPYC" in machine.get("cpu", "") and "avx512f" in (machine.get("isa") or [])


def run_ci() -> str:
    """``.ci/run`` in a fresh clone of the checkout's HEAD; its output (also echoed)."""
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        done = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True, text=True)
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
        if done.returncode:
            raise SystemExit(f"error: .ci/run failed (exit {done.returncode}) in the fresh clone")
        return done.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, help="a .ci/run log from this machine, instead of running it")
    args = p.parse_args(argv)
    if args.log is not None and not args.log.is_file():
        print(f"error: --log {args.log}: no such file", file=sys.stderr)
        return 2
    text = args.log.read_text(errors="replace") if args.log else run_ci()
    stages = {name: float(seconds) for name, seconds in STAGE.findall(text)}
    if "total" not in stages:
        print(f"error: {args.log or '.ci/run'}: no 'ci stage total' line (an unfinished run, or one from "
              "before .ci/run timed its stages)", file=sys.stderr)
        return 2
    machine = machine_record()
    factor = 1.0 if reference_host(machine) else SLOWEST_FACTOR
    host = "the reference host" if factor == 1.0 else f"{factor:g}x the reference host's, on another host"
    print(f"{describe(machine)}; budgets: {host}")
    names = {"install": "the two environments' install", "test": "make test (TransformerLens 4)",
             "test-tl3": "make test-tl3", "docs": "make docs", "total": ".ci/run"}
    rows = []
    for name, seconds in stages.items():
        label = f"{names.get(name, name)}, wall time"
        if name in BUDGET_S:
            rows.append(against(label, seconds / 60, "min", "<=", BUDGET_S[name] * factor / 60))
        else:
            rows.append(row(label, seconds / 60, "min"))
    print_rows(rows, "{:.1f}")
    print(f"saved {save('suite', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
