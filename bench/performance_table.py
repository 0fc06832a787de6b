"""Write the measured-timings table of ``docs/pages/performance.md`` from ``bench/results/*.json``.

    .venv/bin/python bench/performance_table.py [--check]

The table sits between the page's ``<!-- performance-table:start -->`` and ``:end -->`` markers; one
row per measure of every saved bench result, with its target, whether it was met, the machine and
the commit. ``--check`` exits 1 if the page differs from what the files give (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "pages" / "performance.md"
START, END = "<!-- performance-table:start -->", "<!-- performance-table:end -->"


def _value(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def table(results_dir: Path = RESULTS) -> str:
    """The markdown table of every saved result, by bench then measure."""
    lines = ["| bench | measure | value | target | met | machine | commit |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted(results_dir.glob("*.json")):
        result = json.loads(path.read_text())
        m = result["machine"]
        machine = f"{m['cpu']} [{' '.join(m['isa'])}], {m['threads']} threads, torch {m['torch']}"
        for r in result["rows"]:
            met = {True: "met", False: "**not met**", None: ""}[r.get("met")]
            lines.append(f"| `bench/{result['bench']}.py` | {r['measure']} | {_value(r['value'])} {r['unit']} | "
                         f"{r.get('target') or ''} | {met} | {machine} | {result['commit']}, {result['date']} |")
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
