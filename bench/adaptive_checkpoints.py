"""Benchmark (not a test): the adaptive checkpoint policy against a dense run of the same preset,
trained in the same process.

    .venv/bin/python bench/adaptive_checkpoints.py                  # the demo (issue 40's targets)
    .venv/bin/python bench/adaptive_checkpoints.py --preset ci

Trains the preset with ``checkpoints=dense`` and ``checkpoints=adaptive`` into fresh directories,
one after the other (the order alternates with ``--adaptive-first``), and prints:

* the adaptive run's directory in MB, against the target of at most 200 MB on the demo, and the
  largest it was during training (sampled at every evaluation); the dense run's beside it;
* what the window alone needs: its dense checkpoints times a checkpoint's size, so that a miss of
  the size target says whether the window itself is over it;
* the adaptive run's wall time over the dense one's, against the target of at most 1.10;
* whether every kept checkpoint is byte-identical to the dense run's, and ``metrics.jsonl`` the
  same but for ``wall_s``;
* how far lossless compression could take the window (``--run DIR`` prints this alone, for a
  trained adaptive run): every window checkpoint's weights XORed with the previous checkpoint's,
  byte-shuffled and compressed with LZMA, the best of the usual lossless schemes for float32
  weights, so that a miss of the size target says whether any byte-exact storage could meet it.

    .venv/bin/python bench/adaptive_checkpoints.py --run checkpoints/demo   # the compression bound only

What it found on the demo: the window alone (147 dense checkpoints of 3.2 MB, the model's 805,000
float32 weights) is over the 200 MB asked of the whole directory, and no byte-exact storage gets it
there: the best lossless scheme above shrinks it by 1.38x, to 344 MB. Comparing the kept checkpoints
byte for byte needed one change to every checkpoint: safetensors writes its metadata from a hash map
in an order that changes between calls, so two checkpoints of the same weights differed in their
header; the metadata keys are now written sorted (``plateauscope.runs.files``).
"""

from __future__ import annotations

import argparse
import lzma
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

os.environ.setdefault("TQDM_DISABLE", "1")

from record import against, arguments, row, save, yes_no  # noqa: E402

from plateauscope.runs.machine import describe, machine_record  # noqa: E402
from plateauscope.runs.presets import PRESETS, get_preset  # noqa: E402
from plateauscope.runs.run import Run  # noqa: E402
from plateauscope.training.checkpoint_policy import transition_window  # noqa: E402
from plateauscope.training.train import TrainingHooks, train  # noqa: E402

TARGET_MB = 200.0
"""Issue 40: the demo's run directory at most this many MB."""
TARGET_WALL = 1.10
"""Issue 40: the adaptive run's wall time at most this multiple of a dense run's."""


def directory_mb(path: Path) -> float:
    """The MB (10^6 bytes) of every file under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e6


def lossless_mb(checkpoints: list[Path]) -> float:
    """The MB that ``checkpoints`` (a series, in step order) take losslessly compressed at best:
    each one's float32 weights XORed with the previous one's (the first as it is), the bytes of each
    significance together (byte shuffle), LZMA."""
    previous, total = None, 0
    for path in checkpoints:
        weights = load_file(path)
        bits = np.concatenate([weights[k].ravel().view(np.uint32) for k in sorted(weights)
                               if weights[k].dtype == np.float32])
        delta = bits if previous is None else bits ^ previous
        total += len(lzma.compress(delta.view(np.uint8).reshape(-1, 4).T.tobytes()))
        previous = bits
    return total / 1e6


def compression_rows(run: Run, on: str) -> list[dict]:
    """The window's dense checkpoints of a trained run: as stored, and losslessly compressed at best."""
    start, end = transition_window(run.metrics(), run.progress, complete=True)
    window = [run.checkpoint_path(s) for s in run.steps if start <= s <= end]
    stored = sum(p.stat().st_size for p in window) / 1e6
    packed = lossless_mb(window)
    rest = directory_mb(run.path) - stored
    print(f"window: steps {start}..{end}, {len(window)} checkpoints, {stored:.1f} MB stored, "
          f"{packed:.1f} MB compressed at best ({stored / packed:.2f}x); the directory so: {rest + packed:.1f} MB "
          f"(target <= {TARGET_MB:g} MB)")
    return [row(f"{on}: the window's checkpoints, losslessly compressed at best (XOR delta, byte shuffle, LZMA)",
                packed, "MB"),
            row(f"{on}: lossless compression ratio of the window at best", stored / packed, "x"),
            row(f"{on}: run directory with the window so compressed", rest + packed, "MB")]


