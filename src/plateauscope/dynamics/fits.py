"""Fits across a sweep's runs, with intervals of stated coverage: the scaling law, the K slope, the
batch-size and learning-rate effects, the directional asymmetry, the collective snap and the lead over
seeds (the definitions are in :mod:`plateauscope.dynamics`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from plateauscope.analysis.formation import RULES
from plateauscope.analysis.intervals import (
    geometric_mean,
    geometric_mean_interval,
    median_interval,
    ratio_interval,
    slope_interval,
)
from plateauscope.analysis.results import median
from plateauscope.analysis.snap import SNAP_HI
from plateauscope.dynamics.sweep import FACTORS, THRESHOLDS, tau_key

PAPER = {"alpha": 1.19, "alpha_ci": (1.137, 1.308), "k_slope": 0.0, "batch_factor": 1.8, "lr_factor": 3.6,
         "snap_share": 0.0, "snap_window_tau": 0.5, "direction_ratio": (1.7, 4.4)}
"""The paper's numbers, printed next to ours."""


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
