"""Figures of a run and its analysis: results in, ``(plotly Figure, one-sentence caption)`` out.

Every function here is pure: it takes already loaded records (``Run.metrics()``,
``plateauscope.analysis.analyze.load_analysis``, ``routing.json``) and returns a ``(figure, caption)`` pair;
nothing is read from disk, nothing is shown. Each figure has a title and axis labels; the
caption says, in one sentence, what the reader should see. Landmarks are drawn as labelled
vertical lines: ``tau`` (first step with candidate loss < 0.5 log K), ``tau/2`` and ``t_form``
(the selector head's formation step, ``plateauscope.analysis.formation``). Time-series figures have a
``linear x`` / ``log x`` toggle (step 0 is not drawn on the log axis). Where the summary names no single
routing head, the figures that highlight it take ``group`` (the routing group,
``plateauscope.analysis.summary.stated_routing``) instead: its heads are drawn and named, and t_form is the
group's mean attention's.

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from plateauscope.analysis.components import GAP_FLOOR, gap_problem
from plateauscope.analysis.hessian import PAPER_ANISOTROPY
from plateauscope.analysis.snap import (
    SNAP_HI,
    SNAP_LO,
    group_accuracies,
    snap_statistics,
)
from plateauscope.analysis.summary import plateau_stretch, stated_routing
from plateauscope.model.heads import head_label
from plateauscope.runs.metrics import MARGINAL_REL
from plateauscope.runs.references import kl_key
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.views.phrases import na, plateau_sentence

SELECTOR_COLOR = "#d62728"
OTHER_COLOR = "rgba(120, 120, 120, 0.55)"
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Line colours of the non-selector heads (no red: red is the selector head's)."""
LANDMARK_STYLE = {"tau": ("#444444", "solid"), "tau/2": ("#444444", "dot"), "t_form": ("#2ca02c", "dash")}
FIGURE_HEIGHT = 460

Captioned = tuple[go.Figure, str]


# ---- helpers ------------------------------------------------------------------------------



def _landmarks(tau: int | None, t_form: int | None) -> list[tuple[str, float]]:
    marks: list[tuple[str, float]] = []
    if tau is not None:
        marks += [("tau/2", tau / 2), ("tau", float(tau))]
    if t_form is not None:
        marks.append(("t_form", float(t_form)))
    return marks


def _add_landmarks(fig: go.Figure, tau: int | None, t_form: int | None, rows: Sequence[int] = (1,)) -> None:
    """Vertical lines at tau/2, tau and t_form (labelled on the first row only)."""
    names = {"tau/2": "τ/2", "tau": "τ", "t_form": "t_form"}
    for name, x in _landmarks(tau, t_form):
        color, dash = LANDMARK_STYLE[name]
        for i, row in enumerate(rows):
            label = ({"text": names[name], "textposition": "end", "textangle": 0, "yanchor": "bottom",
                      "font": {"size": 12, "color": color}} if i == 0 else None)
            kw: dict[str, Any] = {"row": row, "col": 1} if len(rows) > 1 or row != 1 else {}
            fig.add_vline(x=x, line={"color": color, "dash": dash, "width": 1.2}, label=label, **kw)


def _log_x_toggle(fig: go.Figure, n_xaxes: int = 1) -> None:
    """Buttons that switch every x axis between a linear and a log scale."""
    keys = ["xaxis"] + [f"xaxis{i}" for i in range(2, n_xaxes + 1)]
    buttons = [{"label": f"{kind} x", "method": "relayout", "args": [{f"{k}.type": kind for k in keys}]}
               for kind in ("linear", "log")]
    fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons,
                                    "x": 1.0, "xanchor": "right", "y": 1.12, "yanchor": "bottom",
                                    "showactive": True, "pad": {"r": 0, "t": 0}}])


def _array(nested: Any) -> np.ndarray:
    """A nested list from the cache (JSON null = NaN) as a float array."""
    return np.array(nested, dtype=float)


def _nan_to_none(a: np.ndarray) -> list:
    """A float array as nested lists with NaN as None (plotly leaves those cells empty)."""
    return np.where(np.isnan(a), None, a).tolist()


def layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = FIGURE_HEIGHT,
           legend: bool = True, top: int = 80, log: bool | None = None) -> go.Figure:
    """The house style of every figure: the title on the left, ``plotly_white``, hover on the nearest point,
    the legend to the right (``legend``), ``top`` pixels above the plot, and the axes' titles; ``log``:
    both axes logarithmic (True) or linear (False), said explicitly (None: plotly's choice)."""
    legend_ = {"legend": {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0}} if legend else {}
    fig.update_layout(title={"text": title, "x": 0.0, "xanchor": "left"}, height=height, template="plotly_white",
                      **legend_, margin={"l": 70, "r": 30, "t": top, "b": 55}, hovermode="closest")
    axis_type = {} if log is None else {"type": "log" if log else "linear"}
    fig.update_xaxes(title_text=x_title, **axis_type)
    fig.update_yaxes(title_text=y_title, **axis_type)
    return fig


def _highlighted(head: Sequence[int] | None, group: Sequence[Sequence[int]]) -> set[tuple[int, int]]:
    """The heads a figure draws as the routing: the routing group's, else the routing head."""
    if group:
        return {(int(la), int(h)) for la, h in group}
    return {(int(head[0]), int(head[1]))} if head is not None else set()


def _group_words(group: Sequence[Sequence[int]]) -> str:
    """``L0H2 and L0H1`` (``L0H2, L0H1 and L1H0``)."""
    labels = [head_label(int(la), int(h)) for la, h in group]
    return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else "".join(labels)


