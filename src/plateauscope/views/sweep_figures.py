"""Figures of a sweep: the fits of ``plateauscope.dynamics`` in, ``(plotly Figure, one-sentence caption)`` out.

Pure functions, as in ``plateauscope.views.figures``: rows and fits (``plateauscope.dynamics.sweep.load_sweep`` /
``analyze_sweep``) in, figures out; nothing is read or written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from plateauscope.dynamics.noise import noise_claims
from plateauscope.dynamics.sweep import Sweep
from plateauscope.views.figures import layout
from plateauscope.views.phrases import direction_text, effect_text, fit_text

Captioned = tuple[go.Figure, str]


SWEEP_STYLE = {"height": 440, "legend": False, "top": 70, "log": True}
"""The sweep's figures: shorter, no legend box, log-log axes."""
SWEEP_LINEAR = {**SWEEP_STYLE, "log": False}
"""The same with linear axes."""


def tau_against(rows: list[dict], fit: dict | None, factor: str, label: str) -> Captioned:
    """tau of each run (dots) and the power-law fit (line) against ``factor``, log-log."""
    fam = [r for r in rows if r["direction"] == "backward" and r["tau"] is not None]
    if fit is not None:
        fam = [r for r in fam if all(r[f] == v for f, v in fit["family"].items())]
    fig = go.Figure(go.Scatter(x=[r[factor] for r in fam], y=[r["tau"] for r in fam], mode="markers",
                               name="runs", text=[r["name"] for r in fam], marker={"size": 9, "opacity": 0.7}))
    if fit is not None:
        xs = np.geomspace(min(fit["values"]), max(fit["values"]), 50)
        fig.add_trace(go.Scatter(x=xs, y=fit["c"] * xs ** fit["slope"], mode="lines",
                                 name=f"fit: slope {fit['slope']:.2f}", line={"color": "#d62728"}))
    layout(fig, f"tau against {label}", label, "tau (steps)", **SWEEP_STYLE)
    caption = (f"Each dot is a run; the line is the least-squares fit of log tau on log {label}, slope "
               f"{fit_text(fit)}.")
    return fig, caption


def noise_figure(batch: dict | None, batch_steps: dict | None, lr: dict | None, claims: list[dict]) -> Captioned:
    """Geometric mean tau (over seeds, with their intervals: 95% t from 3 seeds, the range of 2 below) in tokens
    and in steps against batch size, and in
    steps against learning rate; the caption reads the paper's two claims (``plateauscope.dynamics.noise``)."""
    panels = ((batch, "tokens at tau", "batch size"), (batch_steps, "steps at tau", "batch size"),
              (lr, "steps at tau", "learning rate"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tau in tokens vs batch size", "tau in steps vs batch size",
                                                        "tau in steps vs learning rate"))
    layout(fig, "Gradient noise and the waiting time (mean over seeds, 95% interval)", "", "", **SWEEP_STYLE)
    for col, (eff, y_title, x_title) in enumerate(panels, start=1):
        fig.update_xaxes(title_text=x_title, row=1, col=col)
        fig.update_yaxes(title_text=y_title, row=1, col=col)
        if eff is None:
            continue
        vals = eff["values"]
        err = {"type": "data", "symmetric": False,
               "array": [v["mean_ci"].high - v["mean"] if v["mean_ci"] else 0 for v in vals],
               "arrayminus": [v["mean"] - v["mean_ci"].low if v["mean_ci"] else 0 for v in vals]}
        fig.add_trace(go.Scatter(x=[v["value"] for v in vals], y=[v["mean"] for v in vals], error_y=err,
                                 mode="lines+markers", name=y_title + " vs " + x_title, showlegend=False,
                                 text=[f"{v['ratio']:.2f}x, {v['n']} seeds" for v in vals]), row=1, col=col)
    readings = " ".join(f"The paper's '{c['claim']}': {c['verdict']}"
                        + (f" ({c['ratio']:.2f}x against its {c['paper']:g}x)" if c["ratio"] is not None else "")
                        + "." for c in claims)
    caption = f"Batch (tokens): {effect_text(batch)}. Learning rate: {effect_text(lr)}. {readings}"
    return fig, caption


def direction_figure(ratios: list[dict]) -> Captioned:
    """Forward and backward waiting times per configuration (bars)."""
    labels = [f"D={d['D']}" for d in ratios]
    fig = go.Figure([go.Bar(x=labels, y=[d["backward"] for d in ratios], name="backward (B, z) -> A"),
                     go.Bar(x=labels, y=[d["forward"] for d in ratios], name="forward A -> B")])
    layout(fig, "Directional asymmetry (steps to 50% exact-match accuracy)", "", "steps", **SWEEP_LINEAR)
    return fig, f"Forward / backward: {direction_text(ratios)} (the paper: 1.7x to 4.4x)."


def snap_figure(rows: list[dict]) -> Captioned:
    """Per run: the share of groups >= 80% at tau/2, and the median snap window / tau."""
    rs = [r for r in rows if r["direction"] == "backward" and r["tau"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("groups >= 80% at tau/2", "snap window / tau"))
    names = [r["name"] for r in rs]
    fig.add_trace(go.Bar(x=names, y=[r["snap_share_at_half_tau"] for r in rs], name="share at tau/2"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[r["snap_window_tau"] for r in rs], name="window / tau"), row=1, col=2)
    layout(fig, "Collective snap per run", "", "", **SWEEP_LINEAR)
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    return fig, ("Left: no group should be accurate at tau/2 (the paper: 0 of 200); right: each group goes from "
                 "< 20% to >= 80% within a short window (the paper: about 0.5 tau).")


def collapse_figure(rows: list[dict], curves: dict[str, tuple[list[int], list[float]]]) -> Captioned:
    """Candidate loss / log K against step / tau for every backward run: one shape, rescaled."""
    fig = go.Figure()
    for r in rows:
        if r["name"] in curves and r["tau"]:
            steps, loss = curves[r["name"]]
            fig.add_trace(go.Scatter(x=[s / r["tau"] for s in steps], y=loss, mode="lines", name=r["name"],
                                     line={"width": 1.2}, opacity=0.75))
    layout(fig, "Every run, time in units of its own tau", "step / tau", "candidate loss / log K", **SWEEP_LINEAR)
    return fig, ("If one mechanism sets the waiting time, the curves fall onto one another once time is measured "
                 "in units of tau: a plateau at 1, then the drop through 0.5 at step / tau = 1.")


def sweep_figures(sweep: Sweep, result: dict[str, Any]) -> list[tuple[str, str, go.Figure, str]]:
    """Every figure the sweep has data for: ``[(key, heading, figure, caption), ...]``."""
    m, rows = result["main"], sweep.rows
    out: list[tuple[str, str, go.Figure, str]] = []
    if sweep.curves:
        out.append(("collapse", "Loss curves, rescaled by tau", *collapse_figure(rows, sweep.curves)))
    if m["scaling"]:
        out.append(("scaling", "Scaling law: tau against D", *tau_against(rows, m["scaling"], "D", "D")))
    if m["k"]:
        out.append(("k", "tau against K at fixed D", *tau_against(rows, m["k"], "K", "K")))
    if m["batch"] or m["lr"]:
        out.append(("noise", "Batch size and learning rate",
                    *noise_figure(m["batch"], m["batch_steps"], m["lr"], noise_claims(m))))
    if m["direction_acc50"]:
        out.append(("direction", "Forward against backward", *direction_figure(m["direction_acc50"])))
    if m["snap"]:
        out.append(("snap", "Collective snap", *snap_figure(rows)))
    return out
