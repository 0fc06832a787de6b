"""Result files of the analyses: their names, strict JSON, atomic writes, and records keyed on settings.

Every analysis caches its results beside the run, under ``RUN/analysis/`` (the file names are the
constants below, in this one place). A cache file is JSON lines, one record per analysed step;
each record carries the ``settings`` that produced it (the number of examples, the seed, ...),
and :func:`load_records` returns only the records whose settings match the ones asked for, so a
call with other settings recomputes instead of silently reusing. Records with other settings
stay in the file (keeping both costs a few kilobytes, and switching back is free).

Files are written atomically (a temporary file, then one rename: ``plateauscope.runs.run.atomic_write``),
so a killed analysis never leaves a torn record behind; appending rewrites the file that way.
Records are strict JSON: NaN and infinities become ``null`` (:func:`strict_json`). One process writes a
run's caches at a time (:func:`writes_cache`, a lock file in ``RUN/analysis/``); readers take no lock.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from plateauscope.runs.files import ANALYSIS_DIR, LOCK_FILE, ROUTING_FILE, append_lines_atomic, writer_lock
from plateauscope.runs.run import (
    Run,
    RunError,
    read_json,
    read_jsonl,
    write_json_atomic,
)

log = logging.getLogger(__name__)

ATTENTION_FILE = "attention.jsonl"
ATTRIBUTION_FILE = "attribution.jsonl"
PATCH_FILE = "patch.jsonl"
ABLATION_FILE = "ablation.jsonl"
CIRCUIT_FILE = "circuit.jsonl"
"""Head shares, set ablations and reads-z patching per exact step (``plateauscope.analysis.circuit``)."""
EDGES_FILE = "edges.jsonl"
"""Attribution of every edge, per analysed step (``plateauscope.analysis.edges``)."""
EDGE_CIRCUIT_FILE = "edge_circuit.jsonl"
"""The faithful edge circuit, per step it was searched at (the landmarks, or every analysed step with ``--full``)."""
EDGE_EXACT_FILE = "edge_exact.jsonl"
"""Exact patching of the strongest edges and its agreement with attribution, per exact step."""
MEASURES_FILE = "measures.jsonl"
"""The built-in measures and the task's own, per analysed step (``plateauscope.analysis.measures``)."""
PATTERNS_FILE = "patterns.jsonl"
"""Attention patterns of a few examples, per analysed step (for the time view)."""
HESSIAN_FILE = "hessian.jsonl"
LLC_FILE = "llc.jsonl"
"""Local learning coefficient records, one per (step, SGLD settings)."""
LLC_SUMMARY_FILE = "llc.json"
"""The LLC series summary of the latest ``plateauscope llc``."""
HEAD_LLC_FILE = "head_llc.jsonl"
"""Per-head (weight-restricted) LLC records: one per (step, head, settings)."""
HEAD_LLC_SUMMARY_FILE = "head_llc.json"
"""The per-head LLC series: ``steps``, ``heads`` (``L0H1`` ...), ``llc`` (one row per step, one value per head), the
settings and clusters."""
MOVED_FIRST_FILE = "moved_first.json"
PROBE_PASS_FILE = "probe_{name}.json"
"""The probe's pass on an imported run (``plateauscope.analysis.probe_pass``), by the probe's name."""
PROBE_STEPS_FILE = "probe_{name}.jsonl"
"""The probe's pass, one record per step as it is measured (a killed pass resumes from it)."""
"""The one change-point rule applied to every signal of a run: each signal's change point and the order."""
SHARDS_DIR = "shards"
"""The shards of an analysis in shards (``plateauscope.analysis.shards``), one run directory each, until merged."""
LEGACY_ROUTING_FILE = "selector.json"
"""What :data:`ROUTING_FILE` was called before; read when the new file is absent."""
REPORT_FILE = "report.html"
"""A run's report, in the run directory."""
VIEW_FILE = "view.html"
"""A run's time view (``plateauscope.views.view``), in the run directory."""
OVERVIEW_FILE = "overview.svg"
"""A run at a glance (``plateauscope.views.overview``), in the run directory next to its report."""
SWEEP_REPORT_FILE = "sweep_report.html"
"""A sweep's report, in the sweep directory."""
DYNAMICS_CSV_FILE = "dynamics.csv"
"""A sweep's per-run table, in the sweep directory."""
VARIANTS_CSV_FILE = "variants.csv"
"""A sweep's per-task-variant table (plateau kind), in the sweep directory."""


