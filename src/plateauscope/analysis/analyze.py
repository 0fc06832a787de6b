"""Run the analyses over a run's checkpoint series, with a cache, and summarise the routing head.

The driver: it asks the run's task (``plateauscope.tasks``) for its cue and prompt pairs and knows no
task itself. Each checkpoint is loaded lazily into a model already built: one model in memory per
worker (the cheap pass analyses ``workers`` checkpoints side by side). Two passes:

* the *cheap* pass, at every chosen step, a fixed few forwards and backwards each: attention to the
  cue (``plateauscope.analysis.attention``), attribution patching of head outputs and the residual
  stream (``plateauscope.analysis.attribution``) and of every edge of the residual-stream graph
  (``plateauscope.analysis.edges``; the two from the same passes) and the attention patterns of a
  few examples (for the time view, ``plateauscope.views.view``);
* the *expensive* pass, at the landmarks that ``plateauscope.analysis.landmarks`` finds from the cheap
  pass (plateau start and middle, each rule's t_form, tau, the last step, then steps where the cheap
  signals change fastest, up to ``n_exact`` steps in all; head ablation alone at tau/2, where the
  summary reads it; then, by bisection and with exact patching only, the steps that narrow t_form
  by patch share, which reads the exact records, to neighbouring analysed steps): exact activation
  patching (``plateauscope.analysis.patch``),
  zero / mean head ablation (``plateauscope.analysis.ablate``), the concentration of the routing
  (``plateauscope.analysis.circuit``: each head's share of the head-patching effect, ablation of sets
  of heads, patching at the cue positions and the prediction position), exact patching of the
  strongest edges and the smallest faithful edge circuit.

``full=True`` (``--full``) is the exhaustive plan instead: the faithful edge circuit at every chosen
step, and the rest of the expensive pass at ``n_exact`` evenly spaced steps plus those nearest the
plateau start, tau/2 and tau, and the last step. Skip the edge analyses with ``--no-edges``.

Results go to ``RUN/analysis/`` as one JSON-lines file per analysis (``plateauscope.analysis.results``); each
record stores the settings it was made with (:class:`AnalysisSettings`), and a second call only
computes the steps that have no record with the same settings (both plans share the cache). Where
exact and attribution patching both ran, their agreement (Spearman rank correlation, max error) is
reported, so the fast mode can be trusted, or not, with numbers. ``routing.json``
(``plateauscope.analysis.summary``) holds the routing head, t_form, tau and the lead fraction
(``plateauscope.analysis.formation``), t_form and the lead by each of the three rules
(``t_form_rules``), the circuit verdict (``circuit``: ``single head`` / ``conjunctive`` /
``redundant`` / ``unresolved`` / ``none``) and the plan (``plan``: which steps got the expensive
pass, and why).

An imported run (``plateauscope import``, :class:`plateauscope.runs.imported.ImportedRun`) is analysed the same
way on its probe: the probe's evaluation at the chosen steps stands in for the training metrics (tau, the
plateau), each checkpoint runs through the bridge's own forward, and nothing reads training data it lacks.

    plateauscope analyze --run checkpoints/demo [--every N | --steps 0 100 200] [--n-exact 8] [--full]
"""

from __future__ import annotations

import logging
import queue
import threading
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
    edge_and_attribution_records,
    edge_circuit_record,
    edge_record,
    edges_refusal,
    edges_summary,
    exact_edge_record,
)
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.landmarks import DEFAULT_BUDGET, landmark_steps, nearest
from plateauscope.analysis.measures import (
    MEASURE_RECORD_VERSION,
    MeasureInputs,
    attention_and_measures,
    measure_inputs,
    measure_record,
)
from plateauscope.analysis.patch import patch
from plateauscope.analysis.results import (
    ABLATION_FILE,
    ATTENTION_FILE,
    ATTRIBUTION_FILE,
    CIRCUIT_FILE,
    EDGE_CIRCUIT_FILE,
    EDGE_EXACT_FILE,
    EDGES_FILE,
    LEGACY_ROUTING_FILE,
    MEASURES_FILE,
    PATCH_FILE,
    PATTERNS_FILE,
    ROUTING_FILE,
    analysis_dir,
    append_records,
    load_records,
    pick_steps,
    read_routing_summary,
    settings_key,
    task_changed,
    write_json_result,
    writes_cache,
)
from plateauscope.analysis.summary import summarize
from plateauscope.errors import AnalysisFailure
from plateauscope.model.backend import resolve_backend
from plateauscope.model.families import family_of
from plateauscope.processes import release_freed_memory, thread_map
from plateauscope.runs.imported import ImportedRun
from plateauscope.runs.interventions import has_interventions
from plateauscope.runs.metrics import compute_tau
from plateauscope.runs.run import Run, RunError
from plateauscope.runs.series import Fetch

