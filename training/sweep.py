"""Sweeps: a named grid over run options, one run directory per point, and ``python -m training.sweep``.

    python -m training.sweep --list
    python -m training.sweep --preset quick-d --out sweeps/quick-d [--executor local|serial|submitit-local|slurm]
                             [--workers N] [--ensemble] [--seeds 0,1,2]
    python -m training.sweep --base ci --grid K=3,10,36 --grid seed=0,1 --set n_b=504 --out sweeps/mine

A sweep (:class:`SweepSpec`) is a base preset, options fixed for every point, and one or more
grid blocks; each block is the cartesian product of its axes, and the sweep's points are the
blocks' points in order (duplicates once). A point's options are flat ``RunConfig.replace``
names (``K``, ``n_b``, ``lr``, ``batch_size``, ``direction``, ``seed``, ``max_steps``, ...) plus:

* ``D``: the data set size; ``n_b = D / K`` (D must be a multiple of K);
* ``preset``: the point's base preset instead of the sweep's;
* ``data_seed``: the data set's seed (``TaskConfig.seed``: which strings, paired how), which the
  flat ``seed`` (model init and data order) leaves alone.

Sweep directory::

    sweep.json     the sweep's name, base, fixed options and its points (name + options)
    <run name>/    one run directory per point (the ``training.run`` layout), named by its
                   options in a fixed order, e.g. ``backward_K10_D5000_lr0.001_bs128_seed0``

Idempotent: a point whose ``summary.json`` says ``complete`` is skipped; any other is trained
with ``resume=True``, so a killed run continues from its last checkpoint and a fresh one starts.
Running a sweep again therefore finishes what is missing and does nothing else.

Executors: ``local`` (default) is a pool of spawned processes; each sets its torch threads to
``cores // workers``, so workers x threads never exceed the cores. ``serial`` trains in this
process (notebooks, debugging). ``submitit-local`` and ``slurm`` submit the same jobs through
submitit (the optional ``cluster`` extra): the first as local subprocesses (what the tests use
to exercise the cluster path without a cluster), the second to a Slurm cluster. With
``--ensemble`` the points that differ only in their seed form one job, trained as one
vectorised model (``training.ensemble``); every member still writes its own run directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from training import run as rd
from training.config import ConfigError, RunConfig
from training.ensemble import train_ensemble
from training.interventions import INTERVENTION_OPTIONS, has_interventions
from training.presets import get_preset
from training.train import train

log = logging.getLogger(__name__)

SUBMITIT_DIR = ".submitit"
EXECUTORS: tuple[str, ...] = ("local", "serial", "submitit-local", "slurm")

# How each option appears in a run directory's name, and in which order (others: alphabetical, before seed).
_NAME_ORDER: tuple[str, ...] = ("preset", "direction", "K", "D", "n_b", "lr", "batch_size")
_NAME_ALIAS: dict[str, str] = {"preset": "", "direction": "", "n_b": "nb", "batch_size": "bs", "max_steps": "steps",
                               "target_uniqueness": "uniq", "tails": "tails_", "order": "order_",
                               "selectors": "sel_",
                               "eval_groups": "eg", "stop_after_tau": "stop", "weight_decay": "wd",
                               "data_seed": "ds", "hide_cue_at": "hide", "transplant": "give_",
                               "freeze_transplant": "frozen", "only_head": "only"}


@dataclass(frozen=True)
class SweepSpec:
    """A named grid over run options (see the module docstring)."""

    name: str
    """The sweep's name (``--preset``), recorded in ``sweep.json``."""
    base: str
    """The preset every point starts from (unless the point sets ``preset``)."""
    grids: tuple[dict[str, tuple], ...]
    """Grid blocks: each maps option names to the values it takes; a block is their cartesian product."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Options applied to every point (not part of the run names)."""
    description: str = ""
    """What the sweep measures, one sentence."""
    cost: str = ""
    """Expected cost (runs, steps, time on the 2-core CPU this project is developed on)."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep."""

    name: str
    """The run directory's name, from the options."""
    options: dict[str, Any]
    """The point's own options (grid values)."""
    cfg: RunConfig | None
    """The full configuration: base preset + fixed options + the point's options (None for a point
    relative to its baseline until that has trained: :func:`resolve_relative`)."""
    baseline: str | None = None
    """The run that a relative point's options refer to (``RELATIVE_OPTIONS``): the point with the
    same options but no intervention."""


