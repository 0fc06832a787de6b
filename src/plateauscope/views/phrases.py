"""The words that the pages and the command line share: a number or its absence, a value with its
interval, a fit's slope, a factor's effect, the sweep's summary lines and the run table's columns; and
the routing in words (:func:`routing_name`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plateauscope.analysis.edges import STABLE_JACCARD
from plateauscope.analysis.summary import StatedRouting, stated_routing
from plateauscope.dynamics.fits import PAPER
from plateauscope.dynamics.sweep import tau_key


def routing_name(routing: StatedRouting) -> str:
    """The routing in words: ``routing head L0H2`` or ``routing group L0H2 and L0H1``."""
    if not routing.is_group:
        return f"routing head {routing.labels[0]}"
    return f"routing group {', '.join(routing.labels[:-1])} and {routing.labels[-1]}"


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
    """The plateau in words, from the counts of ``plateauscope.runs.metrics.plateau_stretch``: the
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
    text = f"no single head: the margin over the runner-up is within the evaluation noise ({versus}); top heads: {tops}"
    drawn = stated_routing(s)
    if drawn is not None and drawn.is_group:
        text += (f"; the {routing_name(drawn)}: their mean attention to the cue is halfway up at t_form = "
                 f"{na(drawn.t_form, '{}')}" + (f", a lead of {drawn.lead_fraction:.2f} tau" if drawn.lead_fraction
                                                  is not None else ""))
    return text


# ---- the probe's pass on an imported run (``RUN/analysis/probe_<name>.json``) -----------------------------------


def _step(value: float) -> str:
    """A step, rounded to a whole step."""
    return f"{value:.0f}"


def _signed(value: float) -> str:
    """``+2``, ``-3``, ``0`` (a whole step; no ``-0``)."""
    whole = round(value)
    return f"{whole:+d}" if whole else "0"


def landmark_text(mark: dict[str, Any] | None) -> str:
    """``512 [500, 520]``: a transition landmark and its interval (its bracket where it has none)."""
    if mark is None:
        return "none"
    low, high = mark["interval"] or mark["bracket"]
    return f"{_step(mark['step'])} [{_step(low)}, {_step(high)}]"


def head_call_text(call: dict[str, Any]) -> str:
    """``L1H0 0.894 (null 0.100)``, with a fixed-lag copier's lags."""
    text = f"{call['head']} {call['score']:.3f} (null {call['null']:.3f})"
    if call["kind"] == "fixed_lag":
        lags = call["lags"]
        text += f", copies at lag{'s' if len(lags) > 1 else ''} {', '.join(map(str, lags))} only"
    return text


def probe_head_lines(result: dict[str, Any]) -> list[str]:
    """The heads the probe's rule names at the last step, by pattern, then the fixed-lag copiers and the layer-0
    heads that follow an induction pattern by position, each with its score and null."""
    steps = result.get("steps") or []
    last = f", {steps[-1]['step']}" if steps else ""
    lines = [f"heads at the last step{last} ({result['rule']}):"]
    for name, calls in result["heads"].items():
        label = name.replace("_", "-")
        chosen = [c for c in calls if c["kind"] == "named"]
        lines.append(f"  {label} heads: " + (", ".join(map(head_call_text, chosen)) or "none"))
        copiers = [c for c in calls if c["kind"] == "fixed_lag"]
        if copiers:
            lines.append(f"  fixed-lag copiers on the {label} pattern (they copy at some of the probe's lags only): "
                         + ", ".join(map(head_call_text, copiers)))
        offsets = [c for c in calls if c["kind"] == "layer0_offset"]
        if offsets:
            lines.append(f"  layer-0 heads on the {label} pattern (by position: a layer-0 head has no earlier layer "
                         "to read, so it is no induction head): " + ", ".join(map(head_call_text, offsets)))
    return lines


def transition_lines(result: dict[str, Any]) -> list[str]:
    """The loss gap's transition in three parts, and the named heads' co-occurrence, from the record's numbers only
    (a part with no number gets its note instead)."""
    t = result.get("transition")
    if t is None:
        steps = result.get("steps") or []
        if not any(s.get("loss_gap") is not None for s in steps):
            return ["the probe measures no loss gap: no transition is read"]
        return [f"the in-context loss gap: {len(steps)} checkpoint{'s' if len(steps) != 1 else ''}, fewer than 3: "
                "no transition is read"]
    lines = [f"the in-context loss gap (mean over {t['n_sequences']} sequences) rises from {t['low']:.3f} to "
             f"{t['high']:.3f}" if t["phase_change"] else
             f"the in-context loss gap (mean over {t['n_sequences']} sequences): {t['low']:.3f} to {t['high']:.3f}, "
             "no transition"]
    if t["phase_change"]:  # only the parts that exist; a missing one's note follows
        steep = t["steepest_rise"]
        parts = ([f"onset {landmark_text(t['onset'])}"] if t["onset"] else []) + [
            f"phase change (half-rise) {landmark_text(t['phase_change'])}, steepest between steps "
            f"{steep['bracket'][0]} and {steep['bracket'][1]}"] + ([f"end {landmark_text(t['end'])}"] if t["end"] else [])
        lines.append(f"  {'; '.join(parts)} (95% intervals)")
    lines += [f"  {note}" for note in t["notes"]]
    co = result.get("co_occurrence")
    if co and co["half_rise"] and co["lag"] is not None:
        heads = ", ".join(co["heads"])
        way = "after" if co["lag"] >= 0 else "before"
        interval = (f" (95% interval of the lag [{_signed(co['lag_interval'][0])}, {_signed(co['lag_interval'][1])}])"
                    if co["lag_interval"] else "")
        span = (f"from {'its onset' if t['onset'] else 'the first checkpoint'} to "
                f"{'its end' if t['end'] else 'the last checkpoint'}")
        window = f"{'inside' if co['same_window'] else 'outside'} the gap's window {span}"
        lag = round(abs(co["lag"]))
        lines.append(f"  the named induction heads' ({heads}) mean score reaches half its rise at step "
                     f"{landmark_text(co['half_rise'])}, {lag} step{'s' if lag != 1 else ''} {way} the gap's "
                     f"half-rise{interval}: {window}")
    elif co and co["half_rise"] is None:
        lines.append(f"  the named induction heads' ({', '.join(co['heads'])}) mean score does not rise over these "
                     "checkpoints")
    return lines