log = logging.getLogger(__name__)

CACHE_FILES = {"attention": ATTENTION_FILE, "attribution": ATTRIBUTION_FILE, "patch": PATCH_FILE,
               "circuit": CIRCUIT_FILE, "ablation": ABLATION_FILE, "edges": EDGES_FILE,
               "edge_circuit": EDGE_CIRCUIT_FILE, "edge_exact": EDGE_EXACT_FILE, "patterns": PATTERNS_FILE,
               "measures": MEASURES_FILE}
"""The per-step caches of :func:`analyze_run`, by analysis name, in the order a step computes them
(the circuit reuses the head patching; the head ablation of the circuit's kind reuses its set
ablations; the edge circuit and exact edges reuse the edge attribution)."""
CHEAP = ("attention", "attribution", "edges", "patterns", "measures")
"""The cheap pass: a fixed few forwards and backwards per checkpoint, at every chosen step."""
EXPENSIVE = ("patch", "circuit", "ablation", "edge_circuit", "edge_exact")
"""The expensive pass: at the landmarks (adaptive) or at the exact steps (``full``)."""
EDGE_ANALYSES = ("edges", "edge_circuit", "edge_exact")
"""The analyses ``--no-edges`` skips."""
MAX_BISECTIONS = 10
"""Most expensive steps the adaptive plan adds to narrow t_form by patch share (2^10 analysed steps apart)."""
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

    def for_cache(self, name: str, task: str, reference_step: int | None = None) -> dict[str, Any]:
        """The settings that analysis ``name`` depends on, and ``task`` (the run's
        :meth:`plateauscope.runs.run.Run.task_fingerprint`): the key its records are stored under. The
        measures also depend on ``reference_step``, the run's last checkpoint (each head's pattern distance)."""
        keys = {"attention": ("n_examples", "seed"), "attribution": ("n_examples", "seed", "patch_targets"),
                "patch": ("n_examples", "seed", "patch_targets"), "ablation": ("ablation_groups", "seed"),
                "circuit": ("n_examples", "seed", "ablation_groups", "circuit_ablation"),
                "edges": ("n_examples", "seed"), "edge_circuit": ("n_examples", "seed", "edge_target", "circuit_pairs"),
                "edge_exact": ("n_examples", "seed", "n_exact_edges"),
                "patterns": ("pattern_examples", "seed"), "measures": ("n_examples", "seed")}[name]
        key = {k: v for k, v in self.to_dict().items() if k in keys}
        version = {"circuit": RECORD_VERSION, "edges": EDGE_RECORD_VERSION, "edge_circuit": EDGE_RECORD_VERSION,
                   "edge_exact": EDGE_RECORD_VERSION, "measures": MEASURE_RECORD_VERSION}.get(name)
        reference = {"reference_step": reference_step} if name == "measures" else {}
        return {**key, **({"record": version} if version else {}), **reference, "task": task}


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
    run = Run(run_dir)
    task, last = run.task_fingerprint(), (run.steps or [None])[-1]
    out: dict[str, Any] = {name: load_records(folder / file, settings.for_cache(name, task, last))
                           for name, file in CACHE_FILES.items()}
    routing = read_routing_summary(run_dir)
    same = routing and routing.get("settings") == settings.to_dict() and routing.get("task") == task
    out["routing"] = routing if same else None
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


