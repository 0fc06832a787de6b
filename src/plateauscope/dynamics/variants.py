"""The plateau's kind per task variant, over seeds: one row per (variant, model) of a sweep's backward
runs, with the verdicts, the plateau's numbers as mean and seed range, and whether every seed has a true
marginal stage."""

from __future__ import annotations

from typing import Any

import numpy as np

MARGINAL_STAGE_MIN_TAU = 0.3
"""A true marginal stage lasts at least this share of tau (issue 11)."""


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
