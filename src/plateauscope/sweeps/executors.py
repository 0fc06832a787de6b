"""Executors: train a sweep's points locally (a pool of spawned processes, or serially) or through submitit (local subprocesses or Slurm)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from plateauscope.errors import ConfigError
from plateauscope.processes import available_cores, spawn_pool, submitit_executor
from plateauscope.runs import run as rd
from plateauscope.runs.files import SUBMITIT_DIR
from plateauscope.sweeps.spec import (
    EXECUTORS,
    Job,
    Point,
    SweepSpec,
    expand,
    plan_jobs,
    resolve_relative,
    write_manifest,
)
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.train import train

log = logging.getLogger(__name__)


def run_job(job: Job) -> list[dict[str, Any]]:
    """Train a job's runs (resuming what exists); one outcome per run, errors as one line each."""
    torch.set_num_threads(job.threads)
    t0 = time.perf_counter()
    try:
        if len(job.cfgs) > 1:
            summaries = train_ensemble(list(job.cfgs), list(job.out_dirs), resume=True, device=job.device,
                                       progress=False)
        else:
            summaries = [train(job.cfgs[0], job.out_dirs[0], resume=True, device=job.device, progress=False)]
    except (ConfigError, rd.RunError, RuntimeError, ValueError, OSError) as e:
        message = " ".join(f"{type(e).__name__}: {e}".split())
        return [{"name": n, "error": message} for n in job.names]
    seconds = round(time.perf_counter() - t0, 1)
    return [{"name": n, "tau": s.get("tau"), "final_step": s.get("final_step"), "seconds": seconds,
             "members": len(job.cfgs)} for n, s in zip(job.names, summaries)]


# ---- executors ----------------------------------------------------------------------------


def _run_serial(jobs: list[Job], bar: tqdm) -> list[dict]:
    threads = torch.get_num_threads()  # run_job sets this process's threads: give them back after
    outcomes = []
    try:
        for job in jobs:
            outcomes += run_job(job)
            bar.update(1)
    finally:
        torch.set_num_threads(threads)
    return outcomes


def _died(job: Job, e: BaseException) -> list[dict]:
    """Outcomes of a job whose process died (killed, out of memory, timed out): failed runs, not a failed sweep."""
    return [{"name": n, "error": f"the job's process died: {' '.join(f'{type(e).__name__}: {e}'.split())}"}
            for n in job.names]


def _run_local(jobs: list[Job], workers: int, bar: tqdm) -> list[dict]:
    outcomes = []
    # Interrupted (Ctrl-C, or SIGTERM, which main() turns into the same), the pool stops its workers: a
    # worker left running would go on writing its run directory while a second sweep resumes it.
    with spawn_pool(workers) as pool:
        futures = {pool.submit(run_job, job): job for job in jobs}
        for future in cf.as_completed(futures):
            try:
                outcomes += future.result()
            except cf.process.BrokenProcessPool as e:
                outcomes += _died(futures[future], e)
            bar.update(1)
    return outcomes


def _run_submitit(executor: Any, jobs: list[Job], workers: int, threads: int, slurm: dict[str, Any],
                  bar: tqdm) -> list[dict]:
    executor.update_parameters(name="plateauscope-sweep", cpus_per_task=threads, timeout_min=slurm.get("timeout_min", 240))
    outcomes = []
    if executor.cluster == "slurm":  # the cluster schedules: submit everything as one array
        extra = {f"slurm_{k}": v for k, v in slurm.items()
                 if k not in ("timeout_min", "cpus_per_task") and v is not None}
        executor.update_parameters(slurm_array_parallelism=workers, **extra)
        try:
            handles = executor.map_array(run_job, jobs)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            raise ConfigError(f"slurm submission failed: {' '.join(str(e).split())}") from None
        for job, handle in zip(jobs, handles):
            outcomes += _submitit_result(job, handle)
            bar.update(1)
        return outcomes
    # Local subprocesses start at once: keep at most `workers` of them running.
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop(0)
            running.append((job, executor.submit(run_job, job)))
        finished = [(job, h) for job, h in running if h.done()]
        for job, handle in finished:
            outcomes += _submitit_result(job, handle)
            running.remove((job, handle))
            bar.update(1)
        if not finished:
            time.sleep(0.2)
    return outcomes


def _submitit_result(job: Job, handle: Any) -> list[dict]:
    try:
        return handle.result()
    except Exception as e:  # noqa: BLE001 - submitit's FailedJobError / UncompletedJobError: the process died
        return _died(job, e)


