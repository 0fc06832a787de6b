"""The paper's dynamics from a sweep directory: one row per run, and the fits across runs.

    plateauscope dynamics --sweep DIR [--analyze [--every 10]] [--csv FILE] [--report]

(the command, the figures and the page are ``plateauscope.views.sweep_report`` and ``plateauscope.views.sweep_figures``;
this module computes).

The table (``DIR/dynamics.csv`` and printed) has one row per run: its options, tau at the
thresholds 0.3 / 0.5 / 0.7 log K, tau in tokens, the plateau span, the lead fraction (when
``plateauscope analyze`` was run on it) and the collective-snap statistics. The fits, all
on log-log axes and all over the runs of one *family* (the runs that share every factor -
direction, preset, D, K, learning rate, batch size - except the one that varies and the seed;
the largest such family is used):

* scaling law: ``log tau = log c + alpha log D``, least squares over runs; alpha's 95% interval
  is the least-squares t interval (n - 2 degrees of freedom; none with fewer than 3 runs). The
  paper reports alpha = 1.19 (its code's fit: 1.194 [1.137, 1.308]).
* K-independence: the same fit with K in place of D at fixed D (slope ~0 in the paper).
* noise: mean tau *in tokens* (step x batch size x target tokens) and in steps per batch size, as a
  ratio to the largest batch (the paper: the smallest batch is 1.8x slower in tokens), and mean tau
  in steps per learning rate as a ratio to the smallest (the paper: monotone, up to 3.6x slower);
  ``trend`` says whether the means rise or fall monotonically with the factor. The means are
  geometric means over seeds; each has a t interval on logs and each ratio Welch's t interval on
  the log ratio (95% from 3 seeds up, the range of 2 seeds below: ``plateauscope.analysis.intervals``);
  ``plateauscope.dynamics.noise`` reads the paper's claims from them.
* collective snap, per run from the tracked groups' accuracies (``plateauscope.analysis.snap.snap_statistics``):
  the share of groups >= 80% accurate at tau/2 (the paper: 0 of 200) and the median snap
  window in units of tau (the paper: about 0.5); totals over the backward runs.
* directional asymmetry: mean tau(forward A -> B) / mean tau(backward (B, z) -> A) for runs
  that differ only in direction. The two directions' own taus measure different things
  (candidate loss below 0.5 log K; exact-match accuracy above 50%), so the ratio is also
  given on one metric for both: the first step with exact-match accuracy above 50%
  (``t_acc50``). A forward run that never gets there makes the ratio a lower bound
  (its final step stands in, marked ``>=``). The paper: 1.7x to 4.4x.

* plateau kind, per task variant (``variant_table``, ``DIR/variants.csv``): one row per task
  variant (``TaskConfig.variant_label``) and model, over its seeds: the verdicts (``marginal``,
  ``global marginal``, ``shelf``, ``mixed``: ``plateauscope.training.metrics.plateau_verdict``), the plateau's
  median set loss and the variant's exact global-marginal reference, t_marginal (the first evaluated
  step with set loss < 0.1 log K), tau, t_marginal / tau, the plateau's share of tau, the plateau's
  median first-token set loss (with its global-marginal reference), and whether every seed has a
  *true marginal stage*: set loss below 0.1 log K while the candidate loss stays within 10% of
  log K, for at least 30% of tau; and the same test with the global marginal's threshold in place
  of 0.1 log K (where the global marginal is a kind of its own). Each number is the mean over seeds
  with the seed range [min, max]. A t_marginal / tau below 1 means the marginal came first.
* seeds (:func:`seed_summary`), over the runs analysed by ``plateauscope analyze`` (or
  ``--analyze``, which analyses every run of the sweep first): the median lead fraction by each
  t_form rule of ``plateauscope.analysis.formation`` (``attention``, ``patch_share``, ``cue_effect``) with
  the order-statistic interval of the median and the coverage it has at that n (75% at 3 runs), the
  selector head per seed and how many are in layer 0, and the circuit verdict
  per seed (``plateauscope.analysis.circuit``). All runs of the sweep are pooled: run it on one configuration
  over seeds (``plateauscope sweep --preset seeds-ci``).

Every fit is repeated with tau at the thresholds 0.3 and 0.7 log K (``sensitivity``), to show
how much a conclusion depends on where tau is read off. Signs: alpha > 0 means larger data
sets wait longer; a ratio > 1 means the named condition is slower.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plateauscope.analysis.results import median, na, read_routing_summary
from plateauscope.analysis.formation import RULES
from plateauscope.analysis.snap import SNAP_HI, snap_statistics
from plateauscope.cli.common import format_table
from plateauscope.analysis.intervals import (
    geometric_mean,
    geometric_mean_interval,
    median_interval,
    ratio_interval,
    slope_interval,
)
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.training import run as rd
from plateauscope.training.interventions import has_interventions
from plateauscope.training.metrics import MARGINAL_REL, compute_tau
from plateauscope.training.run import MANIFEST_FILE, Run, RunError

THRESHOLDS: tuple[float, ...] = (0.3, 0.5, 0.7)
"""Where tau is read off, in units of log K (0.5 is tau; forward runs: exact-match accuracy)."""
EXACT_MATCH = ProgressMeasure("accuracy", 1.0, falls=False, label="exact-match accuracy")
"""The measure both directions share: t_acc50 is the first step above 50% exact match."""
FACTORS: tuple[str, ...] = ("direction", "preset", "D", "K", "lr", "batch_size")
"""What defines a configuration, besides the seed: runs equal in all but one form a family."""
PAPER = {"alpha": 1.19, "alpha_ci": (1.137, 1.308), "k_slope": 0.0, "batch_factor": 1.8, "lr_factor": 3.6,
         "snap_share": 0.0, "snap_window_tau": 0.5, "direction_ratio": (1.7, 4.4)}
"""The paper's numbers, printed next to ours."""
MARGINAL_STAGE_MIN_TAU = 0.3
"""A true marginal stage lasts at least this share of tau (issue 11)."""


