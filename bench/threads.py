"""Threads on a busy machine: ``plateauscope train`` alone, beside one busy process, and beside ``analyze --follow``.

Each condition runs ``plateauscope train --preset ci --max-steps N`` at the command's default thread count and at
every explicit count from 1 to the cores this process may use; the default again with OpenMP's own long spin
(``OMP_WAIT_POLICY=ACTIVE``, what torch does outside the command) shows the cliff that the command's short spin
(:data:`plateauscope.cli.SPIN_COUNT`) avoids, and with threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``) what
the other remedy costs. Rounds are interleaved (every setting once per round),
and each figure is the median over rounds, with its spread.

* **alone**: nothing else runs.
* **busy**: one other process spins on one core for the whole run (a pure-Python loop).
* **follow**: ``plateauscope analyze --follow`` on the run from its start; the time is until both have
  finished, against ``train`` then ``analyze`` one after the other (the same settings, the same final cache).

Targets (issue 72): beside one busy process the default is within 1.2x of the best explicit count; ``train`` and
``analyze --follow`` together are no slower than one after the other.

    python bench/threads.py [--steps 120] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import against, arguments, print_rows, row, save

from plateauscope.processes import available_cores

TARGET_BUSY = 1.2
TARGET_FOLLOW = 1.0
COMMAND = [sys.executable, "-m", "plateauscope"]
SPIN = {"OMP_WAIT_POLICY": "ACTIVE"}
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def timed(*commands: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds until every one of ``commands`` (started together) has exited; a failure stops the bench."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for c in commands]
    for c, p in zip(commands, procs):
        _, err = p.communicate()
        if p.returncode:
            sys.exit(f"{' '.join(c[2:])} exited with {p.returncode}: {err.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def train_cmd(out: Path, steps: int, threads: int | None) -> list[str]:
    """The training command, at ``threads`` (None: the command's default)."""
    return [*COMMAND, "train", "--preset", "ci", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            *([] if threads is None else ["--threads", str(threads)])]


def analyze_cmd(out: Path, follow: bool) -> list[str]:
    """The analysis of the run, following it as it trains or after it."""
    return [*COMMAND, "analyze", "--run", str(out), "--no-progress", *(["--follow", "--poll", "1"] if follow else [])]


def one(condition: str, threads: int | None, env: dict[str, str], steps: int, tmp: Path) -> float:
    """Seconds of one setting under ``condition`` (a fresh run directory each time)."""
    out = tmp / "run"
    shutil.rmtree(out, ignore_errors=True)
    train = train_cmd(out, steps, threads)
    if condition == "alone":
        return timed(train, env=env)
    if condition == "busy":
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            return timed(train, env=env)
        finally:
            spinner.kill()
            spinner.wait()
    if condition == "follow":
        out.mkdir()  # --follow waits for the run's config: start it on the directory training writes into
        return timed(train, analyze_cmd(out, True), env=env)
    if condition == "sequential":
        return timed(train, env=env) + timed(analyze_cmd(out, False), env=env)
    raise ValueError(condition)


def main() -> int:
    """Every condition at every setting, interleaved over rounds; the rows against the targets."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120, help="training steps of each run (preset ci)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cores = available_cores()
    settings: list[tuple[str, int | None, dict[str, str]]] = [("default", None, {}), ("default, spinning", None, SPIN),
                                                               ("default, passive", None, PASSIVE)]
    settings += [(f"--threads {n}", n, {}) for n in range(1, cores + 1)]
    plan = [(c, s) for c in ("alone", "busy") for s in settings] + [(c, settings[0]) for c in ("follow", "sequential")]
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for condition, (name, threads, env) in plan:
                seconds = one(condition, threads, env, args.steps, Path(tmp))
                times.setdefault((condition, name), []).append(seconds)
                print(f"round {r + 1}: {condition:10s} {name:18s} {seconds:6.1f} s", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in times.items()}
    rows = [row(f"train {args.steps} steps, {c}, {name} (median of {args.rounds}; spread {min(v):.1f}-{max(v):.1f} s)",
                median[(c, name)], "s") for (c, name), v in times.items()]
    explicit = [name for name, n, _ in settings if n is not None]
    best = min(median[("busy", name)] for name in explicit)
    rows.append(against("beside one busy process: the default vs the best explicit thread count",
                        median[("busy", "default")] / best, "x", "<=", TARGET_BUSY))
    for name in ("default, spinning", "default, passive"):
        rows.append(row(f"beside one busy process: {name} vs the best explicit thread count",
                        median[("busy", name)] / best, "x"))
    rows.append(row("alone: the default vs OpenMP's spinning default", median[("alone", "default")]
                    / median[("alone", "default, spinning")], "x"))
    rows.append(against("train beside analyze --follow vs train then analyze", median[("follow", "default")]
                        / median[("sequential", "default")], "x", "<=", TARGET_FOLLOW))
    print_rows(rows)
    print(f"saved {save('threads', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