def train_timed(cfg, out: Path) -> tuple[float, float]:
    """Train ``cfg`` into ``out``; (wall seconds, the directory's largest size in MB at an evaluation)."""
    peak = [0.0]
    hooks = TrainingHooks(on_evaluation=lambda record, seconds: peak.__setitem__(0, max(peak[0], directory_mb(out))))
    t0 = time.perf_counter()
    train(cfg, out, device="cpu", progress=False, hooks=hooks)
    return time.perf_counter() - t0, max(peak[0], directory_mb(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo", help=f"run to train ({', '.join(PRESETS)}; default demo)")
    p.add_argument("--coarse-every", type=int, help="the adaptive run's coarse spacing (default: the preset's)")
    p.add_argument("--adaptive-first", action="store_true", help="train the adaptive run first")
    p.add_argument("--run", type=Path, help="a trained adaptive run: print only how far lossless compression "
                                            "could take its window")
    args = p.parse_args(argv)
    if args.run is not None:
        try:
            run = Run(args.run)
            rows = compression_rows(run, run.config.preset or run.path.name)
        except Exception as e:  # noqa: BLE001 - a RunError or a missing file, printed as one line
            print(f"error: --run {args.run}: {e}", file=sys.stderr)
            return 2
        print(f"saved {save('adaptive_checkpoints', rows, arguments(args), 'compression')}")
        return 0
    if args.preset not in PRESETS:
        print(f"error: --preset {args.preset!r}: choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    base = get_preset(args.preset)
    adaptive_cfg = base.replace(checkpoints="adaptive", **({"coarse_every": args.coarse_every}
                                                          if args.coarse_every else {}))
    try:
        adaptive_cfg.validate()
    except Exception as e:  # noqa: BLE001 - a ConfigError, printed as one line
        print(f"error: --coarse-every: {e}", file=sys.stderr)
        return 2
    configs = {"dense": base.replace(checkpoints="dense"), "adaptive": adaptive_cfg}
    order = ["adaptive", "dense"] if args.adaptive_first else ["dense", "adaptive"]
    print(f"{args.preset}: {' then '.join(order)}; {describe(machine_record())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        wall, mb, peak = {}, {}, {}
        for name in order:
            wall[name], peak[name] = train_timed(configs[name], Path(tmp) / name)
            mb[name] = directory_mb(Path(tmp) / name)
            print(f"{name:<9} {wall[name]:7.1f} s, {mb[name]:6.1f} MB (largest {peak[name]:.1f} MB)", flush=True)
        dense, kept = Run(Path(tmp) / "dense"), Run(Path(tmp) / "adaptive")
        same_bytes = all(kept.checkpoint_path(s).read_bytes() == dense.checkpoint_path(s).read_bytes()
                         for s in kept.steps)
        strip = lambda records: [{k: v for k, v in r.items() if k != "wall_s"} for r in records]  # noqa: E731
        same_metrics = strip(kept.metrics()) == strip(dense.metrics())
        start, end = transition_window(kept.metrics(), kept.progress, complete=True)
        in_window = [s for s in dense.steps if start <= s <= end]
        one_mb = dense.checkpoint_path(dense.steps[-1]).stat().st_size / 1e6
        n_dense, n_kept = len(dense.steps), len(kept.steps)
        bound_rows = compression_rows(kept, args.preset)
    ratio = wall["adaptive"] / wall["dense"]
    window_mb = len(in_window) * one_mb
    on = args.preset
    print(f"window: steps {start}..{end}, {len(in_window)} dense checkpoints of {one_mb:.2f} MB = {window_mb:.1f} MB")
    print(f"checkpoints kept: {n_kept} of {n_dense}")
    print(f"adaptive directory: {mb['adaptive']:.1f} MB (target <= {TARGET_MB:g} MB: "
          f"{'met' if mb['adaptive'] <= TARGET_MB else 'NOT met'}); dense {mb['dense']:.1f} MB")
    print(f"wall time adaptive / dense: {ratio:.3f} "
          f"(target <= {TARGET_WALL}: {'met' if ratio <= TARGET_WALL else 'NOT met'})")
    print(f"kept checkpoints byte-identical to the dense run's: {'yes' if same_bytes else 'NO'}; "
          f"metrics the same: {'yes' if same_metrics else 'NO'}")
    size = f"{on}: run directory, adaptive checkpoints"
    size_row = against(size, mb["adaptive"], "MB", "<=", TARGET_MB) if args.preset == "demo" \
        else row(size, mb["adaptive"], "MB")  # the target is the demo's
    rows = [size_row,
            row(f"{on}: run directory, adaptive, largest during training", peak["adaptive"], "MB"),
            row(f"{on}: run directory, dense checkpoints", mb["dense"], "MB"),
            row(f"{on}: the window's dense checkpoints alone ({len(in_window)} x {one_mb:.2f} MB)", window_mb, "MB"),
            row(f"{on}: checkpoints kept, adaptive / dense", n_kept / n_dense, ""),
            row(f"{on}: training, dense", wall["dense"], "s"),
            row(f"{on}: training, adaptive", wall["adaptive"], "s"),
            against(f"{on}: wall time, adaptive / dense", ratio, "", "<=", TARGET_WALL),
            yes_no(f"{on}: kept checkpoints byte-identical to the dense run's", same_bytes),
            yes_no(f"{on}: metrics.jsonl the same as the dense run's (but wall_s)", same_metrics),
            *bound_rows]
    part = None if args.preset == "demo" else args.preset
    print(f"saved {save('adaptive_checkpoints', rows, arguments(args), part)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