def _per_head_lines(steps: list[int], grid: np.ndarray, head: Sequence[int] | None, mode: str,
                    opacity: float, group: Sequence[Sequence[int]] = ()) -> go.Figure:
    """One line per head of a [steps, layer, head] grid; the selector head (or the routing group's heads) thick
    and red."""
    fig = go.Figure()
    marked = _highlighted(head, group)
    suffix = " (routing group)" if group else " (routing)"
    n_layers, n_heads = grid.shape[1:] if grid.size else (0, 0)
    for i, (l, h) in enumerate((l, h) for l in range(n_layers) for h in range(n_heads)):
        is_sel = (l, h) in marked
        fig.add_trace(go.Scatter(
            x=steps, y=_nan_to_none(grid[:, l, h]), mode=mode, name=head_label(l, h) + (suffix if is_sel else ""),
            line={"color": SELECTOR_COLOR if is_sel else HEAD_COLORS[i % len(HEAD_COLORS)],
                  "width": 3.5 if is_sel else 1.3}, opacity=1.0 if is_sel else opacity))
    return fig


def _head_grid(records: list[dict[str, Any]], field: str) -> tuple[list[int], np.ndarray]:
    """Steps and a [steps, layer, head] array of one per-head field of the analysis records."""
    steps = [int(r["step"]) for r in records]
    return steps, np.stack([_array(r[field]) for r in records]) if records else np.zeros((0, 0, 0))


# ---- training curves ----------------------------------------------------------------------


def loss_curves(records: list[dict[str, Any]], progress: ProgressMeasure, tau: int | None = None,
                t_form: int | None = None, plateau: dict[str, Any] | None = None) -> Captioned:
    """The task's progress measure over its height (e.g. candidate loss / log K), the training loss and
    (when logged) the set loss on top, the cue effect (e.g. delta_z) below, over steps.

    With ``plateau`` (the run's ``summary.json`` block) also the first-token set loss, the
    know-nothing set loss as a line, and the verdict in the title and caption.
    """
    key, height, hl = progress.key, progress.height, progress.height_label
    rec = [r for r in records if r.get(key) is not None]
    steps = [int(r["step"]) for r in rec]
    has_set_loss = any(r.get("set_loss") is not None for r in rec)
    cue = progress.cue_effect_key
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38],
                        specs=[[{"secondary_y": True}], [{}]])
    fig.add_trace(go.Scatter(x=steps, y=[r[key] / height for r in rec], name=f"{progress.label} / {hl}",
                             mode="lines", line={"color": "#1f77b4", "width": 2.5}), row=1, col=1)
    if any(r.get("loss") is not None for r in rec):  # an imported run has no training loss
        fig.add_trace(go.Scatter(x=steps, y=[r.get("loss") for r in rec], name="training loss (nats/token)",
                                 mode="lines", line={"color": "#ff7f0e", "width": 1.5}), row=1, col=1, secondary_y=True)
    if has_set_loss:
        fig.add_trace(go.Scatter(x=steps, y=[r.get("set_loss") for r in rec], name="set loss (nats)",
                                 mode="lines", line={"color": "#9467bd", "width": 1.5, "dash": "dash"}),
                      row=1, col=1, secondary_y=True)
    if cue is not None:
        fig.add_trace(go.Scatter(x=steps, y=[r.get(cue) for r in rec], name=f"{progress.cue_label} (nats)",
                                 mode="lines", line={"color": "#2ca02c", "width": 2}), row=2, col=1)
    fig.add_hline(y=1.0, line={"color": "#1f77b4", "dash": "dot", "width": 1},
                  label={"text": hl, "textposition": "end", "font": {"size": 11, "color": "#1f77b4"}}, row=1, col=1)
    verdict = ""
    if plateau is not None:
        if any(r.get("first_token_set_loss") is not None for r in rec):
            fig.add_trace(go.Scatter(x=steps, y=[r.get("first_token_set_loss") for r in rec],
                                     name="first-token set loss (nats)", mode="lines",
                                     line={"color": "#8c564b", "width": 1.2, "dash": "dot"}),
                          row=1, col=1, secondary_y=True)
        metric = plateau["know_nothing"].get("metric", "set_loss")
        ref = plateau["know_nothing"][metric]
        if metric != "set_loss":
            fig.add_trace(go.Scatter(x=steps, y=[r.get(metric) for r in rec], name=f"{metric.replace('_', ' ')} (nats)",
                                     mode="lines", line={"color": "#9467bd", "width": 1.5, "dash": "dash"}),
                          row=1, col=1, secondary_y=True)
        fig.add_hline(y=ref, line={"color": "#9467bd", "dash": "dot", "width": 1}, secondary_y=True,
                      label={"text": f"know-nothing {metric.replace('_', ' ')} {ref:.2f}", "textposition": "start",
                             "font": {"size": 11, "color": "#9467bd"}}, row=1, col=1)
        global_ref = (plateau.get("global_marginal") or {}).get(metric)
        if plateau.get("global_marginal_threshold") is not None:
            fig.add_hline(y=global_ref, line={"color": "#e377c2", "dash": "dot", "width": 1}, secondary_y=True,
                          label={"text": f"global marginal {global_ref:.2f}", "textposition": "start",
                                 "font": {"size": 11, "color": "#e377c2"}}, row=1, col=1)
        verdict = f"; plateau: {plateau.get('verdict') or 'none'}"
    _add_landmarks(fig, tau, t_form, rows=(1, 2))
    layout(fig, f"Loss across training ({hl} = {height:.3f}{verdict})", "", "", height=560)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text=f"{progress.label} / {hl}", row=1, col=1, secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="nats", row=1, col=1, secondary_y=True, rangemode="tozero", showgrid=False,
                     tickmode="auto")
    fig.update_yaxes(title_text=f"{progress.cue_label} (nats)", row=2, col=1)
    _log_x_toggle(fig, 2)
    counts = plateau_stretch(rec, progress, tau)
    caption = (plateau_sentence(counts, progress.label, f"{hl} (the dotted line at 1)")[:-1]
               + (f" (inside: with {progress.cue_label} below 0.1 {hl}, the cue unused)" if cue else "")
               + f"; it drops below half of {hl} at τ = {na(tau, '{}')}.")
    if has_set_loss:
        caption = (caption[:-1] + "; the set loss (dashed) tells which plateau it is: near 0, the model has learned "
                   "the marginal and waits to use the cue, high, it cannot yet tell the candidates from other strings.")
    if plateau is not None:
        share = plateau.get("share") or {}
        what = metric.replace("_", " ")
        caption = (caption[:-1] + f"; here the verdict is {plateau.get('verdict') or 'no plateau'}: "
                   f"{na(share.get('marginal'), '{:.0%}')} of the plateau's evaluations have {what} below "
                   f"{na(plateau.get('marginal_threshold'))} and {na(share.get('shelf'), '{:.0%}')} above 90% of the "
                   f"know-nothing {what} {ref:.2f} nats (dotted purple line)"
                   + (f"; {na(share.get('global_marginal'), '{:.0%}')} sit within {MARGINAL_REL} {hl} of the "
                      f"global marginal {global_ref:.2f} nats (dotted pink line: p(A) known, B ignored)"
                      if plateau.get("global_marginal_threshold") is not None else "")
                   + (", and the dotted brown line is the first-token set loss, the cheapest marginal."
                      if metric == "set_loss" else "."))
    return fig, caption


