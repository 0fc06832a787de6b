"""A run's report: ONE self-contained HTML file that opens from disk with no network.

    plateauscope report --run checkpoints/demo [--examples 2] [--analyze] [--out FILE]

It holds a summary table (tau, t_form, lead fraction with their brackets, the selector head,
the set loss on the plateau, the collective-snap statistics, t_form and the lead by each rule,
the circuit verdict), every figure of :mod:`plateauscope.views.figures` with a heading and a one-sentence
caption, and CircuitsVis attention patterns of layer 0 and of the selector head's layer on a few
examples at five moments: the plateau start, t_form, tau/2, tau and the end of training (each
the nearest checkpoint), with, at each moment, one view of the top heads of the routing (the
circuit's heads at the end, ``plateauscope.analysis.circuit``) on the same examples.

Self-contained: plotly.js is inlined once (with the first figure), the CircuitsVis bundle once
(taken from its *local* rendering, ``RenderedHTML.local_src``; its ``str()`` and, when online,
its ``_repr_html_`` point to a CDN); no script, style or image is loaded from anywhere else.

The report reads the analysis cache (``RUN/analysis/``, written by ``plateauscope analyze``).
Without it the command fails with a one-line error saying which command to run, unless
``--analyze`` is given: then it runs the analysis first (``--every`` N-th checkpoint, with a
progress bar).

An imported run's report (:func:`build_imported_report`) is written in its probe's words: it opens with the
probe's pass (:mod:`plateauscope.views.probe_report`: the phase change, the heads the probe's rule names) and
marks those heads, never a routing head or a cue; a probe that is not a task gets its pass alone.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import circuitsvis as cv
from circuitsvis.utils.render import RenderedHTML

from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.attention import example_patterns
from plateauscope.analysis.changepoint import moved_first, run_landmarks
from plateauscope.analysis.landmarks import nearest
from plateauscope.analysis.measures import descriptions, measure_series
from plateauscope.analysis.results import (
    HEAD_LLC_SUMMARY_FILE,
    LLC_SUMMARY_FILE,
    OVERVIEW_FILE,
    REPORT_FILE,
    analysis_dir,
    median,
    routing_summary_path,
)
from plateauscope.analysis.snap import snap_statistics
from plateauscope.analysis.summary import plateau_stretch, stated_routing
from plateauscope.model.heads import head_label
from plateauscope.runs.imported import ImportedRun
from plateauscope.runs.machine import describe
from plateauscope.runs.run import Run, RunError, read_json, write_text_atomic
from plateauscope.runs.series import is_imported
from plateauscope.views.figures import all_figures, heldout_curves, ladder_lines, llc_figure, patching_slider
from plateauscope.views.llc_figures import head_llc_curves
from plateauscope.views.overview import overview_svg
from plateauscope.views.pages import figure_section, page, table_html, write_page
from plateauscope.views.phrases import (
    landmark_text,
    na,
    named_head_text,
    plateau_sentence,
    reads_cue_text,
    routing_name,
)
from plateauscope.views.probe_report import (
    ablation_figure,
    build_pass_report,
    crossing_words,
    evaluation_figure,
    llc_caption,
    named_marks,
    pass_rows,
    pass_sections,
    patching_caption,
    probe_terms,
    read_probe_record,
)
from plateauscope.views.timeline_figures import run_timeline

MOMENTS: tuple[str, ...] = ("plateau start", "t_form", "tau/2", "tau", "end")
"""The moments at which attention patterns are shown (each at the nearest checkpoint)."""

IMPORTED_NOTE = ("An imported series: every number here is measured on the probe's own sequences (its evaluation "
                 "stands in for the training metrics: tau and the plateau are the probe's progress measure against its "
                 "height), not on the training data, which an imported run lacks; the stages are the probe's reference "
                 "predictors'; "
                 "the training loss, summary.json's thresholds and the Hessian are not shown; an LLC is the "
                 "probe's sequences'.")
"""The report's note on an imported run (``plateauscope import``)."""
_CV_DIV = re.compile(r'<div id="(circuits-vis-[^"]+)"')
_CV_SCRIPT_OPEN = '<script crossorigin type="module">'
_CV_RENDER = "CircuitsVis.render("
_SOURCE_MAP = re.compile(r"^//# sourceMappingURL=.*$", re.MULTILINE)

# ---- the pieces ---------------------------------------------------------------------------


def moment_targets(steps: Sequence[int], plateau_start: int | None, tau: int | None,
                   t_form: int | None = None) -> dict[str, int | float | None]:
    """The step each moment of :data:`MOMENTS` stands for (None: that moment does not exist)."""
    return {"plateau start": plateau_start, "t_form": t_form, "tau/2": tau / 2 if tau else None,
            "tau": tau, "end": steps[-1] if steps else None}


def moment_steps(steps: Sequence[int], plateau_start: int | None, tau: int | None,
                 t_form: int | None = None) -> dict[str, int]:
    """``{moment: checkpoint step}`` for the moments that exist (no tau: no tau/2, no tau; no t_form), in
    the order of their steps (t_form may come before or after tau/2)."""
    targets = moment_targets(steps, plateau_start, tau, t_form)
    found = [(t, i, name) for i, (name, t) in enumerate(targets.items()) if t is not None]
    return {name: nearest(steps, t) for t, _, name in sorted(found)}


