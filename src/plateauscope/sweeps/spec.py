"""Sweeps: a named grid over run options, one run directory per point, and ``plateauscope sweep``.

    plateauscope sweep --list
    plateauscope sweep --preset quick-d --out sweeps/quick-d [--executor local|serial|submitit-local|slurm]
                             [--workers N] [--ensemble] [--seeds 0,1,2]
    plateauscope sweep --base ci --grid K=3,10,36 --grid seed=0,1 --set n_b=504 --out sweeps/mine

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
    <run name>/    one run directory per point (the ``plateauscope.runs.run`` layout), named by its
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
vectorised model (``plateauscope.training.ensemble``); every member still writes its own run directory.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plateauscope.errors import ConfigError
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.interventions import INTERVENTION_OPTIONS, has_interventions, top_head
from plateauscope.runs.presets import get_preset

EXECUTORS: tuple[str, ...] = ("local", "serial", "submitit-local", "slurm")

# How each option appears in a run directory's name, and in which order (others: alphabetical, before seed).
_NAME_ORDER: tuple[str, ...] = ("preset", "direction", "K", "D", "n_b", "lr", "batch_size")
_NAME_ALIAS: dict[str, str] = {"preset": "", "direction": "", "n_b": "nb", "batch_size": "bs", "max_steps": "steps",
                               "target_uniqueness": "uniq", "tails": "tails_", "order": "order_",
                               "selectors": "sel_",
                               "eval_groups": "eg", "stop_after_tau": "stop", "weight_decay": "wd",
                               "data_seed": "ds", "hide_cue_at": "hide", "transplant": "give_",
                               "freeze_transplant": "frozen", "only_head": "only", "clamp_head_of": "clamp_",
                               "clamp_layer": "clamplayer", "clamp_strength": "a"}


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
    """Expected cost in runs and steps (the time per step is machine-dependent: see bench/sweep_budget.py)."""


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
    return f"{v:g}" if isinstance(v, float) else str(v).replace(" ", "-")


def run_name(options: dict[str, Any]) -> str:
    """A run directory's name from its options, e.g. ``backward_K10_D5000_seed0``."""
    rest = sorted(k for k in options if k not in _NAME_ORDER and k != "seed")
    keys = [k for k in _NAME_ORDER if k in options] + rest + (["seed"] if "seed" in options else [])
    return "_".join(f"{_NAME_ALIAS.get(k, k)}{_format_value(options[k])}" for k in keys) or "run"


RELATIVE_OPTIONS: dict[str, str] = {
    "hide_cue_at": "hide_cue_until = this fraction of the baseline run's tau (at least 1 step)",
    "transplant": "without a donor, the donor is the baseline run's last checkpoint",
    "clamp_head_of": "clamp_heads = the baseline run's head with the most attention by this rule of the task "
                     "at its last checkpoint, clamped to that rule; 'routing': the routing head of the baseline's "
                     "analysis (plateauscope analyze), clamped to the cue",
}
# (``only_head="L.H"`` and ``clamp_layer=L`` are resolved without a baseline: every other head of layer L
# masked; every head of layer L clamped.)
"""Point options resolved from the point's baseline run once it has trained (interventions relative
to each seed's own run, ``plateauscope.runs.interventions``)."""


def _is_relative(options: dict[str, Any]) -> bool:
    return "hide_cue_at" in options or "clamp_head_of" in options or ("transplant" in options and "donor" not in options)


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
        options["donor"] = str(base.checkpoint_path(base.steps[-1]).resolve())
    if options.get("clamp_head_of") == "routing":  # the routing head of the baseline's analysis, clamped to the cue
        summary = base_dir / rd.ANALYSIS_DIR / rd.ROUTING_FILE
        if not summary.exists():
            raise ConfigError(f"{point.name}: clamp_head_of=routing reads its baseline's routing head; "
                              f"run plateauscope analyze --run {base_dir} first, then the sweep again")
        layer, head = rd.read_json(summary)["head"]
        options.pop("clamp_head_of")
        options.update(clamp_heads=(f"{layer}.{head}",), clamp_rule="cue")
    elif "clamp_head_of" in options:
        base = rd.Run(base_dir)
        rule = options.pop("clamp_head_of")
        options.update(clamp_heads=(top_head(base.model(base.steps[-1]), base.task(), rule),), clamp_rule=rule)
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
    clamp_layer = merged.pop("clamp_layer", None)
    if clamp_layer is not None:  # every head of that layer clamped
        merged["clamp_heads"] = tuple(f"{clamp_layer}.{h}" for h in range(cfg.model.n_heads))
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


