"""An imported run's probe pass in a report: the phase change as Olsson et al. (2022) draw it, the heads the probe
names and the loss gap's transition, from ``RUN/analysis/probe_<name>.json``
(:mod:`plateauscope.analysis.probe_pass`), in the probe's own words.

* :func:`phase_change_figure`: the in-context loss gap (top) and the scores of the heads the probe's rule names
  (bottom: induction solid, previous-token dashed, the other heads grey, the null dotted) over the pass's
  checkpoints, the onset, the phase change and the end shaded over their 95% intervals; its caption is the
  sentences the command line prints (:func:`plateauscope.views.phrases.transition_lines`,
  :func:`~plateauscope.views.phrases.probe_head_lines`), so the two never disagree;
* :func:`head_rows`: every head's reading at the last step, as table rows;
* :func:`probe_terms`: the probe's words for what a task calls its cue and its cue effect (an imported run has
  no selector: the induction probe's cue is the induction target);
* :func:`probe_record_path`: the record a report reads (the probe of ``RUN/analysis/probe.json``, else the pass
  written last);
* :func:`build_pass_report`: the page of a probe that is not a task (its pass is its analysis).

``plateauscope report`` on an imported run (:mod:`plateauscope.views.report`) draws these; the page of a probe
that is also a task adds the analyses of its data in the same words.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from plateauscope.analysis.results import analysis_dir
from plateauscope.model.heads import head_label
from plateauscope.runs.files import ANALYSIS_DIR, RunError, read_json
from plateauscope.runs.imported import PROBE_FILE, read_probe_choice
from plateauscope.runs.series import ImportedSeries
from plateauscope.views.figures import FIGURE_HEIGHT, HEAD_COLORS, OTHER_COLOR, layout
from plateauscope.views.pages import figure_section, page, table_html
from plateauscope.views.phrases import head_call_text, landmark_text, probe_head_lines, transition_lines

LANDMARKS: tuple[tuple[str, str, str], ...] = (("onset", "onset", "#6baed6"),
                                               ("phase_change", "phase change", "#fd8d3c"),
                                               ("end", "end", "#74c476"))
"""The transition's parts as drawn: record key, label, colour (shaded over the 95% interval, a line at the step)."""
PATTERN_DASH = {"induction": "solid", "previous_token": "dash"}
"""Line style per detection pattern; any other pattern takes the next of :data:`OTHER_DASHES` (the null's is
dotted)."""
OTHER_DASHES = ("dashdot", "longdash", "longdashdot")
DASH_WORDS = {"solid": "solid", "dash": "dashed", "dashdot": "dash-dotted", "longdash": "long-dashed",
              "longdashdot": "long-dash-dotted"}
"""The line styles in words."""
PASS_NOTE = ("An imported series analysed with a probe that is not a task (it has no evaluate): its pass is its "
             "analysis. Every number is measured on the probe's own sequences at each chosen checkpoint: each head's "
             "mean attention to each pattern's targets against its null, the loss gap where the probe measures one, "
             "and head patching on its prompt pairs where it gives them.")
"""The note of a report of the pass alone."""


def pattern_dashes(names: list[str]) -> dict[str, str]:
    """Each detection pattern's line style: ``induction`` solid, ``previous_token`` dashed, the others in turn."""
    others = [name for name in names if name not in PATTERN_DASH]
    return {name: PATTERN_DASH.get(name) or OTHER_DASHES[others.index(name) % len(OTHER_DASHES)] for name in names}


def pattern_words(name: str) -> str:
    """``previous_token`` -> ``previous-token``."""
    return name.replace("_", "-")


def probe_terms(task: Any) -> dict[str, str]:
    """The probe's words for what a task calls its cue (``target``), its cue effect (``effect``: a short label, and
    ``effect_text``, what it measures) and its corrupted prompts (``corrupted``): the induction probe's cue is the
    induction target, the token after the earlier occurrence; any other task keeps its own label
    (``ProgressMeasure.cue_label``)."""
    from plateauscope.tasks.loading import task_class  # the registry, by name: no built-in task module imported here

    if isinstance(task, task_class("induction")):
        return {"target": "the induction target", "effect": "first-copy effect",
                "effect_text": "the repeat loss with the first copy replaced by unused tokens, minus the repeat loss",
                "corrupted": "the token after the earlier occurrence swapped for one the sequence does not use"}
    label = task.progress.cue_label
    return {"target": "the probe's target", "effect": label, "effect_text": label,
            "corrupted": "the probe's corrupted prompts"}