HELDOUT_PREFIX = "heldout_"
"""A logged field ``heldout_<key>`` is ``<key>`` measured on the held-out split."""


def heldout_curves(records: list[dict[str, Any]], tau: int | None = None) -> Captioned | None:
    """Each logged field that has a held-out twin (``heldout_<key>``), on the training split and on the
    held-out one, under their own names; None when the run logs no held-out field."""
    keys = sorted({k[len(HELDOUT_PREFIX):] for r in records for k in r if k.startswith(HELDOUT_PREFIX)})
    keys = [k for k in keys if any(r.get(k) is not None for r in records)]
    if not keys:
        return None
    steps = [r["step"] for r in records]
    fig = go.Figure()
    for key in keys:
        name = key.replace("_", " ")
        fig.add_trace(go.Scatter(x=steps, y=[r.get(key) for r in records], mode="lines", name=f"training {name}"))
        fig.add_trace(go.Scatter(x=steps, y=[r.get(HELDOUT_PREFIX + key) for r in records], mode="lines",
                                 name=f"held-out {name}", line={"dash": "dash"}))
    _tau_line(fig, tau)
    layout(fig, "Training and held-out curves", "step", "value")
    names = ", ".join(k.replace("_", " ") for k in keys)
    return fig, (f"{names} on the training split (solid) and on the held-out split (dashed), at every evaluation; "
                 f"τ = {na(tau, '{}')}.")


def timing_word(t_form: int | None, tau: int | None) -> str:
    """``ahead of`` / ``at`` / ``after`` the drop, as the numbers say (``before`` with no t_form or tau)."""
    if t_form is None or tau is None:
        return "with no t_form or τ to compare"
    return "ahead of" if t_form < tau else "at" if t_form == tau else "after"


# ---- attention to z -----------------------------------------------------------------------


def attention_heatmap(records: list[dict[str, Any]], head: Sequence[int] | None = None, tau: int | None = None,
                      t_form: int | None = None, field: str = "to_z_first",
                      group: Sequence[Sequence[int]] = ()) -> Captioned:
    """Attention to the cue of every head (rows) at every analysed step (columns); the routing head (or the
    routing ``group``'s heads, where no single head is named) starred and boxed."""
    steps, grid = _head_grid(records, field)
    n_layers, n_heads = grid.shape[1:] if grid.size else (0, 0)
    labels = [head_label(l, h) for l in range(n_layers) for h in range(n_heads)]
    z = grid.reshape(len(steps), -1).T if grid.size else np.zeros((0, 0))
    marked = {head_label(*h) for h in _highlighted(head, group)}
    y = [f"{lab} ★" if lab in marked else lab for lab in labels]
    fig = go.Figure(go.Heatmap(x=steps, y=y, z=_nan_to_none(z), colorscale="Viridis", zmin=0, zmax=1,
                               colorbar={"title": {"text": "attn to cue"}}, name="attention to the cue",
                               hovertemplate="step %{x}<br>%{y}<br>attention to the cue %{z:.3f}<extra></extra>"))
    for row in sorted(labels.index(lab) for lab in marked if lab in labels):
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=row - 0.5, y1=row + 0.5,
                      line={"color": SELECTOR_COLOR, "width": 2.5})
    _add_landmarks(fig, tau, t_form)
    layout(fig, "Attention to the cue from the prediction position, per head", "step", "head")
    fig.update_yaxes(autorange="reversed", type="category")
    when = f"t_form = {na(t_form, '{}')}, {timing_word(t_form, tau)} the drop at τ = {na(tau, '{}')}."
    if group:
        caption = (f"Each row is a head's attention from the prediction position to the cue; no single routing head "
                   f"is named, and the routing group {_group_words(group)} (★, boxed) has its mean attention halfway "
                   f"up at {when}")
    elif head is not None:
        caption = (f"Each row is a head's attention from the prediction position to the cue; the routing head "
                   f"{head_label(*head)} (★, boxed) goes halfway up at {when}")
    else:
        caption = "Each row is a head's attention from the prediction position to the cue; no routing head is named."
    return fig, caption


def _attention_lines(steps: list[int], grid: np.ndarray, head: Sequence[int] | None, tau: int | None,
                     t_form: int | None, title: str, y_title: str, group: Sequence[Sequence[int]] = ()) -> go.Figure:
    """One attention line per head over steps (``head``, or ``group``'s heads, highlighted), landmarks, a 0..1 axis."""
    fig = _per_head_lines(steps, grid, head, "lines", 0.7, group)
    _add_landmarks(fig, tau, t_form)
    layout(fig, title, "step", y_title)
    fig.update_yaxes(range=[0, 1])
    _log_x_toggle(fig)
    return fig


