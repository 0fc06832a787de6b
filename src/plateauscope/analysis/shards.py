"""An imported series analysed in shards: its checkpoints split over N jobs (a Slurm job array, or submitit's local
processes), each analysing its share in a folder of its own; their records merged into the run's cache; then the rest
of the analysis here, in one process.

A shard is a run directory of its own, ``RUN/analysis/shards/<k>/``: the series' manifest and model folder (small
files; the manifest names each checkpoint's file or hub revision, so nothing is copied), the probe, and its own
analysis cache. On its share of the steps it runs what is made step by step: the probe's pass
(:func:`plateauscope.analysis.probe_pass.analyze_imported`), the probe's evaluation and the cheap pass
(:func:`plateauscope.analysis.analyze.analyze_run` with ``expensive=False``), the same functions as one process, so
the same records. A shard killed and run again (requeued by Slurm, or submitted again here: ``retries``) resumes from
its folder; no step whose record was written is analysed again.

The merge appends each shard's records that the run's cache lacks, in step order and as the lines were written,
to the run's cache: the bytes one process writes. Then :func:`plateauscope.analysis.probe_pass.analyze_series`
runs as in one process and finds every per-step record cached, so it computes only what reads the whole series
(the heads named, the transition, the landmarks) and the expensive pass at the landmarks. The result equals one
process's byte for byte where the torch threads are the same (a shard's are ``threads``).

A hub series' shards fetch their own steps just in time into the shared Hugging Face cache, each keeping at most
``keep`` of them: a shard evicts only its own steps' revisions, and the last step (every shard reads it: the
measures' reference) is evicted by none. The disk holds about ``shards * keep + 1`` checkpoints.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plateauscope.analysis.analyze import AnalysisSettings
from plateauscope.analysis.probe_pass import analyze_series
from plateauscope.analysis.results import SHARDS_DIR, analysis_dir, pick_steps, writes_cache
from plateauscope.errors import ConfigError
from plateauscope.processes import submitit_executor
from plateauscope.runs.files import MODEL_CONFIG_DIR, SERIES_FILE, SUBMITIT_DIR, append_lines_atomic, read_jsonl
from plateauscope.runs.run import RunError
from plateauscope.runs.series import Fetch, ImportedSeries, is_imported

log = logging.getLogger(__name__)

SHARD_EXECUTORS = {"submitit-local": "local", "slurm": "slurm"}
"""``--executor`` -> submitit's cluster."""


def split_steps(steps: list[int], shards: int) -> list[list[int]]:
    """``steps`` in ``shards`` contiguous shares whose sizes differ by at most one (fewer where there are fewer
    steps than shards)."""
    n = min(shards, len(steps))
    size, extra = divmod(len(steps), n) if n else (0, 0)
    shares, start = [], 0
    for k in range(n):
        end = start + size + (k < extra)
        shares.append(steps[start:end])
        start = end
    return shares


@dataclass(frozen=True)
class Shard:
    """What one shard's job needs (submitit pickles it)."""

    index: int
    folder: str
    """The shard's run directory (module docstring)."""
    steps: tuple[int, ...]
    probe: str
    probe_options: dict[str, Any]
    settings: AnalysisSettings
    threads: int
    """Torch threads of the shard's process (on Slurm, its ``cpus_per_task``)."""
    device: str = "cpu"
    edges: bool = True
    probe_only: bool = False
    fetch_for: Callable[..., Fetch] | None = None
    """A hub series: ``fetch_for(run_dir, steps=...)`` builds the shard's fetcher, evicting only those steps."""
    last_step: int | None = field(default=None)
    """The series' last step: read by every shard (the measures' reference), evicted by none."""


def shard_records(folder: Path) -> tuple[int, int]:
    """``(records, distinct)`` in a shard's cache files: distinct by step and settings (a record written twice
    counts once in ``distinct``)."""
    lines, keys = 0, set()
    for path in sorted(analysis_dir(folder).glob("*.jsonl")):
        for record in read_jsonl(path):
            lines += 1
            keys.add((path.name, record_key(record)))
    return lines, len(keys)