def probe_record_path(run_dir: str | Path) -> Path | None:
    """The probe record a report reads: that of the probe in ``RUN/analysis/probe.json`` (a probe that is also a
    task), else the ``probe_<name>.json`` written last (a probe that is not a task records no choice); None
    without any."""
    folder = analysis_dir(run_dir)
    if (folder / PROBE_FILE).exists():
        from plateauscope.tasks.base import TaskError
        from plateauscope.tasks.probe import probe_class

        try:
            name = probe_class(read_probe_choice(run_dir)["probe"]).probe_name
        except TaskError:  # a probe file that moved: the pass written last
            name = None
        if name is not None and (folder / f"probe_{name}.json").is_file():
            return folder / f"probe_{name}.json"
    found = sorted(folder.glob("probe_*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def read_probe_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The record of :func:`probe_record_path`, or None."""
    path = probe_record_path(run_dir)
    return None if path is None else read_json(path)


def sentences(lines: list[str]) -> str:
    """Command-line lines as prose: each stripped, capitalised and ended with a full stop."""
    out = []
    for line in lines:
        text = line.strip().rstrip(":")
        if text:
            out.append(text[0].upper() + text[1:] + ("" if text.endswith(".") else "."))
    return " ".join(out)


def _patterns(record: dict[str, Any]) -> list[str]:
    """The record's detection patterns, ``induction`` first."""
    names = list(record.get("heads") or (record["steps"][-1]["head_scores"] if record.get("steps") else {}))
    return sorted(names, key=lambda n: n != "induction")


def _gap_band(step: dict[str, Any]) -> tuple[float | None, float | None]:
    """The loss gap's mean -+ 1.96 standard errors over the probe's sequences at one step (None without them)."""
    values = [v for v in step.get("loss_gap_sequences") or [] if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return None, None
    mean = sum(values) / len(values)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return mean - 1.96 * se, mean + 1.96 * se


def _shade_transition(fig: go.Figure, transition: dict[str, Any] | None, rows: int) -> None:
    """The onset, phase change and end: each shaded over its interval (its bracket where it has none) on every
    row, a line at its step, labelled above the top row (one label a line, so close landmarks stay legible)."""
    if not transition:
        return
    for i, (key, label, colour) in enumerate(LANDMARKS):
        mark = transition.get(key)
        if mark is None:
            continue
        low, high = mark["interval"] or mark["bracket"]
        for row in range(1, rows + 1):
            where = {"row": row, "col": 1} if rows > 1 else {}
            fig.add_vrect(x0=low, x1=max(high, low + 1e-9), fillcolor=colour, opacity=0.18, line_width=0,
                          layer="below", **where)
            fig.add_vline(x=mark["step"], line={"color": colour, "dash": "dash", "width": 1.3}, **where)
        fig.add_annotation(x=mark["step"], y=1.0 + 0.05 * (len(LANDMARKS) - 1 - i), xref="x", yref="paper",
                           yanchor="bottom", showarrow=False, font={"size": 11, "color": colour},
                           text=f"{label} {mark['step']:.0f} [{low:.0f}, {high:.0f}]")


def phase_change_figure(record: dict[str, Any]) -> tuple[go.Figure, str]:
    """The phase change as Olsson et al. draw it (module docstring), and its caption from the record's numbers."""
    steps = [int(s["step"]) for s in record["steps"]]
    has_gap = any(s.get("loss_gap") is not None for s in record["steps"])
    rows = 2 if has_gap else 1
    fig = (make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.45, 0.55])
           if has_gap else go.Figure())
    where = {"row": rows, "col": 1} if has_gap else {}
    if has_gap:
        bands = [_gap_band(s) for s in record["steps"]]
        if any(lo is not None for lo, _ in bands):
            fig.add_trace(go.Scatter(x=steps + steps[::-1], y=[hi for _, hi in bands] + [lo for lo, _ in bands][::-1],
                                     fill="toself", fillcolor="rgba(0, 0, 0, 0.12)", line={"width": 0},
                                     hoverinfo="skip", name="loss gap -+ 1.96 s.e.", showlegend=True), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=[s.get("loss_gap") for s in record["steps"]], mode="lines+markers",
                                 name="in-context loss gap", line={"color": "black", "width": 2.5},
                                 marker={"size": 4}, hovertemplate="step %{x}<br>loss gap %{y:.3f}<extra></extra>"),
                      row=1, col=1)
    named = {name: [tuple(h) for h in (record.get("named_heads") or {}).get(name, [])] for name in _patterns(record)}
    colour, dashes = 0, pattern_dashes(_patterns(record))
    for name in _patterns(record):
        grids = [s["head_scores"].get(name) for s in record["steps"]]
        if not grids or grids[-1] is None:
            continue
        dash = dashes[name]
        words = pattern_words(name)
        shown = False
        cells = [(la, h) for la in range(len(grids[-1])) for h in range(len(grids[-1][la]))]
        for la, h in [c for c in cells if c not in named[name]] + named[name]:  # the named heads drawn on top
            values = [None if g is None else g[la][h] for g in grids]
            if (la, h) in named[name]:
                line = {"color": HEAD_COLORS[colour % len(HEAD_COLORS)], "width": 3, "dash": dash}
                colour += 1
                trace = go.Scatter(x=steps, y=values, mode="lines", name=f"{head_label(la, h)} {words} score",
                                   line=line)
            else:
                trace = go.Scatter(x=steps, y=values, mode="lines", name=f"other heads, {words} score",
                                   legendgroup=f"other-{name}", showlegend=not shown,
                                   line={"color": OTHER_COLOR, "width": 1, "dash": dash},
                                   hovertemplate=f"{head_label(la, h)} {words} score<br>step %{{x}}<br>%{{y:.3f}}"
                                                 "<extra></extra>")
                shown = True
            fig.add_trace(trace, **where)
        nulls = [s["null_scores"].get(name) for s in record["steps"]]
        over = named[name] or cells
        null = [None if g is None else _mean([g[la][h] for la, h in over]) for g in nulls]
        fig.add_trace(go.Scatter(x=steps, y=null, mode="lines", name=f"null, {words}",
                                 line={"color": "#444444", "width": 1.2, "dash": "dot"}), **where)
    _shade_transition(fig, record.get("transition"), rows)
    title = ("The phase change: the in-context loss gap and the named heads' scores" if has_gap
             else "The heads' scores over the checkpoints")
    layout(fig, title, "step", "mean attention to the target", height=FIGURE_HEIGHT + (200 if has_gap else 0), top=130)
    if has_gap:
        fig.update_yaxes(title_text="loss gap (nats)", row=1, col=1)
        fig.update_xaxes(title_text="", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", **where)
    return fig, phase_change_caption(record)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return sum(known) / len(known) if known else None


def shaded_words(transition: dict[str, Any] | None) -> str:
    """``onset, phase change and end``: the parts of the transition that exist (and are shaded); "" for none."""
    shaded = [label for key, label, _ in LANDMARKS if (transition or {}).get(key)]
    return ", ".join(shaded[:-1]) + " and " + shaded[-1] if len(shaded) > 1 else "".join(shaded)


def phase_change_caption(record: dict[str, Any]) -> str:
    """What :func:`phase_change_figure` draws, then the transition and the named heads in the sentences the
    command line prints (the record's numbers; a missing part is its note)."""
    n = len(record["steps"])
    has_gap = any(s.get("loss_gap") is not None for s in record["steps"])
    dashes = pattern_dashes(_patterns(record))
    patterns = ", ".join(f"{pattern_words(p)} {DASH_WORDS[dashes[p]]}" for p in _patterns(record))
    shaded = shaded_words(record.get("transition"))
    drawn = (f"At each of the {n} checkpoints of the probe's pass: "
             + ("top, the in-context loss gap (loss on the first copy minus loss on the second, the mean over the "
                "probe's sequences, shaded -+ 1.96 standard errors); bottom, " if has_gap else "")
             + f"each head's mean attention to the target of each pattern ({patterns}), the heads the probe's rule "
             "names in colour, the others grey, the null dotted"
             + (f"; shaded across both, the {shaded} over their 95% intervals. " if shaded else ". "))
    return drawn + sentences(transition_lines(record)) + " " + sentences(probe_head_lines(record)[1:])


def head_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """Every head's reading at the last step per pattern, strongest first: ``(pattern: head, verdict, score, null,
    score - null with its interval[, patching])``."""
    last = record["steps"][-1] if record.get("steps") else {}
    patching = last.get("head_patching")
    verdicts = {"named": "named", "fixed_lag": "fixed-lag copier (not by content)",
                "layer0_offset": "layer-0 offset head (by position, no induction head)", None: "not named"}
    rows = []
    for name in _patterns(record):
        for call in record["heads"].get(name, []):
            low, high = call["interval"]
            text = (f"{verdicts.get(call['kind'], call['kind'])}: {head_call_text(call)}; score - null "
                    f"{call['difference']:.3f} [{low:.3f}, {high:.3f}]")
            if patching is not None:
                value = patching[call["layer"]][call["index"]]
                text += "" if value is None else f"; head patching {value:+.2f}"
            rows.append((f"{pattern_words(name)}: {call['head']}", text))
    return rows


def heads_caption(record: dict[str, Any]) -> str:
    """The head table's caption: the rule and the heads it names (the command line's lines)."""
    last = record["steps"][-1] if record.get("steps") else {}
    note = (f" Head patching: the share of the clean - corrupted logit difference a head's clean output restores in "
            f"the corrupted run, at step {last['step']}." if last.get("head_patching") is not None else "")
    return sentences(probe_head_lines(record)) + note


def pass_sections(record: dict[str, Any], include_plotlyjs: bool) -> list[str]:
    """The pass as HTML parts: the phase-change figure, the head table and the transition."""
    fig, caption = phase_change_figure(record)
    has_gap = any(s.get("loss_gap") is not None for s in record["steps"])
    heading = "The phase change (Olsson et al. 2022)" if has_gap else "The heads over the checkpoints"
    return [*figure_section("phase_change", heading, fig, caption, include_plotlyjs),
            f"<h2>Heads the probe names ({html.escape(record['probe'])})</h2>", table_html(head_rows(record)),
            f'<p class="caption">{html.escape(heads_caption(record))}</p>']


def build_pass_report(run_dir: str | Path) -> str:
    """The report of an imported run's probe pass alone (a probe that is not a task), as one HTML string; a
    one-line RunError where no pass was written."""
    run_dir = Path(run_dir)
    record = read_probe_record(run_dir)
    if record is None:
        raise RunError(f"{run_dir / ANALYSIS_DIR}: no probe pass (probe_<name>.json); run `plateauscope analyze "
                       f"--run {run_dir}` first")
    series = ImportedSeries(run_dir)
    steps = [s["step"] for s in record["steps"]]
    parts = [f"<h1>Run report: {html.escape(run_dir.name)}</h1>",
             f'<p class="sub">{html.escape(str(run_dir.resolve()))} - imported series of '
             f"{html.escape(record['architecture'])} from {html.escape(series.source or 'series.json')}; probe "
             f"{html.escape(record['probe'])}: {html.escape(record.get('layout') or '')}; {len(steps)} of "
             f"{len(series.steps)} checkpoints, steps {steps[0] if steps else '-'} to {steps[-1] if steps else '-'}"
             "</p>",
             f'<p class="note">{html.escape(PASS_NOTE)}</p>',
             "<h2>Summary</h2>", table_html(pass_rows(record, len(series.steps))),
             *pass_sections(record, include_plotlyjs=True),
             '<p class="note">Written by <code>plateauscope report</code> from '
             f"<code>{html.escape(str(probe_record_path(run_dir)))}</code>; definitions: "
             "<code>plateauscope.analysis.probe_pass</code> (the pass), <code>plateauscope.analysis.head_naming</code> "
             "(the naming rule), <code>plateauscope.analysis.transition</code> (onset, phase change, end).</p>"]
    return page(f"Report: {run_dir.name}", parts)


def pass_rows(record: dict[str, Any], n_checkpoints: int) -> list[tuple[str, str]]:
    """The pass's summary as ``(name, value)`` rows: the probe, the heads named per pattern, the transition."""
    rows = [("probe", f"{record['probe']}: {record.get('layout') or 'no description'}"),
            ("analysed checkpoints", f"{len(record['steps'])} of {n_checkpoints}"),
            ("naming rule", record.get("rule") or "none recorded")]
    for name in _patterns(record):
        named = [c for c in record["heads"].get(name, []) if c["kind"] == "named"]
        rows.append((f"{pattern_words(name)} heads (at the last step)",
                     ", ".join(map(head_call_text, named)) or "none named"))
    rows.append(("the in-context loss gap", sentences(transition_lines(record))))
    return rows


def landmark_words(record: dict[str, Any] | None) -> str | None:
    """``the loss gap's phase change (half-rise) at step 517 [480, 560]``, or None without one."""
    mark = ((record or {}).get("transition") or {}).get("phase_change")
    return None if mark is None else f"the in-context loss gap's phase change (half-rise) at step {landmark_text(mark)}"


# ---- the analyses of a probe that is also a task, in its words ----------------------------------------------------


def crossing_words(progress: Any) -> str:
    """How the progress measure crosses (``ProgressMeasure.crossed``): ``below half of log V`` or ``above 0.5``."""
    return f"below half of {progress.height_label}" if progress.falls else "above 0.5"


def evaluation_figure(records: list[dict[str, Any]], progress: Any, terms: dict[str, str], tau: int | None,
                      transition: dict[str, Any] | None) -> tuple[go.Figure, str]:
    """The probe's progress measure and its cue effect (in the probe's words) on its evaluation sequences over the
    evaluated checkpoints, the height dotted, the crossing level dashed, the first crossing where there is one, the
    loss gap's transition shaded; the caption states only the numbers that exist."""
    steps = [int(r["step"]) for r in records]
    label, hl = progress.label, progress.height_label
    fig = go.Figure()
    values = [r.get(progress.key) for r in records]
    fig.add_trace(go.Scatter(x=steps, y=values, mode="lines+markers", name=label, line={"color": "black", "width": 2.5},
                             marker={"size": 4}))
    effect = progress.cue_effect_key
    has_effect = effect is not None and any(r.get(effect) is not None for r in records)
    if has_effect:
        fig.add_trace(go.Scatter(x=steps, y=[r.get(effect) for r in records], mode="lines+markers",
                                 name=terms["effect"], line={"color": HEAD_COLORS[0], "width": 2}, marker={"size": 4}))
    if progress.falls:
        fig.add_hline(y=progress.height, line={"color": "#1f77b4", "dash": "dot", "width": 1},
                      label={"text": hl, "textposition": "end", "font": {"size": 11, "color": "#1f77b4"}})
        fig.add_hline(y=progress.height / 2, line={"color": "#7f7f7f", "dash": "dash", "width": 1})
    if tau is not None:
        fig.add_vline(x=tau, line={"color": "#444444", "width": 1.2},
                      label={"text": f"{label} {crossing_words(progress)}", "textposition": "end", "textangle": 0,
                             "yanchor": "bottom", "font": {"size": 11, "color": "#444444"}})
    _shade_transition(fig, transition, 1)
    layout(fig, f"The probe's evaluation: {label}" + (f" and the {terms['effect']}" if has_effect else ""), "step",
           "nats", top=130)
    known = [(s, v) for s, v in zip(steps, values) if v is not None]
    if not known:
        return fig, f"No evaluation of the {label} is recorded."
    caption = (f"The {label} on the probe's evaluation sequences at {len(known)} checkpoints, from {known[0][1]:.3f} "
               f"at step {known[0][0]} to {known[-1][1]:.3f} at step {known[-1][0]}"
               + (f" ({hl} = {progress.height:.3f}, dotted; half of it dashed)" if progress.falls else ""))
    if tau is not None:
        caption += f"; it is first {crossing_words(progress)} at step {tau}."
    else:
        best = (min if progress.falls else max)(known, key=lambda sv: sv[1])
        caption += (f"; it is never {crossing_words(progress)} (its {'lowest' if progress.falls else 'highest'}, "
                    f"{best[1]:.3f}, at step {best[0]}).")
    if has_effect:
        known_effect = [(s, r[effect]) for s, r in zip(steps, records) if r.get(effect) is not None]
        caption += (f" The {terms['effect']} ({terms['effect_text']}) goes from {known_effect[0][1]:.3f} to "
                    f"{known_effect[-1][1]:.3f}.")
    if shaded_words(transition):
        caption += f" Shaded: the in-context loss gap's {shaded_words(transition)} (the probe's pass)."
    return fig, caption


def named_marks(record: dict[str, Any] | None) -> dict[tuple[int, int], str]:
    """``(layer, head)`` -> the patterns the probe's rule names it on (``induction``, ``previous-token``)."""
    marks: dict[tuple[int, int], list[str]] = {}
    for name in _patterns(record) if record else []:
        for la, h in (record.get("named_heads") or {}).get(name, []):
            marks.setdefault((int(la), int(h)), []).append(pattern_words(name))
    return {head: "/".join(words) for head, words in marks.items()}


def ablation_figure(records: list[dict[str, Any]], progress: Any, marks: dict[tuple[int, int], str],
                    transition: dict[str, Any] | None) -> tuple[go.Figure, str]:
    """The progress measure with each head mean-ablated on its own at every exact-analysis step, the heads the
    probe names in colour (``marks``: :func:`named_marks`), the others grey."""
    steps = [int(r["step"]) for r in records]
    label, hl = progress.label, progress.height_label
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=[r["mean"]["base"]["candidate_loss"] for r in records], mode="lines+markers",
                             name="no ablation", line={"color": "black", "width": 2.5}))
    grids = [r["mean"]["candidate_loss"] for r in records]
    n_layers, n_heads = len(grids[-1]), len(grids[-1][0])
    shown, colour = False, 0
    for la in range(n_layers):
        for h in range(n_heads):
            ys = [g[la][h] for g in grids]
            if (la, h) in marks:
                fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines", name=f"{head_label(la, h)} ({marks[la, h]}) "
                                         "mean-ablated", line={"color": HEAD_COLORS[colour % len(HEAD_COLORS)],
                                                               "width": 3}))
                colour += 1
            else:
                fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines", name="other heads, mean-ablated",
                                         legendgroup="other", showlegend=not shown,
                                         line={"color": OTHER_COLOR, "width": 1.2},
                                         hovertemplate=f"{head_label(la, h)} mean-ablated<br>step %{{x}}<br>%{{y:.3f}}"
                                                       "<extra></extra>"))
                shown = True
    if progress.falls:
        fig.add_hline(y=progress.height, line={"color": "#1f77b4", "dash": "dot", "width": 1},
                      label={"text": hl, "textposition": "end", "font": {"size": 11, "color": "#1f77b4"}})
    _shade_transition(fig, transition, 1)
    layout(fig, f"{label[0].upper() + label[1:]} with one head mean-ablated", "step", f"{label} (nats)", top=130)
    fig.update_yaxes(rangemode="tozero")
    last, base = grids[-1], records[-1]["mean"]["base"]["candidate_loss"]
    own = ", ".join(f"{head_label(*head)} ({words}) {last[head[0]][head[1]]:.3f}" for head, words in marks.items()
                    if last[head[0]][head[1]] is not None)
    others = [last[la][h] for la in range(n_layers) for h in range(n_heads)
              if (la, h) not in marks and last[la][h] is not None]
    caption = (f"The {label} with each head mean-ablated on its own at each of the {len(steps)} exact-analysis steps"
               + (f" ({hl} = {progress.height:.3f}, dotted)" if progress.falls else "") + ". "
               + f"At step {steps[-1]}, from {base:.3f} unablated: "
               + (f"the heads the probe names, {own}" if own else "the probe names no head")
               + (f"; the most any other head does alone, {max(others):.3f}." if others else "."))
    return fig, caption


