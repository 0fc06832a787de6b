"""Graft bisection: when is a part of the model causally ready?

    plateauscope graft --run RUN --part layer0 [--criterion 0.5]

The observational t_form says when a head's attention looks ready. A graft asks the model: take
the part (:data:`plateauscope.runs.interventions.PARTS`: the embeddings, a layer, a head's QK
or OV) from the run's checkpoint at step c, put it into the run's own step-0 weights, and train.
The part *suffices* at c when the grafted run's tau is at most ``criterion * tau_0``, tau_0 the
run's own. Each trial stops as soon as that is settled: at its tau, or at ``criterion * tau_0``
steps without one.

Assuming a part that suffices at c suffices at every later checkpoint, :func:`bisect_boundary`
finds the earliest such checkpoint among the run's N in at most ``ceil(log2 N) + 1`` trials (the
last checkpoint first: a part that never suffices is said so after one trial). The boundary is
known to within one checkpoint interval: the last failing checkpoint and the first sufficient one.
Each trial is a run directory under the bisection's folder; a bisection run again reuses the
trials that finished and resumes an interrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plateauscope.analysis.formation import RULES
from plateauscope.analysis.intervals import median_interval
from plateauscope.analysis.results import median, read_routing_summary
from plateauscope.errors import ConfigError
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import check_part
from plateauscope.training.train import train

GRAFT_FILE = "graft.json"
"""The bisection's result, in its folder."""


@dataclass(frozen=True)
class Boundary:
    """Where a monotone test over candidates ``0 .. n - 1`` turns from failing to passing."""

    first_passing: int | None
    """The earliest candidate that passes (None: not even the last one)."""
    last_failing: int | None
    """The latest candidate that fails (None: the first one passes)."""
    tried: dict[int, bool]
    """Every candidate tested, with its result, in the order tested."""


def bisect_boundary(n: int, passes: Callable[[int], bool]) -> Boundary:
    """The boundary of a test that fails before some candidate and passes from it on, in at most
    ``ceil(log2 n) + 1`` calls of ``passes``: the last candidate, then halving."""
    if n < 1:
        raise ValueError("bisect_boundary needs at least one candidate")
    tried: dict[int, bool] = {}

    def test(i: int) -> bool:
        if i not in tried:
            tried[i] = bool(passes(i))
        return tried[i]

    if not test(n - 1):
        return Boundary(None, n - 1, tried)
    failing, passing = -1, n - 1  # -1: before the first candidate
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if test(middle):
            passing = middle
        else:
            failing = middle
    return Boundary(passing, failing if failing >= 0 else None, tried)


def max_trials(n: int) -> int:
    """The most trials :func:`bisect_boundary` takes over ``n`` candidates."""
    return math.ceil(math.log2(n)) + 1 if n > 1 else 1


GRAFTS_DIR = "grafts"
"""The folder of a run directory that holds its bisections."""


def bisection_dir(run_dir: Path, part: str, criterion: float) -> Path:
    """Where a bisection's trials go: ``RUN/grafts/<part>_criterion<c>`` (``0.1:qk`` -> ``0.1-qk``). The
    criterion sets each trial's length, so trials of another criterion are never reused."""
    return run_dir / GRAFTS_DIR / f"{part.replace(':', '-')}_criterion{criterion:g}"


def graft_trial(run: rd.Run, step: int, part: str, criterion: float, tau_0: int, out: Path) -> dict[str, Any]:
    """Train the run's own step-0 weights with ``part`` from its checkpoint at ``step`` for at most
    ``criterion * tau_0`` steps, stopping at tau; the trial's record (reused when it finished before)."""
    budget = max(1, math.floor(criterion * tau_0))
    cfg = run.config.replace(transplant=part, donor=str(run.checkpoint_path(step).resolve()),
                             freeze_transplant=False, max_steps=budget, stop_after_tau=1.0,
                             ckpt_every=budget, early_log_points=0, checkpoints="dense")
    trial_dir = out / f"step_{step:06d}"
    summary = rd.read_json(trial_dir / rd.SUMMARY_FILE) if (trial_dir / rd.SUMMARY_FILE).exists() else None
    if summary is None:
        summary = train(cfg, trial_dir, resume=(trial_dir / rd.CONFIG_FILE).exists(), device="cpu", progress=False)
    tau = summary.get("tau")
    return {"step": step, "tau": tau, "tau_over_tau_0": tau / tau_0 if tau is not None else None,
            "steps_trained": summary.get("final_step"), "passes": tau is not None and tau <= criterion * tau_0}