@dataclass(frozen=True)
class Job:
    """The unit of work an executor runs: one run, or a seed ensemble of several."""

    cfgs: tuple[RunConfig, ...]
    out_dirs: tuple[str, ...]
    names: tuple[str, ...]
    threads: int
    """torch intra-op threads for this job's process."""
    device: str = "cpu"


# ---- the grid -----------------------------------------------------------------------------


def _format_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def run_name(options: dict[str, Any]) -> str:
    """A run directory's name from its options, e.g. ``backward_K10_D5000_seed0``."""
    rest = sorted(k for k in options if k not in _NAME_ORDER and k != "seed")
    keys = [k for k in _NAME_ORDER if k in options] + rest + (["seed"] if "seed" in options else [])
    return "_".join(f"{_NAME_ALIAS.get(k, k)}{_format_value(options[k])}" for k in keys) or "run"


RELATIVE_OPTIONS: dict[str, str] = {
    "hide_cue_at": "hide_cue_until = this fraction of the baseline run's tau (at least 1 step)",
    "transplant": "without a donor, the donor is the baseline run's last checkpoint",
}
# (``only_head="L.H"`` is resolved without a baseline: every other head of layer L masked.)
"""Point options resolved from the point's baseline run once it has trained (interventions relative
to each seed's own run, ``training.interventions``)."""


def _is_relative(options: dict[str, Any]) -> bool:
    return "hide_cue_at" in options or ("transplant" in options and "donor" not in options)


def resolve_relative(spec: SweepSpec, point: Point, out: Path) -> Point:
    """A relative point with its options made absolute from its baseline run (which must be complete
    and have reached tau); else a one-line ConfigError naming the baseline."""
    base_dir = out / point.baseline
    if not is_complete(base_dir):
        raise ConfigError(f"{point.name}: its baseline run {base_dir} is not complete")
    tau = rd.read_json(base_dir / rd.SUMMARY_FILE).get("tau")
    options = dict(point.options)
    if "hide_cue_at" in options:
        if tau is None:
            raise ConfigError(f"{point.name}: its baseline run {base_dir} never reached tau")
        options["hide_cue_until"] = max(1, round(options.pop("hide_cue_at") * tau))
    if "transplant" in options and "donor" not in options:
        base = rd.Run(base_dir)
        options["donor"] = str(base.checkpoint_path(base.steps()[-1]).resolve())
    return dataclasses.replace(point, cfg=point_config(spec, options))


def point_config(spec: SweepSpec, options: dict[str, Any]) -> RunConfig:
    """The RunConfig of one point: base preset, then the fixed options, then the point's own."""
    merged = {**spec.fixed, **options}
    cfg = get_preset(merged.pop("preset", spec.base))
    data_seed = merged.pop("data_seed", None)
    if data_seed is not None:
        cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, seed=data_seed))
    only = merged.pop("only_head", None)
    if only is not None:  # "L.H": every other head of layer L masked
        layer, _, head = str(only).partition(".")
        merged["masked_heads"] = tuple(f"{layer}.{h}" for h in range(cfg.model.n_heads) if str(h) != head)
    D = merged.pop("D", None)
    if D is not None:
        K = merged.get("K", cfg.task.K)
        if D % K:
            raise ConfigError(f"D={D} is not a multiple of K={K}")
        merged["n_b"] = D // K
    return cfg.replace(**merged).validate()


def expand(spec: SweepSpec, seeds: list[int] | None = None) -> list[Point]:
    """The sweep's points in order (``seeds`` replaces every block's seed axis, or adds one).

    A point whose configuration equals an earlier point's (the default batch size of a batch
    block is the default learning rate of a learning-rate block) is that point: trained once.
    """
    points: dict[str, Point] = {}
    for block in spec.grids:
        axes = dict(block)
        if seeds is not None:
            axes["seed"] = tuple(seeds)
        for values in itertools.product(*axes.values()):
            options = dict(zip(axes, values))
            if _is_relative(options):
                baseline = {k: v for k, v in options.items() if k not in INTERVENTION_OPTIONS}
                point_config(spec, baseline)  # an impossible option fails now, not after the baselines
                key = json.dumps(options, sort_keys=True, default=str)
                points.setdefault(key, Point(run_name(options), options, None, run_name(baseline)))
                continue
            cfg = point_config(spec, options)
            key = json.dumps(cfg.to_dict(), sort_keys=True)
            if key not in points:
                points[key] = Point(run_name(options), options, cfg)
    names = [p.name for p in points.values()]
    if len(set(names)) != len(names):
        raise ConfigError(f"sweep {spec.name!r}: two different points share a run name")
    missing = sorted({p.baseline for p in points.values() if p.baseline} - set(names))
    if missing:
        raise ConfigError(f"sweep {spec.name!r}: relative points need their baseline runs in the sweep "
                          f"({', '.join(missing)})")
    return list(points.values())


