"""tau and the plateau from ``metrics.jsonl`` records, for any task (its ``ProgressMeasure``).

tau is the first evaluated step at which the task's progress measure has made the drop (the
selector task: candidate loss below 0.5 log K). The plateau (:func:`plateau_stretch`) is counted, not
joined: of the evaluations before tau, those inside the band (the measure within 10% of its height,
its cue effect, ``delta_z``, below 10% of it), and the longest stretch of consecutive ones inside it.
There is a plateau at the height only when at least half of the evaluations before tau lie inside.
``summary.json`` stores the stretch (``plateau_stretch``) and the counts (``plateau_counts``); the
analyses, the train command's last line and every sentence read these, and nothing joins the first and
the last in-band step (an older ``summary.json`` holds that join as ``plateau_span``:
:data:`LEGACY_PLATEAU_SPAN`).

The plateau verdict (``plateau_verdict``, the ``plateau`` block of ``summary.json``) compares the
set loss on the plateau with two references: the **marginal floor** 0 (all mass on the group's
candidates) and the task's **know-nothing reference** (``Task.plateau_reference``; for the
selector task ``plateauscope.tasks.selector_metrics.know_nothing_reference``). A plateau evaluation
is *marginal* when its set loss is below 0.1 log K, *global marginal* when it is below the task's
**global-marginal reference** (``reference["global_marginal"]``: a model that knows the targets'
distribution over the data set but not B; ``global_marginal_reference``) plus 0.1 log K, *shelf*
when it is above 90% of the know-nothing reference, and *between* otherwise. The global marginal
counts as a kind of its own only where it lies apart from the other two (its threshold above the
marginal's and below the shelf's): with one-character targets it *is* the know-nothing model. The
verdict names the kind that holds at least two thirds of the plateau's evaluations, or says
``mixed``.
"""

from __future__ import annotations

from typing import Any

from plateauscope.tasks.base import ProgressMeasure


def compute_tau(records: list[dict], progress: ProgressMeasure, threshold: float = 0.5) -> int | None:
    """tau: the first evaluated step at which the task's progress measure has made the drop
    (:meth:`ProgressMeasure.crossed`: the selector's candidate loss below ``threshold`` log K going
    backward, exact-match accuracy above ``threshold`` forward). None if it never happens."""
    return next((r["step"] for r in records if progress.crossed(r, threshold)), None)


PLATEAU_REL_TOL = 0.1
"""The band of the plateau: the progress measure within this share of its height."""
PLATEAU_CUE_TOL = 0.1
"""... and its cue effect below this share of the height (``ProgressMeasure.on_plateau``)."""
PLATEAU_STRETCH = "plateau_stretch"
"""``summary.json``'s key of the plateau: ``[first, last]`` step of the longest stretch of consecutive
evaluations before tau inside the band (None: none inside)."""
PLATEAU_COUNTS = "plateau_counts"
"""``summary.json``'s key of the plateau's counts (:func:`plateau_stretch`'s record)."""
LEGACY_PLATEAU_SPAN = "plateau_span"
"""The key an older ``summary.json`` holds instead: the first and the last in-band
evaluation before tau, joined (read only where :data:`PLATEAU_STRETCH` is absent)."""