def attention_lines(records: list[dict[str, Any]], head: Sequence[int] | None = None, tau: int | None = None,
                    t_form: int | None = None, field: str = "to_z_first",
                    group: Sequence[Sequence[int]] = ()) -> Captioned:
    """Attention to the cue over steps, one line per head, the routing head (or the routing ``group``'s heads)
    highlighted."""
    steps, grid = _head_grid(records, field)
    fig = _attention_lines(steps, grid, head, tau, t_form, "Attention to the cue over training, per head",
                           "attention to the cue (prediction position)", group)
    when = (f"halfway from its plateau-start value to its final one by t_form = {na(t_form, '{}')}, "
            f"{timing_word(t_form, tau)} the loss drop at τ = {na(tau, '{}')}.")
    if group:
        caption = (f"No single routing head is named: the mean attention to the cue of the routing group "
                   f"{_group_words(group)} (thick red) has gone {when}")
    elif head is not None:
        caption = f"The routing head's attention to the cue (thick red) has gone {when}"
    else:
        caption = "Each head's attention to the cue over training; no routing head is named."
    return fig, caption


# ---- activation patching ------------------------------------------------------------------


def _patch_values(rec: dict[str, Any], value: str) -> np.ndarray:
    r = rec["heads"]
    if value == "normalised":
        return _array(r["normalised"])
    return _array(r["raw"]) - r["corrupt_metric"]


def patching_slider(records: list[dict[str, Any]], head: Sequence[int] | None = None,
                    value: str = "effect") -> Captioned:
    """The layers x heads patching map at each analysed step, with a step slider (plotly frames).

    ``value``: ``"effect"`` (patched - corrupt metric, in logits: comparable across steps) or
    ``"normalised"`` (1 = restores the clean answer; NaN where the clean-corrupt gap vanishes).
    """
    if value not in ("effect", "normalised"):
        raise ValueError(f"value must be 'effect' or 'normalised', got {value!r}")
    if not records:
        raise ValueError("no patching records to plot")
    method = records[0]["heads"].get("method", "exact")
    steps = [int(r["step"]) for r in records]
    maps = [_patch_values(r, value) for r in records]
    norm = [_array(r["heads"]["normalised"]) for r in records]
    n_layers, n_heads = maps[0].shape
    finite = np.abs(np.stack(maps))[np.isfinite(np.stack(maps))]
    lim = max(float(finite.max()) if finite.size else 1.0, 1.0 if value == "normalised" else 1e-6)  # one colour scale
    x = [f"H{h}" for h in range(n_heads)]
    y = [f"L{l}" for l in range(n_layers)]

    def heatmap(i: int) -> go.Heatmap:
        text = [[("★ " if head is not None and (l, h) == tuple(head) else "") + na(None if np.isnan(v) else v, "{:.2f}")
                 for h, v in enumerate(row)] for l, row in enumerate(maps[i])]
        return go.Heatmap(z=_nan_to_none(maps[i]), x=x, y=y, zmin=-lim, zmax=lim, colorscale="RdBu", zmid=0,
                          text=text, texttemplate="%{text}", customdata=_nan_to_none(norm[i]), name="patching",
                          colorbar={"title": {"text": "logits" if value == "effect" else "normalised"}},
                          hovertemplate="%{y}%{x}<br>" + value + " %{z:.3f}<br>normalised %{customdata:.2f}<extra></extra>")

    def title(i: int) -> str:
        h = records[i]["heads"]
        return (f"Head-output patching ({method}), step {steps[i]}: clean - corrupt gap "
                f"{h['clean_metric'] - h['corrupt_metric']:.3f} logits")

    last = len(records) - 1
    fig = go.Figure(data=[heatmap(last)],
                    frames=[go.Frame(data=[heatmap(i)], name=str(s), layout={"title": {"text": title(i)}})
                            for i, s in enumerate(steps)])
    slider = {"active": last, "currentvalue": {"prefix": "step "}, "pad": {"t": 50},
              "steps": [{"label": str(s), "method": "animate",
                         "args": [[str(s)], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                             "transition": {"duration": 0}}]} for s in steps]}
    layout(fig, title(last), "head", "layer", height=380 + 40 * n_layers)
    fig.update_layout(sliders=[slider])
    fig.update_yaxes(autorange="reversed")
    what = "logits restored (patched - corrupt)" if value == "effect" else "normalised effect (1 = fully restored)"
    first_gap = records[0]["heads"]["clean_metric"] - records[0]["heads"]["corrupt_metric"]
    last_gap = records[-1]["heads"]["clean_metric"] - records[-1]["heads"]["corrupt_metric"]
    caption = (f"Drag the slider through the {len(steps)} analysed steps: each cell is a head's {what} when its clean "
               f"output is patched into the corrupted-cue run; the clean - corrupt gap that the heads can restore is "
               f"{first_gap:.2f} logits at step {steps[0]} and {last_gap:.2f} at step {steps[-1]}.")
    return fig, caption


