"""An imported series analysed in Slurm shards against one process, on a one-node Slurm cluster on this machine.

The series: the tests' tiny GPT-NeoX (2 layers, 32 wide), trained on repeated random tokens and saved every 5 steps,
``--checkpoints`` saves, imported as a user does. The cluster: ``tests/slurm_cluster.py`` (munge, slurmctld and
slurmd on localhost, 2 CPUs). Every analysis is the command line's (``python -m plateauscope analyze``), with the
tests' small settings (``tests.sources.series_builders.SMALL_ANALYSIS``: one torch thread, one worker), each into a
fresh import of the series:

* **one process**: ``analyze --run RUN``;
* **4 shards**: ``analyze --run RUN --executor slurm --shards 4`` (a job array, 1 CPU each, two at a time on this
  node; the merge and the rest of the analysis in the submitting process);
* **4 shards, one killed**: the same, with every process of the third shard's job SIGKILLed once its probe pass has
  written a record (as the out-of-memory killer would); the job is submitted again and resumes from its folder.

Targets (issue 73): the shards' results equal one process's (every file of ``RUN/analysis`` byte for byte); the
wall times recorded; the killed shard resumes (it finds its earlier records) and nothing is analysed twice (what
the shards wrote and found is each step's record once). A node of 2 CPUs runs two shards at a time, and each shard
starts Python and loads torch, so on this machine the shards are slower than one process: the figures say what
sharding costs in overhead, not what a cluster gains.

    python bench/sharded_analysis.py [--checkpoints 40]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import arguments, print_rows, row, save, yes_no  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import slurm_cluster  # noqa: E402  (the tests' one-node cluster)
from tests.sources.series_builders import (  # noqa: E402
    SMALL_ANALYSIS,
    analysis_files,
    tiny_neox_config,
    train_hf_series,
)

from plateauscope.sources.importer import import_series  # noqa: E402

SHARDS = 4
PER_STEP_FILES = 7
"""The files a shard writes, one record per step each: the probe's pass and evaluation, and the cheap pass's five."""


def analyze(env: dict, run: Path, *more: str, kill: int | None = None) -> tuple[float, str, str]:
    """Seconds, stdout and stderr of one ``analyze``; ``kill``: that shard's job killed midway."""
    t0 = time.perf_counter()
    analysing = subprocess.Popen([sys.executable, "-m", "plateauscope", "analyze", "--run", str(run), *SMALL_ANALYSIS,
                                  *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killed = kill is None or slurm_cluster.kill_shard_midway(env, analysing, run, kill)
    stdout, stderr = analysing.communicate()
    if analysing.returncode != 0 or not killed:
        raise SystemExit(f"analyze failed (exit {analysing.returncode}, killed {killed}): {stderr[-2000:]}")
    return time.perf_counter() - t0, stdout, stderr


def shard_records(stdout: str) -> tuple[int, int]:
    """(records written, records found from an earlier try), summed over the shards' lines."""
    def count(line: str, what: str) -> int:
        return int(line.split(f" {what}")[0].rsplit(" ", 1)[1]) if what in line else 0
    lines = [line for line in stdout.splitlines() if line.startswith("shard ")]
    return sum(count(x, "records written") for x in lines), sum(count(x, "found from") for x in lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=40, help="saves of the series (default 40)")
    args = p.parse_args()
    lacking = slurm_cluster.missing()
    if lacking:
        raise SystemExit(f"Slurm is not installed ({', '.join(lacking)} missing): apt-get install slurm-wlm munge")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = tmp / "trainer"
        train_hf_series(source, tiny_neox_config(), steps=5 * (args.checkpoints - 1), save_every=5, lr=5e-3)
        env = {**os.environ, **slurm_cluster.start(tmp / "cluster")}
        try:
            runs = {name: import_series(source, tmp / name).path for name in ("alone", "shards", "killed")}
            alone_s, _, _ = analyze(env, runs["alone"])
            shards_s, shards_out, _ = analyze(env, runs["shards"], "--executor", "slurm", "--shards", str(SHARDS))
            killed_s, killed_out, killed_err = analyze(env, runs["killed"], "--executor", "slurm", "--shards",
                                                      str(SHARDS), kill=2)
        finally:
            slurm_cluster.stop(tmp / "cluster")
        reference = analysis_files(runs["alone"])
        written, found = shard_records(killed_out)
        rows = [yes_no(f"{SHARDS} Slurm shards ({shards_s:.0f} s wall) vs one process ({alone_s:.0f} s), "
                       f"{args.checkpoints} checkpoints on a 2-CPU node: every analysis file equal byte for byte",
                       analysis_files(runs["shards"]) == reference),
                row("one process (1 thread), whole analyze", alone_s, "s"),
                row(f"{SHARDS} Slurm shards (1 CPU each, 2 at a time), whole analyze", shards_s, "s"),
                row(f"{SHARDS} shards / one process, wall time", shards_s / alone_s, "x"),
                yes_no("a killed shard, submitted again: resumes from its folder (finds its earlier records)",
                       found > 0 and "ended without a result" in killed_err),
                yes_no(f"a killed shard: nothing analysed twice (written + found = {PER_STEP_FILES} records x "
                       f"{args.checkpoints} steps)", written + found == PER_STEP_FILES * args.checkpoints),
                yes_no("a killed shard: every analysis file equal to one process's",
                       analysis_files(runs["killed"]) == reference),
                row(f"{SHARDS} shards with one killed and resumed, whole analyze", killed_s, "s"),
                row("the killed shard's records found from its earlier try", found, "records")]
        print_rows(rows)
        print(f"saved {save('sharded_analysis', rows, arguments(args, shards=SHARDS))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