def routing_summary_path(run_dir: str | Path) -> Path:
    """The routing-head summary of a run: ``analysis/routing.json``, or an older analysis's
    ``analysis/selector.json`` when only that exists (where a new one is written otherwise)."""
    folder = analysis_dir(run_dir)
    legacy = folder / LEGACY_ROUTING_FILE
    return legacy if legacy.exists() and not (folder / ROUTING_FILE).exists() else folder / ROUTING_FILE


LEGACY_ROUTING_KEYS: dict[str, str] = {
    "log_k": "height", "floor_log_k": "floor_height",
    "base_candidate_loss": "unablated", "zero_candidate_loss": "zero_ablated",
    "mean_candidate_loss": "mean_ablated", "zero_delta_z": "zero_ablated_cue_effect",
    "candidate_loss": "progress", "delta_z": "cue_effect",
    "near_log_k": "near_height", "reaches_log_k": "reaches_height",
    "top_alone_candidate_loss": "top_alone_progress", "top_alone_near_log_k": "top_alone_near_height",
    "top_alone_reaches_log_k": "top_alone_reaches_height",
    "cover_ablated_candidate_loss": "cover_ablated_progress",
    "cover_ablated_reaches_log_k": "cover_ablated_reaches_height", "reads_z": "reads_cue",
}
"""Keys of a routing summary written before it spoke the neutral words (the selector task's
``log_k``, candidate loss and delta_z), and what each is called now."""


def _neutral_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {LEGACY_ROUTING_KEYS.get(k, k): _neutral_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_neutral_keys(v) for v in obj]
    return obj


def read_routing_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's routing-head summary (:func:`routing_summary_path`), with an older file's keys
    renamed to today's (:data:`LEGACY_ROUTING_KEYS`); None when the run has none."""
    path = routing_summary_path(run_dir)
    return _neutral_keys(json.loads(path.read_text())) if path.exists() else None


def probe_pass_path(run_dir: str | Path, probe_name: str) -> Path:
    """``RUN/analysis/probe_<name>.json``: the record of a probe's pass."""
    return analysis_dir(run_dir) / PROBE_PASS_FILE.format(name=probe_name)


def probe_steps_path(run_dir: str | Path, probe_name: str) -> Path:
    """``RUN/analysis/probe_<name>.jsonl``: the per-step records of a probe's pass."""
    return analysis_dir(run_dir) / PROBE_STEPS_FILE.format(name=probe_name)


def read_probe_pass(run_dir: str | Path) -> dict[str, Any] | None:
    """The record of the pass of the probe an imported run's analyses read (``RUN/analysis/probe.json``'s), or None
    before ``plateauscope analyze``."""
    from plateauscope.runs.imported import read_probe_choice
    from plateauscope.tasks.probe import probe_class

    path = probe_pass_path(run_dir, probe_class(read_probe_choice(run_dir)["probe"]).probe_name)
    return read_json(path) if path.exists() else None


def analysis_dir(run_dir: str | Path) -> Path:
    """``RUN/analysis``: where a run's analysis caches live."""
    return Path(run_dir) / ANALYSIS_DIR


def writes_cache(fn: Callable) -> Callable:
    """Run ``fn`` (whose first argument is a run directory or a :class:`Run`) holding the lock on the
    run's analysis caches: a second writer of the same run waits for the first and then finds its
    records cached, so the work is done once. The keyword ``wait=False`` exits with one line
    instead of waiting."""
    @functools.wraps(fn)
    def locked(run: Any, *args: Any, wait: bool = True, **kwargs: Any) -> Any:
        run_dir = Path(getattr(run, "path", run))
        if not run_dir.is_dir():
            raise RunError(f"{run_dir}: no such run directory")
        with writer_lock(analysis_dir(run_dir) / LOCK_FILE, "its analysis cache", wait):
            return fn(run, *args, **kwargs)
    return locked


