"""Which signal moved first, over the seeds of a sweep: the one change-point rule's order with its spread.

Per run, ``plateauscope.analysis.changepoint.moved_first`` reads every signal's change point by one
rule, in units of tau. Over the runs of a sweep (all pooled: run it on one configuration over seeds,
e.g. ``seeds-ci``, ``seeds-demo``, ``induction-seeds``), per signal:

* the median change point as a fraction of tau, with the distribution-free order-statistic interval
  of the median (``plateauscope.analysis.intervals.median_interval``) and the coverage it has at that
  many seeds: 75% at 3 seeds (the interval is then the range: no interval of 3 values reaches 95%),
  93.75% at 5, 95% from 6 on at the widest; 2 seeds give their range with no coverage claimed;
* in how many seeds the signal was read at all, and which way it moved;
* the order of the signals by their median, of the signals read in at least half the runs (the median
  of the few runs where a signal moved says little when it did not move, or was not analysed, in
  most: those are listed apart), and for each adjacent pair of that order how many of the seeds that
  read both agree with it: "A before B in 4 of 5 seeds" (a tie, the same step, agrees with neither;
  it is counted apart).

The median order is a summary; the pair counts say how far each seed follows it. Two signals with no
order at all agree in every seed with probability 1/4 at 3 seeds and 1/16 at 5 (the median order
takes whichever way they fall, so twice 1/2^n).

    plateauscope moved_first --sweep sweeps/seeds-ci
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from plateauscope.analysis.changepoint import ChangePointRule, moved_first
from plateauscope.analysis.intervals import LEVEL, median_interval
from plateauscope.analysis.results import median
from plateauscope.dynamics.sweep import sweep_runs
from plateauscope.runs.run import METRICS_FILE, RunError


def sweep_moved_first(sweep_dir: str | Path, rule: ChangePointRule = ChangePointRule(),
                      write: bool = True) -> list[dict[str, Any]]:
    """:func:`plateauscope.analysis.changepoint.moved_first` on every run of a sweep that has metrics
    (each run's ``moved_first.json`` written when ``write``); a run it cannot read (no tau, no plateau)
    is kept as ``{"run": name, "error": why}``."""
    path = Path(sweep_dir)
    _, names = sweep_runs(path)
    out: list[dict[str, Any]] = []
    for name in names:
        if not (path / name / METRICS_FILE).exists():
            continue  # not trained yet
        try:
            out.append(moved_first(path / name, rule, write=write))
        except RunError as e:
            out.append({"run": name, "error": str(e)})
    if not out:
        raise RunError(f"{path}: no run of the sweep has metrics (train them with plateauscope sweep)")
    return out


def over_seeds(results: list[dict[str, Any]], level: float = LEVEL) -> dict[str, Any]:
    """Per signal over the runs' :func:`moved_first` results: the median change point / tau with the
    order-statistic interval of the median, the order by median and the seeds that agree with each
    adjacent pair of it (module docstring). Runs with an ``error`` are listed and left out."""
    read = [r for r in results if "error" not in r]
    skipped = [{"run": r["run"], "error": r["error"]} for r in results if "error" in r]
    if not read:
        raise RunError("no run has a change-point table: " + "; ".join(s["error"] for s in skipped))
    names = list(dict.fromkeys(name for r in read for name in r["signals"]))
    signals: dict[str, dict[str, Any]] = {}
    for name in names:
        per_run = {r["run"]: r["signals"][name] for r in read if name in r["signals"]}
        values = {run: row["fraction_of_tau"] for run, row in per_run.items() if row["fraction_of_tau"] is not None}
        ways = Counter(row["direction"] for row in per_run.values() if row.get("direction"))
        signals[name] = {
            "n": len(values), "n_runs": len(read), "n_with_signal": len(per_run),
            "median": median(list(values.values())),
            "interval": median_interval(list(values.values()), level),
            "values": values,
            "directions": dict(ways),
            "heads": {run: row.get("head") for run, row in per_run.items() if row.get("head")},
        }
    # a signal read in fewer than half the runs (no change point, or no analysis, in the others) has a median
    # of the few runs that moved: it stays out of the order, listed apart
    ranked = [n for n, s in signals.items() if s["median"] is not None and 2 * s["n"] >= len(read)]
    order = sorted(ranked, key=lambda n: (signals[n]["median"], n))
    pairs = [seeds_agreeing(signals, a, b) for a, b in zip(order, order[1:])]
    return {"runs": [r["run"] for r in read], "skipped": skipped, "level": level,
            "stages": stages_over_seeds(read, level),
            "rule": read[0]["rule"], "rule_text": read[0]["rule_text"],
            "signals": signals, "order": order, "pairs": pairs,
            "sparse": [n for n in names if signals[n]["median"] is not None and n not in ranked],
            "unread": [n for n in names if signals[n]["median"] is None]}


def stages_over_seeds(read: list[dict[str, Any]], level: float = LEVEL) -> dict[str, Any] | None:
    """The ladder's stages over the runs (each run's ``stages``): how many runs sit at each stage on the
    plateau, beside the thresholds' verdict, and each stage's first step / tau (median, order-statistic
    interval of the median). None when no run has a ladder."""
    rows = [r["stages"] for r in read if r.get("stages")]
    if not rows:
        return None
    names = list(dict.fromkeys(name for r in rows for name in r["first_reached"]))
    reached = {}
    for name in names:
        values = [r["first_reached"][name] for r in rows if name in r["first_reached"]]
        reached[name] = {"n": len(values), "median": median(values), "interval": median_interval(values, level)}
    return {"n_runs": len(rows),
            "plateau": dict(Counter(f"{r['plateau_stage']} (verdict {r['plateau_verdict']})" for r in rows)),
            "final": dict(Counter(str(r["final_stage"]) for r in rows)),
            "first_reached": reached}


def seeds_agreeing(signals: dict[str, dict[str, Any]], first: str, second: str) -> dict[str, Any]:
    """Over the runs that read both signals (``over_seeds(...)["signals"]``), how many have ``first``
    strictly before ``second`` (``agree``), at the same step (``ties``) or after it (``against``)."""
    a, b = signals[first]["values"], signals[second]["values"]
    both = [run for run in a if run in b]
    ahead = sum(a[run] < b[run] for run in both)
    ties = sum(a[run] == b[run] for run in both)
    return {"first": first, "second": second, "agree": ahead, "ties": ties, "against": len(both) - ahead - ties,
            "n": len(both),
            "text": f"{first} before {second} in {ahead} of {len(both)} seeds" + (f" ({ties} tied)" if ties else "")}