def tau_key(threshold: float) -> str:
    """The row field of tau read off at ``threshold`` x log K."""
    return f"tau@{threshold:g}"


# ---- loading ------------------------------------------------------------------------------


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
    span = summary.get("plateau_span")
    routing = read_routing_summary(run.path) or {}
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
        "plateau_start": span[0] if span else None, "plateau_end": span[1] if span else None,
        "lead_fraction": routing.get("lead_fraction"),
        **{f"lead_{rule}": (rules.get(rule) or {}).get("lead_fraction") for rule in RULES},
        "routing_head": routing.get("label"), "routing_layer": (routing.get("head") or [None])[0],
        "circuit": circuit.get("verdict"), "circuit_heads": " ".join(circuit.get("heads") or []) or None,
        "model": f"{cfg.model.n_layers}L d{cfg.model.d_model}", "variant": cfg.task.variant_label() if hasattr(cfg.task, "variant_label") else "default",
        "verdict": plateau.get("verdict"), "t_marginal": t_m,
        "t_marginal_over_tau": t_m / tau if t_m is not None and tau else None,
        "plateau_share": (span[1] - span[0]) / tau if span and tau else None,
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


def _mean_range(xs: list[Any]) -> tuple[float | None, float | None, float | None]:
    """Mean, min and max of the values that are not None (all None without any)."""
    vals = [float(x) for x in xs if x is not None]
    return (float(np.mean(vals)), min(vals), max(vals)) if vals else (None, None, None)