def routing_patching_lines(exact: list[dict[str, Any]], attribution: list[dict[str, Any]], head: Sequence[int] | None,
                            tau: int | None = None, t_form: int | None = None,
                            group: Sequence[Sequence[int]] = ()) -> Captioned:
    """The selector head's patching effect over steps: exact where run, attribution everywhere; where no single
    head is named, that of each head of the routing ``group``."""
    heads = [(int(la), int(h)) for la, h in group] if group else [(int(head[0]), int(head[1]))]
    fig = go.Figure()
    for i, (l, h) in enumerate(heads):
        dash = {"dash": ("solid", "dot", "dash", "dashdot")[i % 4]} if group else {}  # a group's heads told apart
        styles = {"attribution": {"mode": "lines", "line": {"color": "#1f77b4", "width": 2, **dash}},
                  "exact": {"mode": "lines+markers", "line": {"color": SELECTOR_COLOR, "width": 2, **dash},
                            "marker": {"size": 8}}}
        for name, recs, style in (("attribution (first order)", attribution, styles["attribution"]),
                                  ("exact patching", exact, styles["exact"])):
            if recs:
                fig.add_trace(go.Scatter(x=[int(r["step"]) for r in recs],
                                         y=[float(_patch_values(r, "effect")[l, h]) for r in recs],
                                         name=f"{head_label(l, h)} effect, {name}", **style))
    gap_src = attribution or exact
    fig.add_trace(go.Scatter(x=[int(r["step"]) for r in gap_src],
                             y=[r["heads"]["clean_metric"] - r["heads"]["corrupt_metric"] for r in gap_src],
                             name="clean - corrupt gap (full restoration)", mode="lines",
                             line={"color": "#7f7f7f", "dash": "dash", "width": 1.5}))
    _add_landmarks(fig, tau, t_form)
    what = f"the routing group {_group_words(group)}" if group else f"the routing head {head_label(*heads[0])}"
    layout(fig, f"Patching effect of {what} over training", "step", "logit difference restored (patched - corrupt)")
    _log_x_toggle(fig)

    def share(r: dict[str, Any], l: int, h: int) -> str:
        gap = r["heads"]["clean_metric"] - r["heads"]["corrupt_metric"]
        if gap_problem(gap):  # no percentage of a negative or negligible gap
            return f"{float(_patch_values(r, 'effect')[l, h]):+.2f} logits (no share: the gap is {gap:+.3f})"
        return f"{float(_patch_values(r, 'effect')[l, h]) / gap:.0%} of the clean-corrupt gap"

    main = exact or attribution
    restores = "; ".join(f"patching {head_label(l, h)}'s clean output into the corrupted-cue run restores "
                         f"{share(main[0], l, h)} at step {main[0]['step']} and {share(main[-1], l, h)} at step "
                         f"{main[-1]['step']}" for l, h in heads)
    caption = ("No single routing head is named; for each head of the routing group, " + restores if group
               else restores[0].upper() + restores[1:])
    caption += f" (the gap: dashed; shares only of a gap of at least {GAP_FLOOR:g} logits)"
    by_step = {r["step"]: r for r in attribution}
    both = [(float(_patch_values(r, "effect")[l, h]), float(_patch_values(by_step[r["step"]], "effect")[l, h]))
            for l, h in heads for r in exact if r["step"] in by_step]
    if both:
        caption += (f"; attribution differs from the exact points by at most "
                    f"{max(abs(a - b) for a, b in both):.2f} logits at the {len(both) // len(heads)} steps where "
                    "both ran")
    return fig, caption + "."


# ---- ablation -----------------------------------------------------------------------------


def ablation_lines(records: list[dict[str, Any]], log_k: float, head: Sequence[int] | None = None,
                   tau: int | None = None, t_form: int | None = None, label: str = "candidate loss",
                   height_label: str = "log K", group: Sequence[Sequence[int]] = ()) -> Captioned:
    """The progress measure (``label``: the selector task's candidate loss) with each head zero- or
    mean-ablated, over steps, with the unablated value and the height ``log_k`` (``height_label``); the routing
    head (or the routing ``group``'s heads, where no single head is named) in red."""
    steps = [int(r["step"]) for r in records]
    fig = go.Figure()
    if records:
        fig.add_trace(go.Scatter(x=steps, y=[r["zero"]["base"]["candidate_loss"] for r in records], mode="lines+markers",
                                 name="no ablation", line={"color": "black", "width": 2.5}))
        n_layers, n_heads = _array(records[0]["zero"]["candidate_loss"]).shape
        marked = _highlighted(head, group)
        routing = "routing group" if group else "routing"
        for kind, dash in (("zero", "solid"), ("mean", "dash")):
            grid = np.stack([_array(r[kind]["candidate_loss"]) for r in records])
            legend_shown = False  # the other heads share one legend entry per ablation kind
            for l in range(n_layers):
                for h in range(n_heads):
                    is_sel = (l, h) in marked
                    name = (f"{head_label(l, h)} {kind}-ablated ({routing})" if is_sel
                            else f"other heads, {kind}-ablated")
                    fig.add_trace(go.Scatter(
                        x=steps, y=_nan_to_none(grid[:, l, h]), mode="lines", name=name,
                        legendgroup=f"selector-{kind}" if is_sel else f"other-{kind}",
                        showlegend=is_sel or not legend_shown,
                        hovertemplate=f"{head_label(l, h)} {kind}-ablated<br>step %{{x}}<br>%{{y:.3f}}<extra></extra>",
                        line={"color": SELECTOR_COLOR if is_sel else OTHER_COLOR, "dash": dash,
                              "width": 3 if is_sel else 1.2}))
                    legend_shown = legend_shown or not is_sel
    fig.add_hline(y=log_k, line={"color": "#1f77b4", "dash": "dot", "width": 1},
                  label={"text": height_label, "textposition": "end", "font": {"size": 11, "color": "#1f77b4"}})
    _add_landmarks(fig, tau, t_form)
    layout(fig, f"{label[0].upper() + label[1:]} with one head ablated (zero: solid, mean: dashed)", "step",
            f"{label} (nats)")
    fig.update_yaxes(rangemode="tozero")
    _log_x_toggle(fig)
    caption = f"{label[0].upper() + label[1:]} with each head ablated on its own at every exact-analysis step."
    if records and group:
        last = records[-1]["mean"]
        grid, base = _array(last["candidate_loss"]), last["base"]["candidate_loss"]
        marked = sorted(_highlighted(None, group))
        own = ", ".join(f"{head_label(*h)} {float(grid[h]):.3f}" for h in marked)
        others = np.delete(grid.flatten(), [la * grid.shape[1] + h for la, h in marked])
        worst = float(np.nanmax(others)) if others.size else float("nan")
        caption = (f"At the last step ({records[-1]['step']}) no single routing head is named; mean-ablating each "
                   f"head of the routing group (red) alone moves the {label} from {base:.3f} to: {own} "
                   f"({height_label} = {log_k:.3f}, dotted), and the most any other head does alone is {worst:.3f}.")
    elif records and head is not None:
        last = records[-1]["mean"]
        grid, base = _array(last["candidate_loss"]), last["base"]["candidate_loss"]
        own = float(grid[tuple(head)])
        others = np.delete(grid.flatten(), int(head[0]) * grid.shape[1] + int(head[1]))
        worst = float(np.nanmax(others)) if others.size else float("nan")
        caption = (f"At the last step ({records[-1]['step']}) mean-ablating the routing head {head_label(*head)} (red) "
                   f"alone moves the {label} from {base:.3f} to {own:.3f} ({own / log_k:.0%} of {height_label}, dotted), "
                   f"and the most any other head does alone is {worst:.3f}.")
    return fig, caption


