"""A sweep directory read into one row per run: its options, its taus at three thresholds, its plateau,
its lead fractions and its collective-snap statistics (the CSV table of ``plateauscope dynamics``)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plateauscope.analysis.formation import RULES
from plateauscope.analysis.results import read_routing_summary
from plateauscope.analysis.snap import snap_statistics
from plateauscope.analysis.summary import stated_routing
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import has_interventions
from plateauscope.runs.metrics import MARGINAL_REL, compute_tau
from plateauscope.runs.run import MANIFEST_FILE, Run, RunError
from plateauscope.tasks.base import ProgressMeasure

THRESHOLDS: tuple[float, ...] = (0.3, 0.5, 0.7)
"""Where tau is read off, in units of log K (0.5 is tau; forward runs: exact-match accuracy)."""


EXACT_MATCH = ProgressMeasure("accuracy", 1.0, falls=False, label="exact-match accuracy")
"""The measure both directions share: t_acc50 is the first step above 50% exact match."""


FACTORS: tuple[str, ...] = ("direction", "preset", "D", "K", "lr", "batch_size")
"""What defines a configuration, besides the seed: runs equal in all but one form a family."""


def tau_key(threshold: float) -> str:
    """The row field of tau read off at ``threshold`` x log K."""
    return f"tau@{threshold:g}"


@dataclass
class Sweep:
    """A sweep directory read into one row per run (and each backward run's loss curve)."""

    path: Path
    name: str
    rows: list[dict[str, Any]]
    curves: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    """Backward runs: ``name -> (steps, candidate loss / log K)``."""


def run_row(run: Run, name: str) -> dict[str, Any]:
    """One run's row: its factors, taus, tokens, plateau, lead fraction and snap statistics."""
    cfg = run.config
    metrics = run.metrics()
    summary = run.summary or {}
    # the selector task's factors; another task's runs are told apart by its name (no D / K fits)
    direction, progress = getattr(cfg.task, "direction", cfg.task_name), run.progress
    log_k = progress.height
    taus = {t: compute_tau(metrics, progress, t) for t in THRESHOLDS}
    tau = taus[0.5]
    tokens_per_step = cfg.train.batch_size * run.task().tokens_per_example()
    snap = snap_statistics(metrics, tau)
    stretch = run.plateau_stretch()
    routing = read_routing_summary(run.path) or {}
    stated = stated_routing(routing)
    layers = {la for la, _ in stated.heads} if stated is not None else set()  # the routing's layers
    rules = routing.get("t_form_rules") or {}
    circuit = routing.get("circuit") or {}
    plateau = run.plateau() or {}
    t_m = plateau.get("t_marginal")
    return {
        "name": name, "direction": direction, "preset": cfg.preset, "D": len(run.task().tokens),
        "K": getattr(cfg.task, "K", None), "n_b": getattr(cfg.task, "n_b", None), "lr": cfg.train.lr, "batch_size": cfg.train.batch_size, "seed": cfg.train.seed,
        "complete": bool(summary.get("complete")), "final_step": metrics[-1]["step"] if metrics else None,
        "tau": tau, **{tau_key(t): v for t, v in taus.items()},
        "tokens_per_step": tokens_per_step, "tau_tokens": tau * tokens_per_step if tau is not None else None,
        "t_acc50": compute_tau(metrics, EXACT_MATCH, 0.5),
        "plateau_start": stretch[0] if stretch else None, "plateau_end": stretch[1] if stretch else None,
        "lead_fraction": stated.lead_fraction if stated is not None else None,
        **{f"lead_{rule}": (rules.get(rule) or {}).get("lead_fraction") for rule in RULES},
        # the named routing head, or where no single head is named the routing group (L0H2+L0H1); none else
        "routing_head": "+".join(stated.labels) if stated is not None else None,
        "routing_layer": min(layers) if len(layers) == 1 else None,
        "circuit": circuit.get("verdict"), "circuit_heads": " ".join(circuit.get("heads") or []) or None,
        "model": f"{cfg.model.n_layers}L d{cfg.model.d_model}", "variant": cfg.task.variant_label() if hasattr(cfg.task, "variant_label") else "default",
        "verdict": plateau.get("verdict"), "t_marginal": t_m,
        "t_marginal_over_tau": t_m / tau if t_m is not None and tau else None,
        "plateau_share": (stretch[1] - stretch[0]) / tau if stretch and tau else None,  # the longest in-band stretch
        "marginal_share": (plateau.get("share") or {}).get("marginal"),
        "first_token_set_loss_plateau": plateau.get("median_first_token_set_loss"),
        "set_loss_plateau": plateau.get("median_set_loss"),
        "marginal_stage_tau": marginal_stage(metrics, log_k, tau),
        "t_global_marginal": plateau.get("t_global_marginal"),
        "global_marginal_set_loss": (plateau.get("global_marginal") or {}).get("set_loss"),
        "global_marginal_first_token": (plateau.get("global_marginal") or {}).get("first_token_set_loss"),
        "global_marginal_stage_tau": marginal_stage(metrics, log_k, tau, below=plateau["global_marginal_threshold"])
        if plateau.get("global_marginal_threshold") is not None else None,
        "snap_groups": snap["n_groups"], "snap_share_at_half_tau": snap["share_above_at_half_tau"],
        "snap_window_tau": snap["snap_window_tau"], "snap_spread_tau": snap["snap_spread_tau"],
        "snap_snapped": snap["n_snapped"], "intervention": has_interventions(cfg.train),
    }


def marginal_stage(records: list[dict], log_k: float, tau: int | None, rel: float = 0.1,
                   below: float | None = None) -> float | None:
    """Length, in units of tau, of the longest run of consecutive evaluations before tau with set loss
    below ``below`` (default ``MARGINAL_REL`` log K: the marginal; the plateau block's
    ``global_marginal_threshold`` for the global marginal) and candidate loss within ``rel`` log K of
    log K (None without tau)."""
    below = MARGINAL_REL * log_k if below is None else below
    if not tau:
        return None
    best, start = 0.0, None
    for r in records:
        if r["step"] >= tau or r.get("set_loss") is None or r.get("candidate_loss") is None:
            break
        ok = r["set_loss"] < below and abs(r["candidate_loss"] - log_k) <= rel * log_k
        if ok:
            start = r["step"] if start is None else start
            best = max(best, (r["step"] - start) / tau)
        else:
            start = None
    return best


def sweep_runs(sweep_dir: str | Path) -> tuple[str, list[str]]:
    """A sweep's name and its run names (the points of ``sweep.json``, or every run directory in it)."""
    path = Path(sweep_dir)
    if not path.is_dir():
        raise RunError(f"{path}: no such sweep directory")
    if (path / MANIFEST_FILE).exists():
        manifest = rd.read_json(path / MANIFEST_FILE)
        return manifest.get("sweep", path.name), [p["name"] for p in manifest.get("points", [])]
    return path.name, sorted(p.name for p in path.iterdir() if (p / rd.CONFIG_FILE).exists())


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Every run of a sweep directory (the points of ``sweep.json``, or every run directory in it)."""
    path = Path(sweep_dir)
    name, names = sweep_runs(path)
    sweep = Sweep(path, name, [])
    for run_name in names:
        if not (path / run_name / rd.METRICS_FILE).exists():
            continue  # not started yet
        run = Run(path / run_name)
        sweep.rows.append(run_row(run, run_name))
        tau = sweep.rows[-1]["tau"]
        if tau and run.progress.falls:
            key = run.progress.key
            rec = [r for r in run.metrics() if r.get(key) is not None]
            sweep.curves[run_name] = ([r["step"] for r in rec], [r[key] / run.log_k for r in rec])
    if not sweep.rows:
        raise RunError(f"{path}: no runs with metrics (train them with plateauscope sweep)")
    sweep.rows.sort(key=lambda r: (r["direction"], str(r["preset"]), r["K"], r["D"], r["lr"], r["batch_size"],
                                   r["seed"]))
    return sweep


def table_csv(rows: list[dict]) -> str:
    """The per-run table as CSV text (every field of the rows)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