def variant_table(rows: list[dict]) -> list[dict[str, Any]]:
    """One row per (task variant, model) of the backward runs: verdicts and plateau numbers over seeds
    (mean and seed range), and whether every seed has a true marginal stage (>= 0.3 tau). Runs with an
    intervention are left out."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["direction"] == "backward" and not r.get("intervention"):
            groups.setdefault((r["variant"], r["model"], r["D"], r["K"]), []).append(r)
    out = []
    for (variant, model, D, K), rs in groups.items():
        verdicts = [r["verdict"] or "none" for r in rs]
        row: dict[str, Any] = {"variant": variant, "model": model, "D": D, "K": K, "seeds": len(rs),
                               "verdict": "/".join(sorted(set(verdicts))) + f" ({len(rs)})"}
        for key in ("t_marginal", "tau", "t_marginal_over_tau", "plateau_share", "first_token_set_loss_plateau",
                    "set_loss_plateau", "marginal_stage_tau", "t_global_marginal", "global_marginal_set_loss",
                    "global_marginal_first_token", "global_marginal_stage_tau"):
            mean, lo, hi = _mean_range([r.get(key) for r in rs])
            row[key], row[f"{key}_lo"], row[f"{key}_hi"] = mean, lo, hi
        row["never_marginal"] = sum(r["t_marginal"] is None for r in rs)
        row["never_tau"] = sum(r["tau"] is None for r in rs)
        row["true_marginal"] = all((r["marginal_stage_tau"] or 0.0) >= MARGINAL_STAGE_MIN_TAU for r in rs)
        row["global_marginal_kind"] = any(r.get("global_marginal_stage_tau") is not None for r in rs)
        row["global_marginal_stage"] = row["global_marginal_kind"] and all(
            (r.get("global_marginal_stage_tau") or 0.0) >= MARGINAL_STAGE_MIN_TAU for r in rs)
        out.append(row)
    return out


def variant_table_text(table: list[dict]) -> str:
    """The variant table as aligned text: mean [seed range] per number."""
    def cell(row: dict, key: str, fmt: str) -> str:
        if row[key] is None:
            return "n/a"
        return f"{fmt.format(row[key])} [{fmt.format(row[key + '_lo'])}, {fmt.format(row[key + '_hi'])}]"

    header = ["variant", "model", "verdict", "plateau set loss", "global marginal", "t_marginal", "tau",
              "t_marg/tau", "plateau/tau", "first-token set loss", "(global)", "true marginal",
              "global-marginal stage"]
    body = [[r["variant"], r["model"], r["verdict"], cell(r, "set_loss_plateau", "{:.2f}"),
             cell(r, "global_marginal_set_loss", "{:.2f}"),
             cell(r, "t_marginal", "{:.0f}") + (f" ({r['never_marginal']} never)" if r["never_marginal"] else ""),
             cell(r, "tau", "{:.0f}") + (f" ({r['never_tau']} never)" if r["never_tau"] else ""),
             cell(r, "t_marginal_over_tau", "{:.2f}"), cell(r, "plateau_share", "{:.2f}"),
             cell(r, "first_token_set_loss_plateau", "{:.2f}"),
             cell(r, "global_marginal_first_token", "{:.2f}"),
             "yes" if r["true_marginal"] else "no",
             "no kind" if not r["global_marginal_kind"] else
             f"{'yes' if r['global_marginal_stage'] else 'no'} ({cell(r, 'global_marginal_stage_tau', '{:.2f}')} tau)"]
            for r in table]
    return format_table(body, header)


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


# ---- fits ---------------------------------------------------------------------------------


def largest_family(rows: list[dict], factor: str, value: Callable[[dict], float | None]) -> list[dict]:
    """The runs with a value that share every factor but ``factor`` (and the seed), taking the family
    with the most distinct ``factor`` values (then the most runs); empty if none has two."""
    families: dict[tuple, list[dict]] = {}
    for r in rows:
        if value(r) is not None:
            families.setdefault(tuple(r[f] for f in FACTORS if f != factor), []).append(r)
    best = max(families.values(), key=lambda fam: (len({r[factor] for r in fam}), len(fam)), default=[])
    return best if len({r[factor] for r in best}) >= 2 else []


def fit_loglog(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept of log y against log x."""
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)


def power_law(rows: list[dict], factor: str = "D", key: str = "tau") -> dict[str, Any] | None:
    """Fit ``key = c * factor^slope`` over the largest family (least squares on log-log axes), with the
    slope's least-squares t interval (``plateauscope.analysis.intervals.slope_interval``).

    None when no family has two distinct values of ``factor`` with a tau.
    """
    fam = largest_family(rows, factor, lambda r: r[key])
    if not fam:
        return None
    x = np.array([r[factor] for r in fam], dtype=float)
    y = np.array([r[key] for r in fam], dtype=float)
    slope, intercept = fit_loglog(x, y)
    return {"factor": factor, "key": key, "slope": slope, "c": math.exp(intercept),
            "ci": slope_interval(np.log(x), np.log(y)), "n_runs": len(fam),
            "values": sorted({r[factor] for r in fam}), "seeds_per_value": [int((x == v).sum()) for v in np.unique(x)],
            "family": {f: fam[0][f] for f in FACTORS if f != factor}}


