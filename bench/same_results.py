"""Benchmark (not a test): the same run directory, file by file, from the current checkout and a baseline
commit, on this machine, for a preset trained, analysed, reported and viewed by each.

    .venv/bin/python bench/same_results.py [--baseline a7bec31] [--current SHA] [--preset ci] [--preset demo]

A change that should change no behaviour (a refactor: issue 63) leaves every file of a run the same. The
baseline is the project at a git commit, exported with ``git archive``; each tree runs ``plateauscope train``
(``demo``: ``plateauscope demo``, which also analyses, reports and views), ``analyze``, ``report`` and
``view`` in a fresh interpreter with its own ``src`` first on the path, writing into the same folder (the
report names the run's path), one tree after the other. The files are then compared:

* checkpoints, ``dataset.jsonl``, ``config.json``, the analysis cache (``analysis/*``), ``view.html``,
  ``overview.svg``: byte for byte;
* ``metrics.jsonl`` and ``summary.json``: byte for byte but the wall clock (``wall_s``);
* ``report.html``: byte for byte, once its CircuitsVis views' element ids are numbered in order (CircuitsVis
  draws a random id for each view, so two renderings of the same data differ there) and the names of the
  modules that moved (``plateauscope.deprecation.MOVED``) are written as their new homes in the baseline's
  page (its footnote names the module that defines tau);
* ``resume.pt`` / ``checksums.json`` hold the wall clock and are not compared.

One field may differ by design: the analysis cache keys its records on the task's fingerprint, a hash of
the task class's source file and its config (``Run.task_fingerprint``), so that an edited task recomputes.
A refactor that moves an import of ``tasks/selector.py`` changes that hash. The bench says so: each file is
compared as it is, and again with the baseline's fingerprint replaced by the current one; "identical but
the task fingerprint" is the second kind. Saves one row per preset and kind of file (1 = the same).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from record import print_rows, save, yes_no

from plateauscope.deprecation import MOVED
from plateauscope.runs.machine import describe, machine_record

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "a7bec31"
"""The last commit before the ground floor (issue 63)."""
PIPELINE = {
    "ci": [["train", "--preset", "ci", "--out", "{run}", "--no-progress", "--device", "cpu"],
           ["analyze", "--run", "{run}", "--no-progress"], ["report", "--run", "{run}"], ["view", "--run", "{run}"]],
    "demo": [["demo", "--out", "{run}"]],
}
NOT_COMPARED = ("resume.pt", "resume.prev.pt", "checksums.json", ".lock", ".train.lock")
WALL = re.compile(rb'"wall_s": [0-9.e+-]+')
CIRCUITSVIS_ID = re.compile(rb"circuits-vis-[0-9a-f]{8}-[0-9a-f]{4}")


def numbered_views(page: bytes) -> bytes:
    """``page`` with each CircuitsVis element id replaced by its order of first appearance."""
    ids: dict[bytes, bytes] = {}
    return CIRCUITSVIS_ID.sub(lambda m: ids.setdefault(m.group(0), b"circuits-vis-%d" % len(ids)), page)


def moved_names(page: bytes) -> bytes:
    """``page`` with every module path that moved in 0.3 written as its new home."""
    for old, new in MOVED.items():
        if isinstance(new, str):
            page = re.sub(re.escape(old.encode()) + rb"(?![\w])", new.encode(), page)
    return page


def run_tree(tree: Path, preset: str, run: Path) -> None:
    """The preset's pipeline in ``tree``: each command in a fresh interpreter with ``tree/src`` first."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "TQDM_DISABLE": "1"}
    env.pop("PLATEAUSCOPE_OTHER_PYTHON", None)
    for argv in PIPELINE[preset]:
        done = subprocess.run([sys.executable, "-m", "plateauscope", *(a.format(run=run) for a in argv)],
                              cwd=run.parent, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"bench/same_results.py: {argv[0]} in {tree} failed: {done.stderr.strip().splitlines()[-1:]}")


def export(ref: str, into: Path, flag: str) -> Path:
    """The project at commit ``ref`` as files in ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True)
    if archive.returncode:
        sys.exit(f"bench/same_results.py: {flag} {ref}: not a commit of this repository")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def fingerprint(run: Path) -> bytes:
    """The task fingerprint the run's analysis cache is keyed on."""
    return json.loads((run / "analysis" / "routing.json").read_text())["task"].encode()


def compare(base: Path, current: Path) -> dict[str, dict[str, str]]:
    """Every file of the two runs: ``same``, ``same but the task fingerprint``, or ``differs`` (by kind)."""
    old, new = fingerprint(base), fingerprint(current)
    kinds: dict[str, dict[str, str]] = {}
    names = sorted({p.relative_to(base) for p in base.rglob("*") if p.is_file()}
                   | {p.relative_to(current) for p in current.rglob("*") if p.is_file()})
    for name in names:
        if name.name in NOT_COMPARED:
            continue
        kind = "checkpoints" if name.parts[0] == "checkpoints" else "analysis cache" if name.parts[0] == "analysis" \
            else str(name)
        a, b = base / name, current / name
        if not (a.is_file() and b.is_file()):
            verdict = "only in one"
        else:
            x, y = a.read_bytes(), b.read_bytes()
            if name.name in ("metrics.jsonl", "summary.json"):
                x, y = WALL.sub(b'"wall_s": _', x), WALL.sub(b'"wall_s": _', y)
            if name.name == "report.html":
                x, y = moved_names(numbered_views(x)), numbered_views(y)
            verdict = "same" if x == y else "same but the task fingerprint" if x.replace(old, new) == y else "differs"
        kinds.setdefault(kind, {})[str(name)] = verdict
    return kinds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=BASELINE, help=f"git commit of the baseline (default {BASELINE})")
    p.add_argument("--current", help="git commit to check as the current tree (default: this checkout, as it is)")
    p.add_argument("--preset", action="append", choices=sorted(PIPELINE), help="ci, demo or both (default: both)")
    args = p.parse_args()
    presets = args.preset or sorted(PIPELINE)
    print(f"{describe(machine_record())}; {args.current or 'this checkout'} against {args.baseline}; "
          f"presets {', '.join(presets)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        baseline = export(args.baseline, tmp / "baseline", "--baseline")
        current = export(args.current, tmp / "current", "--current") if args.current else ROOT
        for preset in presets:
            work = tmp / preset
            work.mkdir()
            run = work / "run"  # both trees write here, one after the other (the report names the path)
            runs = {}
            for name, tree in (("baseline", baseline), ("current", current)):
                run_tree(tree, preset, run)
                runs[name] = run.rename(work / name)
            kinds = compare(runs["baseline"], runs["current"])
            for kind, files in kinds.items():
                verdicts = sorted(set(files.values()))
                print(f"{preset} {kind} ({len(files)} files): {', '.join(verdicts)}")
                for file, verdict in files.items():
                    if verdict not in ("same", "same but the task fingerprint"):
                        print(f"  {file}: {verdict}")
                rows.append(yes_no(f"{preset}: {kind} the same as {args.baseline}'s"
                                   + (" (but the task fingerprint)" if "same but the task fingerprint" in verdicts
                                      else ""), set(verdicts) <= {"same", "same but the task fingerprint"}))
            shutil.rmtree(work)
    print_rows(rows)
    settings = {"baseline": args.baseline, "current": args.current, "presets": presets}
    print(f"saved {save('same_results', rows, settings)}")


if __name__ == "__main__":
    main()
