"""Sweeps, and an imported series analysed in shards, on a real Slurm cluster: one node on localhost
(``tests/slurm_cluster.py``), submitit's ``SlurmExecutor``, job arrays, ``scancel``, a shard's processes killed.

A sweep is checked against the serial executor's sweep of the same grid (the session's ``tiny_sweep``, one
torch thread): every run's ``metrics.jsonl`` equal but for the wall clock, and every checkpoint
byte-identical. A sharded analysis is checked against one process's, byte for byte. The tests skip, loudly, only where Slurm and munge are not installed; ``.ci/run``
installs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plateauscope.runs import run as rd
from plateauscope.sources.importer import import_series
from tests import slurm_cluster
from tests.sources.series_builders import SMALL_ANALYSIS, analysis_files, tiny_neox_config, train_hf_series

SWEEP = ["sweep", "--preset", "tiny", "--executor", "slurm", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, up for this module's tests and stopped after them, even when one fails."""
    lacking = slurm_cluster.missing()
    if lacking:
        pytest.skip(f"SLURM NOT INSTALLED ({', '.join(lacking)} missing): the Slurm tests did not run "
                    "(apt-get install slurm-wlm munge, or let .ci/run install them)")
    folder = Path(tmp_path_factory.mktemp("slurm"))
    env = slurm_cluster.start(folder)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        try:
            yield {**os.environ, **env}
        finally:
            slurm_cluster.stop(folder)


def sweep(env: dict, out: Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plateauscope", *SWEEP, "--out", str(out), *more],
                          capture_output=True, text=True, env=env, timeout=600)


def same_as_serial(out: Path, reference: Path) -> None:
    runs = sorted(p.name for p in reference.iterdir() if (p / rd.CONFIG_FILE).exists())
    assert runs and runs == sorted(p.name for p in out.iterdir() if (p / rd.CONFIG_FILE).exists())
    for name in runs:
        def metrics(run: Path) -> list[dict]:
            return [{k: v for k, v in r.items() if k != "wall_s"} for r in rd.read_jsonl(run / rd.METRICS_FILE)]
        assert metrics(out / name) == metrics(reference / name), name
        ckpts = sorted(p.name for p in (reference / name / rd.CHECKPOINT_DIR).iterdir())
        assert ckpts == sorted(p.name for p in (out / name / rd.CHECKPOINT_DIR).iterdir()), name
        for ckpt in ckpts:
            assert (out / name / rd.CHECKPOINT_DIR / ckpt).read_bytes() == \
                (reference / name / rd.CHECKPOINT_DIR / ckpt).read_bytes(), (name, ckpt)


def test_a_sweep_on_slurm_equals_the_serial_one(cluster, tiny_sweep, tmp_path):
    done = sweep(cluster, tmp_path / "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 of 6 runs complete" in done.stdout
    same_as_serial(tmp_path / "slurm", tiny_sweep)


def final_state(env: dict, job: str, timeout: float = 30.0) -> str:
    """The state an array task ends in (``squeue -t all`` keeps finished jobs for a while)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%T"], capture_output=True,
                               text=True, env=env).stdout.strip()
        if state and state not in ("RUNNING", "COMPLETING", "PENDING"):
            return state
        time.sleep(0.1)
    return "UNKNOWN"


def cancel_one_running_task(cluster: dict, out: Path) -> subprocess.CompletedProcess:
    """The sweep started in the background, one of its running array tasks cancelled; its outcome."""
    first = subprocess.Popen([sys.executable, "-m", "plateauscope", *SWEEP, "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster)
    deadline, cancelled, tried = time.monotonic() + 120, None, set()
    while cancelled is None:  # a running array task is cancelled; one that finished first is not counted
        assert time.monotonic() < deadline and first.poll() is None
        running = subprocess.run(["squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i %j"], capture_output=True,
                                 text=True, env=cluster).stdout.split("\n")
        jobs = [line.split()[0] for line in running if "plateauscope-sweep" in line and line.split()[0] not in tried]
        if jobs:  # the last task listed: the array's later points are its longest runs (largest D)
            tried.add(jobs[-1])
            subprocess.run(["scancel", jobs[-1]], check=True, env=cluster)
            if final_state(cluster, jobs[-1]) == "CANCELLED":
                cancelled = jobs[-1]
        time.sleep(0.1)
    stdout, stderr = first.communicate(timeout=600)
    return subprocess.CompletedProcess(first.args, first.returncode, stdout, stderr)


def test_a_cancelled_job_is_one_line_and_the_next_call_resumes_it(cluster, tiny_sweep, tmp_path):
    # A task cancelled while it still runs but after its run wrote its summary (seen in CI: Slurm
    # reports CANCELLED, the run is complete) cancels nothing: the sweep is then tried again, afresh.
    for attempt in range(5):
        out = tmp_path / f"slurm{attempt}"
        first = cancel_one_running_task(cluster, out)
        if not (first.returncode == 0 and "6 of 6 runs complete" in first.stdout):
            break
    stdout, stderr = first.stdout, first.stderr
    assert first.returncode == 1, stdout + stderr
    failed = [line for line in stdout.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and "CANCELLED" in failed[0], stdout
    assert "5 of 6 runs complete" in stdout
    again = sweep(cluster, out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(line.startswith("done") for line in again.stdout.splitlines()) == 1  # only the cancelled run
    assert "6 of 6 runs complete" in again.stdout
    same_as_serial(out, tiny_sweep)


PER_STEP_FILES = ("probe_induction.jsonl", "probe_metrics.jsonl", "attention.jsonl", "attribution.jsonl", "edges.jsonl",
                  "patterns.jsonl", "measures.jsonl")
"""What a shard writes, one record per step each (the rest is computed after the merge, in one process)."""


def test_four_slurm_shards_equal_one_process_with_a_killed_shard_resumed(cluster, tmp_path):
    source = tmp_path / "trainer"
    train_hf_series(source, tiny_neox_config(), steps=120, save_every=10, lr=5e-3)
    reference = import_series(source, tmp_path / "one_process").path
    args = [sys.executable, "-m", "plateauscope", "analyze", *SMALL_ANALYSIS]
    alone = subprocess.run([*args, "--run", str(reference)], capture_output=True, text=True, env=cluster, timeout=600)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    for attempt in range(5):  # a shard that ended before it could be killed: again, afresh
        run = import_series(source, tmp_path / f"sharded{attempt}").path
        analysing = subprocess.Popen([*args, "--run", str(run), "--executor", "slurm", "--shards", "4"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster)
        killed = slurm_cluster.kill_shard_midway(cluster, analysing, run, 2)
        stdout, stderr = analysing.communicate(timeout=600)
        if killed:
            break
    assert analysing.returncode == 0, stdout + stderr
    assert "shard 3 of 4 (steps 70-90): its job ended without a result" in stderr, stderr
    shards = {line.split(":")[0]: line for line in stdout.splitlines() if line.startswith("shard ")}
    assert sorted(shards) == [f"shard {k} of 4" for k in range(1, 5)], stdout
    assert "found from an earlier try" in shards["shard 3 of 4"], stdout  # it resumed from its folder

    def count(line: str, what: str) -> int:
        return int(line.split(f" {what}")[0].rsplit(" ", 1)[1]) if what in line else 0

    # nothing analysed twice: what the shards wrote and found is each step's record once
    written = sum(count(line, "records written") + count(line, "found from") for line in shards.values())
    assert written == len(PER_STEP_FILES) * 13
    assert analysis_files(run) == analysis_files(reference)
