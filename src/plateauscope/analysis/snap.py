"""Collective snap: do the tracked groups switch on together or one by one?

Method. From the per-group exact-match accuracies ``group_acc`` of the tracked groups in
``metrics.jsonl`` (``plateauscope.runs.metrics``):

* ``share_above_at_half_tau``: the share of tracked groups with accuracy >= ``hi`` (80%) at the
  last evaluated step <= tau/2 (the paper: none);
* a group *snaps* at its first evaluated step with accuracy >= ``hi``; its snap window is that
  step minus the last evaluated step before it with accuracy < ``lo`` (20%). Groups that never
  reach ``hi`` (or, never below ``lo`` before) have no window;
* ``snap_window_tau``: the median snap window over the groups that have one, divided by tau;
* ``snap_spread_tau``: (latest snap step - earliest snap step) / tau over the snapped groups,
  i.e. how narrow the window is in which the whole data set switches on (the paper: ~0.5 tau).

Signs: shares lie in [0, 1]; windows and spreads are positive, and small means collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plateauscope.analysis.results import median

SNAP_HI = 0.8
"""Group accuracy that counts as snapped."""
SNAP_LO = 0.2
"""Group accuracy that counts as not yet started."""


def group_accuracies(records: list[dict[str, Any]]) -> tuple[list[int], np.ndarray]:
    """Evaluated steps with group accuracies, and their [steps, groups] array."""
    rec = [r for r in records if r.get("group_acc")]
    if not rec:
        return [], np.zeros((0, 0))
    return [int(r["step"]) for r in rec], np.array([r["group_acc"] for r in rec], dtype=float)


def snap_statistics(records: list[dict[str, Any]], tau: int | None, hi: float = SNAP_HI,
                    lo: float = SNAP_LO) -> dict[str, Any]:
    """Collective-snap statistics of the tracked groups (definitions in the module docstring)."""
    steps, acc = group_accuracies(records)
    n_groups = int(acc.shape[1]) if acc.size else 0
    out: dict[str, Any] = {"hi": hi, "lo": lo, "tau": tau, "n_groups": n_groups, "half_tau_step": None,
                           "share_above_at_half_tau": None, "snap_steps": [None] * n_groups,
                           "windows": [None] * n_groups, "n_snapped": 0, "n_windows": 0,
                           "snap_window_steps": None, "snap_window_tau": None, "snap_spread_tau": None}
    if not n_groups:
        return out
    if tau is not None:
        before = [i for i, s in enumerate(steps) if s <= tau / 2]
        if before:
            out["half_tau_step"] = steps[before[-1]]
            out["share_above_at_half_tau"] = float(np.mean(acc[before[-1]] >= hi))
    for g in range(n_groups):
        reached = np.flatnonzero(acc[:, g] >= hi)
        if not reached.size:
            continue
        i_hi = int(reached[0])
        out["snap_steps"][g] = steps[i_hi]
        low = np.flatnonzero(acc[:i_hi, g] < lo)
        if low.size:
            out["windows"][g] = steps[i_hi] - steps[int(low[-1])]
    snapped = [s for s in out["snap_steps"] if s is not None]
    windows = [w for w in out["windows"] if w is not None]
    out["n_snapped"], out["n_windows"] = len(snapped), len(windows)
    if windows:
        out["snap_window_steps"] = median(windows)
    if tau:
        if windows:
            out["snap_window_tau"] = out["snap_window_steps"] / tau
        if snapped:
            out["snap_spread_tau"] = (max(snapped) - min(snapped)) / tau
    return out
