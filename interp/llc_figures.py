"""The LLC figure: ``interp.llc``'s series summary in, ``(plotly Figure, one-sentence caption)`` out.

A pure function, self-contained (it does not share helpers with ``interp.figures``): nothing is
read from disk and nothing is shown.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

LLC_COLOR = "#9467bd"
UNSTEADY_COLOR = "#d62728"
MARKS = {"tau": ("τ", "#444444", "solid"), "tau/2": ("τ/2", "#444444", "dot"), "t_form": ("t_form", "#2ca02c", "dash")}


def llc_figure(summary: dict[str, Any], title: str = "Local learning coefficient over training") -> tuple[go.Figure, str]:
    """LLC (mean over chains, +- the chains' std) against step, with t_form, tau/2 and tau marked.

    ``summary`` is the dict of ``interp.llc.llc_series`` (``RUN/analysis/llc.json``).
    Checkpoints whose chains failed the stationarity check are drawn as red crosses.
    """
    steps, llc, std = summary["steps"], summary["llc"], summary["llc_std"]
    stationary = summary.get("stationary") or [True] * len(steps)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=llc, mode="lines+markers", name="LLC", line={"color": LLC_COLOR},
                             error_y={"type": "data", "array": std, "visible": True, "thickness": 1},
                             hovertemplate="step %{x}<br>LLC %{y:.2f}<extra></extra>"))
    bad = [i for i, ok in enumerate(stationary) if not ok]
    if bad:
        fig.add_trace(go.Scatter(x=[steps[i] for i in bad], y=[llc[i] for i in bad], mode="markers",
                                 name="chains not stationary", marker={"symbol": "x", "size": 10, "color": UNSTEADY_COLOR}))
    tau, t_form = summary.get("tau"), summary.get("t_form")
    marks = ([("tau/2", tau / 2), ("tau", tau)] if tau is not None else []) + ([("t_form", t_form)] if t_form is not None else [])
    for name, x in marks:
        text, color, dash = MARKS[name]
        fig.add_vline(x=x, line={"color": color, "dash": dash, "width": 1.2},
                      label={"text": text, "textposition": "end", "textangle": 0, "yanchor": "bottom",
                             "font": {"size": 12, "color": color}})
    s = summary["settings"]
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="LLC estimate (SGLD)", height=460,
                      template="plotly_white", legend={"orientation": "h", "y": -0.2})
    calib = summary.get("calibration")
    calib_text = (f" Doubling the draws at step {calib['step']} changes it by {100 * calib['rel_change']:.1f}%."
                  if calib else "")
    caption = (f"The local learning coefficient (SGLD: {s['num_chains']} chains x {s['num_draws']} draws, "
               f"eps {s['lr']:g}, gamma {s['localization']:g}, nbeta {s['nbeta']:g}) at each analysed checkpoint; "
               f"compare where it moves with t_form (the selector head forms) and tau (the loss drops)."
               + calib_text)
    return fig, caption
