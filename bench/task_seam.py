"""Benchmark (not a test): the selector task's training step and analysis through the task seam,
against the code from before it, on this machine.

    .venv/bin/python bench/task_seam.py [--baseline d25527e] [--rounds 3] [--steps 300]

The baseline is the project at a git commit (default: the last one before ``plateauscope.tasks``),
exported with ``git archive`` into a temporary folder. Two workloads run in fresh subprocesses of
this interpreter, each code tree on its own ``PYTHONPATH``, alternating baseline / current
``--rounds`` times (A/B/A/B...), so drift of the machine hits both alike:

* training: ``train()`` of the ``ci`` preset for ``--steps`` steps (evaluations and checkpoints
  included), as milliseconds per step; TransformerLens is imported before the clock starts, since
  the baseline's modules import it at import time and the current ones when a model is built;
* analysis: ``plateauscope.analysis.analyze.analyze_run`` of one ``ci`` run (trained by the baseline, so both
  trees read it), every 10th checkpoint, 4 exact steps, into a fresh cache each time.

Each prints the median of both, their ratio (current / baseline) and the issue's target: within
5% (ratio <= 1.05). Then the issue's other numeric targets, on the current tree: the ``induction``
preset trains in 2 minutes or less (one timed run, evaluations and checkpoints included), and the
task of your own in notebook 07 (``notebooks/markov_chains.py``) is under 100 lines. It also checks that both trees write the same ``metrics.jsonl`` (but wall
times) and the same analysis records, the seam's promise that the numbers do not move.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "d25527e"
"""The last commit before the task seam."""
TARGET = 1.05

TRAIN = """
import json, sys, time, torch
import transformer_lens  # imported before the clock starts in both trees (the baseline's modules import it eagerly)
from plateauscope.training.presets import get_preset
from plateauscope.training.train import train
torch.set_num_threads(2)
cfg = get_preset("ci").replace(max_steps={steps}, stop_after_tau=None)
t0 = time.perf_counter()
train(cfg, sys.argv[1], device="cpu", progress=False)
print(json.dumps({{"ms_per_step": 1000 * (time.perf_counter() - t0) / {steps}}}))
"""

INDUCTION = """
import json, sys, time, torch
import transformer_lens
from plateauscope.training.presets import get_preset
from plateauscope.training.train import train
torch.set_num_threads(2)
t0 = time.perf_counter()
summary = train(get_preset("induction"), sys.argv[1], device="cpu", progress=False)
print(json.dumps({"s": time.perf_counter() - t0, "steps": summary["final_step"], "tau": summary["tau"]}))
"""
INDUCTION_TARGET_S = 120.0
TASK_FILE_LINES = 100

ANALYZE = """
import json, sys, time, torch
import transformer_lens
from plateauscope.analysis.analyze import analyze_run
torch.set_num_threads(2)
t0 = time.perf_counter()
import inspect  # like for like: the edge analyses came after the seam, so neither side runs them
kw = {"edges": False} if "edges" in inspect.signature(analyze_run).parameters else {}
analyze_run(sys.argv[1], every=10, n_exact=4, progress=False, **kw)
print(json.dumps({"s": time.perf_counter() - t0}))
"""


def run_in(tree: Path, code: str, arg: Path) -> dict:
    """``code`` in a fresh interpreter with ``tree`` first on the path; its one JSON line."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(arg)], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench/task_seam.py: a run in {tree} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(ref: str, into: Path) -> Path:
    """The project at ``ref`` as files in ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True)
    if archive.returncode:
        sys.exit(f"bench/task_seam.py: --baseline {ref}: not a commit of this repository")
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
        sys.exit("bench/task_seam.py: --rounds and --steps must be at least 1")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"CPU: {cpu}; {os.cpu_count()} cores; baseline {args.baseline}; {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {"baseline": export(args.baseline, tmp / "baseline"), "current": ROOT}
        times: dict[str, dict[str, list[float]]] = {"train": {k: [] for k in trees}, "analyse": {k: [] for k in trees}}
        reference_run = tmp / "ci_run"
        run_in(trees["baseline"], TRAIN.format(steps=args.steps), reference_run)
        for i in range(args.rounds):
            for name, tree in trees.items():
                out = tmp / f"train_{name}_{i}"
                times["train"][name].append(run_in(tree, TRAIN.format(steps=args.steps), out)["ms_per_step"])
                copy = tmp / f"analyse_{name}_{i}"
                shutil.copytree(reference_run, copy)
                times["analyse"][name].append(run_in(tree, ANALYZE, copy)["s"])
        same_metrics = same_records(tmp / "train_baseline_0", tmp / "train_current_0", "metrics.jsonl", ("wall_s",))
        same_analysis = all(same_records(tmp / "analyse_baseline_0" / "analysis", tmp / "analyse_current_0" / "analysis",
                                         f) for f in ("attention.jsonl", "patch.jsonl", "ablation.jsonl",
                                                      "circuit.jsonl", "attribution.jsonl"))
    print(f"{'workload':<36} {'baseline':>10} {'current':>10} {'ratio':>7}  target")
    for workload, unit in (("train", "ms/step"), ("analyse", "s")):
        base, cur = (statistics.median(times[workload][k]) for k in ("baseline", "current"))
        ratio = cur / base
        label = f"ci {workload} ({unit}, median of {args.rounds})"
        print(f"{label:<36} {base:>10.2f} {cur:>10.2f} {ratio:>7.3f}  <= {TARGET} "
              f"({'met' if ratio <= TARGET else 'NOT met'})")
    print(f"same metrics.jsonl (but wall_s): {same_metrics}; same analysis records: {same_analysis}")
    with tempfile.TemporaryDirectory() as tmp_name:
        ind = run_in(ROOT, INDUCTION, Path(tmp_name) / "induction")
    print(f"induction preset: trained in {ind['s']:.1f} s ({ind['steps']} steps, tau {ind['tau']}); target <= "
          f"{INDUCTION_TARGET_S:.0f} s ({'met' if ind['s'] <= INDUCTION_TARGET_S else 'NOT met'})")
    lines = len((ROOT / "notebooks" / "markov_chains.py").read_text().splitlines())
    print(f"notebook 07's task file: {lines} lines; target < {TASK_FILE_LINES} "
          f"({'met' if lines < TASK_FILE_LINES else 'NOT met'})")


if __name__ == "__main__":
    main()
