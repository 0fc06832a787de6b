"""One change-point rule for every signal of a run, and which signal moved first.

The toolkit reads "when does it happen" with several rules, one per signal: t_form by attention
halfway up, by patching share halfway up, by the cue effect over mean + 3 sd
(``plateauscope.analysis.formation``), the LLC's half-change step (``plateauscope.analysis.llc``) and
its 3-sd departure (``plateauscope.dynamics.llc``). With different rules, who moves first is partly
decided by the rules. This module has one rule, :class:`ChangePointRule`, applied with the same
parameters to every signal, so that an order of signals is an order of the signals.

**The rule** (:func:`change_point`). A signal is a series of ``(step, value)`` at its own
checkpoints (evaluations, analysed steps, LLC steps):

1. missing values (None, NaN) are left out; the series is smoothed by a centred moving mean of
   ``smooth`` points (``plateauscope.analysis.formation.smooth_series``; 1 = none);
2. the *noise band* is read from the values in the *baseline window* (the first half of the
   plateau, :func:`baseline_window`): its centre is their median, its half-width ``n_sd`` robust
   standard deviations (1.4826 x the median absolute deviation from the median, made unbiased at
   small n: :func:`robust_sd`), and at least ``floor`` x the signal's range (max - min from the
   start on), so that a perfectly flat plateau does not make a zero-width band that any rounding
   leaves. The floor is a fraction of the range, not a number in the signal's units, because one
   rule serves nats, attention probabilities and LLC counts alike;
3. the change point is the first checkpoint, from the start (the plateau start) on, that begins
   ``k`` consecutive checkpoints all beyond the band on the same side: above it (``rise``) or
   below it (``fall``). Its bracket is (the checkpoint before it, it]: the signal's resolution.

A series that never leaves its band for ``k`` checkpoints in a row (a flat one, pure noise, a
change within the noise) has no change point (None). The baseline window may hold the start of a
change (a head that begins forming in the plateau's first half): the median and the MAD shrug off
a minority of moved values, and the search starts at the plateau start, not after the window.

What the step means: where the signal has *left its own noise*. A step change is found at its
step; a gradual one (a ramp, a sigmoid) where it has crossed ``n_sd`` noise sd (or ``floor`` of its
range), so of two signals with the same shape the noisier one is read later; and a signal sampled
every 100 steps is read to within 100 steps (its bracket), one evaluated every 25 to within 25.

The defaults (3 robust sd, 4 consecutive checkpoints, no smoothing, floor 0.001, at least 5
baseline checkpoints) are chosen and their errors measured on simulated series with a known truth
(``tests/analysis/test_changepoint.py``: steps, ramps and sigmoids of size 1, rising and falling, Gaussian
noise of sd 0.02 to 0.2, 200 series each). A step is found at its checkpoint in 99% of the series
up to noise 0.1 (never more than one checkpoint off) and in 81% at 0.2; a ramp or sigmoid within 1-2
checkpoints (median) of where its noise-free curve crosses the band, 3 at noise 0.2. False alarms on
pure noise: none of 200 series with 20 baseline checkpoints, 2% with 10, 9.5% with 5; noise
correlated from one checkpoint to the next (AR(1), 0.5) raises them to 4% with 20, as a slow wander
beyond the band is a move. Asking for 4 checkpoints in a row rather than 3 cuts the false alarms at
10 baseline checkpoints from 5.5% to 2% (and at 5 from 14.5% to 9.5%) for a lag of one checkpoint;
a centred smoothing of 3 points multiplies them several times (neighbours become correlated) and
reads a step a checkpoint early.

**A run's signals** (:func:`run_signals`), by role, so that seeds line up (a role's head can differ
from seed to seed; :func:`read_signals` records it):

* ``metrics.jsonl``: ``loss`` (the training objective on the evaluation groups), the task's progress
  measure (``Run.progress.key``, e.g. ``candidate_loss``), its cue effect (``cue_effect_key``, e.g.
  ``delta_z``) and every ``kl_<name>`` field (the KL to each of the task's reference predictors);
* the analysis cache (``plateauscope analyze``; absent: left out), a few heads and summed / maximal
  forms rather than every head: ``attention:routing`` (the routing head of ``routing.json``: its
  attention to the cue; where ``routing.json`` names no single head, ``attention:routing_group``, the
  routing group's mean attention, and no signal of one routing head), ``attention:top`` (the head with the highest attention to the cue at the
  last analysed step, when it is not the routing head), ``attention:max`` (the largest attention to
  the cue over heads, per step), ``attention[<rule>]:top`` for each of the task's named attention
  rules (the head that follows the rule most at the end, e.g. induction's previous-token head);
  ``attribution_share:routing`` (the routing head's share of the heads' summed positive effect towards
  the clean answer, in logits, gated as the patch-share rule gates it: ``plateauscope.analysis.circuit.head_shares``,
  ``plateauscope.analysis.formation.gated_shares``) and ``attribution_total`` (that sum), from head
  attribution at every analysed step; ``patch_share:routing`` and ``patch_total``, the same from exact
  patching, at the exact steps only (often too few for a band); ``edge_circuit_mass``
  (the final faithful edge circuit's share of the summed |attribution| over every edge, at every
  analysed step) and ``edge_circuit_effect`` (the summed attribution of those edges, logits);
  ``measure:<name>`` for each measure of the cheap pass (``plateauscope.analysis.measures``: weight
  norm, embedding rank, representation collapse ``measure:collapse[L0]``, repetition bias, each head's
  pattern distance as its mean ``:mean`` and its largest mover ``:top``, and the task's own measures);
* ``llc.json``: ``llc``; ``head_llc.json`` (the per-head LLC): ``head_llc:routing``, ``head_llc:top``
  (the head with the largest change from its first to its last value, when not the routing head)
  and ``head_llc:sum`` (over heads).

:func:`moved_first` reads the plateau's stretch and tau (``summary.json``), applies the rule to every
signal from the plateau start with the band of the plateau's first half, and writes
``RUN/analysis/moved_first.json`` (:data:`plateauscope.analysis.results.MOVED_FIRST_FILE`): each
signal's change point, its fraction of tau, the order, and, labelled as such, the t_form of the
existing rules (``routing.json``) and the LLC's half-change step (``llc.json``), each its own rule.

    plateauscope moved_first --run checkpoints/demo
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float, Int

from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.circuit import head_effects, head_shares
from plateauscope.analysis.formation import SHARE_MIN_EFFECT, gated_shares, pick_routing_head, smooth_series
from plateauscope.analysis.measures import measure_series
from plateauscope.analysis.results import (
    ATTENTION_FILE,
    ATTRIBUTION_FILE,
    EDGES_FILE,
    HEAD_LLC_SUMMARY_FILE,
    LLC_SUMMARY_FILE,
    MEASURES_FILE,
    MOVED_FIRST_FILE,
    PATCH_FILE,
    analysis_dir,
    read_probe_pass,
    read_routing_summary,
    write_json_result,
)
from plateauscope.analysis.summary import stated_routing
from plateauscope.model.heads import head_label
from plateauscope.runs.imported import PROBE_METRICS_FILE, ImportedRun
from plateauscope.runs.metrics import compute_tau
from plateauscope.runs.run import METRICS_FILE, Run, RunError, read_json

MAD_TO_SD = 1.4826
"""The median absolute deviation times this estimates the standard deviation of normal noise (large n)."""
MAD_SMALL_SAMPLE = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
"""Factors that make 1.4826 x MAD unbiased for normal noise at n values (Croux and Rousseeuw 1992; n > 9:
``n / (n - 0.8)``). Without them a baseline of 5 values reads its noise 18% low on average."""
GAP_MEASURE = "in_context_loss_gap"
"""The induction probe's measure of the loss gap, whose change an imported run's transition record states."""
DIRECTIONS = ("either", "rise", "fall")
"""What :attr:`ChangePointRule.direction` may ask for."""


@dataclass(frozen=True)
class ChangePointRule:
    """The one change-point rule (module docstring); the same parameters serve every signal."""

    n_sd: float = 3.0
    """Half-width of the noise band in robust standard deviations (:func:`robust_sd`) of the baseline values."""
    k: int = 4
    """Consecutive checkpoints that must all lie beyond the band, on one side; the first of them is the change point."""
    smooth: int = 1
    """Centred moving mean over this many checkpoints before the rule (1 = none: a centred mean moves a
    step earlier by up to half its window and makes neighbours correlated, which raises false alarms)."""
    floor: float = 1e-3
    """The band's half-width is at least this fraction of the signal's range (max - min from the start
    on): scale-free, so one value serves nats, attention and the LLC alike, and small enough to act only
    where the baseline has no noise (a flat plateau; a share gated to 0). A larger one reads the
    signals with the largest late excursion (the cue effect grows for long after tau) late."""
    min_baseline: int = 5
    """Fewest checkpoints in the baseline window for a band; fewer is an error (the signal is not read):
    the MAD of fewer values is too unsure (the false alarms grow as the baseline shrinks)."""
    direction: str = "either"
    """``either`` (the first departure, up or down), ``rise`` or ``fall`` (only departures that way count)."""

    def validate(self) -> None:
        """Raise ValueError (one line) on parameters the rule cannot use."""
        if not (math.isfinite(self.n_sd) and self.n_sd > 0):
            raise ValueError(f"change-point n_sd must be a positive number, got {self.n_sd}")
        for name, least in (("k", 1), ("smooth", 1), ("min_baseline", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"change-point {name} must be at least {least}, got {getattr(self, name)}")
        if not (math.isfinite(self.floor) and 0 <= self.floor < 1):
            raise ValueError(f"change-point floor must be in [0, 1), got {self.floor}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"change-point direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (stored with every result)."""
        return dataclasses.asdict(self)

    def describe(self, band: str = "the plateau's first half") -> str:
        """The rule in one line, with its parameters (``band``: where the band is read)."""
        smooth = "no smoothing" if self.smooth == 1 else f"a centred {self.smooth}-point moving mean"
        way = {"either": "on one side", "rise": "above", "fall": "below"}[self.direction]
        return (f"first of {self.k} consecutive checkpoints beyond the band ({way}): median of {band} "
                f"+- max({self.n_sd:g} robust sd, {self.floor:g} x the signal's range); {smooth}")