def record_key(record: dict[str, Any]) -> tuple[int, str]:
    """A cache record's identity: its step and what it was made with (its settings, or the probe's task)."""
    return record["step"], json.dumps(record.get("settings", record.get("task")), sort_keys=True)


def analyze_shard(shard: Shard) -> dict[str, Any]:
    """One shard's job (module docstring): its steps' per-step passes into its folder; what it found there and
    what it wrote, as ``{"index", "steps", "resumed", "written", "records", "distinct"}``."""
    torch.set_num_threads(shard.threads)
    folder = Path(shard.folder)
    resumed, _ = shard_records(folder)
    fetch = None
    if shard.fetch_for is not None:
        fetch = shard.fetch_for(folder, steps=[s for s in shard.steps if s != shard.last_step])
    analyze_series(folder, shard.probe, shard.probe_options, list(shard.steps), device=shard.device, progress=False,
                   probe_only=shard.probe_only, fetch=fetch, settings=shard.settings, edges=shard.edges,
                   expensive=False, workers=1)
    records, distinct = shard_records(folder)
    return {"index": shard.index, "steps": len(shard.steps), "resumed": resumed, "written": records - resumed,
            "records": records, "distinct": distinct}


def prepare_shard(run_dir: Path, index: int) -> Path:
    """The shard's run directory: the series' manifest and model folder copied in (module docstring)."""
    folder = analysis_dir(run_dir) / SHARDS_DIR / str(index)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(run_dir / SERIES_FILE, folder / SERIES_FILE)
    shutil.copytree(run_dir / MODEL_CONFIG_DIR, folder / MODEL_CONFIG_DIR, dirs_exist_ok=True)
    return folder


