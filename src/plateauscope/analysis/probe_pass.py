"""The cheap pass on an imported run: a probe's signals at every checkpoint of a series trained elsewhere.

At each chosen step, with the series' one model (:class:`plateauscope.runs.series.ImportedSeries`, each
checkpoint's weights loaded into it): the probe's head scores per sequence (for ``induction``: each head's mean
attention to the previous token and to the induction target, their nulls, and ``head_detector``'s ``mul`` scores
beside them), the in-context loss gap per sequence, and exact activation patching of every head's output on the
probe's prompt pairs (``plateauscope.analysis.patch``; the bridge's own forward where the fast paths do not cover
the architecture). Then the heads named at the last step, against their nulls
(:mod:`plateauscope.analysis.head_naming`: content-based heads, fixed-lag copiers, layer-0 offset heads), the loss
gap's onset, phase change and end with their intervals (:mod:`plateauscope.analysis.transition`), and whether the
named induction heads' scores rise in the same window.

The result is written to ``RUN/analysis/probe_<name>.json``. An analysis that needs the training data
(the Hessian, the plateau verdict) is not run on an imported run.

    plateauscope analyze --run IMPORTED [--probe induction] [--every N | --steps ...]
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from plateauscope.analysis.analyze import analyze_run, default_workers
from plateauscope.analysis.changepoint import ChangePointRule
from plateauscope.analysis.head_naming import LEVEL, MARGIN, HeadCall, name_heads, named
from plateauscope.analysis.patch import patch
from plateauscope.analysis.results import (
    append_records,
    load_records,
    pick_steps,
    probe_pass_path,
    probe_steps_path,
    settings_key,
    write_json_result,
)
from plateauscope.analysis.transition import co_occurrence, transition
from plateauscope.model.heads import head_label
from plateauscope.runs.imported import record_probe
from plateauscope.runs.run import RunError
from plateauscope.runs.series import Fetch, ImportedSeries, is_imported
from plateauscope.tasks.base import Task
from plateauscope.tasks.probe import (
    BUILTIN_PROBES,
    ProbeError,
    ProbeSignals,
    build_probe,
    chance_scores,
    offers_pairs,
    probe_class,
    probe_code_error,
)

@dataclass
class ProbeStep:
    """The probe's signals at one checkpoint."""

    step: int
    head_scores: dict[str, list[list[float]]]
    """Detection pattern -> ``[n_layers][n_heads]``: mean attention to the pattern's targets
    (:func:`plateauscope.tasks.probe.target_scores`), over the probe's sequences."""
    null_scores: dict[str, list[list[float]]]
    """The same under each pattern's null (uniform attention, or the probe's control sequences)."""
    detector_scores: dict[str, list[list[float]]]
    """TransformerLens ``head_detector``'s ``mul`` scores, for comparison."""
    loss_gap: float | None
    """Loss on the first copy minus loss on the second (the induction probe), or None."""
    head_patching: list[list[float]] | None
    """Exact patching of each head's output, the share of the clean-corrupted logit difference it restores."""
    loss_gap_sequences: list[float] | None = None
    """The loss gap per probe sequence (the transition's bootstrap resamples them)."""
    score_sequences: dict[str, list[list[list[float]]]] = field(default_factory=dict)
    """Detection pattern -> ``[N][n_layers][n_heads]``: each sequence's score (the co-occurrence's resamples)."""