MAX_WORKERS = 4
"""Most checkpoints the analysis runs side by side by default (each on a model of its own)."""


def default_workers(device: str | torch.device = "cpu") -> int:
    """Checkpoints analysed side by side by default: on the CPU one per torch thread, at most
    :data:`MAX_WORKERS` (a small model's operations split badly over cores; whole checkpoints side by
    side do not); on an accelerator one."""
    return min(torch.get_num_threads(), MAX_WORKERS) if torch.device(device).type == "cpu" else 1


@writes_cache
def analyze_run(run_dir: str | Path, steps: list[int] | None = None, every: int = 1, n_exact: int = DEFAULT_BUDGET,
                settings: AnalysisSettings | None = None, device: str = "cpu",
                progress: bool = True, backend: str | None = None, edges: bool = True,
                full: bool = False, expensive: bool = True, workers: int | None = None,
                measures: bool = True, fetch: Fetch | None = None) -> dict[str, Any]:
    """Analyse the chosen checkpoints (only what the cache lacks for these settings); return the summary.

    ``steps`` / ``every``: which checkpoints (default: all). ``n_exact``: the budget of the expensive pass
    (adaptive: the landmarks, then fast-change steps up to ``n_exact`` in all; ``full``: ``n_exact`` evenly
    spaced steps, plus the landmarks; module docstring). ``expensive=False``: the cheap pass only (a run
    still training: ``plateauscope.analysis.follow``). ``edges``: also the edge analyses. ``backend``: hooked
    or bridge (None: the installed TransformerLens); not a setting (both give the same numbers, so the
    cache is shared). ``workers``: checkpoints of the cheap pass analysed side by side, each on its own
    model and thread (None: :func:`default_workers`; the records are the same, up to the float rounding of
    the torch threads each one gets); the expensive pass's large batches run faster one checkpoint at a
    time on every thread. ``measures=False``: the cheap pass without the measures (each compares a step
    with the run's last checkpoint, so a run still training gets them once it is complete). ``fetch``: an imported
    run's checkpoints from the hub, fetched as each is read (:class:`plateauscope.runs.series.ImportedSeries`).
    The keyword ``wait=False`` (:func:`plateauscope.analysis.results.writes_cache`)
    exits with one line, rather than waiting, when another process is writing the run's analysis cache."""
    settings = settings or AnalysisSettings()
    workers = default_workers(device) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    resolve_backend(backend)  # an uninstalled one: one line, before anything runs
    run = Run(run_dir) if fetch is None else ImportedRun(run_dir, fetch)
    chosen = pick_steps(run.steps, every, steps)
    if not chosen:
        raise RunError(f"{run.path}: the run has no checkpoints")
    if isinstance(run, ImportedRun):  # its metrics: the probe's evaluation at the chosen steps
        run.evaluate(chosen, device)
    analysis = SeriesAnalysis(run, settings, device, backend, workers, edges, progress)
    if full:
        plan = analysis.full_plan(chosen, n_exact)
    elif not expensive:
        analysis.cheap_pass(chosen, measures)
        plan = {"mode": "cheap", "steps": {}, "stand_in": "attribution patching stands in for exact patching"}
    else:
        plan = analysis.adaptive_plan(chosen, n_exact)
    return analysis.summary(plan, expensive)


