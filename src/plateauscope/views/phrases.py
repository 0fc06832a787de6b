"""The words that the pages and the command line share: a number or its absence, a value with its
interval, a fit's slope, a factor's effect, the sweep's summary lines and the run table's columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plateauscope.analysis.edges import STABLE_JACCARD
from plateauscope.dynamics.fits import PAPER
from plateauscope.dynamics.sweep import tau_key


def reads_cue_text(c: dict[str, Any], head: tuple[int, int] | list[int]) -> str:
    """The head's normalised patching effect at the z positions and the last ``<SEP>``, as text
    (n/a when the task's cue moves between prompts)."""
    rz = c["reads_cue"]
    if rz is None:
        return "n/a (the cue moves between prompts)"
    layer, h = int(head[0]), int(head[1])
    labels = rz.get("labels") or [str(p) for p in rz["positions"]]
    vals = [row[h] for row in rz["normalised"][layer]]
    return ", ".join(f"{lab} {'n/a' if v is None else f'{v:+.2f}'}" for lab, v in zip(labels, vals))


def interval_text(value: float | None, interval: list[float] | None) -> str:
    """``value [low, high]`` to 3 decimals (the interval over the eval groups when there is one)."""
    if value is None:
        return "n/a"
    return f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


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


def na(x: float | int | None, fmt: str = "{:.3f}") -> str:
    """``fmt.format(x)``, or "n/a" for a missing value."""
    return "n/a" if x is None else fmt.format(x)


def stability(s: dict[str, Any], tau: int | None) -> str:
    """Words for when the circuit settles, from :func:`edges_summary`."""
    if s["stable_from"] is not None:
        return f"stable (Jaccard >= {STABLE_JACCARD} with the last) from step {s['stable_from']}"
    at_tau = None
    if tau is not None:
        known = [(step, j) for step, j in s["jaccard_to_last"][:-1] if j is not None]
        at_tau = min(known, key=lambda sj: abs(sj[0] - tau))[1] if known else None
    return (f"not stable before the last step (Jaccard with the last below {STABLE_JACCARD}"
            + (f"; {at_tau:.2f} at tau)" if at_tau is not None else ")"))


def plateau_sentence(counts: dict[str, Any], label: str, height_label: str) -> str:
    """The plateau in words, from the counts of ``plateauscope.analysis.summary.plateau_stretch``: the
    evaluations before tau inside the band, and the longest stretch of them in a row; or, when fewer
    than half lie inside, that there is no plateau at the reference height, with the measure's range."""
    n, k, tol = counts["n_before"], counts["n_inside"], counts["rel_tol"]
    before = "before tau" if counts.get("tau") is not None else "(tau not reached)"
    if not n:
        return f"No evaluation of the {label} {before}."
    if not counts["holds"]:
        low, high = counts["range"]
        return (f"No plateau at {height_label} ({counts['height']:.3g}): {k} of the {n} evaluations {before} lie "
                f"within {tol:.0%} of it; the {label} ranges from {low:.3g} to {high:.3g} there.")
    a, b = counts["stretch"]
    return (f"The {label} lies within {tol:.0%} of {height_label} at {k} of the {n} evaluations {before}; "
            f"the longest stretch inside, {counts['n_stretch']} evaluations in a row, runs from step {a} to step {b}.")


def named_head_text(s: dict[str, Any]) -> str:
    """The routing head when the summary names it (``named_head``: a cue, and a margin over the runner-up
    clear of the evaluation noise), else "no single head" and the top heads with their scores."""
    margin = s.get("margin")
    tops = ", ".join(f"{t['head']} {t['score']:.3g}" for t in s.get("top_heads") or [])
    if margin is None:
        return f"no single head (margin over the runner-up not measured); top heads by score: {tops}"
    lo, hi = margin["interval"]
    versus = (f"{margin['heads'][0]} - {margin['heads'][1]} = {margin['difference']:.3g}, "
              f"{margin['level']:.0%} interval [{lo:.3g}, {hi:.3g}]")
    if s.get("named_head"):
        return f"{s['label']} (margin over the runner-up: {versus})"
    return f"no single head: the margin over the runner-up is within the evaluation noise ({versus}); top heads: {tops}"
