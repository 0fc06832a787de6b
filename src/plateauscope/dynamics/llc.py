"""When the LLC leaves its plateau value, over the seeds of a sweep, against t_form, the training loss and tau.

Per run (its ``analysis/llc.json`` from ``plateauscope llc``, its ``routing.json`` from
``plateauscope analyze`` and its metrics):

* **the LLC's plateau value**: the mean and standard deviation of the LLC at the analysed
  checkpoints in the first half of the plateau (``Run.plateau_stretch``: the longest in-band stretch; at least
  ``MIN_BASELINE`` of them);
* **t_llc**, the step the LLC leaves it: the first analysed step after that window from which the
  LLC stays above mean + ``LLC_SD`` sd for ``LLC_CONSECUTIVE`` analysed checkpoints in a row (one
  checkpoint above it can be a fluctuation of the estimate);
* **t_loss**, the step the training loss first falls: the first evaluated step after the same
  window with the loss (the training objective on the evaluation groups, ``loss``) at or below
  ``1 - LOSS_FALL`` times its mean over the window;
* how far the loss has already fallen at t_llc, against the same plateau mean;
* the three t_form rules (``plateauscope.analysis.formation``) and tau.

Over the runs: the median of each step in units of tau, and of t_llc - t_loss and t_llc - t_form
(per rule) in units of tau, with the order-statistic interval of the median and the coverage it
has at that many runs (``plateauscope.analysis.intervals.median_interval``).

Who moves first is not read from these: t_llc departs by a 3-sd rule over the LLC's own noise,
t_loss by a fixed 5% fall, and with different rules a "lead" is close to guaranteed by the rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from plateauscope.analysis.formation import RULES
from plateauscope.analysis.intervals import median_interval
from plateauscope.analysis.results import LLC_SUMMARY_FILE, analysis_dir, median, read_routing_summary
from plateauscope.dynamics.sweep import sweep_runs
from plateauscope.runs import run as rd
from plateauscope.runs.run import Run

LLC_SD = 3.0
"""The LLC has left its plateau value when it is above the plateau mean plus this many sd."""
LOSS_FALL = 0.05
"""The training loss has fallen when it is this share below its plateau mean."""
LLC_CONSECUTIVE = 2
"""...for this many analysed checkpoints in a row."""
MIN_BASELINE = 3
"""Fewest analysed checkpoints in the plateau window for a plateau value."""


def plateau_window(stretch: list[int] | None) -> tuple[int, int] | None:
    """The first half of the plateau's stretch (``Run.plateau_stretch``): where the plateau values are read."""
    return (stretch[0], (stretch[0] + stretch[1]) // 2) if stretch else None


def llc_departure(steps: list[int], llc: list[float], window: tuple[int, int], n_sd: float = LLC_SD,
                  consecutive: int = LLC_CONSECUTIVE) -> dict[str, Any]:
    """The LLC's plateau mean and sd over ``window`` and the first later step from which it stays above
    mean + n_sd sd for ``consecutive`` analysed checkpoints."""
    base = [v for s, v in zip(steps, llc) if window[0] <= s <= window[1]]
    if len(base) < MIN_BASELINE:
        return {"baseline_n": len(base), "baseline_mean": None, "baseline_sd": None, "t_llc": None}
    mean, sd = float(np.mean(base)), float(np.std(base, ddof=1))
    after = [(s, v > mean + n_sd * sd) for s, v in zip(steps, llc) if s > window[1]]
    t = next((after[i][0] for i in range(len(after) - consecutive + 1)
              if all(above for _, above in after[i:i + consecutive])), None)
    return {"baseline_n": len(base), "baseline_mean": mean, "baseline_sd": sd, "t_llc": t}


def loss_fall_step(records: list[dict], window: tuple[int, int], fall: float = LOSS_FALL,
                   key: str = "loss") -> int | None:
    """First evaluated step after ``window`` with ``key`` at or below (1 - fall) x its mean over the window."""
    base = [r[key] for r in records if window[0] <= r["step"] <= window[1] and r.get(key) is not None]
    if not base:
        return None
    level = (1 - fall) * float(np.mean(base))
    return next((r["step"] for r in records if r["step"] > window[1] and r.get(key) is not None
                 and r[key] <= level), None)


def loss_fall_at(records: list[dict], window: tuple[int, int], step: int | None, key: str = "loss") -> float | None:
    """How far ``key`` is below its mean over ``window`` at the last evaluation at or before ``step``
    (a share: 0.01 = 1% lower)."""
    base = [r[key] for r in records if window[0] <= r["step"] <= window[1] and r.get(key) is not None]
    at = [r[key] for r in records if step is not None and r["step"] <= step and r.get(key) is not None]
    return 1 - at[-1] / float(np.mean(base)) if base and at else None


def llc_rows(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """One row per run of the sweep with an ``llc.json``: t_llc, t_loss, the t_form rules and tau."""
    rows = []
    for name in sweep_runs(sweep_dir)[1]:
        path = Path(sweep_dir) / name
        llc_file = analysis_dir(path) / LLC_SUMMARY_FILE
        if not llc_file.exists():
            continue
        run, llc = Run(path), rd.read_json(llc_file)
        window = plateau_window(run.plateau_stretch())
        rules = (read_routing_summary(path) or {}).get("t_form_rules") or {}
        row = {"name": name, "seed": run.config.train.seed, "tau": llc["tau"], "window": window,
               "n_checkpoints": len(llc["steps"]), "all_stationary": llc["all_stationary"],
               **{f"t_form_{rule}": (rules.get(rule) or {}).get("t_form") for rule in RULES}}
        if window is None:
            rows.append({**row, "baseline_n": 0, "baseline_mean": None, "baseline_sd": None, "t_llc": None,
                         "t_loss": None, "loss_fall_at_llc": None})
            continue
        departure, records = llc_departure(llc["steps"], llc["llc"], window), run.metrics()
        rows.append({**row, **departure, "t_loss": loss_fall_step(records, window),
                     "loss_fall_at_llc": loss_fall_at(records, window, departure["t_llc"])})
    return rows


def _in_tau(a: int | None, b: int | None, tau: int | None) -> float | None:
    """(a - b) / tau, or a / tau with b = 0; None when a step is missing."""
    return (a - b) / tau if a is not None and b is not None and tau else None


def llc_summary(rows: list[dict]) -> dict[str, Any]:
    """Medians over the runs, in units of tau, with the order-statistic interval of each median."""
    quantities = {"t_llc / tau": lambda r: _in_tau(r["t_llc"], 0, r["tau"]),
                  "loss fall at t_llc": lambda r: r["loss_fall_at_llc"],
                  "t_loss / tau": lambda r: _in_tau(r["t_loss"], 0, r["tau"]),
                  "(t_llc - t_loss) / tau": lambda r: _in_tau(r["t_llc"], r["t_loss"], r["tau"]),
                  **{f"(t_llc - t_form {rule}) / tau": (lambda r, rule=rule: _in_tau(r["t_llc"], r[f"t_form_{rule}"],
                                                                                     r["tau"])) for rule in RULES},
                  **{f"t_form {rule} / tau": (lambda r, rule=rule: _in_tau(r[f"t_form_{rule}"], 0, r["tau"]))
                     for rule in RULES}}
    out: dict[str, Any] = {"runs": len(rows), "quantities": {}}
    for what, f in quantities.items():
        vals = [v for v in (f(r) for r in rows) if v is not None]
        out["quantities"][what] = {"median": median(vals) if vals else None, "ci": median_interval(vals),
                                   "n": len(vals), "values": vals}
    return out