def factor_effect(rows: list[dict], factor: str, key: str, reference: str) -> dict[str, Any] | None:
    """The geometric mean of ``key`` per value of ``factor`` (over seeds) and its ratio to the
    ``reference`` value (``"min"`` or ``"max"`` of the factor), over the largest family; ``trend`` is
    ``rising``, ``falling`` (monotone in the factor), ``not monotone``, or ``unknown`` when a value
    with runs without tau (below) breaks the order.

    Intervals (``plateauscope.analysis.intervals``): each value's ``mean_ci`` is the t interval of
    its mean log, exponentiated, and each ``ratio_ci`` Welch's t interval of the ratio of geometric
    means, both 95% from 3 seeds up; with 2 seeds they are ranges, labelled so; with 1, None. Rows
    marked ``censored`` (a run that stopped before tau, its last step standing in) make their value's
    mean a lower bound: ``censored`` counts them, ``bound`` says what the ratio is (``>=`` with a
    censored value, ``<=`` with a censored reference), and the interval ends they enter print open.
    """
    fam = largest_family(rows, factor, lambda r: r[key])
    if not fam:
        return None
    values = sorted({r[factor] for r in fam})
    samples = [[r[key] for r in fam if r[factor] == v] for v in values]
    flags = [[bool(r.get("censored")) for r in fam if r[factor] == v] for v in values]
    means = np.array([geometric_mean(s) for s in samples])
    ref = 0 if reference == "min" else len(values) - 1
    censored = [sum(f) for f in flags]
    diffs = np.diff(means)
    trend = "rising" if (diffs > 0).all() else "falling" if (diffs < 0).all() else \
        "unknown (runs without tau)" if any(censored) else "not monotone"  # a bound cannot break an order
    bounds = [("?" if c and censored[ref] else ">=" if c else "<=" if censored[ref] else "") if i != ref else ""
              for i, c in enumerate(censored)]
    out_values = [{"value": v, "mean": float(m), "ratio": float(m / means[ref]), "n": len(s),
                   "mean_ci": geometric_mean_interval(s, f),
                   "ratio_ci": ratio_interval(s, samples[ref], f, flags[ref]) if i != ref else None,
                   "censored": c, "bound": b}
                  for i, (v, m, s, f, c, b) in enumerate(zip(values, means, samples, flags, censored, bounds))]
    return {"factor": factor, "key": key, "reference": values[ref], "values": out_values,
            "max_ratio": max(v["ratio"] for v in out_values), "trend": trend,
            "family": {f: fam[0][f] for f in FACTORS if f != factor}}


def scaling_law(rows: list[dict], threshold: float = 0.5) -> dict | None:
    """alpha in tau = c * D^alpha (backward runs)."""
    return power_law([r for r in rows if r["direction"] == "backward"], "D", tau_key(threshold))


def k_dependence(rows: list[dict], threshold: float = 0.5) -> dict | None:
    """The slope of log tau against log K at fixed D (backward runs)."""
    return power_law([r for r in rows if r["direction"] == "backward"], "K", tau_key(threshold))


def _waits(rows: list[dict], threshold: float, unit: str) -> list[dict]:
    """The backward runs with ``wait``: tau at ``threshold`` in steps or tokens; a run that stopped before
    it (killed, or at max_steps) waits at least its last step, and is marked ``censored``."""
    key = tau_key(threshold)
    out = []
    for r in rows:
        if r["direction"] != "backward":
            continue
        steps = r[key] if r[key] is not None else r.get("final_step")
        wait = None if steps is None else steps * (r["tokens_per_step"] if unit == "tokens" else 1)
        out.append({**r, "wait": wait, "censored": r[key] is None})
    return out


def batch_effect(rows: list[dict], threshold: float = 0.5, unit: str = "tokens") -> dict | None:
    """tau in tokens (``unit="tokens"``) or in steps per batch size, as a ratio to the largest batch
    (backward runs; a run without tau counts as a lower bound)."""
    return factor_effect(_waits(rows, threshold, unit), "batch_size", "wait", "max")


def lr_effect(rows: list[dict], threshold: float = 0.5) -> dict | None:
    """tau in steps per learning rate, as a ratio to the smallest (backward runs; a run without tau
    counts as a lower bound)."""
    return factor_effect(_waits(rows, threshold, "steps"), "lr", "wait", "min")


def direction_ratios(rows: list[dict], key: str = "tau") -> list[dict[str, Any]]:
    """mean ``key`` forward / mean ``key`` backward for each configuration trained both ways.

    A forward run without ``key`` (never got there) counts with its final step, and the ratio is
    then a lower bound (``censored``).
    """
    pairs: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        pairs.setdefault(tuple(r[f] for f in FACTORS if f != "direction"), {}).setdefault(r["direction"], []).append(r)
    out = []
    for both in pairs.values():
        fwd, bwd = both.get("forward", []), [r for r in both.get("backward", []) if r[key] is not None]
        if not fwd or not bwd:
            continue
        censored = any(r[key] is None for r in fwd)
        f = float(np.mean([r[key] if r[key] is not None else r["final_step"] for r in fwd]))
        b = float(np.mean([r[key] for r in bwd]))
        out.append({"D": bwd[0]["D"], "K": bwd[0]["K"], "key": key, "forward": f, "backward": b, "ratio": f / b,
                    "censored": censored, "n_forward": len(fwd), "n_backward": len(bwd)})
    return sorted(out, key=lambda d: (d["K"], d["D"]))


