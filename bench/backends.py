"""Benchmark (not a test): ``plateauscope analyze`` on TransformerLens 4.x against 3.x, on the demo.

    .venv/bin/python bench/backends.py [--run checkpoints/demo] [--other-python .venv-tl3/bin/python]
                                       [--rounds 2]

The demo run (trained with ``plateauscope train --preset demo`` when ``--run`` is missing) is copied
without its analysis once per major and round, and ``python -m plateauscope analyze`` runs on each
copy in a fresh process of that major's environment: this environment (4.x, the project's) and
``--other-python`` (3.x, ``make install-tl3``), the first of each pair alternating between rounds.
The figure is the ratio of the child processes' CPU time, 4.x / 3.x (target, issue 41: <= 1.2),
per round and its median; wall times are printed beside it. It also prints the largest difference
between the two majors' analysis caches: over the fields in logits, losses and attention (target
1e-5), and over the ratios to a logit gap (shares, normalised effects, faithfulness), where float32
rounding is divided by gaps near 0 on the plateau.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import against, arguments, print_rows, row, save

from plateauscope.analysis.results import ANALYSIS_DIR
from plateauscope.model.backend import installed_transformer_lens

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.2
"""Issue 41: analyze on 4.x within 1.2x of 3.x on the demo."""
TARGET_DIFF = 1e-5
"""Issue 41: the same analysis cache on both majors, to 1e-5."""


def analyse(python: str, run: Path) -> tuple[float, float]:
    """CPU and wall seconds of ``python -m plateauscope analyze --run RUN`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([python, "-m", "plateauscope", "analyze", "--run", str(run), "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{python}: analyze failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


RATIOS = ("share", "normalised", "faithfulness", "evaluated", "spearman", "fraction", "max_abs_err_normalised")
"""Fields that divide by a difference of logits (the clean - corrupted gap, a circuit's total): rounding
in the numerator is multiplied by one over a gap that is near 0 on the plateau."""


def largest_differences(a: Path, b: Path) -> dict[str, tuple[float, str]]:
    """The largest |difference| between two analysis caches, and where: over the fields measured in
    logits, losses or attention (``raw``), and over the ratios (:data:`RATIOS`)."""
    worst = {"raw": (0.0, ""), "ratio": (0.0, "")}

    def walk(x, y, where: str) -> None:
        if isinstance(x, dict):
            for key in x:
                walk(x[key], y[key], f"{where}.{key}")
        elif isinstance(x, list):
            for u, v in zip(x, y):
                walk(u, v, where)
        elif isinstance(x, float) and isinstance(y, (int, float)):
            d = 0.0 if math.isnan(x) and math.isnan(y) else abs(x - y)
            kind = "ratio" if any(r in where for r in RATIOS) else "raw"
            worst[kind] = max(worst[kind], (d, where))

    for path in sorted(a.glob("*.json*")):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        other = (b / path.name).read_text()
        for x, y in zip(lines, other.splitlines() if path.suffix == ".jsonl" else [other]):
            walk(json.loads(x), json.loads(y), path.name)
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=ROOT / "checkpoints" / "demo")
    p.add_argument("--other-python", default=str(ROOT / ".venv-tl3" / "bin" / "python"))
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if not installed_transformer_lens().startswith("4."):
        sys.exit(f"run this bench in the TransformerLens 4 environment (.venv), not {installed_transformer_lens()}")
    if not os.access(args.other_python, os.X_OK):
        sys.exit(f"--other-python {args.other_python}: not found (make install-tl3 builds it)")
    if not (args.run / "summary.json").is_file():
        print(f"training {args.run} (plateauscope train --preset demo) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "plateauscope", "train", "--preset", "demo", "--out", str(args.run),
                        "--no-progress"], cwd=ROOT, check=True)
    pythons = {"4.x": sys.executable, "3.x": args.other_python}
    cpu: dict[str, list[float]] = {"4.x": [], "3.x": []}
    wall: dict[str, list[float]] = {"4.x": [], "3.x": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for major in (("3.x", "4.x") if r % 2 == 0 else ("4.x", "3.x")):
                copy = Path(tmp) / f"{major}-{r}"
                shutil.copytree(args.run, copy, ignore=shutil.ignore_patterns(ANALYSIS_DIR, "*.html", "*.svg"))
                c, w = analyse(pythons[major], copy)
                cpu[major].append(c)
                wall[major].append(w)
                print(f"round {r + 1}, TransformerLens {major}: {c:.1f} s CPU, {w:.1f} s wall", file=sys.stderr)
        worst = largest_differences(Path(tmp) / "3.x-0" / ANALYSIS_DIR, Path(tmp) / "4.x-0" / ANALYSIS_DIR)
    ratios = [a / b for a, b in zip(cpu["4.x"], cpu["3.x"])]
    rows = [
        against(f"demo: analyze CPU time, TransformerLens 4.x / 3.x (median of {args.rounds} rounds)",
                statistics.median(ratios), "x", "<=", TARGET_RATIO),
        row("demo: analyze wall time, TransformerLens 4.x / 3.x (median)",
            statistics.median(a / b for a, b in zip(wall["4.x"], wall["3.x"])), "x"),
        row("demo: analyze CPU time on TransformerLens 4.x (median)", statistics.median(cpu["4.x"]), "s"),
        row("demo: analyze CPU time on TransformerLens 3.x (median)", statistics.median(cpu["3.x"]), "s"),
        against(f"demo: largest difference between the two majors' analysis caches in logits, losses and attention "
                f"({worst['raw'][1]})", worst["raw"][0], "", "<=", TARGET_DIFF),
        row(f"demo: largest difference in a ratio to a logit gap ({worst['ratio'][1]})", worst["ratio"][0], ""),
    ]
    print_rows(rows)
    versions = {"transformer_lens_4": installed_transformer_lens(), "other_python": args.other_python}
    print(f"saved {save('backends', rows, arguments(args, **versions))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