def graft_bisection(run_dir: str | Path, part: str, criterion: float = 0.5, out: str | Path | None = None,
                    on_trial: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """The earliest checkpoint of a run whose ``part`` suffices (module docstring); written to
    ``out/graft.json`` (default :func:`bisection_dir`) and returned. ``on_trial`` sees each trial's record."""
    run = rd.trained_run(run_dir, "grafting (it retrains from a checkpoint)")
    if not 0 < criterion <= 1:
        raise ConfigError(f"--criterion must lie in (0, 1] (the grafted tau as a fraction of tau_0), got {criterion}")
    check_part(part, run.config.model.n_layers, run.config.model.n_heads)
    summary = run.summary
    if not summary or not summary.get("complete"):
        raise ConfigError(f"{run.path}: the run is not complete; train it to the end first")
    tau_0 = summary.get("tau")
    if tau_0 is None:
        raise ConfigError(f"{run.path}: the run never reached tau, so there is no tau_0 to shorten")
    steps = run.steps
    folder = Path(out) if out is not None else bisection_dir(run.path, part, criterion)
    trials: list[dict] = []

    def passes(i: int) -> bool:
        record = graft_trial(run, steps[i], part, criterion, tau_0, folder)
        trials.append(record)
        if on_trial is not None:
            on_trial(record)
        return record["passes"]

    boundary = bisect_boundary(len(steps), passes)
    first = steps[boundary.first_passing] if boundary.first_passing is not None else None
    last_failing = steps[boundary.last_failing] if boundary.last_failing is not None else None
    rules = (read_routing_summary(run.path) or {}).get("t_form_rules") or {}
    result = {
        "run": str(run.path), "part": part, "criterion": criterion, "tau_0": tau_0,
        "candidates": len(steps), "max_trials": max_trials(len(steps)), "trials": trials,
        "first_sufficient_step": first, "last_insufficient_step": last_failing,
        "boundary_over_tau_0": first / tau_0 if first is not None else None,
        "t_form": {rule: (rules.get(rule) or {}).get("t_form") for rule in RULES},
    }
    rd.write_json_atomic(folder / GRAFT_FILE, result)
    return result


def boundary_table(results: list[dict]) -> list[dict[str, Any]]:
    """Over seeds (one bisection per seed's run): the graft boundary and each rule's observational
    t_form as fractions of tau_0, their medians with the order-statistic interval of the median, and
    the paired difference t_form - boundary (positive: the attention looked ready before it sufficed)."""
    rows = []
    boundaries = [r["boundary_over_tau_0"] for r in results if r["boundary_over_tau_0"] is not None]
    rows.append({"signal": f"graft boundary ({results[0]['part']})" if results else "graft boundary",
                 "n": len(boundaries), "median": median(boundaries), "interval": median_interval(boundaries)})
    for rule in RULES:
        t_forms = [r["t_form"][rule] / r["tau_0"] for r in results if r["t_form"].get(rule) is not None]
        gaps = [r["t_form"][rule] / r["tau_0"] - r["boundary_over_tau_0"] for r in results
                if r["t_form"].get(rule) is not None and r["boundary_over_tau_0"] is not None]
        rows.append({"signal": f"t_form ({rule})", "n": len(t_forms), "median": median(t_forms),
                     "interval": median_interval(t_forms), "gap_median": median(gaps),
                     "gap_interval": median_interval(gaps)})
    return rows