def strict_json(obj: Any) -> Any:
    """``obj`` with every NaN / infinity replaced by None (tuples become lists, and an object with a
    ``to_dict``, such as an interval, its dict): valid strict JSON."""
    if hasattr(obj, "to_dict"):
        return strict_json(obj.to_dict())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def settings_key(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as they are stored and compared: sorted keys, JSON types (tuples as lists)."""
    return json.loads(json.dumps(dict(sorted(settings.items()))))


def append_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append ``records`` to a JSON-lines file, atomically (the whole file is rewritten in one rename)."""
    append_lines_atomic(Path(path), [json.dumps(strict_json(r), allow_nan=False) for r in records])


def load_records(path: Path, settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The records of a cache file, one per step (the last written wins), sorted by step.

    With ``settings``, only the records made with exactly these settings; records written before
    settings were stored (no ``settings`` field) match nothing, so they are recomputed.
    """
    path = Path(path)
    if not path.exists():
        return []
    wanted = settings_key(settings) if settings is not None else None
    by_step = {r["step"]: r for r in read_jsonl(path) if wanted is None or r.get("settings") == wanted}
    return [by_step[s] for s in sorted(by_step)]


def with_task(run_dir: str | Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with the run's task (``plateauscope.runs.run.Run.task_fingerprint``): the key of a cache's records."""
    return {**settings, "task": Run(run_dir).task_fingerprint()}


def task_changed(path: Path, key: Mapping[str, Any]) -> bool:
    """Whether the cache file ``path`` holds records of the settings ``key`` (which names the run's
    task, ``plateauscope.runs.run.Run.task_fingerprint``) made by another version of the task, or
    before records stored it, and none made by this one: then a changed task recomputes."""
    key = settings_key(key)
    others = [r for r in load_records(path) if {**(r.get("settings") or {}), "task": key["task"]} == key]
    return bool(others) and not any(r["settings"] == key for r in others)


def pick_steps(available: list[int], every: int = 1, steps: list[int] | None = None) -> list[int]:
    """The checkpoints to analyse: explicit ``steps`` (each must exist) or every ``every``-th one and the last."""
    if every < 1:
        raise ValueError(f"--every must be at least 1, got {every}")
    if steps:
        missing = sorted(set(steps) - set(available))
        if missing:
            raise RunError(f"no checkpoint at step(s) {', '.join(map(str, missing))}")
        return sorted(set(steps))
    chosen = available[::every]
    if available and chosen[-1] != available[-1]:
        chosen.append(available[-1])
    return chosen


@writes_cache
def cached_series(run: Run, path: Path, settings: Mapping[str, Any], steps: list[int],
                  compute: Callable[[int, Any], dict[str, Any]], desc: str, device: str = "cpu",
                  progress: bool = True) -> list[dict[str, Any]]:
    """One record per step: from the cache file ``path`` when it holds one with these ``settings`` and
    the run's task, else ``compute(step, model)`` on the checkpoint (loaded one at a time), appended
    to the cache."""
    settings = with_task(run.path, settings)
    if task_changed(path, settings):
        log.warning("%s: the task (%s) changed since %s was written: recomputing", run.path, run.config.task_name,
                    Path(path).name)
    have = {r["step"]: r for r in load_records(path, settings)}
    for step in tqdm([s for s in steps if s not in have], desc=f"{desc} {run.path.name}", disable=not progress,
                     dynamic_ncols=True):
        record = {"step": step, "settings": dict(settings), **compute(step, run.model(step, device))}
        append_records(path, [record])
        have[step] = strict_json(record)
    return [have[s] for s in steps]


def write_json_result(path: Path, obj: Any) -> None:
    """Write a result as strict, indented JSON, atomically."""
    write_json_atomic(Path(path), strict_json(obj))


def median(values: Sequence[float | int | None]) -> float | None:
    """The median of the values that are not None (the mean of the middle two on an even count)."""
    xs = [float(v) for v in values if v is not None]
    return float(np.median(xs)) if xs else None
