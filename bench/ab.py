"""Benchmark (not a test): the training step and ``analyze`` of the current checkout against a
baseline commit, on this machine, in one process tree.

    .venv/bin/python bench/ab.py [--baseline baf9456] [--rounds 8] [--steps 300] [--only train|analyse] [--current SHA]

The baseline is the project at a git commit (default: the last one before the ``plateauscope``
package), exported with ``git archive`` into a temporary folder. Either layout runs: a tree with
``src/plateauscope`` is imported from ``src``, an older one from its root (``training``, ``interp``).
Two workloads run in fresh subprocesses of this interpreter, baseline and current back to back,
``--rounds`` times, the first of the pair alternating (A/B, B/A, ...), so drift of the machine and
any cost of going second hit both alike:

* training: ``train()`` of the ``ci`` preset for ``--steps`` steps (evaluations and checkpoints
  included), as milliseconds per step; TransformerLens is imported before the clock starts;
* analysis: ``analyze_run`` of one ``ci`` run (trained by the baseline, so both trees read it),
  every 10th checkpoint, 4 exact steps, edges included, into a fresh cache each time.

Each workload is timed in CPU time (``time.process_time``, every thread of the process) and in wall
time. CPU time is the measure against the target: on a shared virtual machine the wall clock also
counts the time the host lends the cores to others (steal), which varies by up to 3x between runs of
the same code. Each round gives one paired ratio (current / baseline, run back to back); the figure
against the target (within 5%: ratio <= 1.05) is the median of the rounds' ratios, printed with its
order-statistic interval (``plateauscope.analysis.intervals.median_interval``, with its coverage at
that many rounds), as the machine's drift between rounds cancels within a pair. It also checks that
both trees wrote the same ``metrics.jsonl`` (but wall times) and the same records for the analyses
whose method did not change since the baseline (``SAME_METHOD``); then saves the rows
(``bench/record.py``).
``--only train`` skips the analysis workload.
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

from record import row, save, yes_no

from plateauscope.analysis.intervals import median_interval
from plateauscope.runs.machine import describe, machine_record

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
t0, c0 = time.perf_counter(), time.process_time()
train(cfg, sys.argv[1], device="cpu", progress=False)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({{"wall": 1000 * wall / {steps}, "cpu": 1000 * cpu / {steps}}}))
"""

ANALYZE = """
import json, sys, time, torch
import transformer_lens
from {analysis}.analyze import analyze_run
torch.set_num_threads(2)
t0, c0 = time.perf_counter(), time.process_time()
analyze_run(sys.argv[1], every=10, n_exact=4, progress=False)
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}}))
"""
SAME_METHOD = ("attention.jsonl", "patch.jsonl", "attribution.jsonl")
"""Records whose method is that of ``baf9456``. The ablation, circuit and edge records changed on
purpose since (the cue-mean ablation, the circuit verdict over groups, the faithful-circuit scan
over every k), so their cost and values are not comparable; ``analyse`` times them all the same."""
WORKLOADS = ("train", "analyse")


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
    p.add_argument("--rounds", type=int, default=8, help="A/B rounds per workload (default 8)")
    p.add_argument("--steps", type=int, default=300, help="training steps per timed run (default 300)")
    p.add_argument("--current", help="git commit to time as the current tree (default: this checkout, as it is)")
    p.add_argument("--only", choices=WORKLOADS, help="time one workload only")
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 1:
        sys.exit("bench/ab.py: --rounds and --steps must be at least 1")
    workloads = (args.only,) if args.only else WORKLOADS
    print(f"{describe(machine_record())}; {args.current or 'this checkout'} against {args.baseline}; "
          f"{args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {"baseline": export(args.baseline, tmp / "baseline"),
                 "current": export(args.current, tmp / "current") if args.current else ROOT}
        times: dict[str, dict[str, list[dict]]] = {w: {k: [] for k in trees} for w in workloads}
        reference_run = tmp / "ci_run"
        if "analyse" in workloads:
            run_in(trees["baseline"], TRAIN, reference_run, steps=args.steps)
        for i in range(args.rounds):
            # ABBA: which tree goes first alternates, as the second of two back-to-back runs can be slower
            for name, tree in (list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]):
                if "train" in workloads:
                    out = tmp / f"train_{name}_{i}"
                    times["train"][name].append(run_in(tree, TRAIN, out, steps=args.steps))
                if "analyse" in workloads:
                    copy = tmp / f"analyse_{name}_{i}"
                    shutil.copytree(reference_run, copy)
                    times["analyse"][name].append(run_in(tree, ANALYZE, copy))
        checks = {}
        if "train" in workloads:
            checks["same metrics.jsonl (but wall_s)"] = same_records(tmp / "train_baseline_0", tmp / "train_current_0",
                                                                    "metrics.jsonl", ("wall_s",))
        if "analyse" in workloads:
            checks[f"same {', '.join(f.split('.')[0] for f in SAME_METHOD)} records"] = all(
                same_records(tmp / "analyse_baseline_0" / "analysis", tmp / "analyse_current_0" / "analysis", f)
                for f in SAME_METHOD)
    rows = []
    print(f"{'workload':<28} {'baseline':>10} {'current':>10} {'ratio':>7} {'interval':>16}  target")
    for workload, unit in (("train", "ms/step"), ("analyse", "s")):
        if workload not in workloads:
            continue
        for clock in ("cpu", "wall"):
            base, cur = ([t[clock] for t in times[workload][k]] for k in ("baseline", "current"))
            ratios = [c / b for b, c in zip(base, cur)]
            ratio, spread = statistics.median(ratios), median_interval(ratios)
            judged = clock == "cpu"
            print(f"ci {workload} ({clock} {unit}):".ljust(28) + f" {statistics.median(base):>10.2f} "
                  f"{statistics.median(cur):>10.2f} {ratio:>7.3f} {spread.text('{:.3f}') if spread else '':>16}  "
                  + (f"<= {TARGET} ({'met' if ratio <= TARGET else 'NOT met'})" if judged else "(printed only)"))
            interval = f"; {spread.label} {spread.text('{:.3f}')}" if spread else ""
            measure = (f"ci {workload} {clock} time, {args.current or 'current'} / {args.baseline} (median of "
                       f"{args.rounds} paired rounds{interval})")
            rows.append(row(measure, round(ratio, 3), "x", f"<= {TARGET}", ratio <= TARGET) if judged
                        else row(measure, round(ratio, 3), "x"))
    for measure, ok in checks.items():
        print(f"{measure}: {'yes' if ok else 'NO'}")
        rows.append(yes_no(measure, ok))
    settings = {"baseline": args.baseline, "current": args.current, "rounds": args.rounds, "steps": args.steps,
                "only": args.only}
    # against another baseline than the default: a file of its own (it answers another question)
    other_baseline = None if args.baseline == BASELINE else f"vs-{args.baseline}"
    part = "-".join(filter(None, [args.current, other_baseline, args.only]))
    print(f"saved {save('ab', rows, settings, part=part or None)}")


if __name__ == "__main__":
    main()
