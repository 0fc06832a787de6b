"""Figures of the per-head LLC (``analysis/head_llc.json``, :mod:`plateauscope.analysis.head_llc`): summary in,
``(plotly Figure, caption)`` out.

Pure functions, like :mod:`plateauscope.views.figures`: nothing is read from disk or shown, and every caption
is computed from the summary it describes. The heads the other analyses single out (``marked`` in the
summary: the routing head, the top heads of the cue and of the task's named rules) are starred and drawn
thick; colours of the curves follow the clusters of :func:`plateauscope.analysis.head_llc.cluster_heads`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from plateauscope.analysis.head_llc import STABILITY_FLOOR
from plateauscope.model.heads import head_label
from plateauscope.views.figures import (
    HEAD_COLORS,
    SELECTOR_COLOR,
    Captioned,
    _add_landmarks,
    _log_x_toggle,
    _nan_to_none,
    layout,
)
from plateauscope.views.phrases import na


def _grid(summary: dict[str, Any]) -> np.ndarray:
    """The per-head LLC as a float array ``[step, head]`` (JSON null = NaN)."""
    return np.array(summary["llc"], dtype=float).reshape(len(summary["steps"]), len(summary["heads"]))


def _tags(summary: dict[str, Any]) -> dict[str, list[str]]:
    """Head label -> the names it is marked by (``routing``, ``cue``, ``previous token`` ...)."""
    out: dict[str, list[str]] = {}
    for name, label in (summary.get("marked") or {}).items():
        out.setdefault(label, []).append(name)
    return out


def _settings_text(summary: dict[str, Any]) -> str:
    s = summary["settings"]
    chains = f"{s['num_chains']} chain{'s' if s['num_chains'] != 1 else ''}"
    return (f"SGLD on the head's weights only: {chains} x {s['num_draws']} draws, eps {s['lr']:g}, "
            f"gamma {s['localization']:g}, nbeta {s['nbeta']:g}")


def _calibration_text(summary: dict[str, Any]) -> str:
    calib = summary.get("calibration") or []
    if not calib:
        return ""
    worst = max(calib, key=lambda c: c["max_change"])
    return (f" Doubling the draws changes a head's estimate by at most {100 * worst['max_change']:.1f}% "
            f"(step {worst['step']}; relative to at least {STABILITY_FLOOR:g}).")


def head_llc_heatmap(summary: dict[str, Any], step: int | None = None) -> Captioned:
    """The per-head LLC at one analysed step (default: the last) as a heads x layers grid."""
    steps, grid = summary["steps"], _grid(summary)
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"step {step} was not analysed (steps {steps[0]}..{steps[-1]})")
    i = steps.index(step)
    n_layers, n_heads = summary["n_layers"], summary["n_heads"]
    z = np.full((n_heads, n_layers), np.nan)
    for j, label in enumerate(summary["heads"]):
        layer, head = (int(x) for x in label[1:].split("H"))
        z[head, layer] = grid[i, j]
    tags = _tags(summary)
    text = [[f"{z[h, la]:.1f}" + (" ★" if head_label(la, h) in tags else "") if not np.isnan(z[h, la]) else ""
             for la in range(n_layers)] for h in range(n_heads)]
    fig = go.Figure(go.Heatmap(x=[f"layer {la}" for la in range(n_layers)], y=[f"head {h}" for h in range(n_heads)],
                               z=_nan_to_none(z), text=text, texttemplate="%{text}", colorscale="Viridis",
                               colorbar={"title": {"text": "LLC"}}, name="per-head LLC",
                               hovertemplate="%{x}, %{y}<br>LLC %{z:.2f}<extra></extra>"))
    layout(fig, f"Per-head LLC at step {step}", "layer", "head")
    fig.update_yaxes(autorange="reversed", type="category")
    values = grid[i]
    top, low = int(np.nanargmax(values)), int(np.nanargmin(values))
    marked = "; ".join(f"{lab} ({', '.join(names)}) {values[summary['heads'].index(lab)]:.1f}"
                       for lab, names in tags.items())
    caption = (f"At step {step} {summary['heads'][top]} has the largest per-head LLC ({values[top]:.1f}) and "
               f"{summary['heads'][low]} the smallest ({values[low]:.1f}); median {np.nanmedian(values):.1f}"
               + (f"; marked (★): {marked}." if marked else ".") + f" {_settings_text(summary)}."
               + _calibration_text(summary))
    return fig, caption


def head_llc_time_heatmap(summary: dict[str, Any]) -> Captioned:
    """The per-head LLC of every head (rows, layer by layer) at every analysed step (columns)."""
    steps, grid, heads = summary["steps"], _grid(summary), summary["heads"]
    tags = _tags(summary)
    y = [f"{lab} ★" if lab in tags else lab for lab in heads]
    fig = go.Figure(go.Heatmap(x=steps, y=y, z=_nan_to_none(grid.T), colorscale="Viridis",
                               colorbar={"title": {"text": "LLC"}}, name="per-head LLC",
                               hovertemplate="step %{x}<br>%{y}<br>LLC %{z:.2f}<extra></extra>"))
    for lab in tags:
        row = heads.index(lab)
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=row - 0.5, y1=row + 0.5,
                      line={"color": SELECTOR_COLOR, "width": 2.5})
    tau, t_form = summary.get("tau"), summary.get("t_form")
    _add_landmarks(fig, tau, t_form)
    layout(fig, "Per-head LLC over training", "step", "head")
    fig.update_yaxes(autorange="reversed", type="category")
    change = grid[-1] - grid[0]
    up = int(np.nanargmax(change))
    marked = ", ".join(f"{lab} ({'/'.join(names)})" for lab, names in tags.items())
    caption = (f"Each row is one head's LLC with only its weights sampled, from step {steps[0]} to {steps[-1]}; "
               f"{heads[up]} rises most ({grid[0, up]:.1f} to {grid[-1, up]:.1f}), and the heads' LLC "
               f"{'rises' if np.nanmedian(change) > 0 else 'falls'} by a median {abs(np.nanmedian(change)):.1f}; "
               f"τ = {na(tau, '{}')}, t_form = {na(t_form, '{}')}"
               + (f"; marked (★, boxed): {marked}." if marked else "."))
    return fig, caption


def head_llc_curves(summary: dict[str, Any]) -> Captioned:
    """The per-head LLC over training, one line per head, coloured by cluster, marked heads thick."""
    steps, grid, heads = summary["steps"], _grid(summary), summary["heads"]
    clusters = summary.get("clusters") or {}
    assign = clusters.get("cluster") or [0] * len(heads)
    tags = _tags(summary)
    fig = go.Figure()
    for j, lab in enumerate(heads):
        marked = lab in tags
        fig.add_trace(go.Scatter(
            x=steps, y=_nan_to_none(grid[:, j]), mode="lines+markers",
            name=f"{lab} (cluster {assign[j]})" + (f" ★ {', '.join(tags[lab])}" if marked else ""),
            legendgroup=f"cluster {assign[j]}", line={"color": HEAD_COLORS[assign[j] % len(HEAD_COLORS)],
                                                      "width": 3.5 if marked else 1.3},
            marker={"size": 6 if marked else 3}, opacity=1.0 if marked else 0.75))
    tau, t_form = summary.get("tau"), summary.get("t_form")
    _add_landmarks(fig, tau, t_form)
    layout(fig, "Per-head LLC over training, coloured by cluster", "step", "per-head LLC")
    _log_x_toggle(fig)
    k = clusters.get("n_clusters", 1)
    parts = []
    for name, m in (clusters.get("marked") or {}).items():
        parts.append(f"the {name} head {m['head']} is in cluster {m['cluster']} "
                     + ("on its own" if len(m["cluster_members"]) == 1 else
                        f"with {', '.join(x for x in m['cluster_members'] if x != m['head'])}")
                     + ("" if m["apart"] else " (not apart from the unmarked heads)"))
    caption = (f"{len(heads)} heads' LLC curves fall into {k} cluster{'s' if k != 1 else ''} by their shape "
               f"({clusters.get('method', 'no clustering')}); "
               + ("; ".join(parts) if parts else "no head is marked (no analysis)") + f". {_settings_text(summary)}."
               + _calibration_text(summary))
    return fig, caption
