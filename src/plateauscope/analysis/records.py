"""Typed records of a run's analysis cache: what ``ps.Run(dir).analysis()`` returns.

The cache files (:mod:`plateauscope.analysis.results`) are JSON lines, one record per analysed
step; :func:`plateauscope.analysis.analyze.load_analysis` returns them as dicts. This module reads
the same records into dataclasses with arrays shaped ``[layer, head]``, so that a notebook reads
``analysis.attention[-1].to_cue`` instead of indexing ``records["attention"][-1]["to_z_first"]``.
Every field keeps the value that the cache holds; nothing is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plateauscope.analysis.analyze import AnalysisSettings, load_analysis
from plateauscope.analysis.components import PatchResult
from plateauscope.analysis.summary import StatedRouting, stated_routing


def _array(values: Any) -> np.ndarray:
    """A float array from JSON lists, ``None`` (a NaN in the cache) back to NaN."""
    return np.array(values if values is not None else [], dtype=float)


@dataclass(frozen=True)
class AttentionAtStep:
    """Attention to the task's cue at one step, averaged over the analysed examples."""

    step: int
    to_cue: np.ndarray
    """``[layer, head]``: attention from the first target position to the cue positions."""
    to_cue_all_targets: np.ndarray
    """``[layer, head]``: the same, averaged over every target position."""
    entropy: np.ndarray
    """``[layer, head]``: entropy of the attention pattern at the first target position (nats)."""
    top_head: tuple[int, int]
    """The (layer, head) with the highest ``to_cue``."""
    n_examples: int


@dataclass(frozen=True)
class PatchingAtStep:
    """Exact activation patching (or its attribution estimate) at one step, by target."""

    step: int
    sweeps: dict[str, PatchResult]
    """Target name (``heads``, ``resid``, ...) -> the sweep's raw and normalised metric."""


@dataclass(frozen=True)
class AblationOfEachHead:
    """Each head ablated alone at one step (one kind: ``zero`` or ``mean``)."""

    kind: str
    base: dict[str, float]
    """The unablated model's metrics: ``progress`` (the task's progress measure) and ``cue_effect``."""
    ablated: dict[str, np.ndarray]
    """``progress`` / ``cue_effect`` -> ``[layer, head]``: the metric with that head ablated."""
    change: dict[str, np.ndarray]
    """Metric name -> ``[layer, head]``: ablated minus unablated."""


@dataclass(frozen=True)
class AblationAtStep:
    step: int
    kinds: dict[str, AblationOfEachHead]
    """``zero`` / ``mean`` -> the per-head ablation."""


@dataclass(frozen=True)
class CircuitAtStep:
    """The circuit search's inputs at one exact step: how the patching effect spreads over heads."""

    step: int
    share: np.ndarray
    """``[layer, head]``: each head's share of all heads' positive patching effect."""
    layer_share: np.ndarray
    """``[layer, head]``: each head's share of its layer's positive effect."""
    top: tuple[int, int]
    top_share: float
    heads_for_80: list[tuple[int, int]]
    """The fewest heads holding 80% of the positive effect."""
    record: dict[str, Any] = field(repr=False)
    """The full cache record (set ablations, the cue-reading patching)."""


@dataclass(frozen=True)
class EdgesAtStep:
    """Attribution of every edge of the computational graph, and the faithful circuit, at one step."""

    step: int
    effect: np.ndarray
    """One attribution score per edge, in the graph's edge order."""
    clean_metric: float
    corrupt_metric: float
    circuit_edges: list[Any] | None
    """The smallest set of edges that recovers the target fraction of the metric (None where the
    circuit was not searched: the adaptive analysis searches it at the landmarks only)."""
    faithfulness: float | None
    """The fraction of the metric that ``circuit_edges`` recover."""


@dataclass(frozen=True)
class FormationTime:
    """When a head formed by one rule, with its bracket and the lead it gives over tau."""

    t_form: int | None
    t_form_bracket: tuple[int, int] | None
    lead_fraction: float | None
    lead_bracket: tuple[float, float] | None
    start_value: float | None
    """The rule's signal at the plateau start (None for a threshold rule)."""
    final_value: float | None
    """The rule's signal at the last analysed step (None for a threshold rule)."""


@dataclass(frozen=True)
class RoutingSummary:
    """The routing head of the series and its timing (the summary file of the latest analysis)."""

    head: tuple[int, int] | None
    label: str | None
    rule: str
    """How the head was chosen."""
    height: float | None
    """The plateau height of the progress measure (log K for the selector task)."""
    tau: int | None
    tau_bracket: tuple[int, int] | None
    formation: dict[str, FormationTime]
    """Rule name -> when the head formed by that rule."""
    circuit_verdict: str | None
    """``single head``, ``conjunctive``, ``redundant``, ``unresolved`` or ``none`` (before tau)."""
    record: dict[str, Any] = field(repr=False)
    """The full summary record (ablations at the landmarks, the circuit's evidence)."""
    named_head: bool = True
    """Whether the named-head rule names ``head`` (a summary written before the rule: True); where it does
    not, ``head`` is only the best-scoring head, and ``routing`` is the routing group."""
    routing: StatedRouting | None = None
    """What the summary states as the routing: the named head, or where no single head is named the routing
    group with the t_form of its mean attention (``plateauscope.analysis.summary.stated_routing``)."""