class SeriesAnalysis:
    """One call of :func:`analyze_run`: the run, its task's prompt pairs, the cache's settings, and one model
    per worker, each checkpoint's weights loaded into a free one. A pass computes, at each of its steps, the
    analyses the cache lacks, and appends their records in step order."""

    def __init__(self, run: Run, settings: AnalysisSettings, device: str, backend: str | None, workers: int,
                 edges: bool, progress: bool) -> None:
        self.run, self.settings, self.device, self.backend = run, settings, device, backend
        self.workers, self.edges, self.progress = workers, edges, progress
        self.task = task = run.task()
        for capability, what in (("cue", "the analyses follow the cue"), ("pairs", "patching")):
            if capability not in task.capabilities:
                raise RunError(f"{run.path}: {task.missing(capability, what)}")
        if has_interventions(run.config.train):
            log.info("%s trained with interventions (plateauscope.runs.interventions): each checkpoint is analysed "
                     "with them as they were at its step", run.path)
        self.records = run.metrics()
        self.tau = compute_tau(self.records, run.progress)
        self.folder = analysis_dir(run.path)
        self.pairs = prompt_pairs(task, settings.n_examples, settings.seed)
        self.fingerprint = run.task_fingerprint()
        if task_changed(self.folder / ATTENTION_FILE, settings.for_cache("attention", self.fingerprint)):
            log.warning("%s: the task (%s) changed since its analysis cache was written: recomputing", run.path,
                        run.config.task_name)
        self.reference_step = run.steps[-1] if run.steps else None
        self.inputs: MeasureInputs | None = None
        self.held: queue.SimpleQueue[torch.nn.Module | None] = queue.SimpleQueue()
        for _ in range(workers):
            self.held.put(None)
        self.edge_pass = threading.Lock()
        """Held by the worker running the edges' attribution (at most one: ``bench/imported_analysis.py``'s peak)."""
        self.refused: dict[str, str] = {}
        """Analysis -> why the model's family has none (one line each); the other analyses run."""
        if edges and isinstance(run, ImportedRun):  # the family decides; its model, weights not yet loaded
            model = run.series.build_model(device)
            self.held.get()
            self.held.put(model)
            why = edges_refusal(model)
            if why is not None:
                self.refused["edges"], self.edges = why, False
                log.warning("%s: %s", run.path, why)

    # ---- the plans ----------------------------------------------------------------------------

    def plateau_start(self, chosen: list[int]) -> int:
        """The plateau's first step (``Run.plateau_stretch``: the longest in-band stretch), or the first chosen step."""
        return (self.run.plateau_stretch() or [chosen[0]])[0]

    def cheap_pass(self, chosen: list[int], measures: bool = True) -> None:
        """The cheap analyses at every chosen step (``measures``: the measures too), ``workers`` checkpoints
        side by side."""
        names = [name for name in CHEAP if measures or name != "measures"]
        self.run_pass({name: set(chosen) for name in names}, f"analyse {self.run.path.name} (cheap pass)", self.workers)

    def full_plan(self, chosen: list[int], n_exact: int) -> dict[str, Any]:
        """The exhaustive plan: the cheap pass, then the expensive one at ``n_exact`` evenly spaced steps and the
        landmarks, and the faithful edge circuit at every chosen step."""
        tau = self.tau
        landmarks = [self.plateau_start(chosen)] + ([tau // 2, tau] if tau else [])
        exact = set(exact_steps(chosen, n_exact, landmarks))
        self.cheap_pass(chosen)
        self.run_pass({**{name: exact for name in EXPENSIVE}, "edge_circuit": set(chosen)},
                      f"analyse {self.run.path.name}")
        return {"mode": "full", "steps": {str(s): ["exact step"] for s in sorted(exact)}}

    def adaptive_plan(self, chosen: list[int], n_exact: int) -> dict[str, Any]:
        """The cheap pass, then the expensive one at the landmarks it finds (``plateauscope.analysis.landmarks``),
        head ablation at tau/2, and exact patching at the steps that narrow t_form by patch share."""
        run, tau, records, name = self.run, self.tau, self.records, self.run.path.name
        tau_lo = max((r["step"] for r in records if tau is not None and r["step"] < tau), default=None)
        self.cheap_pass(chosen)
        cache = load_analysis(run.path, self.settings)
        rules_start = max(self.plateau_start(chosen), run.config.train.hide_cue_until or 0)
        picked = landmark_steps(chosen, cache["attention"], cache["attribution"], records, run.progress.key,
                                run.progress.cue_effect_key, run.progress.height, tau, tau_lo,
                                run.plateau_stretch(), rules_start, n_exact)
        # The summary also reads head ablation at tau/2 (with the plateau start and the end): that
        # analysis alone runs there, a sixth of the expensive pass.
        half = nearest(chosen, tau // 2) if tau else None
        ablated = set(picked) | ({half} if half is not None else set())
        self.run_pass({**{name_: set(picked) for name_ in EXPENSIVE}, "ablation": ablated}, f"analyse {name} (landmarks)")
        if half is not None:
            picked.setdefault(half, []).append("tau/2 (head ablation only)")
        # The patch-share rule reads the exact records, which exist at the landmarks only: bisect its
        # bracket over the analysed steps until they are neighbours, so that t_form by that rule has the
        # checkpoints' resolution (the cheap stand-in can be far off). A bisection step needs exact
        # patching only, a tenth of the expensive pass.
        for _ in range(MAX_BISECTIONS):
            cache = load_analysis(run.path, self.settings)
            bracket = summarize(run, cache, tau, records, self.settings.smooth, margin=False)["t_form_rules"][
                "patch_share"]["t_form_bracket"]
            inner = [s for s in chosen if bracket and bracket[0] < s < bracket[1]]
            if not inner:
                break
            middle = inner[len(inner) // 2]
            picked.setdefault(middle, []).append("bisecting t_form by patch_share (exact patching only)")
            self.run_pass({"patch": {middle}}, f"analyse {name} (step {middle})")
        return {"mode": "adaptive", "steps": {str(s): why for s, why in sorted(picked.items())}}

    def summary(self, plan: dict[str, Any], expensive: bool) -> dict[str, Any]:
        """The run's summary of the cached analyses (``routing.json``, written), with the plan that made them."""
        cache = load_analysis(self.run.path, self.settings)
        if not expensive:  # the summary reads head patching: its cheap stand-in until the expensive pass
            cache = {**cache, "patch": cache["attribution"]}
        result = {**summarize(self.run, cache, self.tau, self.records, self.settings.smooth, self.pairs),
                  "edges": edges_summary(cache["edges"], cache["edge_circuit"], cache["edge_exact"], tau=self.tau),
                  "plan": plan, "settings": self.settings.to_dict(), "task": self.fingerprint,
                  **({"refused": self.refused} if self.refused else {})}
        write_json_result(self.folder / ROUTING_FILE, result)
        (self.folder / LEGACY_ROUTING_FILE).unlink(missing_ok=True)  # an older analysis's summary, now replaced
        return result

    # ---- one pass -----------------------------------------------------------------------------

    def cached(self, name: str) -> dict[int, dict[str, Any]]:
        """The cached records of analysis ``name`` made with these settings, by step."""
        return {r["step"]: r for r in load_records(self.folder / CACHE_FILES[name], self.key(name))}

    def key(self, name: str) -> dict[str, Any]:
        """The key analysis ``name``'s records are stored under (:meth:`AnalysisSettings.for_cache`)."""
        return self.settings.for_cache(name, self.fingerprint, self.reference_step)

    def compute(self, name: str, step: int, model: torch.nn.Module, fresh: dict[str, Any],
                before: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
        """The record of analysis ``name`` at ``step`` (``fresh``: this step's records computed so far;
        ``before``: the cached ones, which some analyses reuse)."""
        settings, task, pairs, targets = self.settings, self.task, self.pairs, self.settings.patch_targets

        def earlier(source: str) -> dict[str, Any] | None:  # this step's record of an analysis computed before
            return fresh.get(source) or before[source].get(step)

        if name in fresh:  # made with another analysis, from the same passes
            return fresh[name]
        if name == "attention":
            return attention_to_z(model, task, settings.n_examples, settings.seed).to_dict()
        if name == "attribution":
            res = attribute_all(model, pairs, targets)
            return {t: res[t].to_dict() for t in targets}
        if name == "patch":
            return {t: patch(model, pairs, t).to_dict() for t in targets}
        if name == "edges":
            return edge_record(model, pairs)
        if name == "edge_circuit":
            return edge_circuit_record(model, pairs, (earlier("edges") or {}).get("effect"),
                                       settings.edge_target, settings.circuit_pairs)
        if name == "edge_exact":
            return exact_edge_record(model, pairs, settings.n_exact_edges, (earlier("edges") or {}).get("effect"))
        if name == "patterns":
            return pattern_record(model, task, settings.pattern_examples, settings.seed)
        if name == "measures":
            assert self.inputs is not None  # run_pass prepares them before any step
            return measure_record(model, task, self.inputs)
        if name == "circuit":
            return circuit_record(model, task, pairs, settings.circuit_ablation, settings.ablation_groups,
                                  settings.seed, (earlier("patch") or {}).get("heads"))
        sets = (earlier("circuit") or {}).get("ablation")
        return {k: (each_head_ablation(sets) if sets and sets["kind"] == k else
                    ablate_each_head(model, task, k, settings.ablation_groups, settings.seed)).to_dict()
                for k in ABLATION_KINDS}

    def run_pass(self, wanted: dict[str, set[int]], desc: str, side_by_side: int = 1) -> None:
        """Each step's missing analyses of ``wanted`` (name -> steps), in :data:`CACHE_FILES` order, with its
        model loaded once; the steps ``side_by_side`` on worker threads, their records written here in step
        order."""
        if not self.edges:
            wanted = {name: set() if name in EDGE_ANALYSES else todo for name, todo in wanted.items()}
        before = {name: self.cached(name) for name in CACHE_FILES}
        if self.inputs is None and wanted.get("measures", set()) - set(before["measures"]):
            held = self.held.get()  # a worker's model, loaded with the last checkpoint and given back
            try:  # the measures' reference: the last checkpoint's patterns
                held = self.run.model(self.run.steps[-1], self.device, self.backend, reuse=held)
                self.inputs = measure_inputs(self.run, self.settings.n_examples, self.settings.seed, self.device,
                                             self.backend, held)
            except RunError as e:  # the other analyses go on; the broken checkpoint fails in its own step
                log.warning("%s: no measures this pass (%s)", self.run.path, e)
                wanted = {**wanted, "measures": set()}
            finally:
                self.held.put(held)
        todo = sorted({s for name in wanted for s in wanted[name] - set(before[name])})

        def missing(step: int) -> list[str]:
            return [name for name in CACHE_FILES if step in wanted.get(name, ()) and step not in before[name]]

        def analyse(step: int) -> dict[str, Any]:
            model, doing = self.held.get(), "loading the checkpoint"
            try:
                model = self.run.model(step, self.device, self.backend, reuse=model)
                fresh: dict[str, Any] = {}
                if {"attention", "measures"} <= set(missing(step)) and "cue" in self.task.capabilities:
                    # one forward gives both (the same examples)
                    doing = "attention and measures"
                    fresh["attention"], fresh["measures"] = attention_and_measures(model, self.task, self.inputs)
                if {"attribution", "edges"} <= set(missing(step)):
                    # one clean forward and one corrupted forward and backward give both; one worker at a time,
                    # the other's analyses beside it (its graph holds the most memory of the cheap pass)
                    doing = "edges and attribution"
                    with self.edge_pass:
                        fresh["edges"], fresh["attribution"] = edge_and_attribution_records(
                            model, self.pairs, self.settings.patch_targets)
                for name in missing(step):
                    doing = name
                    fresh[name] = self.compute(name, step, model, fresh, before)
                return fresh
            except (RunError, ValueError, KeyboardInterrupt):  # a user's error, one line as it is
                raise
            except Exception as e:  # a bug: where it happened, for the one line (cli.common.run_cli)
                family = family_of(model).describe() if model is not None else type(self.run).__name__
                raise AnalysisFailure(doing, step, family, e) from e
            finally:
                self.held.put(model)

        for step, fresh in zip(todo, tqdm(thread_map(analyse, todo, side_by_side), total=len(todo), desc=desc,
                                          disable=not self.progress, dynamic_ncols=True)):
            for name in missing(step):
                append_records(self.folder / CACHE_FILES[name],
                               [{"step": step, "settings": self.key(name),
                                 **fresh[name]}])
            release_freed_memory()  # a step's batches, freed, back to the system: the peak stays one step's