def snap_summary(rows: list[dict]) -> dict[str, Any] | None:
    """Collective snap over the backward runs with a tau: groups >= 80% at tau/2, median window / tau."""
    rs = [r for r in rows if r["direction"] == "backward" and r["tau"] and r["snap_share_at_half_tau"] is not None]
    if not rs:
        return None
    above = sum(round(r["snap_share_at_half_tau"] * r["snap_groups"]) for r in rs)
    windows = [r["snap_window_tau"] for r in rs if r["snap_window_tau"] is not None]
    spreads = [r["snap_spread_tau"] for r in rs if r["snap_spread_tau"] is not None]
    return {"runs": len(rs), "groups_above_at_half_tau": int(above), "groups": int(sum(r["snap_groups"] for r in rs)),
            "runs_with_none_above": sum(r["snap_share_at_half_tau"] == 0 for r in rs), "hi": SNAP_HI,
            "median_window_tau": median(windows), "median_spread_tau": median(spreads)}


def seed_summary(rows: list[dict]) -> dict[str, Any] | None:
    """Over the analysed runs: median lead per t_form rule with its order-statistic interval, head and
    verdict per seed."""
    rs = [r for r in rows if r.get("routing_head")]
    if not rs:
        return None
    leads = {}
    for rule in RULES:
        vals = [r[f"lead_{rule}"] for r in rs if r.get(f"lead_{rule}") is not None]
        leads[rule] = {"median": median(vals), "ci": median_interval(vals), "n": len(vals),
                       "values": vals}
    return {"runs": len(rs), "lead": leads,
            "per_seed": [{"name": r["name"], "seed": r["seed"], "head": r["routing_head"],
                          "verdict": r.get("circuit"), "heads": r.get("circuit_heads")} for r in rs],
            "layer0": sum(r.get("routing_layer") == 0 for r in rs)}


def seed_lines(s: dict[str, Any] | None) -> list[str]:
    """The seed summary as text lines."""
    if not s:
        return ["seeds: no analysed runs (plateauscope dynamics --sweep DIR --analyze)"]
    lines = [f"over {s['runs']} analysed runs (median lead fraction [interval of the median]):"]
    for rule, d in s["lead"].items():
        ci = f"{d['ci'].text('{:.3f}')} ({d['ci'].label})" if d["ci"] else "(no interval)"
        vals = ", ".join(f"{v:.2f}" for v in d["values"])
        lines.append(f"  lead by {rule:<12} {na(d['median'])} {ci}  n={d['n']}  ({vals})")
    lines.append(f"  routing head in layer 0: {s['layer0']} of {s['runs']}")
    for p in s["per_seed"]:
        lines.append(f"  {p['name']}: seed {p['seed']}, head {p['head']}, circuit {p['verdict'] or 'n/a'}"
                     + (f" ({p['heads']})" if p["heads"] else ""))
    return lines


def analyze_sweep(rows: list[dict]) -> dict[str, Any]:
    """Every fit, at tau's threshold 0.5 (``main``) and at 0.3 / 0.7 (``sensitivity``); the seed summary.
    Runs with an intervention (``plateauscope.dynamics.interventions``) are left out of all of them."""
    rows = [r for r in rows if not r.get("intervention")]
    def fits(t: float) -> dict[str, Any]:
        return {"scaling": scaling_law(rows, t), "k": k_dependence(rows, t), "batch": batch_effect(rows, t),
                "batch_steps": batch_effect(rows, t, unit="steps"), "lr": lr_effect(rows, t),
                "direction": direction_ratios(rows, tau_key(t))}

    return {"main": {**fits(0.5), "direction_acc50": direction_ratios(rows, "t_acc50"), "snap": snap_summary(rows)},
            "sensitivity": {str(t): fits(t) for t in THRESHOLDS if t != 0.5},
            "seeds": seed_summary(rows)}


# ---- text ---------------------------------------------------------------------------------


def fit_text(fit: dict | None) -> str:
    """A fit's slope with its interval, as text."""
    if fit is None:
        return "n/a"
    ci = f" {fit['ci'].text()}" if fit["ci"] else " (no interval: fewer than 3 runs)"
    return f"{fit['slope']:.2f}{ci}"