@dataclass(frozen=True)
class Analysis:
    """A run's analysis cache, typed. Lists are sorted by step; an analysis that was not run is empty."""

    attention: list[AttentionAtStep]
    patching: list[PatchingAtStep]
    attribution: list[PatchingAtStep]
    ablation: list[AblationAtStep]
    circuit: list[CircuitAtStep]
    edges: list[EdgesAtStep]
    summary: RoutingSummary | None
    """None until an analysis with these settings wrote its summary."""

    @property
    def steps(self) -> list[int]:
        """Steps with attention records (the cheapest analysis, run at every analysed step)."""
        return [r.step for r in self.attention]


def _pair(values: Any) -> tuple | None:
    return tuple(values) if values is not None else None


def _attention(r: dict[str, Any]) -> AttentionAtStep:
    return AttentionAtStep(r["step"], _array(r["to_z_first"]), _array(r["to_z_all_targets"]),
                           _array(r["entropy_first"]), tuple(r["top_head"]), r["n_examples"])


def _patching(r: dict[str, Any]) -> PatchingAtStep:
    return PatchingAtStep(r["step"], {k: PatchResult.from_dict(v) for k, v in r.items()
                                      if isinstance(v, dict) and "raw" in v})


CACHE_METRIC_NAMES = {"candidate_loss": "progress", "delta_z": "cue_effect"}
"""The ablation cache's metric fields (named after the selector task's, for every task) and their
names in the typed records: the task's progress measure and its cue effect."""


def _ablation_of_each_head(r: dict[str, Any]) -> AblationOfEachHead:
    metrics = [k for k in r if k not in ("kind", "n_groups", "base") and not k.startswith("d_")]
    name = lambda m: CACHE_METRIC_NAMES.get(m, m)  # noqa: E731
    return AblationOfEachHead(r["kind"], {name(k): v for k, v in r["base"].items()}, {name(m): _array(r[m]) for m in metrics},
                        {name(m): _array(r[f"d_{m}"]) for m in metrics if f"d_{m}" in r})


def _ablation(r: dict[str, Any]) -> AblationAtStep:
    return AblationAtStep(r["step"], {k: _ablation_of_each_head(v) for k, v in r.items()
                                      if isinstance(v, dict) and "kind" in v})


def _circuit(r: dict[str, Any]) -> CircuitAtStep:
    shares = r["shares"]
    return CircuitAtStep(r["step"], _array(shares["share"]), _array(shares["layer_share"]), tuple(shares["top"]),
                         shares["top_share"], [tuple(h) for h in shares["heads_for_80"]], r)


def _edges(r: dict[str, Any], searched: dict[int, dict[str, Any]]) -> EdgesAtStep:
    if r["step"] not in searched:
        return EdgesAtStep(r["step"], _array(r["effect"]), r["clean"], r["corrupt"], None, None)
    circuit = searched[r["step"]].get("circuit") or {}
    return EdgesAtStep(r["step"], _array(r["effect"]), r["clean"], r["corrupt"], list(circuit.get("edges", [])),
                       circuit.get("faithfulness"))


def _formation(r: dict[str, Any]) -> FormationTime:
    return FormationTime(r.get("t_form"), _pair(r.get("t_form_bracket")), r.get("lead_fraction"),
                         _pair(r.get("lead_bracket")), r.get("start_value"), r.get("final_value"))


def _summary(r: dict[str, Any]) -> RoutingSummary:
    return RoutingSummary(_pair(r.get("head")), r.get("label"), r.get("rule", ""), r.get("height"), r.get("tau"),
                          _pair(r.get("tau_bracket")),
                          {name: _formation(rule) for name, rule in (r.get("t_form_rules") or {}).items()},
                          (r.get("circuit") or {}).get("verdict"), r, bool(r.get("named_head", True)),
                          stated_routing(r))


def read_analysis(run_dir: str | Path, settings: AnalysisSettings | None = None) -> Analysis:
    """The analysis cache of ``run_dir`` made with ``settings`` (default: those of its latest analysis),
    typed; :func:`plateauscope.analysis.analyze.load_analysis` gives the same records as dicts."""
    raw = load_analysis(run_dir, settings)
    return Analysis(
        attention=[_attention(r) for r in raw["attention"]],
        patching=[_patching(r) for r in raw["patch"]],
        attribution=[_patching(r) for r in raw["attribution"]],
        ablation=[_ablation(r) for r in raw["ablation"]],
        circuit=[_circuit(r) for r in raw["circuit"]],
        edges=[_edges(r, {c["step"]: c for c in raw["edge_circuit"]}) for r in raw["edges"]],
        summary=_summary(raw["routing"]) if raw["routing"] else None,
    )