@dataclass(frozen=True)
class ChangePoint:
    """Where one signal left its noise band."""

    step: int
    """The first of the ``k`` consecutive checkpoints beyond the band."""
    bracket: tuple[int, int]
    """(the checkpoint before ``step``, ``step``]: where the change happened, at the signal's resolution."""
    value: float
    """The (smoothed) value at ``step``."""
    direction: str
    """``rise`` (above the band) or ``fall`` (below it)."""
    center: float
    """The band's centre: the median of the baseline values."""
    half_width: float
    """The band's half-width: ``max(n_sd x robust_sd, floor x range)``."""
    robust_sd: float
    """The robust sd of the baseline values (:func:`robust_sd`)."""
    n_baseline: int
    """Checkpoints in the baseline window."""

    @property
    def band(self) -> tuple[float, float]:
        """``(low, high)``: the values that count as noise."""
        return self.center - self.half_width, self.center + self.half_width

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, with the band."""
        return {**dataclasses.asdict(self), "bracket": list(self.bracket), "band": list(self.band)}


def robust_sd(values: Float[np.ndarray, " n"]) -> float:
    """1.4826 x the median absolute deviation from the median, with the small-sample factor
    (:data:`MAD_SMALL_SAMPLE`): the sd of normal noise, robust to a minority of moved values."""
    n = len(values)
    small = MAD_SMALL_SAMPLE.get(n, n / (n - 0.8) if n > 9 else 1.0)
    return float(small * MAD_TO_SD * np.median(np.abs(values - np.median(values))))


def baseline_window(span: Sequence[int] | None) -> tuple[int, int] | None:
    """The first half of a plateau span ``(start, end)``, ``(start, midpoint)``: where the noise band is
    read (the same window as ``plateauscope.dynamics.llc.plateau_window``)."""
    return (int(span[0]), (int(span[0]) + int(span[1])) // 2) if span else None


Steps = Sequence[int] | Int[np.ndarray, " n"]
"""A signal's checkpoints: a list of ints or an integer array."""
Values = Sequence[float | None] | Float[np.ndarray, " n"]
"""A signal's values, one per step: a list (None: missing) or a float array (NaN: missing)."""