# ---- circuit ------------------------------------------------------------------------------


def head_share_lines(records: list[dict[str, Any]], head: Sequence[int] | None = None, tau: int | None = None,
                     t_form: int | None = None, group: Sequence[Sequence[int]] = ()) -> Captioned:
    """Each head's share of the summed positive head-patching effect over the exact steps
    (``plateauscope.analysis.circuit``); the routing head (or the routing ``group``'s heads) in red."""
    steps = [int(r["step"]) for r in records]
    grid = np.stack([_array(r["shares"]["share"]) for r in records]) if records else np.zeros((0, 0, 0))
    fig = _per_head_lines(steps, grid, head, "lines+markers", 0.75, group)
    _add_landmarks(fig, tau, t_form)
    layout(fig, "Each head's share of the positive head-patching effect", "step", "share of summed positive effect")
    fig.update_yaxes(range=[0, 1])
    _log_x_toggle(fig)
    if records:
        last = records[-1]["shares"]
        top = head_label(*last["top"])
        caption = (f"At the last exact step ({steps[-1]}) the top head {top} holds {last['top_share']:.0%} of the heads' "
                   f"positive patching effect ({last['top_layer_share']:.0%} of its layer's) and "
                   f"{last['n_for_80']} head{'' if last['n_for_80'] == 1 else 's'} together hold 80% (before the drop "
                   f"the shares divide an effect near 0).")
    else:
        caption = "No exact-patching steps analysed."
    return fig, caption


# ---- collective snap ----------------------------------------------------------------------


def snap_raster(records: list[dict[str, Any]], tau: int | None = None, t_form: int | None = None,
                hi: float = SNAP_HI, lo: float = SNAP_LO) -> Captioned:
    """Per-group accuracy (groups x steps, groups ordered by snap step) and the share of groups >= hi."""
    steps, acc = group_accuracies(records)
    stats = snap_statistics(records, tau, hi, lo)
    n_groups = acc.shape[1] if acc.size else 0
    big = max(steps[-1], 1) * 10 if steps else 1
    order = sorted(range(n_groups), key=lambda g: (stats["snap_steps"][g] if stats["snap_steps"][g] is not None else big,
                                                  -float(acc[-1, g]), g))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07, row_heights=[0.72, 0.28])
    fig.add_trace(go.Heatmap(x=steps, y=[f"g{g}" for g in order], z=acc[:, order].T.tolist() if n_groups else [],
                             colorscale="Viridis", zmin=0, zmax=1, name="group accuracy",
                             colorbar={"title": {"text": "accuracy"}, "len": 0.7, "y": 0.64},
                             hovertemplate="step %{x}<br>group %{y}<br>accuracy %{z:.2f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=(acc >= hi).mean(1).tolist() if n_groups else [], mode="lines",
                             name=f"share of groups ≥ {hi:.0%}", line={"color": SELECTOR_COLOR, "width": 2}), row=2, col=1)
    fig.add_trace(go.Scatter(x=steps, y=acc.mean(1).tolist() if n_groups else [], mode="lines",
                             name="mean group accuracy", line={"color": "#1f77b4", "width": 1.5, "dash": "dash"}),
                  row=2, col=1)
    _add_landmarks(fig, tau, t_form, rows=(1, 2))
    layout(fig, f"Collective snap: exact-match accuracy of {n_groups} tracked groups", "", "", height=620)
    fig.update_layout(legend={"y": 0.27, "yanchor": "top"})
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text="group (ordered by snap step)", showticklabels=False, row=1, col=1)
    fig.update_yaxes(title_text="share", range=[0, 1.02], row=2, col=1)
    if stats["n_snapped"]:
        snapped = (f"{stats['n_snapped']}/{n_groups} groups snap, with a median snap window of "
                   f"{na(stats['snap_window_tau'], '{:.2f}')} τ and all snap steps within {na(stats['snap_spread_tau'], '{:.2f}')} τ")
    else:
        snapped = f"none of the {n_groups} groups has reached {hi:.0%} by the last evaluated step"
    caption = (f"At τ/2 {na(stats['share_above_at_half_tau'], '{:.0%}')} of the groups are above {hi:.0%} accuracy "
               f"and {snapped}: a collective snap shows as one vertical edge in the raster.")
    return fig, caption


# ---- plateau geometry (plateauscope.analysis.hessian records) ---------------------------------------------


def _tau_line(fig: Any, tau: int | None, **kw: Any) -> None:
    if tau is not None:
        fig.add_vline(x=tau, line_dash="dash", line_color="grey", annotation_text="tau", **kw)


