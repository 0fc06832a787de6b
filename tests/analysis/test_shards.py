"""An imported series analysed in shards (``plateauscope.analysis.shards``), in submitit's local processes: the
merged result equals one process's byte for byte, and bad input is one line. The same on a real Slurm cluster, with
a shard killed and submitted again, is in ``tests/sweeps/test_slurm.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import plateauscope as ps
from plateauscope.analysis.results import analysis_dir
from plateauscope.analysis.shards import merge_shards, prepare_shard, split_steps
from plateauscope.errors import ConfigError
from plateauscope.sources.importer import import_series
from tests.sources.series_builders import SMALL_ANALYSIS, analysis_files, tiny_neox_config, train_hf_series

pytest.importorskip("submitit")


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """A tiny GPT-NeoX series (13 checkpoints), and its whole analysis in one process."""
    source = tmp_path_factory.mktemp("shards") / "trainer"
    train_hf_series(source, tiny_neox_config(), steps=120, save_every=10, lr=5e-3)
    reference = import_series(source, source.parent / "one_process").path
    assert analyze(reference).returncode == 0
    return source, reference


def analyze(run, *more: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plateauscope", "analyze", "--run", str(run), *SMALL_ANALYSIS, *more],
                          capture_output=True, text=True, timeout=600, env=env)


def test_steps_split_into_contiguous_shares_of_nearly_equal_size():
    assert split_steps(list(range(0, 130, 10)), 4) == [[0, 10, 20, 30], [40, 50, 60], [70, 80, 90], [100, 110, 120]]
    assert split_steps([5, 7], 4) == [[5], [7]]
    shares = split_steps(list(range(1000)), 7)
    assert sum(shares, []) == list(range(1000)) and {len(s) for s in shares} == {142, 143}


def test_three_local_shards_equal_one_process_byte_for_byte(series, tmp_path):
    source, reference = series
    run = import_series(source, tmp_path / "sharded").path
    done = analyze(run, "--executor", "submitit-local", "--shards", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("shard ")]
    assert sorted(line.split(":")[0] for line in lines) == [f"shard {k} of 3" for k in (1, 2, 3)]
    assert sum(int(line.split(" steps")[0].rsplit(" ", 1)[1]) for line in lines) == 13
    assert analysis_files(run) == analysis_files(reference)
    assert not (analysis_dir(run) / "shards").exists()  # merged, then removed


API_SHARDS = """
import sys, torch
import plateauscope as ps
torch.set_num_threads(1)
ps.analyze(sys.argv[1], executor="submitit-local", shards=2, threads=1, probe_options={"segment_len": 6},
           n_examples=16, ablation_groups=2, n_exact=2, circuit_pairs=8, n_exact_edges=8, progress=False, workers=1)
"""


def test_the_api_shards_as_the_command_does(series, tmp_path):
    """``ps.analyze(..., executor=, shards=)`` (in a process of its own: the shards are pickled, which the test
    session's type-checking wrappers are not) equals the one-process command byte for byte; shards without an
    executor is one line."""
    source, reference = series
    run = import_series(source, tmp_path / "api").path
    done = subprocess.run([sys.executable, "-c", API_SHARDS, str(run)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert analysis_files(run) == analysis_files(reference)
    with pytest.raises(ConfigError, match="executor and shards go together"):
        ps.analyze(run, shards=2)


def test_the_merge_adds_only_what_the_cache_lacks(series, tmp_path):
    """Shard 0 holds the probe pass's first 7 steps, shard 1 every attention record, of which the run's cache
    already holds 2: the merge appends 7 + 11, and the files are the one process's (for the probe pass, its first
    7 lines)."""
    source, reference = series
    run = import_series(source, tmp_path / "merged").path
    probe = (analysis_dir(reference) / "probe_induction.jsonl").read_text().splitlines()
    attention = (analysis_dir(reference) / "attention.jsonl").read_text().splitlines()
    for k, (name, lines) in enumerate((("probe_induction.jsonl", probe[:7]), ("attention.jsonl", attention))):
        folder = analysis_dir(prepare_shard(run, k))
        folder.mkdir(exist_ok=True)
        (folder / name).write_text("\n".join(lines) + "\n")
    (analysis_dir(run) / "attention.jsonl").write_text("\n".join(attention[:2]) + "\n")
    assert merge_shards(run) == 7 + len(attention) - 2
    assert (analysis_dir(run) / "probe_induction.jsonl").read_text().splitlines() == probe[:7]
    assert (analysis_dir(run) / "attention.jsonl").read_bytes() == (analysis_dir(reference) / "attention.jsonl").read_bytes()
    assert not (analysis_dir(run) / "shards").exists()


@pytest.mark.parametrize("more, says", [
    (["--shards", "2"], "--executor and --shards go together"),
    (["--executor", "submitit-local"], "--executor and --shards go together"),
    (["--executor", "submitit-local", "--shards", "0"], "--shards must be at least 1"),
    (["--executor", "slurm-ish", "--shards", "2"], "invalid choice"),
])
def test_bad_shard_flags_are_one_line(series, more, says):
    _, reference = series
    done = analyze(reference, *more)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_run_trained_here_is_not_sharded(ci_run):
    run = ci_run
    done = subprocess.run([sys.executable, "-m", "plateauscope", "analyze", "--run", str(run), "--executor", "slurm",
                           "--shards", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not an imported series" in done.stderr, done.stderr


def test_slurm_without_a_controller_is_one_line_and_leaves_nothing(series, tmp_path):
    source, _ = series
    run = import_series(source, tmp_path / "nowhere").path
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    done = analyze(run, "--executor", "slurm", "--shards", "2", env=env)
    says = ("no Slurm controller answers", "are you indeed on a slurm cluster")  # srun there or not
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert any(s in done.stderr for s in says), done.stderr
    assert not (analysis_dir(run) / "shards").exists()