@dataclass
class ProbeSeriesResult:
    """The cheap pass over an imported series: the signals per step, the heads named at the last step and the
    transition of the loss gap."""

    probe: str
    architecture: str
    steps: list[ProbeStep]
    layout: str = ""
    """The probe's own description (its lengths, lags and start token)."""
    heads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Detection pattern -> every head's reading at the last step
    (:class:`plateauscope.analysis.head_naming.HeadCall`), strongest first."""
    named_heads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Detection pattern -> the heads the rule names at the last step (content-based; no fixed-lag copier, no layer-0
    head for a pattern that reads an earlier layer), strongest first."""
    rule: str = ""
    """The naming rule in one line."""
    transition: dict[str, Any] | None = None
    """The loss gap's onset, phase change and end (:class:`plateauscope.analysis.transition.Transition`), or None."""
    co_occurrence: dict[str, Any] | None = None
    """Whether the named heads' scores rise in the gap's window
    (:class:`plateauscope.analysis.transition.CoOccurrence`), or None."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


def _rounded(values: torch.Tensor) -> list:
    """A tensor as nested lists of floats to 6 decimals (NaN as None)."""
    return [None if v != v else round(v, 6) for v in values.tolist()] if values.dim() == 1 \
        else [_rounded(row) for row in values]


def _probe_call(call: Callable[[], Any], built: Any, spec: str, what: str) -> Any:
    """``call()``; an error raised in a probe of one's own is one line naming its file and line (a built-in
    probe's error is the toolkit's: raised as it is)."""
    try:
        return call()
    except ProbeError:
        raise
    except Exception as e:
        if spec in BUILTIN_PROBES:
            raise
        raise probe_code_error(e, type(built), spec, what) from None


def read_heads(built: Any, signals: ProbeSignals, margin: float) -> dict[str, list[HeadCall]]:
    """Every head's reading on each of the probe's patterns at one checkpoint (:func:`name_heads`)."""
    tokens = built.scored_tokens()
    return {name: name_heads(name, signals.scores[name], signals.nulls[name], chance_scores(detection),
                             signals.lags.get(name), margin)
            for name, detection in built.detection_patterns(tokens).items() if name in signals.scores}


def analyze_imported(run_dir: str | Path, probe: str = "induction", steps: list[int] | None = None, every: int = 1,
                     device: str = "cpu", patching: bool = True, progress: bool = True,
                     rule: ChangePointRule | None = None, n_pairs: int = 64, on_step: Callable[[int], None] | None = None,
                     margin: float = MARGIN, fetch: Fetch | None = None,
                     **probe_options: Any) -> ProbeSeriesResult:
    """The probe's cheap pass over the chosen checkpoints of an imported run (module docstring);
    ``n_pairs``: the prompt pairs head patching runs on; ``margin``: the naming rule's
    (:mod:`plateauscope.analysis.head_naming`); ``probe_options``: the probe's own (the induction probe:
    ``segment_len``, ``bos``); ``on_step(step)``: called after each step; ``fetch``: a hub series' checkpoints,
    fetched as each is read (a step already in the pass's cache is not read)."""
    rule = rule or ChangePointRule()
    cls = probe_class(probe)  # a probe file that lacks what a probe needs fails here, in one line
    series = ImportedSeries(run_dir, fetch)
    chosen = pick_steps(series.steps, every, steps)
    cache = probe_steps_path(run_dir, cls.probe_name)
    key = settings_key({"probe": probe, "options": probe_options, "patching": patching, "n_pairs": n_pairs,
                        "source": hashlib.sha256(Path(inspect.getsourcefile(cls) or "").read_bytes()).hexdigest()[:16]})
    have = {r["step"] for r in load_records(cache, key)}
    model = built = pairs = last = None

    def load(step: int) -> None:  # the step's weights into the one model; the probe built for it once
        nonlocal model, built, pairs
        model = series.model(step, device, reuse=model)
        if built is None:
            built = build_probe(probe, model.cfg.d_vocab, model.cfg.n_ctx, tokenizer=series.loaded_tokenizer,
                                **probe_options)
            pairs = (_probe_call(lambda: built.prompt_pairs(n_pairs, 0), built, probe, "prompt_pairs")
                     if patching and offers_pairs(built) else None)

    for step in tqdm([s for s in chosen if s not in have], desc=f"probe {Path(run_dir).name}", disable=not progress,
                     dynamic_ncols=True):
        load(step)
        signals = _probe_call(lambda: built.signals(model), built, probe, "head_scores / loss_gap")
        patched = patch(model, pairs, "heads").normalised.tolist() if pairs is not None else None
        gap = signals.loss_gap
        record = ProbeStep(
            step, {k: _rounded(v.nanmean(0)) for k, v in signals.scores.items()},
            {k: _rounded(v.nanmean(0)) for k, v in signals.nulls.items()},
            {k: _rounded(v) for k, v in signals.detector.items()}, None if gap is None else float(gap.mean()), patched,
            None if gap is None else _rounded(gap), {k: _rounded(v) for k, v in signals.scores.items()})
        append_records(cache, [{**asdict(record), "settings": key}])  # a killed pass resumes from here
        last = signals if step == chosen[-1] else last
        if on_step is not None:
            on_step(step)
    if last is None:  # the last step came from the cache: its per-sequence signals again, for the naming
        load(chosen[-1])
        last = _probe_call(lambda: built.signals(model), built, probe, "head_scores / loss_gap")
    records = [ProbeStep(**{k: v for k, v in r.items() if k != "settings"})
               for r in load_records(cache, key) if r["step"] in set(chosen)]
    probe_name, signals = cls.probe_name, last
    result = ProbeSeriesResult(probe_name, series.architecture, records, built.describe() if built else "",
                               rule=f"named where the {LEVEL:.0%} interval of (score - null) over the probe's "
                                    f"sequences lies above {margin:g}")
    if signals is not None:
        calls = read_heads(built, signals, margin)
        result.heads = {name: [c.to_dict() for c in found] for name, found in calls.items()}
        result.named_heads = {name: named(found) for name, found in calls.items()}
    if records and all(r.loss_gap_sequences is not None for r in records) and len(records) >= 3:
        gaps = np.array([r.loss_gap_sequences for r in records], dtype=float)
        passed = transition(chosen, gaps, rule=rule)
        result.transition = passed.to_dict()
        heads = result.named_heads.get("induction") or []
        if heads:
            per_sequence = np.array([[[seq[a][b] for a, b in heads] for seq in r.score_sequences["induction"]]
                                     for r in records], dtype=float).mean(-1)
            result.co_occurrence = co_occurrence(chosen, gaps, per_sequence, "induction",
                                                 [head_label(a, b) for a, b in heads], passed).to_dict()
    write_json_result(probe_pass_path(run_dir, probe_name), result.to_dict())
    return result


def analyze_series(run_dir: str | Path, probe: str = "induction", probe_options: dict[str, Any] | None = None,
                   steps: list[int] | None = None, every: int = 1, device: str = "cpu", progress: bool = True,
                   probe_only: bool = False, fetch: Fetch | None = None,
                   **analysis: Any) -> tuple[ProbeSeriesResult | None, dict[str, Any] | None]:
    """A run's whole analysis, trained here or imported: for an imported run, the probe's pass
    (:func:`plateauscope.analysis.probe_pass.analyze_imported`), then, where the probe is also a task, every analysis on
    the probe's data (:func:`analyze_run`, ``analysis``: its keyword arguments), the probe recorded for the report,
    the view and ``ps.Run``; for a run trained here, :func:`analyze_run` alone (``probe`` must be left as it is).
    ``probe_only``: an imported run's pass alone (a small part of the whole's cost: ``bench/imported_analysis.py``).
    ``fetch``: an imported run's checkpoints from the hub, fetched as each is read
    (:class:`plateauscope.runs.series.ImportedSeries`); where it keeps at most ``keep`` revisions, at most that many
    workers read checkpoints at once.
    Returns ``(the probe's pass or None, the summary or None)``: None where a probe that is not a task has no more,
    or with ``probe_only``."""
    options = probe_options or {}
    if not is_imported(run_dir):
        if probe_only:
            raise RunError(f"{run_dir}: the probe's pass alone is for an imported run (plateauscope import); this "
                           "run's analyses read its own task")
        if probe != "induction" or options:
            raise RunError(f"{run_dir}: a probe is for an imported run (plateauscope import); this run's analyses read "
                           "its own task")
        return None, analyze_run(run_dir, steps, every, device=device, progress=progress, **analysis)
    keep = getattr(fetch, "keep", None)
    if keep is not None:  # a revision that a worker may still be reading is never evicted: at most keep workers
        analysis["workers"] = min(analysis.get("workers") or default_workers(device), keep)
    passed = analyze_imported(run_dir, probe, steps, every, device, progress=progress, fetch=fetch, **options)
    if probe_only or not issubclass(probe_class(probe), Task):  # asked for, or prompts and patterns only: the pass
        return passed, None
    record_probe(run_dir, probe, options)  # the probe every later analysis and view reads
    return passed, analyze_run(run_dir, steps, every, device=device, progress=progress, fetch=fetch, **analysis)