def run_sweep(spec: SweepSpec, out: str | Path, executor: str = "local", workers: int | None = None,
              ensemble: bool = False, seeds: list[int] | None = None, device: str = "cpu",
              progress: bool = True, slurm: dict[str, Any] | None = None,
              threads: int | None = None) -> list[dict[str, Any]]:
    """Run (or finish) a sweep into ``out``; one outcome per point, in the sweep's order.

    ``threads`` per job defaults to ``cores // workers`` (slurm: ``cpus_per_task``); fewer is
    wiser on a machine that others share (oversubscribed torch threads spin and crawl).

    An outcome is ``{"name", "status": "done"|"skipped"|"failed", ...}`` with tau, final step and
    seconds for trained runs, and a one-line ``error`` for failed ones.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    for flag, value in (("--workers", workers), ("--threads", threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    out = Path(out)
    points = expand(spec, seeds)
    # A cluster executor that cannot work fails here, before the sweep directory is touched.
    cluster = {"submitit-local": "local", "slurm": "slurm"}.get(executor)
    submitter = submitit_executor(out / SUBMITIT_DIR, cluster) if cluster else None
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(spec, out, points)
    # Two rounds: the runs that relative points refer to, then every other point in the sweep's
    # order, the relative ones resolved (their S, their donor).
    settings = dict(executor=executor, workers=workers, ensemble=ensemble, device=device, progress=progress,
                    slurm=slurm or {}, threads=threads, submitter=submitter, name=spec.name)
    baselines = {p.baseline for p in points} - {None}
    outcomes = _train_points([p for p in points if p.name in baselines], out, **settings) if baselines else {}
    rest, failed = [], []
    for p in points:
        if p.name in baselines:
            continue
        try:
            rest.append(resolve_relative(spec, p, out) if p.baseline is not None else p)
        except (ConfigError, rd.RunError) as e:
            failed.append({"name": p.name, "status": "failed", "error": str(e)})
    if rest:
        outcomes.update(_train_points(rest, out, **settings))
    outcomes.update({o["name"]: o for o in failed})
    return [outcomes.get(p.name, {"name": p.name, "status": "failed", "error": "no outcome"}) for p in points]


def _train_points(points: list[Point], out: Path, executor: str, workers: int | None, ensemble: bool, device: str,
                  progress: bool, slurm: dict[str, Any], threads: int | None, submitter: Any, name: str
                  ) -> dict[str, dict[str, Any]]:
    """Train the unfinished ``points`` as jobs on the executor; their outcomes by name."""
    groups, skipped = plan_jobs(points, out, ensemble)
    slurm = slurm or {}
    if executor == "slurm":  # the cluster's cores: workers is the array's parallelism
        n_workers = workers or max(len(groups), 1)
        threads = threads or int(slurm.get("cpus_per_task") or 2)
    else:  # this machine's cores: workers x threads never exceed them
        cores = available_cores()
        if workers is not None and workers > cores and executor != "serial":
            log.warning("--workers %d > %d cores: using %d workers", workers, cores, cores)
        n_workers = 1 if executor == "serial" else min(workers or cores, cores, max(len(groups), 1))
        threads = min(threads or cores, max(1, cores // n_workers))
    jobs = [Job(tuple(p.cfg for p in g), tuple(str(out / p.name) for p in g), tuple(p.name for p in g), threads, device)
            for g in groups]
    log.info("sweep %s: %d points, %d complete, %d jobs (%s, %d workers x %d threads%s)", name, len(points),
             len(skipped), len(jobs), executor, n_workers, threads, ", seed ensembles" if ensemble else "")
    bar = tqdm(total=len(jobs), disable=not progress, desc=name, unit="job", dynamic_ncols=True)
    try:
        if not jobs:
            trained = []
        elif executor == "serial":
            trained = _run_serial(jobs, bar)
        elif executor == "local":
            trained = _run_local(jobs, n_workers, bar)
        else:
            trained = _run_submitit(submitter, jobs, n_workers, threads, slurm, bar)
    finally:
        bar.close()
    by_name = {o["name"]: {**o, "status": "failed" if "error" in o else "done"} for o in trained}
    by_name.update({n: {"name": n, "status": "skipped"} for n in skipped})
    return by_name


# ---- shipped sweeps -----------------------------------------------------------------------