def attention_views(run: Run, step: int, layers: Sequence[int], examples: Sequence[int],
                    routing_head: Sequence[int] | None = None) -> list[tuple[int, int, RenderedHTML]]:
    """CircuitsVis attention views of the model at ``step``: ``[(example, layer, rendered), ...]``.

    Tokens are the characters of B, z and A (``<BOS>`` / ``<SEP>`` as such). Display
    ``rendered.local_src`` (self-contained); ``str(rendered)`` loads the library from a CDN.
    """
    return _views(run, step, layers, examples, [routing_head] if routing_head is not None else [], [])[0]


def _views(run: Run, step: int, layers: Sequence[int], examples: Sequence[int],
           routing_heads: Sequence[Sequence[int]], top_heads: Sequence[Sequence[int]]
           ) -> tuple[list[tuple[int, int, RenderedHTML]], list[tuple[int, RenderedHTML]]]:
    """Per-layer views (``routing_heads`` marked: the routing head, or the routing group's heads) and, when
    ``top_heads`` is not empty, one view per example of just those heads."""
    inputs, patterns = example_patterns(run, step, examples)  # patterns: [N, L, H, q, k]
    sel = {(int(la), int(h)) for la, h in routing_heads}
    out, top = [], []
    for n, (ex, words) in enumerate(zip(examples, inputs)):
        for layer in layers:
            names = [head_label(layer, h) + (" (selector)" if (layer, h) in sel else "")
                     for h in range(patterns.shape[2])]
            out.append((int(ex), int(layer), cv.attention.attention_heads(
                attention=patterns[n, layer], tokens=words, attention_head_names=names)))
        if top_heads:
            idx = [(int(la), int(h)) for la, h in top_heads]
            top.append((int(ex), cv.attention.attention_heads(
                attention=patterns[n, [la for la, _ in idx], [h for _, h in idx]], tokens=words,
                attention_head_names=[head_label(la, h) + (" (selector)" if (la, h) in sel else "") for la, h in idx])))
    return out, top


def top_heads(sel: dict[str, Any], n_max: int = 4) -> list[list[int]]:
    """The routing's top heads: those holding 80% of the head-patching effect at the last exact step
    (at most ``n_max``; at least the selector head, or where no single head is named the routing group's)."""
    circuit = sel.get("circuit") or {}
    heads = [list(h) for h in (circuit.get("shares") or {}).get("heads_for_80", [])][:n_max]
    drawn = stated_routing(sel)
    for head in drawn.heads if drawn is not None else []:
        if list(head) not in heads:
            heads.append(list(head))
    return heads


def split_circuitsvis(rendered: RenderedHTML) -> tuple[str, str, str]:
    """``(library_js, element_id, render_call_js)`` of a CircuitsVis *local* rendering.

    The library is the inlined bundle (the same in every rendering), so a page needs it once.
    """
    src = rendered.local_src
    m = _CV_DIV.search(src)
    start = src.find(_CV_SCRIPT_OPEN)
    if m is None or start < 0 or _CV_RENDER not in src:
        raise RunError("unexpected CircuitsVis output (circuitsvis version changed?)")
    body = src[start + len(_CV_SCRIPT_OPEN): src.rindex("</script>")]
    cut = body.rindex(_CV_RENDER)
    library = _SOURCE_MAP.sub("", body[:cut])
    call = body[cut:].strip().replace("</", "<\\/")
    return library, m.group(1), call


def has_landmarks(run: Run, tau: int | None) -> bool:
    """Whether what moved first is read on ``run``: it has tau and a plateau stretch (``summary.json``'s; on an
    imported run, whatever its tau, the probe's transition, ``plateauscope.analysis.changepoint.run_landmarks``)."""
    if not isinstance(run, ImportedRun):
        return tau is not None and bool(run.plateau_stretch())
    try:
        run_landmarks(run)
    except RunError:
        return False
    return True


def _bracket(b: Sequence[float | int] | None, fmt: str = "{}") -> str:
    return "" if not b else f" (bracket {fmt.format(b[0])} .. {fmt.format(b[1])})"


