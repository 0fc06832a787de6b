"""What a bench measured, saved as JSON beside it (``bench/results/<bench>-<machine>.json``) with the
machine record and the commit, for ``bench/performance_table.py`` to put on the Performance page.

A bench calls :func:`save` once with its rows; each row is one measure printed next to its target:
``{"measure": ..., "value": ..., "unit": ..., "target": "<= 1.05" or None, "met": bool or None}``.
A measure that was not measured has no row (a row always holds a number). A run of a bench that
measures only some of its figures (``bench/train_step.py --only-resume``) saves them as a ``part``,
in ``<bench>-<part>-<machine>.json``, so that it does not overwrite the whole run's file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import operator
import re
import subprocess
from pathlib import Path

from plateauscope.runs.files import write_json_atomic
from plateauscope.runs.machine import lowered_kernels, machine_record

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str:
    """The checkout's commit (with ``+dirty`` when it has uncommitted changes)."""
    root = RESULTS.parent.parent
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"{sha}+dirty" if dirty else sha


def row(measure: str, value: float, unit: str, target: str | None = None, met: bool | None = None) -> dict:
    """One measure, its target (as printed, e.g. ``<= 1.05``) and whether it is met."""
    return {"measure": measure, "value": value, "unit": unit, "target": target, "met": met}


COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def against(measure: str, value: float, unit: str, op: str, bound: float, suffix: str = "") -> dict:
    """One measure against the target ``op bound`` (``>= 1.4``; ``< 5%`` with ``suffix="%"``), met or not."""
    return row(measure, value, unit, f"{op} {bound:g}{suffix}", bool(COMPARE[op](value, bound)))


def yes_no(measure: str, ok: bool) -> dict:
    """A check that should hold (bit-identical weights, the same records): 1 if it does, against the target 1."""
    return row(measure, float(ok), "(1 = yes)", "1", bool(ok))


def print_rows(rows: list[dict], fmt: str = "{:.3g}") -> None:
    """Each row on a line: its measure, value and unit, and its target with met or NOT met."""
    for r in rows:
        verdict = "" if r["target"] is None else f" (target {r['target']}: {'met' if r['met'] else 'NOT met'})"
        print(f"{r['measure']}: {fmt.format(r['value'])} {r['unit']}{verdict}")


def arguments(args: argparse.Namespace, **more) -> dict:
    """A bench's arguments (and ``more``) as the settings of its result: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in {**vars(args), **more}.items()}


def machine_slug(machine: dict) -> str:
    """A file-name part for a machine record: its CPU and instruction sets (and torch's kernels where
    they were set below the CPU's best)."""
    lowered = lowered_kernels(machine)
    name = f"{machine['cpu']} {' '.join(machine['isa'])}" + (f" kernels {lowered}" if lowered else "")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def save(bench: str, rows: list[dict], settings: dict | None = None, part: str | None = None) -> Path:
    """Write this bench's rows with the machine record, the commit and the date; return the file
    (``part``: the figures of a partial run, in a file of their own)."""
    machine = machine_record()
    path = RESULTS / f"{bench}-{part + '-' if part else ''}{machine_slug(machine)}.json"
    write_json_atomic(path, {"bench": bench, "commit": commit(), "date": datetime.date.today().isoformat(),
                             "machine": machine, "settings": settings or {}, "rows": rows})
    return path


if __name__ == "__main__":  # the saved results, one line each
    for saved in sorted(RESULTS.glob("*.json")):
        result = json.loads(saved.read_text())
        print(f"{saved.name}: {len(result['rows'])} rows, commit {result['commit']}, {result['date']}, "
              f"{result['machine']['cpu']} [{' '.join(result['machine']['isa'])}]")