def merge_shards(run_dir: str | Path) -> int:
    """Append each shard's records that the run's cache lacks to it, in step order (shard by shard for equal
    steps), the lines as they were written; remove the shards' folders. The number of records merged."""
    main, merged = analysis_dir(run_dir), 0
    shards = sorted((p for p in (main / SHARDS_DIR).iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for name in sorted({f.name for folder in shards for f in analysis_dir(folder).glob("*.jsonl")}):
        have = {record_key(r) for r in read_jsonl(main / name)} if (main / name).exists() else set()
        new: list[tuple[int, str]] = []
        for folder in shards:
            path = analysis_dir(folder) / name
            for line in path.read_text().splitlines() if path.exists() else []:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a torn last line: the step is analysed again here
                    continue
                if record_key(record) not in have:
                    have.add(record_key(record))
                    new.append((record["step"], line))
        new.sort(key=lambda item: item[0])
        if new:
            append_lines_atomic(main / name, [line for _, line in new])
        merged += len(new)
    shutil.rmtree(main / SHARDS_DIR)
    return merged


def _one_line(e: BaseException) -> str:
    """An exception in one line (submitit's: without the error stream it appends; the log has it)."""
    return " ".join(f"{type(e).__name__}: {e}".split(" Error stream produced:")[0].split())


@writes_cache
def run_shards(run_dir: str | Path, shards: int, executor: Any, probe: str = "induction",
               probe_options: dict[str, Any] | None = None, steps: list[int] | None = None, every: int = 1,
               settings: AnalysisSettings | None = None, threads: int = 1, retries: int = 1,
               fetch_for: Callable[..., Fetch] | None = None, device: str = "cpu", edges: bool = True,
               probe_only: bool = False, slurm: dict[str, Any] | None = None,
               on_shard: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """The per-step passes of an imported run's chosen steps in ``shards`` jobs on ``executor`` (a submitit
    executor: :func:`plateauscope.processes.submitit_executor`), a shard whose job died submitted again up to
    ``retries`` times, then their records merged into the run's cache (module docstring). One outcome per shard
    (:func:`analyze_shard`'s, or ``{"index", "error"}``); ``on_shard(outcome)`` as each ends. Then
    :func:`plateauscope.analysis.probe_pass.analyze_series` with the same arguments computes the rest.

    A shard that failed every try leaves every shard's folder in place (a rerun resumes each) and raises a one-line
    RunError naming its log."""
    run_dir = Path(run_dir)
    if not is_imported(run_dir):
        raise RunError(f"{run_dir}: analysing in shards is for an imported series (plateauscope import); a run "
                       "trained here is analysed in one process")
    if shards < 1 or threads < 1 or retries < 0:
        raise ConfigError(f"--shards and --threads must be at least 1 and --retries at least 0, got {shards}, "
                          f"{threads} and {retries}")
    series_steps = ImportedSeries(run_dir).steps
    chosen = pick_steps(series_steps, every, steps)
    jobs = [Shard(k, str(prepare_shard(run_dir, k)), tuple(share), probe, dict(probe_options or {}),
                  settings or AnalysisSettings(), threads, device, edges, probe_only, fetch_for, series_steps[-1])
            for k, share in enumerate(split_steps(chosen, shards))]
    slurm = slurm or {}
    executor.update_parameters(name="plateauscope-analyze", cpus_per_task=threads,
                               timeout_min=slurm.get("timeout_min", 240))
    if executor.cluster == "slurm":
        extra = {f"slurm_{k}": v for k, v in slurm.items() if k != "timeout_min" and v is not None}
        executor.update_parameters(slurm_array_parallelism=len(jobs), **extra)
    outcomes: dict[int, dict[str, Any]] = {}
    todo = jobs
    for attempt in range(retries + 1):
        try:
            handles = executor.map_array(analyze_shard, todo)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            if not any(shard_records(Path(job.folder))[0] for job in jobs):  # nothing analysed yet: nothing left
                shutil.rmtree(analysis_dir(run_dir) / SHARDS_DIR, ignore_errors=True)
            raise ConfigError(f"{executor.cluster} submission failed: {_one_line(e)}") from None
        failed = []
        for shard, handle in _as_they_end(list(zip(todo, handles))):
            try:
                outcome = handle.result()
            except Exception as e:  # noqa: BLE001 - submitit's FailedJobError / UncompletedJobError: the job died
                outcome = {"index": shard.index, "error": _one_line(e), "log": str(handle.paths.stderr)}
                failed.append(shard)
                if attempt < retries:
                    log.warning("shard %d of %d (steps %d-%d): its job ended without a result (%s); submitted again, "
                                "to resume from its folder", shard.index + 1, len(jobs), shard.steps[0],
                                shard.steps[-1], outcome["error"])
            outcomes[shard.index] = outcome
            if on_shard is not None and (shard not in failed or attempt == retries):
                on_shard({**outcome, "attempt": attempt + 1})
        if not failed:
            break
        todo = failed
    broken = [o for o in outcomes.values() if "error" in o]
    if broken:
        first = broken[0]
        raise RunError(f"{run_dir}: {len(broken)} of {len(jobs)} shards failed {retries + 1} times (shard "
                       f"{first['index'] + 1}: {first['error'][:300]}; its log: {first['log']}); their folders in "
                       f"{analysis_dir(run_dir) / SHARDS_DIR} are kept: the same command resumes each")
    merge_shards(run_dir)
    return [outcomes[k] for k in sorted(outcomes)]


def _as_they_end(pairs: list[tuple[Shard, Any]], poll_s: float = 0.5):
    """The (shard, handle) pairs in the order their jobs end."""
    pending = list(pairs)
    while pending:
        done = [pair for pair in pending if pair[1].done()]
        for pair in done:
            pending.remove(pair)
            yield pair
        if not done:
            time.sleep(poll_s)


def shard_executor(run_dir: str | Path, executor: str) -> Any:
    """The submitit executor of ``--executor`` (:data:`SHARD_EXECUTORS`), its files in the run's shards folder."""
    if executor not in SHARD_EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(SHARD_EXECUTORS)}, got {executor!r}")
    return submitit_executor(analysis_dir(run_dir) / SHARDS_DIR / SUBMITIT_DIR, SHARD_EXECUTORS[executor])