def hessian_spectrum(records: Sequence[dict[str, Any]], tau: int | None = None, n_top: int = 5) -> Captioned:
    """Top eigenvalues (log scale) and lambda_min (with the spread over Hessian batches) against the step.

    Flagged (unconverged) values are drawn as open markers.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("top eigenvalues of the Hessian", "lambda_min (mean +- std over batches)"))
    steps = [r["step"] for r in records]
    n = min([n_top, *(len(r["spectrum"]["top"]) for r in records)]) if records else 0
    for i in range(n):
        vals = [r["spectrum"]["top"][i]["value"] for r in records]
        ok = [r["spectrum"]["top"][i]["converged"] for r in records]
        fig.add_trace(go.Scatter(x=steps, y=vals, mode="lines+markers", name=f"lambda_{i + 1}",
                                 marker_symbol=["circle" if c else "circle-open" for c in ok]), row=1, col=1)
    lam_min = [r["spectrum"]["lambda_min"] for r in records]
    err = [r["stability"]["lambda_min"]["std"] or 0.0 for r in records]
    ok = [r["spectrum"]["bottom"][0]["converged"] for r in records]
    fig.add_trace(go.Scatter(x=steps, y=lam_min, mode="lines+markers", name="lambda_min",
                             error_y={"type": "data", "array": err, "visible": True},
                             marker_symbol=["diamond" if c else "diamond-open" for c in ok]), row=2, col=1)
    fig.add_hline(y=0, line_color="black", line_width=1, row=2, col=1)
    fig.update_yaxes(type="log", title_text="eigenvalue", row=1, col=1)
    fig.update_yaxes(title_text="lambda_min", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    for row in (1, 2):
        _tau_line(fig, tau, row=row, col=1)
    fig.update_layout(title="Hessian spectrum over training (open markers: residual above tolerance)", height=600)
    negative = sum(1 for v in lam_min if v is not None and v < 0)
    caption = (f"lambda_min is negative at {negative} of {len(records)} analysed steps: a negative lambda_min is a "
               "saddle (a direction of descent), not a local minimum.")
    return fig, caption


def hessian_anisotropy(records: Sequence[dict[str, Any]], tau: int | None = None) -> Captioned:
    """lambda_max / |curvature| of both escape directions against the step (log scale), the paper's band shaded."""
    fig = go.Figure()
    steps = [r["step"] for r in records]
    for name, label in (("displacement", "displacement (plateau -> after)"), ("min_eigvec", "min eigenvector")):
        key = f"anisotropy_{name}"
        if not records or key not in records[0]["stability"]:
            continue
        mean = [r["escape"][name]["anisotropy"] for r in records]
        lo = [max(m - (r["stability"][key]["min"] or m), 0) if m is not None else 0 for m, r in zip(mean, records)]
        hi = [max((r["stability"][key]["max"] or m) - m, 0) if m is not None else 0 for m, r in zip(mean, records)]
        fig.add_trace(go.Scatter(x=steps, y=mean, mode="lines+markers", name=label,
                                 error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": True}))
    fig.add_hrect(y0=PAPER_ANISOTROPY[0], y1=PAPER_ANISOTROPY[1], fillcolor="orange", opacity=0.15, line_width=0,
                  annotation_text="paper: 500-1000x", annotation_position="top left")
    _tau_line(fig, tau)
    fig.update_yaxes(type="log", title_text="lambda_max / |v^T H v|")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="Anisotropy of the escape directions (bars: min..max over Hessian batches)")
    caption = ("How much flatter each escape direction is than the steepest one (lambda_max / |curvature|); the "
               f"shaded band is the paper's {PAPER_ANISOTROPY[0]:g}-{PAPER_ANISOTROPY[1]:g}x.")
    return fig, caption


def hessian_noise(records: Sequence[dict[str, Any]], tau: int | None = None) -> Captioned:
    """Enrichment (share / isotropic share) of the gradient noise: top-k subspace vs escape directions."""
    fig = go.Figure()
    steps = [r["step"] for r in records]
    for key, label in (("enrichment_topk", "top-k subspace"), ("enrichment_displacement", "displacement"),
                       ("enrichment_min_eigvec", "min eigenvector")):
        if records and key in records[0]["noise"]:
            fig.add_trace(go.Scatter(x=steps, y=[r["noise"][key] for r in records], mode="lines+markers", name=label))
    fig.add_hline(y=1, line_dash="dot", annotation_text="isotropic")
    _tau_line(fig, tau)
    fig.update_yaxes(type="log", title_text="noise share / isotropic share")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="Where the gradient noise goes")
    caption = ("The share of the gradient noise in each subspace, divided by the share an isotropic noise would put "
               "there: above 1, the noise is concentrated in that subspace.")
    return fig, caption


# ---- local learning coefficient (plateauscope.analysis.llc summary) ---------------------------------------


def llc_figure(summary: dict[str, Any], title: str = "Local learning coefficient over training") -> Captioned:
    """LLC (mean over chains, +- the chains' std) against step, with t_form, tau/2 and tau marked.

    ``summary`` is the dict of ``plateauscope.analysis.llc.llc_series`` (``RUN/analysis/llc.json``).
    Checkpoints whose chains failed the stationarity check are drawn as red crosses.
    """
    steps, llc, std = summary["steps"], summary["llc"], summary["llc_std"]
    stationary = summary.get("stationary") or [True] * len(steps)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=llc, mode="lines+markers", name="LLC", line={"color": "#9467bd"},
                             error_y={"type": "data", "array": std, "visible": True, "thickness": 1},
                             hovertemplate="step %{x}<br>LLC %{y:.2f}<extra></extra>"))
    bad = [i for i, ok in enumerate(stationary) if not ok]
    if bad:
        fig.add_trace(go.Scatter(x=[steps[i] for i in bad], y=[llc[i] for i in bad], mode="markers",
                                 name="chains not stationary", marker={"symbol": "x", "size": 10, "color": SELECTOR_COLOR}))
    _add_landmarks(fig, summary.get("tau"), summary.get("t_form"))
    layout(fig, title, "step", "LLC estimate (SGLD)")
    _log_x_toggle(fig)
    s = summary["settings"]
    calib = summary.get("calibration")
    calib_text = (f" Doubling the draws at step {calib['step']} changes it by {100 * calib['rel_change']:.1f}%."
                  if calib else "")
    caption = (f"The local learning coefficient (SGLD: {s['num_chains']} chains x {s['num_draws']} draws, "
               f"eps {s['lr']:g}, gamma {s['localization']:g}, nbeta {s['nbeta']:g}) at each analysed checkpoint, "
               f"the loss on {summary.get('data', 'the training sequences')}; compare where it moves with t_form (the selector head forms) and tau (the loss drops)."
               + calib_text)
    return fig, caption


# ---- all of them --------------------------------------------------------------------------