def is_complete(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run (``summary.json`` says ``complete``)."""
    path = run_dir / rd.SUMMARY_FILE
    try:
        return path.exists() and bool(rd.read_json(path).get("complete"))
    except rd.RunError:
        return False


def write_manifest(spec: SweepSpec, out: Path, points: list[Point]) -> None:
    """Write ``sweep.json``; a sweep run again (more seeds, say) adds its new points to it."""
    path = out / rd.MANIFEST_FILE
    known: dict[str, dict] = {}
    if path.exists():
        old = rd.read_json(path)
        if old.get("sweep") != spec.name:
            raise ConfigError(f"{out} holds the sweep {old.get('sweep')!r}, not {spec.name!r}; choose another --out")
        known = {p["name"]: p["options"] for p in old.get("points", [])}
    known.update({p.name: p.options for p in points})
    rd.write_json_atomic(path, {"sweep": spec.name, "description": spec.description, "base": spec.base,
                                "fixed": spec.fixed, "points": [{"name": n, "options": o} for n, o in known.items()]})


def read_manifest(sweep_dir: str | Path) -> dict:
    """``sweep.json`` of a sweep directory (one-line RunError when missing or broken)."""
    return rd.read_json(Path(sweep_dir) / rd.MANIFEST_FILE)


def plan_jobs(points: list[Point], out: Path, ensemble: bool) -> tuple[list[list[Point]], list[str]]:
    """The unfinished points grouped into jobs, and the names of the points already complete.

    Without ``ensemble`` every unfinished point is a job of its own; with it, the unfinished
    points that differ only in their seed share one job.
    """
    complete = {p.name for p in points if is_complete(out / p.name)}
    groups: dict[str, list[Point]] = {}
    for p in points:
        if p.name not in complete:  # interventions train solo (an ensemble refuses them)
            solo = not ensemble or has_interventions(p.cfg.train)
            key = p.name if solo else run_name({k: v for k, v in p.options.items() if k != "seed"})
            groups.setdefault(key, []).append(p)
    return list(groups.values()), sorted(complete)


# ---- running a job (in whichever process the executor gives it) ----------------------------


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


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    # spawn, not fork: forking a process whose torch (OpenMP) thread pool is running can hang the child.
    outcomes = []
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(run_job, job): job for job in jobs}
        for future in cf.as_completed(futures):
            try:
                outcomes += future.result()
            except cf.process.BrokenProcessPool as e:
                outcomes += _died(futures[future], e)
            bar.update(1)
    except BaseException:
        # Interrupted (Ctrl-C, or SIGTERM, which main() turns into the same): stop the workers too. A
        # worker left running would go on writing its run directory while a second sweep resumes it.
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return outcomes


def submitit_executor(folder: Path, cluster: str) -> Any:
    """A submitit executor (``cluster``: ``local`` or ``slurm``), or a one-line ConfigError saying why not."""
    flag = "slurm" if cluster == "slurm" else "submitit-local"
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"--executor {flag} needs submitit: pip install 'plateauscope[cluster]'") from None
    try:
        return submitit.AutoExecutor(folder=folder, cluster=cluster)
    except RuntimeError as e:  # "Could not detect srun": not on a Slurm cluster
        raise ConfigError(f"--executor {flag}: {' '.join(str(e).split())}") from None


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

# The `quick` grids use the `ci` model (2 layers, d_model 64; about 20 ms a step on 2 cores, tau
# about 500 steps at D = 3,000, 1,000 at 5,000 and 2,900 at 10,000 with K = 10), evaluate every
# 25 steps, checkpoint every 50 and stop at 1.4 tau: the plateau and the drop are in every run.
# Exact-match accuracy lags the candidate loss (at 1.4 tau a group is rarely >= 80% exact), so
# the snap *window* needs longer runs (--set stop_after_tau=3); the share at tau/2 does not.
_QUICK = {"stop_after_tau": 1.4, "eval_every": 25, "ckpt_every": 50, "max_steps": 6000}
# The `paper` grids use the paper's model (4 layers, d_model 128; about 85 ms a step on 2 cores,
# tau about 1,400 steps at D = 10,000), evaluate every 50 steps and stop at 1.5 tau.
_PAPER = {"stop_after_tau": 1.5, "eval_every": 50, "ckpt_every": 50, "tracked_groups": 200}
# Seed ensembles of one preset: model seed and data seed varied together (seed i with data seed i).
_SEEDS = tuple({"seed": (i,), "data_seed": (i,)} for i in range(5))
_K_D_QUICK = 5040  # a multiple of 3, 10 and 36: the same D for every K
_K_D_PAPER = 10080

# The marginal search (issue 11): the `ci` model on D = 5,000 (n_b 500, K 10), evaluated every 25
# steps, stopped at 1.3 tau or at 3,000 steps (the no-z control never reaches tau: its 3,000 steps
# show how long the marginal alone takes; ci's own tau is ~1,000 steps). Cost: at most 30 x 3,000 =
# 90k steps; the ci model takes ~20 ms a step on a quiet core plus ~15% for evaluation every 25
# steps, so <= ~35 min with 2 workers (--ensemble: one vectorised job per variant, less). Measured
# on a loaded machine (load ~10 on 2 cores): 400 steps in 96-142 s of run wall time. Cut to fit 60
# minutes on 2 cores: the `ci` model only (the paper model is left to a variant that shows a
# marginal stage), D = 5,000 and K = 10 only, 3 seeds, 3,000 steps at most, checkpoints every 50
# steps, and only the pairs that test a hypothesis of their own (a_len 1 with zb; a_len 1 without
# z; tails by first character with zb) - not every pair of the five knobs.
_MARGINAL = {"stop_after_tau": 1.3, "eval_every": 25, "ckpt_every": 50, "max_steps": 3000, "tracked_groups": 50}
_MARGINAL_VARIANTS: tuple[dict[str, tuple], ...] = (
    {"a_len": (4,)},  # the paper's task (a_len 4 is its default): the shelf the issue starts from
    # Short targets: is the marginal over 4-character strings what costs the time?
    {"a_len": (1,), "target_uniqueness": ("group",)},
    {"a_len": (2,), "target_uniqueness": ("group",)},
    # Tails as a global function of the first character: 36 tail facts instead of D.
    {"tails": ("by_first_char",), "target_uniqueness": ("group",)},
    # z before B: the selector cannot be read at the answer with B's help before B arrives.
    {"order": ("zb",)},
    {"a_len": (1,), "target_uniqueness": ("group",), "order": ("zb",)},
    {"tails": ("by_first_char",), "target_uniqueness": ("group",), "order": ("zb",)},
    # Private selectors: z is no longer one shared code; the conditional costs D facts like the marginal.
    {"selectors": ("private",)},
    # The (B) -> A control: the price of the marginal alone.
    {"no_z": (True,)},
    {"no_z": (True,), "a_len": (1,), "target_uniqueness": ("group",)},
)

# The second search (issue 20): the same ci setting, variants whose marginal is carried by a cheap,
# shared feature. A pool of M targets makes the global marginal uniform over M strings (worth
# log(36^4 / M) nats of set loss); Zipf first characters make the first character's marginal worth
# learning. The pool's draws may share a first character, so its control is the paper's task with
# that option too.
_MARGINAL_VARIANTS_2: tuple[dict[str, tuple], ...] = (
    {"distinct_first_char": (False,)},  # the control: the paper's task, first characters may repeat
    *({"target_pool": (m,), "target_uniqueness": ("group",), "distinct_first_char": (False,)} for m in (20, 50, 200)),
    {"first_char_zipf": (1.0,)},
)


def _intervention_grids(seeds: range, hide_at: tuple[float, ...], only_heads: tuple[str, ...]
                        ) -> tuple[dict[str, tuple], ...]:
    """Per seed (model and data seed together): the unmodified run and each intervention relative to it.
    Ordered by cost over all seeds, so a sweep stopped early has the sharpest contrast over every
    seed: the unmodified runs, the routing or the readout given (the shortest runs), the routing
    given frozen, the hidden cue (the longest: many never reach tau), then the single routes."""
    seeds_of = [{"seed": (i,), "data_seed": (i,)} for i in seeds]
    grids = [*seeds_of, *({**s, "transplant": ("routing", "readout")} for s in seeds_of),
             *({**s, "transplant": ("routing",), "freeze_transplant": (True,)} for s in seeds_of),
             *({**s, "hide_cue_at": hide_at} for s in seeds_of)]
    grids += [{**s, "only_head": only_heads} for s in seeds_of if only_heads]
    return tuple(grids)


# The paper's noise grid (issue 20): the demo model on the paper's data (n_b 1,000, K 10), batch sizes at
# lr 1e-3 and learning rates at batch 128, 3 seeds (model and data seed together), stopped at 1.3 tau.
# Seed ensembles do not pay on a CPU (training.ensemble: an ensemble step costs the members' solo
# steps), so the runs train as solo jobs, two at a time on one thread each. Evaluation every 50 steps
# reads tau to 50 steps (1-3% of tau).
_NOISE_GRID = {"stop_after_tau": 1.3, "eval_every": 50, "ckpt_every": 100, "max_steps": 12000}


def _noise_grids(seeds: range, batches: tuple[int, ...], lrs: tuple[float, ...]) -> tuple[dict[str, tuple], ...]:
    """The batch sizes at the first learning rate and the other learning rates at the first batch size
    (the centre point, first in both, trains once), ordered so that a sweep stopped early has the most
    to say: the centre and the extreme values over the first two seeds, then the middle values over
    those seeds, then the other seeds."""
    def ends(xs: tuple) -> tuple:
        return tuple(x for x in xs if x in (min(xs), max(xs)))

    def blocks(seed: int, bs: tuple, lr: tuple) -> list[dict[str, tuple]]:
        s = {"seed": (seed,), "data_seed": (seed,)}
        return [{"batch_size": bs, "lr": lrs[:1], **s}, {"batch_size": batches[:1], "lr": lr, **s}]

    outer = (batches[:1] + ends(batches[1:]), ends(lrs[1:]))
    middle = (tuple(b for b in batches[1:] if b not in outer[0]), tuple(x for x in lrs[1:] if x not in outer[1]))
    first, rest = seeds[:2], seeds[2:]
    grids = [g for i in first for g in blocks(i, *outer)] + [g for i in first for g in blocks(i, *middle)]
    grids += [g for i in rest for g in blocks(i, outer[0] + middle[0], outer[1] + middle[1])]
    return tuple(g for g in grids if g["batch_size"] and g["lr"])


# What the plateau waits for (issue 19): each seed's own run, its tau_0 and its last checkpoint (the
# donor, after the drop), then the interventions relative to it. Run as a sweep, the unmodified
# runs train first; their names are those of seeds-ci, so a copy of seeds-ci's runs is reused.
_HIDE_AT = (0.25, 0.5, 0.75, 1.0)

SWEEPS: dict[str, SweepSpec] = {s.name: s for s in [
    SweepSpec(
        name="quick-k", base="ci", fixed=_QUICK,
        grids=({"K": (3,), "D": (_K_D_QUICK,), "seed": (0, 1, 2)},
               {"K": (10,), "D": (_K_D_QUICK,), "seed": (0, 1, 2)},
               # K = 36 scores 36 x 36 candidates per evaluation group: fewer groups keep evaluation cheap.
               {"K": (36,), "D": (_K_D_QUICK,), "eval_groups": (4,), "seed": (0, 1, 2)}),
        description="tau against K at fixed D = 5,040 (K = 3, 10, 36): the paper finds no dependence",
        cost="~14k steps, 5.6 min on 2 cores (measured)"),
    SweepSpec(
        name="induction-seeds", base="induction", fixed={},
        grids=({"seed": (0, 1, 2)},),
        description="the induction preset over 3 seeds: tau, the induction and previous-token heads' t_form and lead",
        cost="~2k steps, about 2 min on 2 cores, analysis about 2.5 min (measured)"),
    SweepSpec(
        name="quick-d", base="ci", fixed=_QUICK,
        grids=({"K": (10,), "D": (2000, 3000, 5000, 8000), "seed": (0, 1, 2)},),
        description="the scaling law tau ~ D^alpha at K = 10 (the paper: alpha = 1.19)",
        cost="~16k steps, 5.4 min on 2 cores (measured)"),
    SweepSpec(
        name="quick-noise", base="ci", fixed=_QUICK,
        grids=({"D": (3000,), "batch_size": (32, 64, 128, 256), "seed": (0, 1)},
               {"D": (3000,), "lr": (3e-4, 1e-3, 3e-3, 5e-3), "seed": (0, 1)}),
        description="gradient noise: tau in tokens against batch size, tau against learning rate (D = 3,000)",
        cost="~20k steps (small batches are cheap steps), ~8 min on 2 cores"),
    SweepSpec(
        # 2.5 tau: the backward runs also reach 50% exact match, the metric both directions share.
        name="quick-direction", base="ci", fixed={**_QUICK, "stop_after_tau": 2.5},
        grids=({"D": (2000, 3000), "direction": ("backward", "forward"), "seed": (0, 1)},),
        description="forward A -> B against backward (B, z) -> A at matched D (the paper: forward 1.7-4.4x slower)",
        cost="~15k steps (forward runs may hit max_steps = 6,000), ~8 min on 2 cores (estimated)"),
    SweepSpec(
        name="paper-k", base="paper", fixed={**_PAPER, "max_steps": 10000},
        grids=({"K": (3,), "D": (_K_D_PAPER,), "seed": (0, 1, 2, 3, 4)},
               {"K": (10,), "D": (_K_D_PAPER,), "seed": (0, 1, 2, 3, 4)},
               {"K": (36,), "D": (_K_D_PAPER,), "eval_groups": (4,), "seed": (0, 1, 2, 3, 4)}),
        description="the paper's K = 3, 10, 36 at fixed D = 10,080, its model, 5 seeds",
        cost="~32k steps, ~1 CPU-hour (about 50 min on 2 cores)"),
    SweepSpec(
        name="paper-d", base="paper", fixed={**_PAPER, "max_steps": 20000},
        grids=({"K": (10,), "D": (2500, 5000, 10000, 20000, 40000), "seed": (0, 1, 2, 3, 4)},),
        description="the paper's scaling law: a D ladder from 2,500 to 40,000 at K = 10, 5 seeds",
        cost="~100k steps (tau ~ 7,000 at D = 40,000), ~2.5 h on 2 cores"),
    SweepSpec(
        name="paper-noise", base="paper", fixed={**_PAPER, "max_steps": 30000},
        grids=({"D": (10000,), "batch_size": (32, 64, 128, 256), "seed": (0, 1, 2)},
               {"D": (10000,), "lr": (3e-4, 1e-3, 2e-3, 3e-3, 5e-3), "seed": (0, 1, 2)}),
        description="the paper's batch sizes (32-256) and learning rates (3e-4 to 5e-3) at D = 10,000, 3 seeds",
        cost="~150k steps (batch 32 needs ~4x the steps of 128), ~3 h on 2 cores"),
    SweepSpec(
        name="paper-noise-grid", base="demo", fixed=_NOISE_GRID, grids=_noise_grids(range(3), (128, 32, 256, 64), (1e-3, 4e-3, 5e-4, 2e-3)),
        description="the paper's noise claims on the demo model (n_b 1,000, K 10): batch 32-256 at lr 1e-3, "
                    "lr 5e-4 to 4e-3 at batch 128, 3 seeds, stopped at 1.3 tau",
        cost="21 runs of the paper model (7 points x 3 seeds); more than 150 min on 2 cores of an Intel Xeon "
             "without VNNI (measured: bench/sweep_budget.py; batch 32 takes ~24 run-minutes, lr 4e-3 sits on "
             "the plateau for 5,000+ steps)"),
    SweepSpec(
        name="paper-noise-grid-tiny", base="tiny",
        fixed={"stop_after_tau": 1.3, "max_steps": 1500, "eval_every": 10, "ckpt_every": 50, "D": 160},
        grids=_noise_grids(range(2), (32, 16), (3e-3, 6e-3)),
        description="machinery check of paper-noise-grid: the 1-layer tiny model, batch 16 and 32, lr 3e-3 and 6e-3, 2 seeds",
        cost="6 runs, ~2k steps, ~15 s on 2 cores (estimated)"),
    SweepSpec(
        name="paper-direction", base="paper", fixed={**_PAPER, "max_steps": 20000},
        grids=({"D": (2500, 5000, 10000), "direction": ("backward", "forward"), "seed": (0, 1, 2)},),
        description="forward A -> B against backward (B, z) -> A at D = 2,500, 5,000 and 10,000, 3 seeds",
        cost="~80k steps (forward up to ~4x backward), ~2 h on 2 cores"),
    SweepSpec(
        # Each block is one hypothesis about what keeps the marginal from coming first (see _MARGINAL).
        name="marginal-search", base="ci", fixed=_MARGINAL,
        grids=tuple({**variant, "seed": (0, 1, 2)} for variant in _MARGINAL_VARIANTS),
        description="task variants (short A, tails by first character, z before B, private selectors, "
                    "the no-z control, and pairs): which plateau - marginal or know-nothing shelf - each has",
        cost="30 runs (10 variants x 3 seeds), 40-90k steps; <= ~35 min on 2 quiet cores (estimated, "
             "not run: see the comment above _MARGINAL)"),
    SweepSpec(
        name="marginal-search-tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 300, "eval_every": 10, "ckpt_every": 50},
        grids=tuple({**variant, "seed": (0, 1)} for variant in _MARGINAL_VARIANTS),
        description="machinery check of marginal-search: the same variants on the 1-layer tiny model, 2 seeds",
        cost="20 runs, ~5k steps, ~1 min on 2 cores"),
    SweepSpec(
        name="marginal-search-2", base="ci", fixed=_MARGINAL,
        grids=tuple({**variant, "seed": (0, 1, 2)} for variant in _MARGINAL_VARIANTS_2),
        description="task variants with a cheap marginal (a shared pool of M = 20, 50, 200 targets; Zipf "
                    "first characters) and their control: is there a marginal stage before the drop?",
        cost="15 runs (5 variants x 3 seeds) of <= 3,000 steps (estimated)"),
    SweepSpec(
        name="marginal-search-2-tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 300, "eval_every": 10, "ckpt_every": 50},
        grids=tuple({**variant, "seed": (0,)} for variant in _MARGINAL_VARIANTS_2),
        description="machinery check of marginal-search-2: the same variants on the 1-layer tiny model, 1 seed",
        cost="5 runs, ~1.5k steps, ~20 s on 2 cores (estimated)"),
    SweepSpec(
        name="seeds-ci", base="ci", grids=_SEEDS,
        description="5 seeds of the ci preset (model and data seed varied): the lead and the circuit over seeds",
        cost="5 runs of ~1,300 steps, ~1 min each on 2 cores"),
    SweepSpec(
        name="seeds-demo", base="demo", grids=_SEEDS,
        description="5 seeds of the demo preset (model and data seed varied): the lead and the circuit over seeds",
        cost="5 runs of ~2,100 steps (1.5 tau), ~3 min each on 2 cores (estimated)"),
    SweepSpec(
        name="plateau-interventions", base="ci", fixed={"forward": "trimmed"},
        grids=_intervention_grids(range(5), _HIDE_AT, ("0.0", "0.1", "0.2", "0.3")),
        description="what the plateau waits for: the cue hidden until S = 0.25-1 tau_0, the routing or the "
                    "readout given (trained or frozen), one route in layer 0; ci, 5 seeds",
        cost="60 runs (5 unmodified, 55 interventions; ~1-2.5 tau_0 each), 105,425 steps: 28.1 min on 2 cores, "
             "2 workers (measured, AMD EPYC with AVX-512; 96 min on an Intel Xeon without VNNI, fused)"),
    SweepSpec(
        name="plateau-interventions-demo", base="demo",
        fixed={"forward": "trimmed"},
        grids=_intervention_grids(range(3), (0.5,), ()),
        description="the main contrasts of plateau-interventions on the demo model: the cue hidden until "
                    "0.5 tau_0, the routing or the readout given; 3 seeds",
        cost="15 runs of the paper model, 33,200 steps: 38.7 min on 2 cores, 2 workers (measured, AMD EPYC "
             "with AVX-512)"),
    SweepSpec(
        name="plateau-interventions-tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 600, "eval_every": 10, "ckpt_every": 10, "D": 80},
        grids=_intervention_grids(range(2), (0.5, 1.0), ("0.0",)),
        description="machinery check of plateau-interventions on the 1-layer tiny model, 2 seeds",
        cost="14 runs of ~60-300 steps, ~1 min on 2 cores (estimated)"),
    SweepSpec(
        name="tiny", base="tiny",
        fixed={"lr": 3e-3, "stop_after_tau": 1.5, "max_steps": 600, "eval_every": 10, "ckpt_every": 10},
        grids=({"D": (80, 160, 320), "seed": (0, 1)},),
        description="machinery check: a 1-layer d_model 32 model whose tau (~60-350 steps) still grows with D",
        cost="~1.5k steps, ~15 s on 2 cores"),
]}


def get_sweep(name: str) -> SweepSpec:
    """The named shipped sweep, or a one-line ConfigError naming the choices."""
    if name not in SWEEPS:
        raise ConfigError(f"unknown sweep preset {name!r}; choose one of {', '.join(SWEEPS)}")
    return SWEEPS[name]


# ---- command line -------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def _parse_assignment(text: str, flag: str) -> tuple[str, list[Any]]:
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ConfigError(f"{flag} expects KEY=VALUE[,VALUE...], got {text!r}")
    return key.strip(), [_parse_value(v.strip()) for v in values.split(",")]


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The sweep a command line asks for: a shipped preset, or ``--base`` with ``--grid``/``--set``."""
    if args.preset and (args.grid or args.base):
        raise ConfigError("give either --preset or --base/--grid, not both")
    if args.preset:
        spec = get_sweep(args.preset)
    elif args.grid:
        get_preset(args.base or "ci")
        grid = dict(_parse_assignment(g, "--grid") for g in args.grid)
        spec = SweepSpec(name="custom", base=args.base or "ci", grids=({k: tuple(v) for k, v in grid.items()},),
                         description="a grid given on the command line")
    else:
        raise ConfigError("give --preset NAME (see --list) or --grid KEY=V1,V2 [--base PRESET]")
    extra = {}
    for s in args.set or []:
        key, values = _parse_assignment(s, "--set")
        if len(values) != 1:
            raise ConfigError(f"--set {s!r}: one value only (use --grid for several)")
        extra[key] = values[0]
    if extra:
        spec = SweepSpec(spec.name, spec.base, spec.grids, {**spec.fixed, **extra}, spec.description, spec.cost)
    return spec


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m training.sweep``."""
    p = argparse.ArgumentParser(prog="python -m training.sweep", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Then: python -m interp.dynamics --sweep OUT")
    p.add_argument("--list", action="store_true", help="list the shipped sweeps with their expected cost, and exit")
    p.add_argument("--preset", help="a shipped sweep (see --list)")
    p.add_argument("--base", help="with --grid: the run preset every point starts from (default ci)")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2", help="an axis of a custom grid (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="an option for every point (repeatable)")
    p.add_argument("--seeds", help="comma-separated seeds replacing the sweep's seed axis, e.g. 0,1,2")
    p.add_argument("--out", type=Path, help="sweep directory (default sweeps/<name>)")
    p.add_argument("--executor", default="local", choices=EXECUTORS, help="where the runs train (default local)")
    p.add_argument("--workers", type=int, help="parallel jobs (default: the cores; slurm: array parallelism)")
    p.add_argument("--threads", type=int, help="torch threads per job (default: cores // workers)")
    p.add_argument("--ensemble", action="store_true",
                   help="train the seeds of each configuration as one vectorised model")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--dry-run", action="store_true", help="print the points and what is left to train, and exit")
    p.add_argument("--slurm-partition", help="slurm: partition")
    p.add_argument("--cpus-per-task", type=int, help="slurm: cores (and torch threads) per job (default 2)")
    p.add_argument("--timeout-min", type=int, default=240, help="submitit: time limit per job in minutes (default 240)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m training.sweep``: plan and train a sweep, one line per run."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for spec in SWEEPS.values():
            n = len(expand(spec))
            print(f"{spec.name:16s} {n:3d} runs  {spec.cost}\n{'':22s}{spec.description}")
        return 0
    try:
        spec = spec_from_args(args)
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        out = args.out or Path("sweeps") / spec.name
        if args.dry_run:
            for point in expand(spec, seeds):
                print(f"{'complete' if is_complete(out / point.name) else 'to train':9s} {out / point.name}")
            return 0
        slurm = {"partition": args.slurm_partition, "cpus_per_task": args.cpus_per_task,
                 "timeout_min": args.timeout_min}
        t0 = time.perf_counter()
        outcomes = run_sweep(spec, out, args.executor, args.workers, args.ensemble, seeds, args.device,
                             progress=not args.no_progress, slurm=slurm, threads=args.threads)
    except (ConfigError, rd.RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # --seeds that are not integers
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to resume the sweep in {out}", file=sys.stderr)
        return 130
    for o in outcomes:
        detail = o.get("error") or (f"tau {o.get('tau')}, {o.get('final_step')} steps, {o.get('seconds')} s"
                                    if o["status"] == "done" else "")
        print(f"{o['status']:8s} {o['name']:40s} {detail}")
    failed = sum(o["status"] == "failed" for o in outcomes)
    print(f"sweep {spec.name} in {out}: {len(outcomes) - failed} of {len(outcomes)} runs complete "
          f"({time.perf_counter() - t0:.0f} s); next: python -m interp.dynamics --sweep {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops the workers as Ctrl-C does
    sys.exit(main())