def _clean_series(steps: Steps, values: Values) -> tuple[list[int], list[float]]:
    """The points with a finite value, checked: as many steps as values, steps strictly increasing."""
    if len(steps) != len(values):
        raise ValueError(f"a signal needs one value per step, got {len(steps)} steps and {len(values)} values")
    if any(b <= a for a, b in zip(steps[:-1], steps[1:])):
        raise ValueError("a signal's steps must be strictly increasing")
    kept = [(int(s), float(v)) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def change_point(steps: Steps, values: Values, baseline: tuple[int, int],
                 start: int | None = None, rule: ChangePointRule = ChangePointRule()) -> ChangePoint | None:
    """The first step at or after ``start`` (default: the baseline's first step) that begins
    ``rule.k`` consecutive checkpoints beyond the noise band of the ``baseline`` window
    (``(first, last)`` step, inclusive), or None if the signal never leaves it (module docstring).

    Raises ValueError (one line) on bad input: mismatched lengths, steps not increasing, a window
    that ends before it starts, fewer than ``rule.min_baseline`` finite values in it."""
    rule.validate()
    lo, hi = baseline
    if hi < lo:
        raise ValueError(f"the baseline window ends before it starts: {lo}..{hi}")
    steps, values = _clean_series(steps, values)
    smoothed = np.array(smooth_series(values, rule.smooth), dtype=float)
    arr_steps = np.array(steps, dtype=np.int64)
    base = smoothed[(arr_steps >= lo) & (arr_steps <= hi)]
    if len(base) < rule.min_baseline:
        raise ValueError(f"{len(base)} checkpoint(s) in the baseline window {lo}..{hi}; "
                         f"the band needs at least {rule.min_baseline}")
    first = lo if start is None else start
    searched = arr_steps >= first
    if not searched.any():
        return None
    center, sd = float(np.median(base)), robust_sd(base)
    after = smoothed[searched]
    half = max(rule.n_sd * sd, rule.floor * float(after.max() - after.min()))
    above, below = after > center + half, after < center - half
    sides = {"either": (("rise", above), ("fall", below)), "rise": (("rise", above),),
             "fall": (("fall", below),)}[rule.direction]
    offset = int(np.argmax(searched))
    for i in range(len(after) - rule.k + 1):
        for name, beyond in sides:
            if beyond[i: i + rule.k].all():
                j = offset + i
                return ChangePoint(step=steps[j], bracket=(steps[j - 1] if j > 0 else steps[j], steps[j]),
                                   value=float(smoothed[j]), direction=name, center=center, half_width=half,
                                   robust_sd=sd, n_baseline=len(base))
    return None


# ---- a run's signals ------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """One series the rule reads, and where it comes from."""

    steps: list[int]
    """Its checkpoints (evaluations, analysed steps, LLC steps), increasing."""
    values: list[float | None]
    """One value per step (None: missing there)."""
    source: str
    """The file it is read from (``metrics.jsonl``, ``attention.jsonl``, ...)."""
    description: str
    """What it is, in words."""
    head: str | None = None
    """The head it follows (``L0H3``), for a per-head signal."""



def _parse_label(label: str) -> tuple[int, int] | None:
    if not (label.startswith("L") and "H" in label):
        return None
    layer, _, head = label[1:].partition("H")
    return (int(layer), int(head)) if layer.isdigit() and head.isdigit() else None


def metric_signals(run: Run, records: list[dict[str, Any]]) -> dict[str, Signal]:
    """The signals of ``metrics.jsonl``: the loss, the progress measure, its cue effect, every ``kl_<name>``."""
    progress = run.progress
    keys: dict[str, str] = {"loss": "the training loss on the evaluation groups",
                            progress.key: f"the progress measure ({progress.label or progress.key})"}
    if progress.cue_effect_key:
        keys[progress.cue_effect_key] = f"the cue effect ({progress.cue_label})"
    for key in sorted({k for r in records for k in r if k.startswith("kl_")}):
        keys[key] = f"the KL from the reference predictor {key[3:]!r} to the model"
    steps = [int(r["step"]) for r in records]
    out = {}
    for key, what in keys.items():
        if any(r.get(key) is not None for r in records):
            out[key] = Signal(steps, [r.get(key) for r in records],
                              PROBE_METRICS_FILE if isinstance(run, ImportedRun) else METRICS_FILE, what)
    return out


def routing_head(run: Run, cache: dict[str, Any] | None) -> tuple[int, int] | None:
    """The routing head of ``routing.json``; without one, picked from the cache's last cheap records as
    the analysis picks it (``plateauscope.analysis.formation.pick_routing_head``); None without either, and
    where ``routing.json`` names no single head (its routing group: :func:`routing_group_signal`)."""
    routing = (cache or {}).get("routing") or read_routing_summary(run.path) or {}
    if routing.get("head") and not routing.get("named_head", True):
        return None
    if routing.get("head"):
        return int(routing["head"][0]), int(routing["head"][1])
    if not cache:
        return None
    by_step = {r["step"]: r for r in cache["attribution"]}
    last = next((r for r in reversed(cache["attention"]) if r["step"] in by_step), None)
    if last is None:
        return None
    return pick_routing_head(last["to_z_first"], by_step[last["step"]]["heads"]["normalised"])[0]


def routing_group_signal(attention: list[dict[str, Any]], routing: dict[str, Any]) -> dict[str, Signal]:
    """``attention:routing_group``: where ``routing.json`` names no single head, its routing group's mean
    attention to the cue (``plateauscope.analysis.summary.routing_group``); {} elsewhere."""
    stated = stated_routing(routing)
    if not attention or stated is None or not stated.is_group:
        return {}
    grids = [np.asarray(r["to_z_first"], dtype=float) for r in attention]
    index = tuple(np.array(h) for h in zip(*stated.heads))
    return {"attention:routing_group": Signal([int(r["step"]) for r in attention],
                                              [float(g[index].mean()) for g in grids], ATTENTION_FILE,
                                              "the routing group's mean attention to the cue (no single head is "
                                              "named)", "+".join(stated.labels))}


def attention_signals(attention: list[dict[str, Any]], head: tuple[int, int] | None) -> dict[str, Signal]:
    """Attention to the cue of the routing head, of the head that attends most at the end and the most
    over heads; along each of the task's named rules, of the head that follows it most at the end."""
    if not attention:
        return {}
    steps = [int(r["step"]) for r in attention]
    grids = [np.asarray(r["to_z_first"], dtype=float) for r in attention]
    out: dict[str, Signal] = {}
    if head is not None:
        out["attention:routing"] = Signal(steps, [float(g[head]) for g in grids], ATTENTION_FILE,
                                          "the routing head's attention to the cue", head_label(*head))
    top = divmod(int(np.nanargmax(grids[-1])), grids[-1].shape[1])
    if top != head:
        out["attention:top"] = Signal(steps, [float(g[top]) for g in grids], ATTENTION_FILE,
                                      "attention to the cue of the head that attends most to it at the end",
                                      head_label(*top))
    out["attention:max"] = Signal(steps, [float(np.nanmax(g)) for g in grids], ATTENTION_FILE,
                                  "the largest attention to the cue over heads")
    for rule in attention[-1].get("rules") or {}:
        final = np.asarray(attention[-1]["rules"][rule], dtype=float)
        at = divmod(int(np.nanargmax(final)), final.shape[1])
        values = [float(np.asarray(r["rules"][rule], dtype=float)[at]) if rule in (r.get("rules") or {}) else None
                  for r in attention]
        out[f"attention[{rule}]:top"] = Signal(steps, values, ATTENTION_FILE, f"attention along the task's rule "
                                               f"{rule!r} of the head that follows it most at the end", head_label(*at))
    return out


def share_signals(records: list[dict[str, Any]], head: tuple[int, int] | None, name: str, source: str, how: str
                  ) -> dict[str, Signal]:
    """``<name>_share:routing``, the routing head's share of the heads' summed positive effect towards the
    clean answer (gated as the patch-share rule gates it; none without a routing head), and ``<name>_total``,
    that sum (logits)."""
    if not records:
        return {}
    shares = [head_shares(head_effects(r["heads"])) for r in records]
    steps, totals = [int(r["step"]) for r in records], [sh["total_positive"] for sh in shares]
    out = {f"{name}_total": Signal(steps, totals, source, f"the heads' summed positive effect towards the clean "
                                   f"answer ({how}; logits)")}
    if head is not None:
        gated = gated_shares([sh["share"][head[0]][head[1]] for sh in shares], totals)
        out[f"{name}_share:routing"] = Signal(steps, gated, source, f"the routing head's share of the heads' summed "
                                              f"positive effect ({how}; 0 where the sum is below "
                                              f"{SHARE_MIN_EFFECT:g} of its last value)", head_label(*head))
    return dict(sorted(out.items(), key=lambda kv: not kv[0].endswith(":routing")))  # the share first, as before


def edge_signals(edges: list[dict[str, Any]], circuits: list[dict[str, Any]]) -> dict[str, Signal]:
    """The final faithful edge circuit (the last searched step's) at every step with edge attribution:
    its share of the summed |attribution| over every edge, and its edges' summed attribution (logits)."""
    searched = [r for r in circuits if r.get("circuit")]
    if not edges or not searched:
        return {}
    circuit = list(searched[-1]["circuit"]["edges"])
    steps = [int(r["step"]) for r in edges]
    effects = [np.nan_to_num(np.asarray(r["effect"], dtype=float)) for r in edges]
    mass = [float(np.abs(e[circuit]).sum() / np.abs(e).sum()) if np.abs(e).sum() > 0 else None for e in effects]
    what = f"the final faithful edge circuit's ({len(circuit)} edges, step {searched[-1]['step']})"
    return {"edge_circuit_mass": Signal(steps, mass, EDGES_FILE, f"{what} share of the summed |attribution| "
                                        "over every edge"),
            "edge_circuit_effect": Signal(steps, [float(e[circuit].sum()) for e in effects], EDGES_FILE,
                                          f"{what} summed attribution (logits)")}


def cache_signals(cache: dict[str, Any], head: tuple[int, int] | None) -> dict[str, Signal]:
    """The signals of the analysis cache (:func:`plateauscope.analysis.analyze.load_analysis`): attention to
    the cue, the routing head's attribution and patching shares, the edge circuit (module docstring)."""
    out = attention_signals(cache["attention"], head)
    out.update(share_signals(cache["attribution"], head, "attribution", ATTRIBUTION_FILE,
                             "head attribution, every analysed step"))
    out.update(share_signals(cache["patch"], head, "patch", PATCH_FILE, "exact head patching, the exact steps"))
    out.update(edge_signals(cache["edges"], cache["edge_circuit"]))
    out.update(measure_signals(cache.get("measures") or []))
    return out


def measure_signals(records: list[dict[str, Any]]) -> dict[str, Signal]:
    """The measures of the cheap pass (``plateauscope.analysis.measures``: the built-in ones and the task's
    own), one signal per series of :func:`plateauscope.analysis.measures.measure_series`, named
    ``measure:<series>``."""
    return {f"measure:{key}": Signal(series["steps"], series["values"], MEASURES_FILE,
                                     f"the measure {series['measure']!r}" + (f" ({series['per']})" if series["per"]
                                                                              != "model" else ""), series["head"])
            for key, series in measure_series(records).items()}


def llc_signals(run: Run, head: tuple[int, int] | None) -> dict[str, Signal]:
    """The LLC (``llc.json``) and the per-head LLC (``head_llc.json``): the routing head's, the head whose
    LLC changes most from its first to its last value, and the sum over heads; none where absent."""
    folder = analysis_dir(run.path)
    out: dict[str, Signal] = {}
    if (folder / LLC_SUMMARY_FILE).exists():
        llc = read_json(folder / LLC_SUMMARY_FILE)
        out["llc"] = Signal([int(s) for s in llc["steps"]], list(llc["llc"]), LLC_SUMMARY_FILE,
                            "the local learning coefficient")
    if (folder / HEAD_LLC_SUMMARY_FILE).exists():
        per = read_json(folder / HEAD_LLC_SUMMARY_FILE)
        steps, heads = [int(s) for s in per["steps"]], list(per["heads"])
        grid = np.array([[np.nan if v is None else v for v in row] for row in per["llc"]], dtype=float)
        if grid.size:
            index = {_parse_label(h): i for i, h in enumerate(heads)}
            if head in index:
                out["head_llc:routing"] = Signal(steps, grid[:, index[head]].tolist(), HEAD_LLC_SUMMARY_FILE,
                                                 "the routing head's weight-restricted LLC", head_label(*head))
            change = np.abs(grid[-1] - grid[0])
            top = int(np.nanargmax(change)) if np.isfinite(change).any() else 0
            if _parse_label(heads[top]) != head:
                out["head_llc:top"] = Signal(steps, grid[:, top].tolist(), HEAD_LLC_SUMMARY_FILE,
                                             "the weight-restricted LLC of the head whose LLC changes most",
                                             heads[top])
            out["head_llc:sum"] = Signal(steps, np.nansum(grid, axis=1).tolist(), HEAD_LLC_SUMMARY_FILE,
                                         "the weight-restricted LLC summed over heads")
    return out


def read_signals(run_dir: str | Path) -> dict[str, Signal]:
    """Every signal of a run (module docstring), by name: ``metrics.jsonl`` first, then the analysis
    cache and the LLC where they exist. A one-line RunError without a run or its metrics."""
    run = Run(run_dir)
    if isinstance(run, ImportedRun):  # its metrics: the probe's evaluation, written by plateauscope analyze
        records = run.metrics()
        if not records:
            raise RunError(f"{run.path}: no probe evaluation ({PROBE_METRICS_FILE}); run plateauscope analyze "
                           f"--run {run.path} first")
        return _signals(run, records)
    if not (run.path / METRICS_FILE).exists():
        raise RunError(f"{run.path}: no {METRICS_FILE} (train the run first)")
    records = run.metrics()
    if not records:
        raise RunError(f"{run.path}: {METRICS_FILE} is empty")
    return _signals(run, records)


def _signals(run: Run, records: list[dict[str, Any]]) -> dict[str, Signal]:
    """:func:`read_signals` of a run with metrics."""
    out = metric_signals(run, records)
    cache = load_analysis(run.path) if analysis_dir(run.path).is_dir() else None
    head = routing_head(run, cache)
    if cache is not None:
        out.update(cache_signals(cache, head))
        out.update(routing_group_signal(cache["attention"], cache.get("routing") or {}))
    out.update(llc_signals(run, head))
    return out


def run_signals(run_dir: str | Path) -> dict[str, tuple[list[int], list[float | None]]]:
    """Every signal of a run as ``name -> (steps, values)`` (:func:`read_signals` says where each is from)."""
    return {name: (s.steps, s.values) for name, s in read_signals(run_dir).items()}


# ---- which signal moved first ---------------------------------------------------------------


def cache_notes(run: Run) -> list[str]:
    """Why the analysis cache's signals are missing, when they are: no analysis, or one made by another
    version of the task (the cache is keyed on it: ``plateauscope.analysis.results.with_task``)."""
    routing = read_routing_summary(run.path)
    if routing is None:
        return [f"no analysis summary: only the signals of {METRICS_FILE} and the LLC (run plateauscope analyze)"]
    if routing.get("task") not in (None, run.task_fingerprint()):
        return ["the analysis cache was made by another version of the task's source: its signals are left out "
                "(run plateauscope analyze again)"]
    return []


def run_landmarks(run: Run) -> tuple[int, int, int]:
    """``(start, plateau end, tau)`` of a run from ``summary.json`` (or computed from its metrics where
    it has none): the start is the plateau's, or the cue's release for a run trained with the cue
    hidden until then (before it the cue's signals are forced, as ``plateauscope.analysis.summary``
    starts the t_form rules there). A one-line RunError when it has no tau or no plateau left."""
    if isinstance(run, ImportedRun):
        return imported_landmarks(run)
    summary = run.summary or {}
    records, progress = run.metrics(), run.progress
    tau = summary["tau"] if "tau" in summary else compute_tau(records, progress)
    span = run.plateau_stretch()  # the longest in-band stretch before tau (summary.json's, or from the metrics)
    if tau is None:
        raise RunError(f"{run.path}: the run has no tau (its progress measure never crossed): nothing moved yet")
    if not span:
        raise RunError(f"{run.path}: no evaluation before tau lies in the plateau's band (summary.json "
                       "plateau_stretch): no band to read")
    start = max(int(span[0]), int(run.config.train.hide_cue_until or 0))
    if start >= int(span[1]) and run.config.train.hide_cue_until:
        raise RunError(f"{run.path}: the cue is released at step {start}, after the plateau ends ({span[1]}): "
                       "no band to read")
    if start >= int(span[1]):
        raise RunError(f"{run.path}: the plateau spans steps {span[0]} to {span[1]}, no checkpoint between them: "
                       "no band to read (analyse more checkpoints before tau)")
    return start, int(span[1]), int(tau)


def imported_landmarks(run: ImportedRun) -> tuple[int, int, int]:
    """``(start, end of the band, phase change)`` of an imported run, from its probe's transition
    (``RUN/analysis/probe_<name>.json``, :mod:`plateauscope.analysis.transition`): the first analysed step, the last
    checkpoint of the onset's band (the checkpoints before the loss gap's rise), and the phase change. The one
    record the probe's pass, the report and :func:`moved_first` read; a one-line RunError where it has none."""
    record = read_probe_pass(run.path)
    if record is None:
        raise RunError(f"{run.path}: no probe pass (run plateauscope analyze --run {run.path} first)")
    found = record.get("transition") or {}
    if not found.get("phase_change"):
        why = "; ".join(found.get("notes") or []) or "the probe measures no loss gap"
        raise RunError(f"{run.path}: the probe's loss gap has no transition ({why}): nothing to order")
    if not found.get("baseline"):
        raise RunError(f"{run.path}: the probe's loss gap has no band before its rise ({'; '.join(found['notes'])})")
    start, end = found["baseline"]
    return int(start), int(end), int(round(found["phase_change"]["step"]))


ALTERNATIVE_RULES = {"attention": "the routing head's attention to the cue halfway from the plateau start to the end",
                     "patch_share": "the routing head's patching share halfway up (exact steps)",
                     "cue_effect": "the cue effect above mean + 3 sd of its first 5 plateau evaluations"}
"""The existing t_form rules (``plateauscope.analysis.formation``), reported beside the one rule, each its own rule."""


def alternative_rules(run: Run, tau: int) -> dict[str, dict[str, Any]]:
    """The t_form rules of ``routing.json`` and the LLC's half-change step (``llc.json``), as they were
    computed, each with its fraction of tau: other rules, not comparable with the one rule's order."""
    out: dict[str, dict[str, Any]] = {}
    routing = read_routing_summary(run.path) or {}
    stated = stated_routing(routing)
    # the routing head's rules where one is named; where none is, the routing group's (its mean attention)
    for rule, r in (routing.get("t_form_rules") or {}).items() if stated is not None and not stated.is_group else ():
        out[f"t_form {rule}"] = {"step": r.get("t_form"), "bracket": r.get("t_form_bracket"),
                                 "rule": ALTERNATIVE_RULES.get(rule, rule), "source": "routing.json"}
    if stated is not None and stated.is_group:
        out["t_form routing group"] = {"step": stated.t_form, "bracket": routing["routing_group"].get("t_form_bracket"),
                                       "rule": f"the mean attention to the cue of {', '.join(stated.labels)} (no single "
                                               "head is named) halfway from the plateau start to the end",
                                       "source": "routing.json"}
    for name, r in (routing.get("attention_rules") or {}).items():
        out[f"t_form {name} head"] = {"step": r.get("t_form"), "bracket": r.get("t_form_bracket"),
                                      "source": "routing.json",
                                      "rule": f"{r.get('label')}'s attention along {name!r} halfway up"}
    llc_file = analysis_dir(run.path) / LLC_SUMMARY_FILE
    if llc_file.exists():
        llc = read_json(llc_file)
        out["llc half-change"] = {"step": llc.get("llc_half_change_step"), "bracket": None, "source": LLC_SUMMARY_FILE,
                                  "rule": "the LLC halfway from its plateau-start value to its last"}
    for r in out.values():
        r["fraction_of_tau"] = r["step"] / tau if r["step"] is not None else None
    return out


def signal_change(signal: Signal, window: tuple[int, int], start: int, tau: int,
                  rule: ChangePointRule) -> dict[str, Any]:
    """One signal's row of :func:`moved_first`: its change point (or why none) and its fraction of tau."""
    row: dict[str, Any] = {"source": signal.source, "description": signal.description, "head": signal.head,
                           "n_points": sum(v is not None for v in signal.values), "step": None, "fraction_of_tau": None}
    try:
        found = change_point(signal.steps, signal.values, window, start, rule)
    except ValueError as e:
        return {**row, "note": str(e)}
    if found is None:
        return {**row, "note": "never leaves its noise band"}
    lo, hi = found.bracket
    return {**row, **found.to_dict(), "fraction_of_tau": found.step / tau,
            "bracket_fraction": [lo / tau, hi / tau], "note": None}


def signal_order(signals: dict[str, dict[str, Any]]) -> list[str]:
    """The signals with a change point, earliest first (ties by name)."""
    return sorted((n for n, r in signals.items() if r["step"] is not None), key=lambda n: (signals[n]["step"], n))


def ladder_stages(run: Run, tau: int) -> dict[str, Any] | None:
    """The ladder's reading of a run (``summary.json``'s ``ladder`` block,
    ``plateauscope.runs.references``): the plateau's stage beside the thresholds' verdict, the final
    stage, and the first step of each stage as a fraction of tau. None for a run without a ladder."""
    summary = run.summary or {}
    ladder = summary.get("ladder")
    if not ladder:
        return None
    return {"plateau_stage": ladder["plateau_stage"], "plateau_verdict": (summary.get("plateau") or {}).get("verdict"),
            "final_stage": ladder["final_stage"],
            "first_reached": {name: step / tau for name, step in ladder["first_reached"].items()}}


def moved_first(run_dir: str | Path, rule: ChangePointRule = ChangePointRule(), write: bool = True) -> dict[str, Any]:
    """Apply the one rule to every signal of a run from its plateau start (:func:`run_landmarks`), with
    the band of the plateau's first half; written to ``RUN/analysis/moved_first.json`` (``write``). One-line RunError
    without a run, its metrics, a tau or a plateau."""
    rule.validate()
    run = Run(run_dir)
    signals = read_signals(run.path)
    start, end, tau = run_landmarks(run)
    imported = isinstance(run, ImportedRun)  # its band: the checkpoints before the loss gap's rise, as its onset's
    window = (start, end) if imported else baseline_window((start, end))
    rows = {name: signal_change(s, window, start, tau, rule) for name, s in signals.items()}
    onset = ((read_probe_pass(run.path) or {}).get("transition") or {}).get("onset") if imported else None
    gap = rows.get(f"measure:{GAP_MEASURE}")
    if onset and gap and gap["step"] is not None:  # the probe's own onset, read from its record: one number
        step = int(round(onset["step"]))
        gap.update(step=step, bracket=list(onset["bracket"]), fraction_of_tau=step / tau,
                   bracket_fraction=[b / tau for b in onset["bracket"]],
                   note="the onset of the probe's transition (where the gap crosses the top of its band)")
    result = {
        "run": run.path.name,
        "tau": tau,
        "tau_name": "the phase change" if imported else "tau",
        "start": start,
        "plateau_end": end,
        "release": run.config.train.hide_cue_until or None,
        "baseline_window": list(window),
        "rule": rule.to_dict(),
        "rule_text": rule.describe("the checkpoints before the loss gap's rise" if imported else
                                   "the plateau's first half"),
        "signals": rows,
        "order": signal_order(rows),
        "alternatives": {} if imported else alternative_rules(run, tau),  # the task's t_form rules: not a probe's
        "alternatives_note": "the existing rules, each its own (halfway, threshold): not comparable with the one rule",
        "notes": cache_notes(run),
        "stages": ladder_stages(run, tau),
    }
    if write:
        write_json_result(analysis_dir(run.path) / MOVED_FIRST_FILE, result)
    return result
