"""Run the analyses over a run's checkpoint series, with a cache, and summarise the routing head.

The driver: it asks the run's task (``plateauscope.tasks``) for its cue and prompt pairs and knows no
task itself. For each chosen checkpoint (lazily, one model in memory at a time):

* attention to the cue (``plateauscope.analysis.attention``) and attribution patching of head outputs and the
  residual stream (``plateauscope.analysis.attribution``, the fast first-order mode) at every chosen step;
* exact activation patching (``plateauscope.analysis.patch``) and zero / mean head ablation
  (``plateauscope.analysis.ablate``) at a subset: evenly spaced steps plus those nearest the plateau start,
  tau/2 and tau, and the last step;
* the edges of the residual-stream graph (``plateauscope.analysis.edges``): attribution of every edge and the
  smallest faithful circuit at every chosen step, exact patching of the strongest edges at the
  subset (skip them with ``--no-edges``); and the attention patterns of a few examples (for the
  time view, ``plateauscope.views.view``);
* at the same subset, the concentration of the routing (``plateauscope.analysis.circuit``): each head's share
  of the head-patching effect, ablation of sets of heads (mean by default), and patching of head
  outputs at the cue positions and the prediction position (the z positions and the last ``<SEP>``).

Results go to ``RUN/analysis/`` as one JSON-lines file per analysis (``plateauscope.analysis.results``); each
record stores the settings it was made with (:class:`AnalysisSettings`), and a second call only
computes the steps that have no record with the same settings. Where exact and attribution patching both ran, their
agreement (Spearman rank correlation, max error) is reported, so the fast mode can be trusted,
or not, with numbers. ``routing.json`` (``plateauscope.analysis.summary``) holds the routing head, t_form, tau
and the lead fraction (``plateauscope.analysis.formation``), t_form and the lead by each of the three rules
(``t_form_rules``) and the circuit verdict (``circuit``: ``single head`` / ``conjunctive`` / ``redundant`` /
``unresolved`` / ``none``).

    plateauscope analyze --run checkpoints/demo [--every N | --steps 0 100 200] [--n-exact 12]
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from plateauscope.analysis.ablate import ablate_each_head
from plateauscope.analysis.attention import attention_to_z, pattern_record
from plateauscope.analysis.attribution import attribute_all
from plateauscope.analysis.circuit import (
    RECORD_VERSION,
    circuit_record,
    each_head_ablation,
)
from plateauscope.analysis.edges import (
    CIRCUIT_PAIRS,
    EDGE_RECORD_VERSION,
    FAITHFULNESS_TARGET,
    edge_record,
    edges_summary,
    exact_edge_record,
)
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.patch import patch
from plateauscope.analysis.results import (
    ABLATION_FILE,
    ATTENTION_FILE,
    ATTRIBUTION_FILE,
    CIRCUIT_FILE,
    EDGE_EXACT_FILE,
    EDGES_FILE,
    LEGACY_ROUTING_FILE,
    PATCH_FILE,
    PATTERNS_FILE,
    ROUTING_FILE,
    analysis_dir,
    append_records,
    load_records,
    pick_steps,
    read_routing_summary,
    settings_key,
    write_json_result,
)
from plateauscope.analysis.summary import summarize
from plateauscope.backend import resolve_backend
from plateauscope.training.interventions import has_interventions
from plateauscope.training.metrics import compute_tau
from plateauscope.training.run import Run, RunError

log = logging.getLogger(__name__)

CACHE_FILES = {"attention": ATTENTION_FILE, "attribution": ATTRIBUTION_FILE, "patch": PATCH_FILE,
               "circuit": CIRCUIT_FILE, "ablation": ABLATION_FILE, "edges": EDGES_FILE, "edge_exact": EDGE_EXACT_FILE,
               "patterns": PATTERNS_FILE}
"""The per-step caches of :func:`analyze_run`, by analysis name, in the order a step computes them
(the circuit reuses the head patching; the head ablation of the circuit's kind reuses its set ablations)."""
EDGE_ANALYSES = ("edges", "edge_exact")
"""The analyses ``--no-edges`` skips (they need the TransformerLens 3.x backend)."""
ABLATION_KINDS = ("zero", "mean")


@dataclass(frozen=True)
class AnalysisSettings:
    """What the analysis records depend on; each record stores its own share of these."""

    n_examples: int = 256
    """Prompt pairs for patching and examples for attention to the cue."""
    seed: int = 0
    """Seed of the prompt-pair / example / ablation-group samples."""
    ablation_groups: int = 8
    """Evaluation groups scored per head ablation."""
    patch_targets: tuple[str, ...] = ("heads", "resid")
    """Component sets of exact and attribution patching (``plateauscope.analysis.components.TARGETS``)."""
    circuit_ablation: str = "cue_mean"
    """Ablation kind of the circuit's head sets (``plateauscope.analysis.circuit``): ``cue_mean`` (the
    cue's route; ``mean`` for a task without candidates), ``mean`` or ``zero``."""
    smooth: int = 1
    """Smoothing window of the t_form rules' series (1 = none; only the summary depends on it)."""
    edge_target: float = FAITHFULNESS_TARGET
    """Share of the metric the faithful edge circuit must recover (``plateauscope.analysis.edges``)."""
    circuit_pairs: int = CIRCUIT_PAIRS
    """Pairs (the first of the ``n_examples``) the faithful edge circuit's search measures on."""
    n_exact_edges: int = 32
    """Strongest edges patched exactly at each exact step, to check edge attribution."""
    pattern_examples: int = 3
    """Examples whose attention patterns are kept for the time view."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (the targets as a list)."""
        return settings_key(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AnalysisSettings:
        """The inverse of :meth:`to_dict` (fields added since a summary was written take their defaults)."""
        return cls(**{**d, "patch_targets": tuple(d["patch_targets"])})

    def for_cache(self, name: str) -> dict[str, Any]:
        """The settings that analysis ``name`` depends on: the key its records are stored under."""
        keys = {"attention": ("n_examples", "seed"), "attribution": ("n_examples", "seed", "patch_targets"),
                "patch": ("n_examples", "seed", "patch_targets"), "ablation": ("ablation_groups", "seed"),
                "circuit": ("n_examples", "seed", "ablation_groups", "circuit_ablation"),
                "edges": ("n_examples", "seed", "edge_target", "circuit_pairs"), "edge_exact": ("n_examples", "seed", "n_exact_edges"),
                "patterns": ("pattern_examples", "seed")}[name]
        key = {k: v for k, v in self.to_dict().items() if k in keys}
        version = {"circuit": RECORD_VERSION, "edges": EDGE_RECORD_VERSION, "edge_exact": EDGE_RECORD_VERSION}.get(name)
        return {**key, "record": version} if version else key


def stored_settings(run_dir: str | Path) -> AnalysisSettings:
    """The settings of the run's latest analysis (``routing.json``), or the defaults."""
    stored = (read_routing_summary(run_dir) or {}).get("settings")
    return AnalysisSettings.from_dict(stored) if stored else AnalysisSettings()


def load_analysis(run_dir: str | Path, settings: AnalysisSettings | None = None) -> dict[str, Any]:
    """Cached analysis records of a run made with ``settings`` (default: those of its latest analysis).

    Returns ``{name: [record, ...] sorted by step, "routing": dict | None}``; the routing summary
    (:func:`plateauscope.analysis.results.read_routing_summary`) is included only when it was made
    with the same settings.
    """
    settings = settings or stored_settings(run_dir)
    folder = analysis_dir(run_dir)
    out: dict[str, Any] = {name: load_records(folder / file, settings.for_cache(name))
                           for name, file in CACHE_FILES.items()}
    routing = read_routing_summary(run_dir)
    out["routing"] = routing if routing and routing.get("settings") == settings.to_dict() else None
    return out


def exact_steps(steps: list[int], n: int, landmarks: list[int]) -> list[int]:
    """``n`` evenly spaced steps of ``steps`` plus the step nearest each landmark, and the last."""
    if not steps or n <= 0:
        return []
    idx = set(np.linspace(0, len(steps) - 1, min(n, len(steps))).round().astype(int).tolist())
    arr = np.asarray(steps)
    idx |= {int(np.abs(arr - m).argmin()) for m in landmarks}
    idx.add(len(steps) - 1)
    return sorted(steps[i] for i in idx)


def analyze_run(run_dir: str | Path, steps: list[int] | None = None, every: int = 1, n_exact: int = 12,
                settings: AnalysisSettings | None = None, device: str = "cpu",
                progress: bool = True, backend: str | None = None, edges: bool = True) -> dict[str, Any]:
    """Analyse the chosen checkpoints (only what the cache lacks for these settings); return the summary.
    ``backend``: hooked or bridge (None: the installed TransformerLens); not a setting (both give the
    same numbers, so the cache is shared). ``edges``: also the edge analyses (hooked backend only;
    on the bridge they are skipped, and said so in the log)."""
    settings = settings or AnalysisSettings()
    run = Run(run_dir)
    task = run.task()
    for capability, what in (("cue", "the analyses follow the cue"), ("pairs", "patching")):
        if capability not in task.capabilities:
            raise RunError(f"{run.path}: {task.missing(capability, what)}")
    chosen = pick_steps(run.steps, every, steps)
    if not chosen:
        raise RunError(f"{run.path}: the run has no checkpoints")
    if has_interventions(run.config.train):
        log.info("%s trained with interventions (plateauscope.training.interventions): each checkpoint is analysed with "
                 "them as they were at its step", run.path)
    records = run.metrics()
    tau = compute_tau(records, run.progress)
    summary = run.summary or {}
    plateau_start = (summary.get("plateau_span") or [chosen[0]])[0]
    landmarks = [plateau_start] + ([tau // 2, tau] if tau else [])
    exact = set(exact_steps(chosen, n_exact, landmarks))

    folder = analysis_dir(run.path)
    cache = load_analysis(run.path, settings)
    done = {name: {r["step"] for r in cache[name]} for name in CACHE_FILES}
    wanted = {"attention": set(chosen), "attribution": set(chosen), "patch": exact, "ablation": exact,
              "circuit": exact, "edges": set(chosen), "edge_exact": exact, "patterns": set(chosen)}
    if edges and resolve_backend(backend) != "hooked":
        log.info("%s: the edge analyses need the hooked backend (TransformerLens 3.x): skipped", run.path)
    if not edges or resolve_backend(backend) != "hooked":
        wanted.update({name: set() for name in EDGE_ANALYSES})
    todo = sorted(s for name in CACHE_FILES for s in wanted[name] - done[name])
    pairs = prompt_pairs(task, settings.n_examples, settings.seed)
    targets = settings.patch_targets

    cached_heads = {r["step"]: r["heads"] for r in cache["patch"] if "heads" in r}
    cached_sets = {r["step"]: r["ablation"] for r in cache["circuit"]}
    cached_effects = {r["step"]: r["effect"] for r in cache["edges"]}

    def compute(name: str, step: int, model: torch.nn.Module, fresh: dict[str, Any]) -> dict[str, Any]:
        if name == "attention":
            return attention_to_z(model, task, settings.n_examples, settings.seed).to_dict()
        if name == "attribution":
            res = attribute_all(model, pairs, targets)
            return {t: res[t].to_dict() for t in targets}
        if name == "patch":
            return {t: patch(model, pairs, t).to_dict() for t in targets}
        if name == "edges":
            return edge_record(model, pairs, settings.edge_target, settings.circuit_pairs)
        if name == "edge_exact":
            effect = (fresh.get("edges") or {}).get("effect") or cached_effects.get(step)
            return exact_edge_record(model, pairs, settings.n_exact_edges, effect)
        if name == "patterns":
            return pattern_record(model, task, settings.pattern_examples, settings.seed)
        if name == "circuit":
            heads = (fresh.get("patch") or {}).get("heads") or cached_heads.get(step)
            return circuit_record(model, task, pairs, settings.circuit_ablation, settings.ablation_groups,
                                  settings.seed, heads)
        sets = (fresh.get("circuit") or {}).get("ablation") or cached_sets.get(step)
        return {k: (each_head_ablation(sets) if sets and sets["kind"] == k else
                    ablate_each_head(model, task, k, settings.ablation_groups, settings.seed)).to_dict()
                for k in ABLATION_KINDS}

    for step in tqdm(sorted(set(todo)), desc=f"analyse {run.path.name}", disable=not progress, dynamic_ncols=True):
        model = run.model(step, device, backend)
        fresh: dict[str, Any] = {}
        for name, file in CACHE_FILES.items():
            if step in wanted[name] and step not in done[name]:
                fresh[name] = compute(name, step, model, fresh)
                append_records(folder / file, [{"step": step, "settings": settings.for_cache(name), **fresh[name]}])
    cache = load_analysis(run.path, settings)
    result = {**summarize(run, cache, tau, records, settings.smooth),
              "edges": edges_summary(cache["edges"], cache["edge_exact"], tau=tau), "settings": settings.to_dict()}
    write_json_result(folder / ROUTING_FILE, result)
    (folder / LEGACY_ROUTING_FILE).unlink(missing_ok=True)  # an older analysis's summary, now replaced
    return result