def ladder_lines(records: list[dict[str, Any]], ladder: dict[str, Any], tau: int | None = None,
                 t_form: int | None = None) -> Captioned:
    """The model's KL from each reference predictor over steps (log scale), the stages shaded.

    ``ladder`` is the ``ladder`` block of ``summary.json`` (``plateauscope.runs.references.ladder_summary``):
    the rungs in order, the stage segments and the plateau's stage.
    """
    refs = ladder["references"]
    rec = [r for r in records if all(r.get(kl_key(x["name"])) is not None for x in refs)]
    steps = [int(r["step"]) for r in rec]
    colors = {x["name"]: HEAD_COLORS[i % len(HEAD_COLORS)] for i, x in enumerate(refs)}
    label = {x["name"]: x["label"] for x in refs}
    fig = go.Figure()
    for seg in ladder["segments"]:
        if seg["stage"] is not None:
            fig.add_vrect(x0=seg["start"], x1=max(seg["end"], seg["start"] + 1), fillcolor=colors[seg["stage"]],
                          opacity=0.12, line_width=0, layer="below")
    for x in refs:
        fig.add_trace(go.Scatter(x=steps, y=[max(r[kl_key(x["name"])], 1e-4) for r in rec], mode="lines",
                                 name=f"KL from {x['label']}", line={"color": colors[x["name"]], "width": 2}))
    _add_landmarks(fig, tau, t_form)
    layout(fig, "Distance to each reference predictor", "step", "KL(reference || model), nats per token")
    fig.update_yaxes(type="log")
    _log_x_toggle(fig)
    reached = sorted(ladder.get("first_reached", {}).items(), key=lambda kv: kv[1])
    order = ", then ".join(f"{label[name]} at step {step}" for name, step in reached) or "no rung by the margin"
    plateau = ladder.get("plateau_stage")
    caption = (f"The model's KL divergence from each rung of the task's ladder of reference predictors, averaged over "
               f"the loss positions; a shaded band is a stage, where one rung is closer than every other by at least "
               f"{ladder['margin']} nats. The model was first closest to {order}. "
               + (f"On the plateau it sat at {label[plateau]} ({ladder['plateau_stage_share']:.0%} of the plateau's "
                  f"evaluations)" if plateau else "The plateau has no stage of its own")
               + f"; the loss drops at τ = {na(tau, '{}')}.")
    return fig, caption


def rule_lines(records: list[dict[str, Any]], name: str, rule: dict[str, Any], tau: int | None = None) -> Captioned:
    """Attention along one of the task's named rules (``rules`` of the attention records, e.g.
    ``previous token``), one line per head, the rule's head (``rule``: the analysis summary's
    ``attention_rules[name]``) highlighted."""
    steps = [int(r["step"]) for r in records]
    grid = np.stack([_array(r["rules"][name]) for r in records])
    head, t_form = rule.get("head"), rule.get("t_form")
    fig = _attention_lines(steps, grid, head, tau, t_form, f"Attention to the {name}, per head", f"attention to the {name}")
    caption = (f"{rule.get('label')} (thick red) attends most to the {name} at the end "
               f"({na(rule.get('final_value'))}, from {na(rule.get('start_value'))} at the plateau start); it went "
               f"halfway up at t_form = {na(t_form, '{}')}, {timing_word(t_form, tau)} the loss drop at τ = {na(tau, '{}')}.")
    return fig, caption


def all_figures(metrics: list[dict[str, Any]], analysis: dict[str, Any], progress: ProgressMeasure,
                tau: int | None = None, plateau: dict[str, Any] | None = None, ladder: dict[str, Any] | None = None
                ) -> list[tuple[str, str, go.Figure, str]]:
    """Every figure of a run: ``[(key, heading, figure, caption), ...]`` in reading order (``plateau`` and
    ``ladder``: the blocks of ``summary.json``).

    ``analysis`` is :func:`plateauscope.analysis.analyze.load_analysis`'s result; its summary gives the routing
    head, t_form (and tau, unless given); where it names no single head, the routing group and its t_form
    (``plateauscope.analysis.summary.stated_routing``) are drawn instead, and where neither exists, no head is
    drawn as the routing; ``progress`` is the run's task's progress measure.
    """
    sel = analysis.get("routing") or {}
    drawn = stated_routing(sel)
    group = drawn.heads if drawn is not None and drawn.is_group else ()
    head = drawn.heads[0] if drawn is not None and not group else None
    tau = tau if tau is not None else sel.get("tau")
    t_form = drawn.t_form if drawn is not None else None
    out: list[tuple[str, str, go.Figure, str]] = [("loss", "Plateau and drop",
                                                   *loss_curves(metrics, progress, tau, t_form, plateau))]
    if ladder:
        out.append(("ladder", "Stages: the distance to each reference predictor", *ladder_lines(metrics, ladder, tau, t_form)))
    if analysis.get("attention"):
        out.append(("attention_heatmap", "Attention to the cue: heads x steps",
                    *attention_heatmap(analysis["attention"], head, tau, t_form, group=group)))
        out.append(("attention_lines", "Attention to the cue: one line per head",
                    *attention_lines(analysis["attention"], head, tau, t_form, group=group)))
        for name, rule in (sel.get("attention_rules") or {}).items():
            out.append((f"rule_{name.replace(' ', '_')}", f"Attention to the {name}: one line per head",
                        *rule_lines(analysis["attention"], name, rule, tau)))
    patches = analysis.get("patch") or analysis.get("attribution") or []
    if patches:
        out.append(("patching_slider", "Activation patching over time", *patching_slider(patches, head)))
    if drawn is not None and (analysis.get("patch") or analysis.get("attribution")):
        out.append(("routing_patching", f"The {'routing group' if group else 'routing head'}'s patching effect",
                    *routing_patching_lines(analysis.get("patch", []), analysis.get("attribution", []), head, tau,
                                            t_form, group=group)))
    if analysis.get("ablation"):
        out.append(("ablation", "Head ablation over time",
                    *ablation_lines(analysis["ablation"], progress.height, head, tau, t_form, progress.label,
                                    progress.height_label, group=group)))
    if analysis.get("circuit"):
        out.append(("head_shares", "One head or a layer: shares of the routing",
                    *head_share_lines(analysis["circuit"], head, tau, t_form, group=group)))
    if any(r.get("group_acc") for r in metrics):
        out.append(("snap", "Collective snap", *snap_raster(metrics, tau, t_form)))
    return out
