"""The paper's two noise claims, read from a sweep's batch and learning-rate effects (issue 20).

The paper (claim 4): smaller batches delay the transition, 1.8x counted in tokens (the smallest
batch against the largest); higher learning rates delay it monotonically, up to 3.6x (the
largest against the smallest). The effects are ``plateauscope.dynamics.fits.factor_effect``'s: the geometric
mean tau per value over seeds, its ratio to the reference value, and Welch's 95% t interval of that
ratio on the log scale (``plateauscope.analysis.intervals``).

A claim is read from the interval of its extreme ratio: the most extreme value whose runs all reached
tau (a value past it, with runs stopped on the plateau, is printed as the one-sided bound it is, and
the paper's factor, which is for the extreme, is then not checked), and only with at least 3 seeds at both
values (``MIN_SEEDS_FOR_A_CLAIM``): with 2, the interval is the range of the seeds, which covers
the true ratio far less often than 95%, and the reading is ``too few seeds``. Otherwise:

* ``reproduced``: the interval lies above 1 and holds the paper's factor, and (learning rate)
  the means rise monotonically;
* ``holds in part``: the interval lies above 1, but the factor lies outside it or (learning rate)
  the means are not monotone, or their order is unknown;
* ``refuted``: the interval lies below 1: the named condition waits *less*, the opposite of the
  claim;
* ``not resolved``: the interval holds 1;
* ``no interval``: one run at the extreme value or at the reference.

A run that stopped before tau (at ``max_steps``, or killed) waits at least its last step: it enters
its value's mean as that lower bound (``censored``), and the ratio is then a bound (``>=``, or ``<=``
when the reference value has such runs). A bound keeps only the conclusions on its open side: a
lower bound can show that the claim's direction holds, never that it is refuted, and puts the
paper's factor outside only when the factor lies below the whole interval.
"""

from __future__ import annotations

from typing import Any

from plateauscope.analysis.intervals import MIN_SEEDS_FOR_A_CLAIM, enough_seeds
from plateauscope.dynamics.fits import PAPER

CLAIMS: tuple[tuple[str, str, str, str, str | None], ...] = (
    # (the effect's key in analyze_sweep's fits, the claim, its extreme value, the paper's factor, the trend it needs)
    ("batch", "smaller batches wait longer (tau in tokens)", "smallest", "batch_factor", None),
    ("lr", "higher learning rates wait longer (tau in steps)", "largest", "lr_factor", "rising"),
)


def _runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def claim_reading(effect: dict | None, paper_factor: float, extreme: str, monotone: str | None) -> dict[str, Any]:
    """One claim's reading from ``effect``: the ratio of the ``extreme`` value (``smallest`` or
    ``largest``) to the reference, its interval, the verdict and why. ``monotone`` is the trend the
    claim needs (``rising``/``falling``), or None."""
    if effect is None:
        return {"verdict": "not measured", "because": "no family of runs varies this factor", "ratio": None,
                "ci": None, "value": None, "trend": None}
    inward = effect["values"] if extreme == "smallest" else effect["values"][::-1]
    inward = [u for u in inward if u["value"] != effect["reference"]]
    # The reading rests on the most extreme value whose runs all reached tau at enough seeds; the more
    # extreme values beyond it, with runs stopped on the plateau, bound their ratio from one side only.
    measured = next((u for u in inward if not u["censored"] and u["n"] >= MIN_SEEDS_FOR_A_CLAIM), inward[0])
    beyond = inward[:inward.index(measured)]
    v = measured
    out = {"value": v["value"], "reference": effect["reference"], "ratio": v["ratio"], "ci": v["ratio_ci"],
           "bound": v["bound"], "trend": effect["trend"], "n": [u["n"] for u in effect["values"]],
           "beyond": [{"value": u["value"], "ratio": u["ratio"], "bound": u["bound"], "n": u["n"],
                       "censored": u["censored"]} for u in beyond]}
    ci, bound = v["ratio_ci"], v["bound"]
    ref = next(u for u in effect["values"] if u["value"] == effect["reference"])
    without = f" (a bound: {_runs(v['censored'] + ref['censored'])} never reached tau)" if bound else ""
    if ci is None:
        return {**out, "verdict": "no interval", "because": "one run at this value or at the reference"}
    if not enough_seeds(v["n"], ref["n"]):
        return {**out, "verdict": "too few seeds",
                "because": f"{v['n']} and {ref['n']} seeds: a reading needs {MIN_SEEDS_FOR_A_CLAIM} at both" + without}
    # A bound (runs without tau) keeps only the conclusions on its open side.
    hi = float("inf") if bound == ">=" else ci.high
    lo = 0.0 if bound == "<=" else ci.low
    if bound == "?":
        return {**out, "verdict": "not resolved", "because": "both values have runs without tau"}
    if hi < 1:
        return {**out, "verdict": "refuted", "because": f"{v['value']:g} waits less: the interval lies below 1" + without}
    if lo <= 1:
        return {**out, "verdict": "not resolved",
                "because": "the interval holds 1" + without}
    misses = []
    if beyond:  # the paper's factor is for the extreme value, which this sweep does not measure
        misses.append(f"the paper's {paper_factor:g}x is for the {extreme} value, {beyond[0]['value']:g}, "
                      f"measured here only as {beyond_text(beyond[0])}")
    elif not lo <= paper_factor <= hi:
        misses.append(f"the paper's {paper_factor:g}x lies outside the interval")
    if monotone and effect["trend"].startswith("unknown"):
        misses.append("the order of the means is unknown (runs without tau)")
    elif monotone and effect["trend"] != monotone:
        misses.append(f"the means are {effect['trend']}, not {monotone}")
    if misses:
        return {**out, "verdict": "holds in part", "because": "; ".join(misses) + without}
    return {**out, "verdict": "reproduced", "because": "the interval lies above 1 and holds the paper's factor" + without}


def noise_claims(fits: dict[str, Any]) -> list[dict[str, Any]]:
    """Both claims read from one set of fits (``analyze_sweep(...)["main"]``)."""
    out = []
    for key, claim, extreme, factor, trend in CLAIMS:
        out.append({"key": key, "claim": claim, "paper": PAPER[factor],
                    **claim_reading(fits.get(key), PAPER[factor], extreme, trend)})
    return out


def beyond_text(u: dict[str, Any]) -> str:
    """A value past the one a reading rests on: its ratio, as the bound or the few seeds it is."""
    if u["censored"]:
        return f"{u['bound']}{u['ratio']:.2f}x ({_runs(u['censored'])} of {u['n']} stopped before tau)"
    return f"{u['ratio']:.2f}x from {_runs(u['n'])}"
