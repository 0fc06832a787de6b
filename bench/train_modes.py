"""Benchmark of the science (not a test): what the training mode does to a run's numbers, over seeds.

Trains a preset (default ``ci``) for each seed (model and data seed varied together, as the
``seeds-ci`` sweep does) in each mode, into ``OUT/<mode>/seed<s>``:

* ``fused``: the default training forward (``plateauscope.model.fused``), float32;
* ``trimmed``: ``--forward trimmed``, the fused forward with the last block only at the loss
  positions, float32;
* ``hooked``: ``--forward hooked``, HookedTransformer's own forward, float32 (every run before
  the fused forward existed);
* ``bf16``: the fused forward and backward under CPU bf16 autocast (a ``TrainingHooks.step_context``). Not a
  training option: it is measured here to decide whether it should become one (on the CPUs it was
  measured on it was slower, so it is not).

``trimmed`` is not the default because it rounds differently from the stored runs; over seeds it
gives the same tau, plateau, verdict and lead as ``fused``.

Each run is analysed (``plateauscope.analysis.analyze``, every 10th checkpoint; cached), and the bench prints
per mode the median over seeds, with the order-statistic interval of the median (its coverage stated), of tau, the plateau's
length, the lead fraction (by ``plateauscope.analysis.formation``'s chosen t_form rule), the plateau verdicts,
and the training time per step; then whether each mode's median lies inside the reference mode's
interval. Runs already trained are reused, so a second call only prints. The medians of the time
per step are saved (``bench/record.py``, with the number of runs reused; the science is in
``OUT/modes.json``).

    .venv/bin/python bench/train_modes.py --out sweeps/modes --seeds 0,1,2 --modes fused,hooked,bf16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import record
import torch

from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.intervals import median_interval
from plateauscope.analysis.results import median
from plateauscope.dynamics.sweep import run_row
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.training.train import NO_HOOKS, TrainingHooks, train

MODES = ("fused", "trimmed", "hooked", "bf16")


def train_mode(preset: str, mode: str, seed: int, out: Path) -> float:
    """Train (or finish) one run; its wall seconds per step as logged (``wall_s`` of the last record)."""
    cfg = get_preset(preset).replace(seed=seed, forward="fused" if mode == "bf16" else mode)
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, seed=seed))  # the data seed too
    # bf16: the fused forward and backward under CPU autocast (the loss itself autocasts to float32)
    hooks = TrainingHooks(step_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mode == "bf16" \
        else NO_HOOKS
    train(cfg, out, resume=out.exists(), device="cpu", progress=False, hooks=hooks)
    last = Run(out).metrics()[-1]
    return last["wall_s"] / max(last["step"], 1)


def interval(values: list[float]) -> str:
    """``median [lo, hi] coverage`` over seeds (the order-statistic interval of the median)."""
    ci = median_interval(values)
    return f"{median(values):8.3f} {ci.text('{:.3f}')} {ci.label}" if ci else f"{median(values):8.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("sweeps/modes"), help="where the runs go (default sweeps/modes)")
    p.add_argument("--preset", default="ci")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--reference", default="fused", help="the mode the others are compared with (default fused)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.reference not in modes:
        p.error(f"--reference {args.reference} is not among --modes")

    rows: dict[str, list[dict]] = {}
    reused = 0  # runs (partly) trained by an earlier call: their time per step was not measured by this one
    for mode in modes:
        rows[mode] = []
        for seed in seeds:
            out = args.out / mode / f"seed{seed}"
            reused += out.exists()
            t0 = time.perf_counter()
            ms = train_mode(args.preset, mode, seed, out) * 1e3
            analyze_run(out, every=10, n_exact=4, progress=False, edges=False)  # the verdicts only
            row = run_row(Run(out), out.name)
            row["ms_per_step"] = ms
            row["plateau_length"] = row["plateau_end"] - row["plateau_start"] if row["plateau_start"] is not None \
                else None
            rows[mode].append(row)
            print(f"{mode:<6} seed {seed}: tau {row['tau']}, plateau [{row['plateau_start']}, {row['plateau_end']}], "
                  f"verdict {row['verdict']}, lead {row['lead_fraction']}, {ms:.1f} ms/step "
                  f"({time.perf_counter() - t0:.0f} s with the analysis)", flush=True)

    keys = [("tau", "tau (steps)"), ("plateau_length", "plateau length (steps)"),
            ("lead_fraction", "lead fraction"), ("ms_per_step", "ms per step, as logged")]
    print(f"\n{args.preset}, seeds {args.seeds}: median over seeds [order-statistic interval of the median]")
    for key, label in keys:
        print(f"  {label}")
        ref = [r[key] for r in rows[args.reference] if r[key] is not None]
        ref_ci = median_interval(ref)
        for mode in modes:
            vals = [r[key] for r in rows[mode] if r[key] is not None]
            if not vals:
                print(f"    {mode:<7} n/a")
                continue
            inside = ""
            if mode != args.reference and ref_ci and key != "ms_per_step":
                ok = ref_ci.contains(median(vals))
                inside = f"  median {'inside' if ok else 'OUTSIDE'} the {args.reference} interval"
            print(f"    {mode:<7} {interval(vals)}  ({', '.join(f'{v:g}' for v in vals)}){inside}")
    print("  plateau verdicts")
    for mode in modes:
        print(f"    {mode:<7} {', '.join(str(r['verdict']) for r in rows[mode])}")
    (args.out / "modes.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"rows: {args.out / 'modes.json'}")
    timings = [record.row(f"{args.preset}, {mode}: ms per step, as logged (median of {len(seeds)} seeds)",
                          median([r["ms_per_step"] for r in rows[mode]]), "ms") for mode in modes]
    print(f"saved {record.save('train_modes', timings, record.arguments(args, runs_reused=reused))}")


if __name__ == "__main__":
    main()