def plateau_stretch(records: list[dict], progress: ProgressMeasure, tau: int | None,
                    rel_tol: float = PLATEAU_REL_TOL, cue_tol: float = PLATEAU_CUE_TOL) -> dict[str, Any]:
    """The plateau by counts: the evaluations before tau (all of them without tau) that log the measure,
    how many lie inside the band (:meth:`ProgressMeasure.on_plateau`), the longest stretch of consecutive
    ones inside it, whether there is a plateau at the height (at least half inside), and the measure's
    range before tau.

    The record: ``key``, ``height``, ``rel_tol`` (the band); ``n_before`` (evaluations before tau),
    ``n_inside`` (of them inside the band), ``holds`` (a plateau at the height), ``stretch`` (``[first,
    last]`` step of the longest stretch inside; the first of equally long ones; None: none inside),
    ``n_stretch`` (its evaluations), ``range`` (``[min, max]`` of the measure before tau) and ``tau``."""
    before = [r for r in records if (tau is None or r["step"] < tau) and r.get(progress.key) is not None]
    inside = [progress.on_plateau(r, rel_tol, cue_tol) for r in before]
    best, start = (0, None), None
    for i, flag in enumerate([*inside, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start > best[0]:
                best = (i - start, start)
            start = None
    length, first = best
    values = [float(r[progress.key]) for r in before]
    return {"key": progress.key, "height": progress.height, "rel_tol": rel_tol, "n_before": len(before),
            "n_inside": sum(inside), "holds": bool(before) and sum(inside) * 2 >= len(before) and length > 0,
            "stretch": [before[first]["step"], before[first + length - 1]["step"]] if length else None,
            "n_stretch": length, "range": [min(values), max(values)] if values else None, "tau": tau}


def summary_plateau_stretch(summary: dict | None) -> list[int] | None:
    """The plateau window ``[first, last]`` that ``summary.json`` records: its :data:`PLATEAU_STRETCH`,
    or, in an older one, its :data:`LEGACY_PLATEAU_SPAN` (None: neither, or no plateau)."""
    summary = summary or {}
    return summary[PLATEAU_STRETCH] if PLATEAU_STRETCH in summary else summary.get(LEGACY_PLATEAU_SPAN)


MARGINAL_REL = 0.1
"""An evaluation is *marginal* when its set loss is below this many log K."""
SHELF_REL = 0.9
"""An evaluation is *shelf* when its set loss is above this share of the know-nothing reference."""
VERDICT_MAJORITY = 2 / 3
"""The verdict names the kind that holds at least this share of the plateau, else ``mixed``."""


def t_marginal(records: list[dict], log_k: float, rel: float = MARGINAL_REL, metric: str = "set_loss",
               floor: float = 0.0) -> int | None:
    """First evaluated step with the reference metric (set loss) below ``floor + rel`` log K (None: never)."""
    return next((r["step"] for r in records if r.get(metric) is not None and r[metric] < floor + rel * log_k), None)


def plateau_verdict(records: list[dict], log_k: float, stretch: tuple[int, int] | list[int] | None,
                    reference: dict, majority: float = VERDICT_MAJORITY) -> dict:
    """The ``plateau`` block: references, shares of the plateau by kind, the verdict, first-token set loss.

    ``reference`` is the task's ``plateau_reference()``: the know-nothing value of its reference
    metric (``reference[metric]``; ``metric`` defaults to ``set_loss``, the selector task's
    ``know_nothing_reference``) and its marginal floor (``marginal``, default 0). ``log_k`` is the
    progress measure's height. The verdict is None when the run has no plateau.
    """
    metric, floor = reference.get("metric", "set_loss"), reference.get("marginal", 0.0)
    on = [r for r in records if stretch and stretch[0] <= r["step"] <= stretch[1] and r.get(metric) is not None]
    lo, hi = floor + MARGINAL_REL * log_k, SHELF_REL * reference[metric]
    global_ref = (reference.get("global_marginal") or {}).get(metric)
    mid = global_ref + MARGINAL_REL * log_k if global_ref is not None else None
    if mid is not None and not lo < mid < hi:
        mid = None  # the global marginal is the marginal or the know-nothing model: no kind of its own

    def kind(value: float) -> str:
        if value < lo:
            return "marginal"
        if mid is not None and value < mid:
            return "global marginal"
        return "shelf" if value > hi else "between"

    kinds = [kind(r[metric]) for r in on]
    n = len(on)
    share = {k.replace(" ", "_"): kinds.count(k) / n if n else None
             for k in ("marginal", "global marginal", "shelf", "between")}
    verdict = None
    if n:
        verdict = next((k for k in ("marginal", "global marginal", "shelf") if kinds.count(k) / n >= majority), "mixed")
    fts = [r["first_token_set_loss"] for r in on if r.get("first_token_set_loss") is not None]
    return {
        "verdict": verdict,
        "know_nothing": {k: v for k, v in reference.items() if k != "global_marginal"},
        "global_marginal": reference.get("global_marginal"),
        "marginal_floor": floor,
        "marginal_threshold": lo,
        "global_marginal_threshold": mid,
        "shelf_threshold": hi,
        "n_evaluations": n,
        "share": share,
        f"median_{metric}": _median([r[metric] for r in on]) if on else None,
        "median_first_token_set_loss": _median(fts) if fts else None,
        "t_marginal": t_marginal(records, log_k, metric=metric, floor=floor),
        "t_global_marginal": t_marginal(records, log_k, metric=metric, floor=global_ref) if mid is not None else None,
    }


def summarize(records: list[dict], progress: ProgressMeasure, reference: dict | None = None) -> dict:
    """The contents of ``summary.json`` (without run bookkeeping): the height, tau, the plateau's stretch
    and counts (:func:`plateau_stretch`), the median set loss and the verdict over the stretch's
    evaluations; ``reference`` (the task's ``plateau_reference``) adds the ``plateau`` verdict block."""
    height = progress.height
    tau = compute_tau(records, progress)
    counts = plateau_stretch(records, progress, tau)
    stretch = counts["stretch"]
    on_plateau = [r for r in records if stretch and stretch[0] <= r["step"] <= stretch[1]]
    final = {k: v for k, v in records[-1].items() if k != "group_acc"} if records else {}
    return {
        progress.height_name: height,
        "tau": tau,
        "tau_by_threshold": {str(t): compute_tau(records, progress, t) for t in (0.3, 0.5, 0.7)},
        PLATEAU_STRETCH: stretch,
        PLATEAU_COUNTS: counts,
        "plateau_median_set_loss": _median([r["set_loss"] for r in on_plateau])
        if on_plateau and on_plateau[0].get("set_loss") is not None else None,
        "plateau": plateau_verdict(records, height, stretch, reference) if reference is not None else None,
        "final": final,
    }


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