def effect_text(eff: dict | None, unit: str = "") -> str:
    """A factor's effect (ratios to the reference value, and the trend), as text."""
    if eff is None:
        return "n/a"
    def ratio(v: dict) -> str:
        ci = f" {v['ratio_ci'].text()}" if v["ratio_ci"] else ""
        return f"{v['value']:g}: {v['bound']}{v['ratio']:.2f}x{ci}"

    parts = ", ".join(ratio(v) for v in eff["values"])
    return f"{parts} (vs {eff['reference']:g}{unit}; {eff['trend']})"


def direction_text(ratios: list[dict]) -> str:
    """Forward / backward ratios per D, as text (``>=`` marks a censored ratio)."""
    return "; ".join(f"D={d['D']}: {'>=' if d['censored'] else ''}{d['ratio']:.2f}x" for d in ratios) or "n/a"


def summary_lines(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The fits as ``(what, our value - the paper's)`` pairs, with the threshold sensitivity."""
    m, sens = result["main"], result["sensitivity"]

    def alt(key: str, text: Callable[[Any], str]) -> str:
        return " | tau@0.3: " + text(sens["0.3"][key]) + ", tau@0.7: " + text(sens["0.7"][key])

    sc, k, snap = m["scaling"], m["k"], m["snap"]
    lines = [
        ("scaling law alpha (tau ~ D^alpha)",
         (f"{fit_text(sc)} over D = {', '.join(map(str, sc['values']))} ({sc['n_runs']} runs)" if sc else "n/a")
         + f" - paper {PAPER['alpha']} [{PAPER['alpha_ci'][0]}, {PAPER['alpha_ci'][1]}]" + alt("scaling", fit_text)),
        ("K slope (d log tau / d log K)",
         (f"{fit_text(k)} over K = {', '.join(map(str, k['values']))} at D = {k['family']['D']}" if k else "n/a")
         + " - paper ~0" + alt("k", fit_text)),
        ("batch size: tau in tokens", effect_text(m["batch"]) + f" - paper: smallest batch {PAPER['batch_factor']}x"
         + alt("batch", effect_text)),
        ("batch size: tau in steps", effect_text(m["batch_steps"]) + alt("batch_steps", effect_text)),
        ("learning rate: tau in steps", effect_text(m["lr"]) + f" - paper: rising, up to {PAPER['lr_factor']}x"
         + alt("lr", effect_text)),
        ("forward / backward (own taus)", direction_text(m["direction"]) + alt("direction", direction_text)),
        ("forward / backward (accuracy > 50%)", direction_text(m["direction_acc50"])
         + f" - paper {PAPER['direction_ratio'][0]}x to {PAPER['direction_ratio'][1]}x"),
        ("snap: groups >= 80% at tau/2",
         (f"{snap['groups_above_at_half_tau']} of {snap['groups']} tracked groups over {snap['runs']} runs "
          f"({snap['runs_with_none_above']} runs with none)" if snap else "n/a") + " - paper 0 of 200"),
        ("snap window / tau (median over runs)",
         (f"{na(snap['median_window_tau'], '{:.2f}')} (spread of snap steps {na(snap['median_spread_tau'], '{:.2f}')})" if snap
          else "n/a") + f" - paper ~{PAPER['snap_window_tau']}"),
    ]
    return lines


TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "run"), ("tau", "tau"), (tau_key(0.3), "tau@.3"), (tau_key(0.7), "tau@.7"), ("tau_tokens", "tokens"),
    ("t_acc50", "acc50"), ("plateau_start", "plat0"), ("plateau_end", "plat1"), ("lead_fraction", "lead"),
    ("lead_patch_share", "lead(share)"), ("lead_cue_effect", "lead(cue)"), ("routing_head", "head"), ("circuit", "circuit"),
    ("snap_share_at_half_tau", "snap@tau/2"), ("snap_window_tau", "window/tau"), ("final_step", "steps"),
    ("complete", "done"))


def table_text(rows: list[dict]) -> str:
    """The per-run table as fixed-width text."""
    def cell(v: Any) -> Any:
        return "-" if v is None else v

    return format_table([[cell(r[k]) for k, _ in TABLE_COLUMNS] for r in rows], [h for _, h in TABLE_COLUMNS])


def table_csv(rows: list[dict]) -> str:
    """The per-run table as CSV text (every field of the rows)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