def summary_rows(run: Run, metrics: list[dict[str, Any]], selector: dict[str, Any],
                 snap: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary table as ``(name, value)`` text pairs."""
    summary = run.summary or {}
    sel = selector
    counts = sel.get("plateau_counts") or plateau_stretch(metrics, run.progress, sel.get("tau"))
    set0 = next((r.get("set_loss") for r in metrics if r.get("set_loss") is not None), None)
    abl = (sel.get("ablation") or {}).get("end")
    agree = [a["spearman"] for a in sel.get("agreement") or [] if a.get("spearman") is not None]
    pm = run.progress
    hl, cue = pm.height_label, pm.cue_label
    rows = [
        (hl, f"{pm.height:.3f}" + (f" (K = {run.config.task.K})" if hl == "log K" else "")),
        (f"tau (first step with {pm.label} < 0.5 {hl})", na(sel.get("tau"), "{}") + _bracket(sel.get("tau_bracket"))),
        *([(f"tau at thresholds 0.3 / 0.5 / 0.7 {hl}",
            " / ".join(na(v, "{}") for v in (summary.get("tau_by_threshold") or {}).values()) or "n/a")]
          if not isinstance(run, ImportedRun) else []),  # summary.json's, written by training
        (f"plateau ({pm.label} within 10% of {hl}" + (f", {cue} < 0.1 {hl})" if pm.cue_effect_key else ")"),
         plateau_sentence(counts, pm.label, hl)),
        *([("set loss on the plateau (median)", f"{na(summary.get('plateau_median_set_loss'))} nats "
                                                f"(step 0: {na(set0)}; 0 = all mass on the K candidates)")]
          if set0 is not None else []),
        *ladder_rows(summary.get("ladder"), run.plateau()),
        *plateau_rows(run.plateau(), counts["holds"]),
        ("routing head", (named_head_text(sel) if "named_head" in sel else sel.get("label"))
         + f" (rule: {sel.get('rule')}" + (f"; named when {sel['margin']['rule']})" if sel.get("margin") else ")")),
        *([("its attention to the cue", f"{na(sel.get('start_value'))} at the plateau start -> "
                                        f"{na(sel.get('final_value'))} at the end"),
           ("t_form (attention to the cue halfway up)", na(sel.get("t_form"), "{}") + _bracket(sel.get("t_form_bracket"))),
           ("lead fraction (tau - t_form) / tau", na(sel.get("lead_fraction"))
            + _bracket(sel.get("lead_bracket"), "{:.3f}") + (" (paper: about 0.5)" if hl == "log K" else "")),
           *[(f"t_form / lead by {rule}", na(r.get("t_form"), "{}") + _bracket(r.get("t_form_bracket"))
              + f"; lead {na(r.get('lead_fraction'))}" + _bracket(r.get("lead_bracket"), "{:.3f}"))
             for rule, r in (sel.get("t_form_rules") or {}).items()]] if sel.get("named_head", True) else []),
        *[(f"{name} head", f"{r['label']}: attention {na(r.get('start_value'))} at the plateau start -> "
                           f"{na(r.get('final_value'))} at the end; t_form {na(r.get('t_form'), '{}')}"
           + _bracket(r.get("t_form_bracket")) + f", lead {na(r.get('lead_fraction'))}")
          for name, r in (sel.get("attention_rules") or {}).items()],
        ("circuit verdict", _circuit_text(sel.get("circuit"), pm.label, hl)),
        ("where the routing head reads the cue (its output patched at one position; 1 = clean answer)",
         reads_cue_text(sel["circuit"], sel["head"]) if sel.get("circuit") else "n/a"),
        (f"routing head ablated at the end ({pm.label})",
         f"{na(abl['unablated'])} -> zero {na(abl['zero_ablated'])}, mean {na(abl['mean_ablated'])} "
         f"(zero-ablated, back within 25% of {hl}: {'yes' if sel.get('falls_back_to_marginal') else 'no'})"
         if abl else "n/a"),
        *([(f"groups >= {snap['hi']:.0%} accurate at tau/2", f"{na(snap['share_above_at_half_tau'], '{:.0%}')} of "
            f"{snap['n_groups']} tracked groups (at step {na(snap['half_tau_step'], '{}')}; paper: none)"),
           ("snapped groups", f"{snap['n_snapped']} / {snap['n_groups']} reach {snap['hi']:.0%}"),
           ("snap window (median over groups) / tau", f"{na(snap['snap_window_tau'])} ({snap['n_windows']} groups; "
            f"first step >= {snap['hi']:.0%} minus the last step < {snap['lo']:.0%} before it)"),
           ("spread of snap steps / tau", f"{na(snap['snap_spread_tau'])} (latest - earliest snap step; paper: about 0.5)")]
          if snap["n_groups"] else []),
        ("attribution vs exact patching (heads)",
         f"Spearman median {median(agree):.3f}, min {min(agree):.3f} over {len(agree)} steps" if agree else "n/a"),
        ("analysed checkpoints", f"{sel.get('analysed_steps')} of {len(run.steps)}"),
    ]
    return rows


def ladder_rows(ladder: dict[str, Any] | None, plateau: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The stages read from the ladder of reference predictors, checked against the thresholds' verdict."""
    if not ladder:
        return []
    label = {x["name"]: x["label"] for x in ladder["references"]}
    stage = ladder.get("plateau_stage")
    reached = sorted(ladder.get("first_reached", {}).items(), key=lambda kv: kv[1])
    return [
        ("stage on the plateau (the closest reference predictor by " f"{ladder['margin']} nats)",
         (f"{label[stage]} at {ladder['plateau_stage_share']:.0%} of the plateau's evaluations" if stage
          else "no single rung")
         + (f" (the thresholds' verdict: {plateau.get('verdict')}; "
            f"{'agrees' if plateau.get('agrees_with_ladder') else 'disagrees'})" if plateau else "")),
        ("stages in order (first step closest to each)",
         ", ".join(f"{label[name]} {step}" for name, step in reached) or "none"),
    ]


def plateau_rows(plateau: dict[str, Any] | None, holds: bool = True) -> list[tuple[str, str]]:
    """The plateau verdict as summary rows (none for a task without references); ``holds``: whether the counts
    find a plateau at the height (``plateauscope.runs.metrics.plateau_stretch``), else the verdict is said to
    read the longest in-band stretch only."""
    if plateau is None:
        return []
    ref, share = plateau["know_nothing"], plateau.get("share") or {}
    metric = ref.get("metric", "set_loss")
    rows = [
        (f"plateau verdict (marginal | global marginal | shelf | mixed, on the {metric.replace('_', ' ')})",
         ("" if holds else "of the longest in-band stretch only (by the counts, no plateau at the height): ")
         + f"{plateau.get('verdict') or 'no plateau'}: {na(share.get('marginal'), '{:.0%}')} marginal "
         f"(< {na(plateau.get('marginal_threshold'))}), "
         + (f"{na(share.get('global_marginal'), '{:.0%}')} global marginal "
            f"(< {na(plateau.get('global_marginal_threshold'))}), " if plateau.get("global_marginal_threshold") else "")
         + f"{na(share.get('shelf'), '{:.0%}')} shelf "
         f"(> {na(plateau.get('shelf_threshold'))}), {na(share.get('between'), '{:.0%}')} between"),
        ("know-nothing reference", f"{metric.replace('_', ' ')} {ref[metric]:.3f} nats; marginal floor "
                                   f"{plateau.get('marginal_floor', 0.0):.3f}"),
    ]
    global_ref = plateau.get("global_marginal")
    if global_ref:
        rows.append(("global-marginal reference (p(A) known, B and z ignored)",
                     f"{metric.replace('_', ' ')} {global_ref[metric]:.3f} nats"
                     + (f", first-token set loss {global_ref['first_token_set_loss']:.3f}"
                        if "first_token_set_loss" in global_ref else "")
                     + ("" if plateau.get("global_marginal_threshold") else
                        " (not a kind of its own: it coincides with the marginal or the know-nothing threshold)")))
    if metric == "set_loss":
        rows += [("know-nothing first-token losses (uniform over the alphabet)",
                  f"first-token set loss {ref['first_token_set_loss']:.3f}, first-token loss "
                  f"{ref['first_token_loss']:.3f} nats"),
                 ("first-token set loss on the plateau (median)", f"{na(plateau.get('median_first_token_set_loss'))} nats")]
    rows.append((f"t_marginal (first step with {metric.replace('_', ' ')} below the marginal threshold)",
                 na(plateau.get("t_marginal"), "{}")))
    if plateau.get("global_marginal_threshold") is not None:
        rows.append((f"t_global_marginal (first step with {metric.replace('_', ' ')} below the global-marginal "
                     "threshold)", na(plateau.get("t_global_marginal"), "{}")))
    return rows


def _circuit_text(c: dict[str, Any] | None, label: str, height_label: str) -> str:
    if not c:
        return "n/a (no exact-patching steps)"
    ch = c["chosen"]

    def cl(e: dict[str, Any]) -> str:
        return na(e["progress"]) + (f" (>= {height_label})" if e.get("reaches_height") else "")

    return (f"{c['verdict']}" + (f": {', '.join(c['heads'])}" if c["heads"] else "")
            + f" at step {c['step']} (top head {c['top']}: {c['top_share']:.0%} of all heads' positive patching effect, "
              f"{c['top_layer_share']:.0%} of its layer's; heads holding 80%: {c['shares']['n_for_80']}). "
              f"{ch['kind']} ablation, {label}: the routing head alone {cl(ch['alone'])}, its layer {cl(ch['layer'])}, "
              f"its layer but it {cl(ch['layer_but'])}, base {cl(ch['base'])}. Heads whose ablation alone returns it to "
              f"{height_label}: {', '.join(c.get('necessary') or []) or 'none'}"
            + (f". Keeping only {', '.join(suff['kept'])} (every other head of their layers ablated): {na(suff['progress'])}, "
               f"{ {True: 'sufficient', False: 'not sufficient', None: 'not tested'}[suff['sufficient']] }" if (suff := c.get("sufficiency")) else ""))


# ---- the page -----------------------------------------------------------------------------


def _analysed(run: Run) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's analysis cache and its routing summary, or a one-line error saying what to run."""
    analysis = load_analysis(run.path)
    if analysis["routing"] is None:
        raise RunError(f"{run.path}: no analysis cache ({routing_summary_path(run.path)}); "
                       f"run `plateauscope analyze --run {run.path}` first (or pass --analyze)")
    return analysis, analysis["routing"]


def build_overview(run_dir: str | Path) -> tuple[str, str]:
    """The run at a glance (``plateauscope.views.overview``): SVG text and caption, naming the machine that
    trained the run (the last of ``summary.json``'s ``machines``, when recorded)."""
    run = Run(run_dir)
    analysis, sel = _analysed(run)
    machines = (run.summary or {}).get("machines") or []
    return overview_svg(run.metrics(), analysis["attention"], sel, run.progress, run.plateau(),
                        describe(machines[-1]) if machines else None)


def report_figures(run: Run, analysis: dict[str, Any], sel: dict[str, Any]) -> list[tuple[str, str, Any, str]]:
    """Every figure of the report in reading order: the run's figures, then the LLC's and the per-head
    LLC's when computed, then what moved first when the run has tau and a plateau."""
    tau = sel.get("tau")
    metrics = run.metrics()
    figures = all_figures(metrics, analysis, run.progress, tau, run.plateau(), (run.summary or {}).get("ladder"))
    heldout = heldout_curves(metrics, tau)
    if heldout is not None:
        figures.insert(1, ("heldout", "Training and held-out curves", *heldout))
    llc_path = analysis_dir(run.path) / LLC_SUMMARY_FILE
    if llc_path.exists():  # written by plateauscope llc; landmarks from the current selector summary
        drawn = stated_routing(sel)  # the routing head's t_form, or the routing group's where no head is named
        llc = {**read_json(llc_path), "tau": tau, "t_form": drawn.t_form if drawn else None}
        figures.append(("llc", "Local learning coefficient", *llc_figure(llc)))
    head_llc_path = analysis_dir(run.path) / HEAD_LLC_SUMMARY_FILE
    if head_llc_path.exists():  # written by plateauscope llc --per-head
        figures.append(("head_llc", "Per-head LLC over training", *head_llc_curves(read_json(head_llc_path))))
    if has_landmarks(run, tau):  # the one change-point rule on every signal
        figures.append(("moved_first", "What moved first", *run_timeline(moved_first(run.path, write=False))))
    return figures


def build_report(run_dir: str | Path, n_examples: int = 2, seed: int = 0) -> str:
    """The report of an analysed run as one HTML string (an imported run's: :func:`build_imported_report`)."""
    run = Run(run_dir)
    if isinstance(run, ImportedRun):
        return build_imported_report(run, n_examples, seed)
    analysis, sel = _analysed(run)
    metrics = run.metrics()
    tau = sel.get("tau")
    snap = snap_statistics(metrics, tau)
    cfg = run.config
    origin = (f"imported series of {cfg.model.architecture} from {run.series.source or 'series.json'}; probe"
              if isinstance(run, ImportedRun) else f"preset {cfg.preset or 'none'}, task")
    parts = [f"<h1>Run report: {html.escape(run.path.name)}</h1>",
             f'<p class="sub">{html.escape(str(run.path.resolve()))} - {html.escape(origin)} '
             f"{html.escape(run.task().describe())}, {len(run.task().tokens)} sequences; "
             f"{cfg.model.n_layers} layers x {cfg.model.n_heads} heads, d_model {cfg.model.d_model}; "
             f"{len(run.steps)} checkpoints up to step {run.steps[-1] if run.steps else 'n/a'}</p>",
             *([f'<p class="note">{html.escape(IMPORTED_NOTE)}</p>'] if isinstance(run, ImportedRun) else []),
             "<h2>Summary</h2>", table_html(summary_rows(run, metrics, sel, snap))]
    svg, caption = build_overview(run.path)
    parts += ["<h2>At a glance</h2>", f'<div class="figure">{svg}</div>', f'<p class="caption">{html.escape(caption)}</p>']
    figures = report_figures(run, analysis, sel)
    for i, (key, heading, fig, caption) in enumerate(figures):
        parts += figure_section(key, heading, fig, caption, include_plotlyjs=(i == 0))
    parts += measures_section(run, analysis["measures"], tau)
    parts += _attention_section(run, sel, n_examples, seed)
    parts.append('<p class="note">Written by <code>plateauscope report</code>; definitions: '
                 "<code>plateauscope.analysis.formation</code> (selector head, t_form, lead fraction), "
                 "<code>plateauscope.analysis.snap</code> (snap statistics), <code>plateauscope.runs.metrics</code> (tau, plateau), "
                 "<code>plateauscope.analysis.llc</code> (local learning coefficient).</p>")
    return page(f"Report: {run.path.name}", parts)


def measure_rows(records: list[dict[str, Any]], moved: dict[str, Any] | None) -> list[tuple[str, str]]:
    """One row per series of the cheap pass's measures: its first and last value, and where the one
    change-point rule reads its change (``moved``: :func:`plateauscope.analysis.changepoint.moved_first`'s
    result, whose signals are ``measure:<series>``; None: no tau or plateau)."""
    rows = []
    for key, series in measure_series(records).items():
        known = [(s, v) for s, v in zip(series["steps"], series["values"]) if v is not None]
        if not known:
            continue
        text = f"{known[0][1]:.4g} at step {known[0][0]} -> {known[-1][1]:.4g} at step {known[-1][0]}"
        row = ((moved or {}).get("signals") or {}).get(f"measure:{key}")
        if row and row.get("step") is not None:
            name = moved.get("tau_name", "tau")
            text += (f"; changes at step {row['step']} ({row['fraction_of_tau']:.2f} "
                     f"{'tau' if name == 'tau' else 'x ' + name}, {row.get('direction')})")
        elif moved is not None:
            text += "; no change point"
        label = key + (f" ({series['head']})" if series.get("head") else "")
        rows.append((label, text))
    return rows


def measures_section(run: Run, records: list[dict[str, Any]], tau: int | None) -> list[str]:
    """The report's measures (``plateauscope.analysis.measures``): a table and what each measures; none
    without records (an analysis made before measures were cached)."""
    if not records:
        return []
    moved = moved_first(run.path, write=False) if has_landmarks(run, tau) else None
    what = descriptions(run.task())
    notes = "; ".join(f"{name}: {text}" for name, text in what.items() if name in records[-1]["values"])
    return ["<h2>Measures</h2>", table_html(measure_rows(records, moved)),
            (f'<p class="caption">{html.escape(notes)}. The change point is the one rule of '
             "<code>plateauscope moved_first</code>.</p>")]


def _attention_section(run: Run, sel: dict[str, Any], n_examples: int, seed: int) -> list[str]:
    head = sel.get("head")
    drawn = stated_routing(sel)  # the routing head, or the routing group where no single head is named
    marked = list(drawn.heads) if drawn is not None else []
    layers = sorted({0, *(la for la, _ in marked)}) if marked else sorted({0, int(head[0])}) if head else [0]
    tau, t_form = sel.get("tau"), drawn.t_form if drawn is not None else None
    moments = moment_steps(run.steps, sel.get("plateau_start"), tau, t_form)
    targets = moment_targets(run.steps, sel.get("plateau_start"), tau, t_form)
    tops = top_heads(sel)
    examples = run.task().sample_examples(n_examples, seed).tolist()
    parts = ["<h2>Attention patterns (CircuitsVis)</h2>",
             f'<p class="caption">Layer {" and layer ".join(map(str, layers))} on {len(examples)} examples '
             f"at {len(moments)} moments; click a head to enlarge it. "
             + (f"The {html.escape(routing_name(drawn))} is marked" if drawn is not None
                else "No routing head is named")
             + "; the last view of each moment shows only the routing's top heads "
             f"({html.escape(', '.join(head_label(*h) for h in tops))}: those holding 80% of the head-patching effect at "
             f"the end) on the same examples.</p>"]
    library_done = False
    for name, step in moments.items():
        views, top_views = _views(run, step, layers, examples, marked, tops)
        parts.append(f'<h3 class="moment">{html.escape(name)} (step {na(targets[name], "{:g}")}): nearest checkpoint, '
                     f'step {step}</h3><div class="cv-row">')
        cells = [(f"example {ex}, layer {layer}", r) for ex, layer, r in views]
        cells += [(f"example {ex}, top heads", r) for ex, r in top_views]
        for title, rendered in cells:
            library_done = add_circuitsvis_cell(parts, title, rendered, library_done)
        parts.append("</div>")
    return parts


# ---- an imported run: the probe's pass and the analyses of its data, in the probe's words ------------------------


def build_imported_report(run: ImportedRun, n_examples: int = 2, seed: int = 0) -> str:
    """The report of an imported run as one HTML string, in the probe's own words: the phase change and the heads
    the probe's rule names (:mod:`plateauscope.views.probe_report`, from ``probe_<name>.json``); then, where the
    probe is also a task and its analysis was run, the analyses of the probe's data. No routing head, cue or
    selector: the heads marked are those the probe's rule names. A probe that is not a task gets its pass alone
    (:func:`plateauscope.views.probe_report.build_pass_report`)."""
    record = read_probe_record(run.path)
    if not routing_summary_path(run.path).exists():
        if record is None:
            raise RunError(f"{run.path}: no analysis cache ({routing_summary_path(run.path)}) and no probe pass; "
                           f"run `plateauscope analyze --run {run.path}` first (or pass --analyze)")
        return build_pass_report(run.path)
    analysis, sel = _analysed(run)
    task, metrics, cfg = run.task(), run.metrics(), run.config
    terms = probe_terms(task)
    parts = [f"<h1>Run report: {html.escape(run.path.name)}</h1>",
             f'<p class="sub">{html.escape(str(run.path.resolve()))} - imported series of '
             f"{html.escape(cfg.model.architecture)} from {html.escape(run.series.source or 'series.json')}; probe "
             f"{html.escape(task.describe())}, {len(task.tokens)} sequences; {cfg.model.n_layers} layers x "
             f"{cfg.model.n_heads} heads, d_model {cfg.model.d_model}; {len(run.steps)} checkpoints up to step "
             f"{run.steps[-1]}</p>",
             f'<p class="note">{html.escape(IMPORTED_NOTE)}</p>',
             "<h2>Summary</h2>", table_html(imported_summary_rows(run, metrics, analysis, sel, record, terms))]
    if record is not None:
        parts += pass_sections(record, include_plotlyjs=True)
    for i, (key, heading, fig, caption) in enumerate(imported_figures(run, metrics, analysis, sel, record, terms)):
        parts += figure_section(key, heading, fig, caption, include_plotlyjs=record is None and i == 0)
    if analysis["measures"]:
        moved = moved_first(run.path, write=False) if has_landmarks(run, sel.get("tau")) else None
        what = descriptions(task)
        notes = "; ".join(f"{name}: {text}" for name, text in what.items() if name in analysis["measures"][-1]["values"])
        parts += ["<h2>Measures</h2>", table_html(imported_measure_rows(analysis["measures"], moved, record)),
                  f'<p class="caption">{html.escape(notes)}. A change point is the one rule of '
                  "<code>plateauscope moved_first</code>; the in-context loss gap's is the probe pass's transition.</p>"]
    parts += imported_attention_section(run, record, n_examples, seed)
    parts.append('<p class="note">Written by <code>plateauscope report</code>; definitions: '
                 "<code>plateauscope.analysis.probe_pass</code> (the probe's pass), "
                 "<code>plateauscope.analysis.head_naming</code> (the naming rule), "
                 "<code>plateauscope.analysis.transition</code> (onset, phase change, end), "
                 "<code>plateauscope.runs.metrics</code> (tau, plateau), "
                 "<code>plateauscope.analysis.llc</code> (local learning coefficient).</p>")
    return page(f"Report: {run.path.name}", parts)


def imported_summary_rows(run: ImportedRun, metrics: list[dict[str, Any]], analysis: dict[str, Any],
                          sel: dict[str, Any], record: dict[str, Any] | None,
                          terms: dict[str, str]) -> list[tuple[str, str]]:
    """An imported run's summary table: the probe's evaluation (tau, the plateau, the stages), the heads its rule
    names and the loss gap's transition (the probe's pass), the named heads ablated, the patching; a row is written
    only where its number exists."""
    pm = run.progress
    label, hl, tau = pm.label, pm.height_label, sel.get("tau")
    counts = sel.get("plateau_counts") or plateau_stretch(metrics, pm, tau)
    crossing = f"tau (first step with the {label} {crossing_words(pm)})"
    if tau is not None:
        tau_text = f"{tau}" + _bracket(sel.get("tau_bracket"))
    else:
        known = [(r["step"], r[pm.key]) for r in metrics if r.get(pm.key) is not None]
        best = (min if pm.falls else max)(known, key=lambda sv: sv[1]) if known else None
        tau_text = "not reached" + (f" (at best {best[1]:.3f}, at step {best[0]})" if best else "")
    rows = [(hl, f"{pm.height:.3f}"), (crossing, tau_text),
            (f"plateau ({label} within 10% of {hl}" + (f", {terms['effect']} < 0.1 {hl})" if pm.cue_effect_key else ")"),
             plateau_sentence(counts, label, hl)),
            *ladder_rows((run.summary or {}).get("ladder"), run.plateau()), *plateau_rows(run.plateau())]
    if record is not None:
        rows += pass_rows(record, len(run.steps))[2:]  # the rule, the heads per pattern, the loss gap
    marks = named_marks(record)
    if analysis["ablation"] and marks:
        last = analysis["ablation"][-1]
        grid = last["mean"]["candidate_loss"]
        rows.append((f"{label} with each named head mean-ablated (step {last['step']})",
                     ", ".join(f"{head_label(*h)} ({words}) {na(grid[h[0]][h[1]])}" for h, words in marks.items())
                     + f"; unablated {na(last['mean']['base']['candidate_loss'])}"
                     + (f"; {hl} = {pm.height:.3f}" if pm.falls else "")))
    shares = (sel.get("circuit") or {}).get("shares")
    if shares and shares.get("heads_for_80"):
        rows.append((f"heads holding 80% of the positive head-patching effect (step {sel['circuit']['step']})",
                     ", ".join(head_label(*h) + (f" ({marks[tuple(h)]})" if tuple(h) in marks else "")
                               for h in shares["heads_for_80"])
                     + f"; the largest, {head_label(*shares['top'])}, holds {shares['top_share']:.0%}"))
    agree = [a["spearman"] for a in sel.get("agreement") or [] if a.get("spearman") is not None]
    if agree:
        rows.append(("attribution vs exact patching (heads)",
                     f"Spearman median {median(agree):.3f}, min {min(agree):.3f} over {len(agree)} steps"))
    rows.append(("analysed checkpoints", f"{sel.get('analysed_steps')} of {len(run.steps)}"
                 + (f" ({len(record['steps'])} in the probe's pass)" if record is not None else "")))
    return rows


def imported_figures(run: ImportedRun, metrics: list[dict[str, Any]], analysis: dict[str, Any], sel: dict[str, Any],
                     record: dict[str, Any] | None, terms: dict[str, str]) -> list[tuple[str, str, Any, str]]:
    """The figures of an imported run after its phase change, each captioned in the probe's words: the probe's
    evaluation, its stages, head patching, the named heads ablated, and the LLC's where computed."""
    tau = sel.get("tau")
    transition = (record or {}).get("transition")
    marks = named_marks(record)
    figures: list[tuple[str, str, Any, str]] = []
    if metrics:
        figures.append(("evaluation", "The probe's evaluation",
                        *evaluation_figure(metrics, run.progress, terms, tau, transition)))
    ladder = (run.summary or {}).get("ladder")
    if ladder:
        fig, _ = ladder_lines(metrics, ladder, tau)
        label = {x["name"]: x["label"] for x in ladder["references"]}
        reached = sorted(ladder.get("first_reached", {}).items(), key=lambda kv: kv[1])
        order = ", then ".join(f"{label[name]} at step {step}" for name, step in reached) or "no rung by the margin"
        figures.append(("ladder", "Stages: the distance to each reference predictor", fig,
                        f"The model's KL divergence from each of the probe's reference predictors, averaged over the "
                        f"loss positions; a shaded band is a stage, where one is closer than every other by at least "
                        f"{ladder['margin']} nats. The model was first closest to {order}."
                        + (f" The {run.progress.label} is first {crossing_words(run.progress)} at step {tau}."
                           if tau is not None else "")))
    if analysis["patch"]:
        fig, _ = patching_slider(analysis["patch"])
        figures.append(("patching_slider", "Head patching over the checkpoints", fig,
                        patching_caption(analysis["patch"], terms)))
    if analysis["ablation"]:
        figures.append(("ablation", "The heads ablated",
                        *ablation_figure(analysis["ablation"], run.progress, marks, transition)))
    llc_path = analysis_dir(run.path) / LLC_SUMMARY_FILE
    if llc_path.exists():
        llc = {**read_json(llc_path), "tau": tau, "t_form": None}
        figures.append(("llc", "Local learning coefficient", llc_figure(llc, "Local learning coefficient")[0],
                        llc_caption(llc, "the local learning coefficient", marks)))
    head_llc_path = analysis_dir(run.path) / HEAD_LLC_SUMMARY_FILE
    if head_llc_path.exists():
        head_llc = {**read_json(head_llc_path), "t_form": None, "marked": {}}
        head_llc["clusters"] = {**(head_llc.get("clusters") or {}), "marked": {}}
        figures.append(("head_llc", "Per-head LLC", head_llc_curves(head_llc)[0],
                        llc_caption(head_llc, "each head's LLC, only its weights sampled,", marks)))
    return figures


def imported_measure_rows(records: list[dict[str, Any]], moved: dict[str, Any] | None,
                          record: dict[str, Any] | None) -> list[tuple[str, str]]:
    """:func:`measure_rows`, the in-context loss gap's change in three parts as the probe pass's transition
    states it (the one record every statement of it reads; its onset is ``moved_first``'s change point)."""
    transition = (record or {}).get("transition")
    rows = []
    for key, text in measure_rows(records, moved):
        if key == "in_context_loss_gap" and transition is not None:
            parts = [f"{name} {landmark_text(transition[part])}" for part, name in
                     (("onset", "onset"), ("phase_change", "phase change (half-rise)"), ("end", "end"))
                     if transition.get(part)]
            notes = "; ".join(transition["notes"])
            text = text.split(";")[0] + (f"; {', '.join(parts)} (the probe's pass){'; ' + notes if notes else ''}"
                                         if parts else f"; no transition ({notes or 'no rise'})")
        rows.append((key, text))
    return rows


def imported_attention_section(run: ImportedRun, record: dict[str, Any] | None, n_examples: int,
                               seed: int) -> list[str]:
    """CircuitsVis attention patterns of layer 0 and of the named heads' layers on a few of the probe's examples at
    the first checkpoint, the loss gap's onset, phase change and end, and the last checkpoint (each the nearest
    checkpoint), the heads the probe's rule names marked with their patterns."""
    marks = named_marks(record)
    transition = (record or {}).get("transition") or {}
    targets = {"first checkpoint": run.steps[0],
               **{name: transition[key]["step"] for key, name in (("onset", "onset"), ("phase_change", "phase change"),
                                                                   ("end", "end")) if transition.get(key)},
               "last checkpoint": run.steps[-1]}
    at: dict[int, list[str]] = {}  # checkpoint -> the moments it is the nearest to ("onset at 500")
    for name, x in sorted(targets.items(), key=lambda kv: kv[1]):
        at.setdefault(nearest(run.steps, x), []).append(f"{name} (step {x:.0f})")
    moments = sorted(at.items())
    layers = sorted({0, *(la for la, _ in marks)})
    examples = run.task().sample_examples(n_examples, seed).tolist()
    named = ", ".join(f"{head_label(*h)} ({words})" for h, words in marks.items())
    parts = ["<h2>Attention patterns (CircuitsVis)</h2>",
             f'<p class="caption">Layer {" and layer ".join(map(str, layers))} on {len(examples)} of the probe\'s '
             f"examples at {len(moments)} checkpoints; click a head to enlarge it. "
             + (f"Marked: the heads the probe's rule names, {html.escape(named)}." if named
                else "The probe's rule names no head.") + "</p>"]
    library_done = False
    for step, names in moments:
        inputs, patterns = example_patterns(run, step, examples)
        parts.append(f'<h3 class="moment">{html.escape(", ".join(names))}: nearest checkpoint, step {step}</h3>'
                     '<div class="cv-row">')
        for n, (ex, words) in enumerate(zip(examples, inputs)):
            for layer in layers:
                names = [head_label(layer, h) + (f" ({marks[layer, h]})" if (layer, h) in marks else "")
                         for h in range(patterns.shape[2])]
                rendered = cv.attention.attention_heads(attention=patterns[n, layer], tokens=words,
                                                        attention_head_names=names)
                library_done = add_circuitsvis_cell(parts, f"example {ex}, layer {layer}", rendered, library_done)
        parts.append("</div>")
    return parts


def add_circuitsvis_cell(parts: list[str], title: str, rendered: Any, library_done: bool) -> bool:
    """Append one CircuitsVis view as a titled cell to ``parts``; its library goes in once, after the heading
    (``parts[0]``). Returns True: the library is in."""
    library, elem_id, call = split_circuitsvis(rendered)
    if not library_done:
        parts.insert(1, f"<script>{library}</script>")
    parts.append(f'<div class="cv-cell"><h4>{title}</h4>'
                 f'<div class="cv-view" id="{elem_id}"></div><script>{call}</script></div>')
    return True


def write_report(run_dir: str | Path, out: str | Path | None = None, n_examples: int = 2, seed: int = 0,
                 live: str | None = None) -> Path:
    """Write the report (default ``RUN/report.html``) and, next to it, the run at a glance
    (``overview.svg``; not for an imported run, whose report opens with its phase change); return the report's
    path. ``live``: the status line of a run still being followed (``plateauscope.analysis.follow``)."""
    path = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    if not is_imported(run_dir):
        write_text_atomic(path.parent / OVERVIEW_FILE, build_overview(run_dir)[0])
    return write_page(path, build_report(run_dir, n_examples, seed), live)
