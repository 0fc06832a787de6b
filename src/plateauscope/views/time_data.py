"""The time view's data, assembled from a run's cached analyses (nothing is computed here).

:func:`time_view_data` reads ``RUN/analysis`` (``plateauscope.analysis.analyze``: edges, attention, attribution,
ablation, patterns) and ``metrics.jsonl`` and returns the dict that
:func:`plateauscope.views.time_view.render_time_view` draws:

* the steps: every step with an edge record;
* the edge graph and each edge's attribution effect in logits of the task's metric (not
  normalised: during the plateau the clean-corrupted gap is near 0 and a share of it is noise;
  in logits the circuit visibly grows), and the faithful circuit at each step it was searched at;
* heatmaps (layers x heads): attention to the cue, the attribution effect of head outputs in
  logits, the progress measure with the head mean-ablated (only at the exact steps), and the
  per-head LLC (``plateauscope llc --per-head``: only at the steps it was estimated at);
* the attention patterns of a few examples, as cached (uint8, base64);
* the measures of the cheap pass (``plateauscope.analysis.measures``): the per-head ones as heatmaps,
  every series scaled to its range as curves;
* the loss curves: the progress measure, the set loss and the cue effect where the task logs them;
  t_form (the named routing head's, or where no single head is named the routing group's) and tau from the
  run's summary (``routing.json``);
* a caption computed from the same numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plateauscope.analysis.analyze import AnalysisSettings, load_analysis
from plateauscope.analysis.edges import edges_summary, graph_of_record
from plateauscope.analysis.measures import measure_series
from plateauscope.analysis.results import HEAD_LLC_SUMMARY_FILE, analysis_dir, read_routing_summary
from plateauscope.analysis.summary import stated_routing
from plateauscope.model.heads import head_label, parse_head_label
from plateauscope.runs.imported import PROBE_FILE, ImportedRun
from plateauscope.runs.references import kl_key
from plateauscope.runs.run import Run, RunError, read_json
from plateauscope.views.phrases import routing_name, stability
from plateauscope.views.probe_report import landmark_words, pattern_words, probe_terms, read_probe_record

CURVE_KEYS = ("set_loss", "loss")
"""Logged fields drawn next to the progress measure and the cue effect, when a run has them."""


def _by_step(records: list[dict[str, Any]], steps: list[int], read) -> list[Any]:
    have = {r["step"]: r for r in records}
    out = []
    for s in steps:
        try:
            out.append(read(have[s]) if s in have else None)
        except (KeyError, TypeError):
            out.append(None)
    return out


def time_view_data(run_dir: str | Path, settings: AnalysisSettings | None = None) -> dict[str, Any]:
    """The view data of a run analysed with edges (a one-line RunError when it was not)."""
    run = Run(run_dir)
    cache = load_analysis(run.path, settings)
    edges = cache["edges"]
    if not edges:
        refused = ((read_routing_summary(run.path) or {}).get("refused") or {}).get("edges")
        if refused:  # the family has no edge graph: the view, which draws the edge circuit, has nothing to draw
            raise RunError(f"{run.path}: the time view draws the edge circuit over training, and {refused}")
        record = read_probe_record(run.path) if isinstance(run, ImportedRun) else None
        if record is not None and not (analysis_dir(run.path) / PROBE_FILE).exists():  # no task recorded
            raise RunError(f"{run.path}: probe {record['probe']} is not a plateauscope.Task, so its pass is its whole "
                           f"analysis: `plateauscope report --run {run.path}` draws it; the time view draws the edge "
                           "circuit over a task's data")
        raise RunError(f"{analysis_dir(run.path)}: no edge analysis; run plateauscope analyze --run {run.path} first")
    graph = graph_of_record(edges[-1])
    steps = [r["step"] for r in edges]
    progress = run.progress
    sel = cache["routing"] or {}

    def head_effect(r: dict[str, Any]) -> Any:  # raw patched metric minus the corrupted one, in logits
        heads = r["heads"]
        return [[None if x is None else x - heads["corrupt_metric"] for x in row] for row in heads["raw"]]

    heatmaps = [
        {"name": "attention to the cue", "values": _by_step(cache["attention"], steps, lambda r: r["to_z_first"])},
        {"name": "head attribution effect (logits)", "values": _by_step(cache["attribution"], steps, head_effect)},
        {"name": f"{progress.label} with the head mean-ablated",
         "values": _by_step(cache["ablation"], steps, lambda r: r["mean"]["candidate_loss"])},
        {"name": "per-head LLC", "values": head_llc_grids(run, steps, graph.n_layers, graph.n_heads)},
        *[{"name": name.replace("_", " "),
           "values": _by_step(cache["measures"], steps, lambda r, n=name: r["values"][n])}
          for name in head_measures(cache["measures"])],
    ]
    patterns = cache["patterns"]
    records = run.metrics()
    curve_keys = [progress.key] + ([progress.cue_effect_key] if progress.cue_effect_key else []) + list(CURVE_KEYS)
    curve_keys = [k for i, k in enumerate(curve_keys) if k not in curve_keys[:i] and any(k in r for r in records)]
    labels = {progress.key: progress.label, progress.cue_effect_key: progress.cue_label, "set_loss": "set loss",
              "loss": "training loss"}
    summary = edges_summary(edges, cache["edge_circuit"], cache["edge_exact"])
    drawn = stated_routing(sel)  # t_form of a named head, or of the routing group where no single head is named
    t_form = drawn.t_form if drawn is not None else None
    searched = {r["step"]: r.get("circuit") for r in cache["edge_circuit"]}
    data = {
        "title": f"{run.path.name}: the circuit over training",
        "caption": caption(summary, t_form, sel.get("tau"), len(steps),
                           routing_name(drawn) if drawn and drawn.is_group else None),
        "steps": steps,
        "n_layers": graph.n_layers,
        "n_heads": graph.n_heads,
        "nodes": graph.nodes(),
        "edges": graph.edge_names(),
        "edge_scores": [r["effect"] for r in edges],
        "circuit": [searched[s]["edges"] if searched.get(s) else None for s in steps],
        "heatmaps": [h for h in heatmaps if any(v is not None for v in h["values"])],
        "patterns": {"examples": patterns[-1]["tokens"] if patterns else [],
                     "values": _by_step(patterns, steps, lambda r: r["values"])},
        "curves": {"steps": [r["step"] for r in records],
                   "series": [{"name": labels.get(k, k), "values": [r.get(k) for r in records]} for k in curve_keys]},
        "markers": {"t_form": t_form, "tau": sel.get("tau")},
        "ladder": ladder_curves(records, (run.summary or {}).get("ladder")),
        "measures": measure_curves(cache["measures"]),
        **({"selected_head": sel["head"]} if sel.get("head") else {}),
        "score_unit": "attribution effect on the metric, logits",
    }
    return in_probe_words(data, run, summary) if isinstance(run, ImportedRun) else data


CUE_HEATMAP = "attention to the cue"
"""The heatmap of each head's attention from the prediction position to the task's cue."""


def in_probe_words(data: dict[str, Any], run: ImportedRun, summary: dict[str, Any] | None) -> dict[str, Any]:
    """An imported run's view data in the probe's own words (:mod:`plateauscope.views.probe_report`): no cue, no
    routing head and no t_form (the routing head's formation); the attention heatmap names the probe's target,
    the cue effect's curve its own name; the caption adds the heads the probe's rule names and the in-context loss
    gap's phase change (``probe_<name>.json``), and the head shown first is the first one named."""
    terms = probe_terms(run.task())
    record = read_probe_record(run.path)
    effect = run.progress.cue_label if run.progress.cue_effect_key else None
    heatmaps = [{**hm, "name": f"attention to {terms['target']} (prediction position)"} if hm["name"] == CUE_HEATMAP
                else hm for hm in data["heatmaps"]]
    series = [{**s, "name": terms["effect"]} if s["name"] == effect else s for s in data["curves"]["series"]]
    tau = data["markers"]["tau"]
    text = caption(summary, None, tau, len(data["steps"]))
    named = (record or {}).get("named_heads") or {}
    if record is not None:
        heads = "; ".join(f"{pattern_words(name)} heads " + (", ".join(head_label(*h) for h in named.get(name, []))
                                                            or "none named") for name in record["heads"])
        mark = landmark_words(record)
        notes = ((record.get("transition") or {}).get("notes") or ["no transition is read"])
        text += (f" The probe's pass ({record['probe']}, {len(record['steps'])} checkpoints): {heads}; "
                 + (mark if mark else f"the in-context loss gap: {'; '.join(notes)}") + ".")
    first = next((h for name in sorted(named, key=lambda n: n != "induction") for h in named[name]), None)
    out = {**data, "caption": text, "heatmaps": heatmaps, "curves": {**data["curves"], "series": series},
           "markers": {"t_form": None, "tau": tau}, "curves_title": "The probe's evaluation curves"}
    out.pop("selected_head", None)
    if first is not None:
        out["selected_head"] = [int(first[0]), int(first[1])]
    return out


def head_measures(records: list[dict[str, Any]]) -> list[str]:
    """The measures of the cheap pass that hold one value per head (drawn as heatmaps)."""
    return [name for name, per in (records[-1]["per"] if records else {}).items() if per == "head"]


def measure_curves(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The view's ``measures``: every series of the cheap pass's measures
    (``plateauscope.analysis.measures.measure_series``; the per-head ones as their mean) scaled to [0, 1]
    over its range, the range in its name; None without measures."""
    series = []
    for key, s in measure_series(records).items():
        if s["per"] == "head" and not key.endswith(":mean"):
            continue
        known = [v for v in s["values"] if v is not None and math.isfinite(v)]
        if not known:
            continue
        low, high = min(known), max(known)
        width = high - low or 1.0
        series.append({"name": f"{key.replace('_', ' ')} ({low:.3g} to {high:.3g})",
                       "values": [None if v is None or not math.isfinite(v) else (v - low) / width
                                  for v in s["values"]]})
    return {"steps": [int(r["step"]) for r in records], "series": series} if series else None


def head_llc_grids(run: Run, steps: list[int], n_layers: int, n_heads: int) -> list[Any]:
    """The per-head LLC (``head_llc.json``) as a layers x heads grid at each view step it was estimated at
    (None elsewhere, and a head it was not estimated for is None); all None without the file."""
    path = analysis_dir(run.path) / HEAD_LLC_SUMMARY_FILE
    if not path.exists():
        return [None] * len(steps)
    summary = read_json(path)
    try:
        cells = [parse_head_label(label, n_layers, n_heads) for label in summary["heads"]]
        at = dict(zip((int(s) for s in summary["steps"]), summary["llc"]))
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"{path}: not a per-head LLC summary ({e}); run plateauscope llc --per-head again") from None
    grids: list[Any] = []
    for step in steps:
        grid: list[list[float | None]] | None = None
        if step in at:
            grid = [[None] * n_heads for _ in range(n_layers)]
            for (layer, head), value in zip(cells, at[step]):
                grid[layer][head] = value
        grids.append(grid)
    return grids


def ladder_curves(records: list[dict[str, Any]], ladder: dict[str, Any] | None) -> dict[str, Any] | None:
    """The view's ``ladder``: the KL from each rung at every evaluation and the stage segments
    (``summary.json``'s ``ladder`` block); None without one."""
    if not ladder:
        return None
    return {"steps": [r["step"] for r in records],
            "series": [{"name": f"KL from {x['label']}", "stage": x["name"],
                        "values": [r.get(kl_key(x["name"])) for r in records]} for x in ladder["references"]],
            "segments": ladder["segments"]}


def caption(summary: dict[str, Any] | None, t_form: int | None, tau: int | None, n_steps: int,
            routing: str | None = None) -> str:
    """One paragraph from the edge summary: what the widths mean, the final circuit, when it settles;
    ``routing`` names the routing group whose t_form it is (``routing group L0H2 and L0H1``; None: the routing
    head's, or none)."""
    text = (f"{n_steps} analysed checkpoints. Edge width: the edge's attribution effect on the task's metric "
            "(logits), on one scale over all steps; blue raises the clean answer, red lowers it. Highlighted: the "
            "faithful circuit, the fewest top edges that recover the target share of the metric when every "
            "other edge is patched to the corrupted run.")
    searched = (summary or {}).get("searched_steps")
    if searched is not None and searched < n_steps:
        text += f" The circuit was searched at {searched} of these checkpoints, the landmarks of the adaptive analysis."
    last = (summary or {}).get("final_circuit")
    if last:
        text += (f" At step {summary['final_step']}, {last['size']} of {summary['n_edges']} edges recover "
                 f"{last['faithfulness']:.2f} (target {last['target']}); the circuit is {stability(summary, tau)}")
        marks = ([f"t_form {t_form}" + (f" (the {routing}'s)" if routing else "")] if t_form is not None else []) \
            + ([f"tau {tau}"] if tau is not None else [])  # only the landmarks that exist
        text += (f"; {', '.join(marks)}." if marks else ".")
    return text