def patching_caption(records: list[dict[str, Any]], terms: dict[str, str]) -> str:
    """The caption of the patching slider (``plateauscope.views.figures.patching_slider``) in the probe's words."""
    gap = [r["heads"]["clean_metric"] - r["heads"]["corrupt_metric"] for r in records]
    return (f"Drag the slider through the {len(records)} analysed steps: each cell is the logits a head's clean output "
            f"restores (patched - corrupted) when it is patched into the corrupted prompt ({terms['corrupted']}); the "
            f"clean - corrupted difference the heads can restore is {gap[0]:.2f} logits at step {records[0]['step']} "
            f"and {gap[-1]:.2f} at step {records[-1]['step']}.")


def llc_caption(summary: dict[str, Any], what: str, marks: dict[tuple[int, int], str]) -> str:
    """An LLC figure's caption on an imported run (``what``: ``the LLC`` or ``each head's LLC``)."""
    s = summary["settings"]
    named = ", ".join(f"{head_label(*head)} ({words})" for head, words in marks.items())
    return (f"{what[0].upper() + what[1:]} (SGLD: {s['num_chains']} chains x {s['num_draws']} draws, eps {s['lr']:g}, "
            f"gamma {s['localization']:g}, nbeta {s['nbeta']:g}) on the probe's sequences, at each checkpoint it was "
            "estimated at" + (f"; the heads the probe names: {named}." if named and "head" in what else "."))
