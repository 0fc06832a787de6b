"""Write the measured-timings table of ``docs/pages/performance.md`` from ``bench/results/*.json``.

    .venv/bin/python bench/performance_table.py [--check]

The table sits between the page's ``<!-- performance-table:start -->`` and ``:end -->`` markers: one row per
measure that has a target, each projection to full size (a measure named ``projected ...``) and each part's cost
(``part: ...``), from the newest
saved result that measured it (by date, then by commit), with its value, the target, whether it was met, and the
machine (a short tag of its CPU) and commit. Any other measure without a target, and an older machine's value, stay in the result files (``bench/results/*.json``, one per bench and
machine, each with the whole machine record), which the page links. ``--check`` exits 1 if the page differs
from what the files give (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plateauscope.runs.machine import lowered_kernels

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "pages" / "performance.md"
START, END = "<!-- performance-table:start -->", "<!-- performance-table:end -->"


def _value(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"  # 4 digits: a value just over its bound reads so


def machine_tag(machine: dict) -> str:
    """A short name for a machine record: its CPU's maker and family, and its widest vector extension
    (and torch's kernels where they were set below it)."""
    cpu = machine["cpu"]
    family = "EPYC" if "EPYC" in cpu else "Xeon" if "Xeon" in cpu else cpu.split()[0]
    isa = set(machine["isa"])
    width = "AMX" if "amx_tile" in isa else "AVX-512" if "avx512f" in isa else "AVX2" if "avx2" in isa else ""
    lowered = lowered_kernels(machine)
    return f"{family} {width}".strip() + (f", torch kernels {lowered}" if lowered else "")


def _untargeted(r: dict) -> str | None:
    """What a measure without a target that the table lists is: a projection to full size (a measure named
    ``projected ...``) or the cost of one part of a whole (``part: ...``); None for the others."""
    if r["measure"].split(": ")[-1].startswith("projected"):
        return "projection"
    return "cost" if r["measure"].startswith("part: ") else None


def table(results_dir: Path = RESULTS) -> str:
    """The markdown table: each measure with a target, projected to full size or a part's cost, from the newest result that
    measured it, by bench (a result with torch's kernels set below the CPU's best is a float path of its own: its rows
    stand beside the others)."""
    newest: dict[tuple[str, str, str], tuple[tuple[str, str], dict, dict]] = {}
    for path in sorted(results_dir.glob("*.json")):
        result = json.loads(path.read_text())
        for r in result["rows"]:
            key = (result["bench"], r["measure"], lowered_kernels(result["machine"]) or "")
            when = (result["date"], result["commit"])
            if (r.get("target") or _untargeted(r)) and (key not in newest or when > newest[key][0]):
                newest[key] = (when, result, r)
    lines = ["| bench | measure | value | target | met | machine, commit |", "| --- | --- | --- | --- | --- | --- |"]
    for (bench, _, _), (_, result, r) in sorted(newest.items(), key=lambda kv: kv[0]):
        met = _untargeted(r) if not r.get("target") else "met" if r.get("met") else "**not met**"
        lines.append(f"| `{bench}` | {r['measure']} | {_value(r['value'])} {r['unit']} | {r.get('target') or '-'} | {met} | "
                     f"{machine_tag(result['machine'])}, {result['commit']} |")
    return "\n".join(lines)


def render(page: str, results_dir: Path = RESULTS) -> str:
    """``page`` with the text between the markers replaced by the table."""
    if START not in page or END not in page:
        raise ValueError(f"{PAGE}: the markers {START} and {END} are missing")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(results_dir)}\n{END}{tail}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page is not what the result files give")
    args = p.parse_args()
    page = PAGE.read_text()
    new = render(page)
    if args.check:
        if new != page:
            print(f"{PAGE}: the performance table is out of date; run bench/performance_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"{PAGE}: {table().count(chr(10)) - 1} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
