"""Benchmark (not a test): the training step and ``analyze`` of the current checkout against a
baseline commit, on this machine, in one process tree.

    .venv/bin/python bench/ab.py [--baseline baf9456] [--rounds 3] [--steps 300]

The baseline is the project at a git commit (default: the last one before the ``plateauscope``
package), exported with ``git archive`` into a temporary folder. Either layout runs: a tree with
``src/plateauscope`` is imported from ``src``, an older one from its root (``training``, ``interp``).
Two workloads run in fresh subprocesses of this interpreter, alternating baseline / current
``--rounds`` times (A/B/A/B...), so drift of the machine hits both alike:

* training: ``train()`` of the ``ci`` preset for ``--steps`` steps (evaluations and checkpoints
  included), as milliseconds per step; TransformerLens is imported before the clock starts;
* analysis: ``analyze_run`` of one ``ci`` run (trained by the baseline, so both trees read it),
  every 10th checkpoint, 4 exact steps, edges included, into a fresh cache each time.

It prints the median of both, their ratio (current / baseline) against the target (within 5%:
ratio <= 1.05), and whether both trees wrote the same ``metrics.jsonl`` (but wall times) and the
same analysis records; then saves the rows (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from record import row, save

from plateauscope.training.machine import describe, machine_record

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "baf9456"
"""The last commit before the ``plateauscope`` package."""
TARGET = 1.05

TRAIN = """
import json, sys, time, torch
import transformer_lens  # imported before the clock starts in both trees
from {training}.presets import get_preset
from {training}.train import train
torch.set_num_threads(2)
cfg = get_preset("ci").replace(max_steps={steps}, stop_after_tau=None)
t0 = time.perf_counter()
train(cfg, sys.argv[1], device="cpu", progress=False)
print(json.dumps({{"ms_per_step": 1000 * (time.perf_counter() - t0) / {steps}}}))
"""

ANALYZE = """
import json, sys, time, torch
import transformer_lens
from {analysis}.analyze import analyze_run
torch.set_num_threads(2)
t0 = time.perf_counter()
analyze_run(sys.argv[1], every=10, n_exact=4, progress=False)
print(json.dumps({{"s": time.perf_counter() - t0}}))
"""
RECORDS = ("attention.jsonl", "patch.jsonl", "ablation.jsonl", "circuit.jsonl", "attribution.jsonl", "edges.jsonl",
           "edge_exact.jsonl")


def layout(tree: Path) -> tuple[Path, dict[str, str]]:
    """Where a tree is imported from, and the names of its training and analysis packages."""
    if (tree / "src" / "plateauscope").is_dir():
        return tree / "src", {"training": "plateauscope.training", "analysis": "plateauscope.analysis"}
    return tree, {"training": "training", "analysis": "interp"}


def run_in(tree: Path, code: str, arg: Path, **fmt) -> dict:
    """``code`` in a fresh interpreter with ``tree``'s packages first on the path; its one JSON line."""
    path, names = layout(tree)
    env = {**os.environ, "PYTHONPATH": str(path), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code.format(**names, **fmt), str(arg)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench/ab.py: a run in {tree} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(ref: str, into: Path) -> Path:
    """The project at ``ref`` as files in ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True)
    if archive.returncode:
        sys.exit(f"bench/ab.py: --baseline {ref}: not a commit of this repository")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def same_records(a: Path, b: Path, name: str, drop: tuple[str, ...] = ()) -> bool:
    """Whether two JSON-lines files hold the same records, ignoring the fields ``drop``."""
    def load(p: Path) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in p.read_text().splitlines()]
    return load(a / name) == load(b / name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=BASELINE, help=f"git commit of the baseline (default {BASELINE})")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds per workload (default 3)")
    p.add_argument("--steps", type=int, default=300, help="training steps per timed run (default 300)")
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 1:
        sys.exit("bench/ab.py: --rounds and --steps must be at least 1")
    print(f"{describe(machine_record())}; baseline {args.baseline}; {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {"baseline": export(args.baseline, tmp / "baseline"), "current": ROOT}
        times: dict[str, dict[str, list[float]]] = {"train": {k: [] for k in trees}, "analyse": {k: [] for k in trees}}
        reference_run = tmp / "ci_run"
        run_in(trees["baseline"], TRAIN, reference_run, steps=args.steps)
        for i in range(args.rounds):
            for name, tree in trees.items():
                out = tmp / f"train_{name}_{i}"
                times["train"][name].append(run_in(tree, TRAIN, out, steps=args.steps)["ms_per_step"])
                copy = tmp / f"analyse_{name}_{i}"
                shutil.copytree(reference_run, copy)
                times["analyse"][name].append(run_in(tree, ANALYZE, copy)["s"])
        same_metrics = same_records(tmp / "train_baseline_0", tmp / "train_current_0", "metrics.jsonl", ("wall_s",))
        same_analysis = all(same_records(tmp / "analyse_baseline_0" / "analysis", tmp / "analyse_current_0" / "analysis",
                                         f) for f in RECORDS)
    rows = []
    print(f"{'workload':<40} {'baseline':>10} {'current':>10} {'ratio':>7}  target")
    for workload, unit in (("train", "ms/step"), ("analyse", "s")):
        base, cur = (statistics.median(times[workload][k]) for k in ("baseline", "current"))
        ratio = cur / base
        label = f"ci {workload} ({unit}, median of {args.rounds})"
        print(f"{label:<40} {base:>10.2f} {cur:>10.2f} {ratio:>7.3f}  <= {TARGET} ({'met' if ratio <= TARGET else 'NOT met'})")
        rows.append(row(f"ci {workload}, current / {args.baseline}", round(ratio, 3), "x", f"<= {TARGET}", ratio <= TARGET))
    print(f"same metrics.jsonl (but wall_s): {same_metrics}; same analysis records: {same_analysis}")
    rows.append(row("same metrics.jsonl and analysis records", float(same_metrics and same_analysis), "(1 = yes)",
                    "1", same_metrics and same_analysis))
    settings = {"baseline": args.baseline, "rounds": args.rounds, "steps": args.steps}
    # against another baseline than the default: a file of its own (it answers another question)
    print(f"saved {save('ab', rows, settings, part=None if args.baseline == BASELINE else f'vs-{args.baseline}')}")


if __name__ == "__main__":
    main()
