"""Timelines of which signal moved first: results in, ``(plotly Figure, caption)`` out.

Pure functions, as in ``plateauscope.views.figures``: the dict of
``plateauscope.analysis.changepoint.moved_first`` (one run; ``RUN/analysis/moved_first.json`` read back
is the same) or of ``plateauscope.dynamics.moved_first.over_seeds`` (a sweep) in; nothing is read or
written. The x axis is the change point as a fraction of tau (tau = 1, the loss drop), one row per
signal, earliest at the top; the caption is computed from the data.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

Captioned = tuple[go.Figure, str]

SIGNAL_COLOR = "#1f77b4"
ALTERNATIVE_COLOR = "#7f7f7f"
SEED_COLOR = "rgba(80, 80, 80, 0.55)"
ROW_HEIGHT = 26
"""Pixels per signal row."""


def _frame(fig: go.Figure, title: str, rows: list[str], xs: list[float]) -> go.Figure:
    """A timeline's frame: one row per signal, change points in units of tau, lines at tau/2 and tau."""
    fig.update_layout(title={"text": title, "x": 0.0, "xanchor": "left"}, template="plotly_white",
                      height=max(320, 140 + ROW_HEIGHT * len(rows)), margin={"l": 200, "r": 30, "t": 70, "b": 55},
                      hovermode="closest", legend={"orientation": "h", "x": 0.0, "y": -0.18})
    fig.update_xaxes(title_text="change point / tau", zeroline=False,
                     range=[min([0.0, *xs]) - 0.02, max([1.0, *xs]) + 0.06])
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(rows)), automargin=True)
    for x, name in ((0.5, "τ/2"), (1.0, "τ")):
        fig.add_vline(x=x, line={"color": "#444444", "dash": "dot" if x < 1 else "solid", "width": 1.2},
                      label={"text": name, "textposition": "end", "textangle": 0, "yanchor": "bottom"})
    return fig


def _first_words(names: list[str], at: dict[str, float], top: int = 3) -> str:
    return ", then ".join(f"{n} ({at[n]:.2f} τ)" for n in names[:top])


def run_timeline(result: dict[str, Any], title: str | None = None) -> Captioned:
    """Each signal's change point / tau in one run (dots; the bar back to the checkpoint before it is the
    signal's resolution), the band's window shaded, and the existing rules' t_form as open diamonds."""
    rows, order, tau = result["signals"], result["order"], result["tau"]
    fig = go.Figure()
    at = {n: rows[n]["fraction_of_tau"] for n in order}
    low = [at[n] - rows[n]["bracket_fraction"][0] for n in order]
    fig.add_trace(go.Scatter(
        x=[at[n] for n in order], y=order, mode="markers", name="the one rule",
        marker={"size": 10, "color": SIGNAL_COLOR, "symbol": ["triangle-up" if rows[n]["direction"] == "rise"
                                                              else "triangle-down" for n in order]},
        error_x={"type": "data", "symmetric": False, "array": [0] * len(order), "arrayminus": low, "thickness": 1.2},
        customdata=[[rows[n]["step"], rows[n]["direction"], rows[n]["head"] or ""] for n in order],
        hovertemplate="%{y} %{customdata[2]}<br>step %{customdata[0]} (%{x:.3f} τ), %{customdata[1]}<extra></extra>"))
    others = {f"{name} (own rule)": a["fraction_of_tau"] for name, a in result.get("alternatives", {}).items()
              if a.get("fraction_of_tau") is not None}
    if others:
        fig.add_trace(go.Scatter(x=list(others.values()), y=list(others), mode="markers", name="existing rules",
                                 marker={"size": 10, "color": ALTERNATIVE_COLOR, "symbol": "diamond-open"},
                                 hovertemplate="%{y}: %{x:.3f} τ<extra></extra>"))
    lo, hi = result["baseline_window"]
    _frame(fig, title or f"{result['run']}: which signal moved first", order + list(others),
            [at[n] for n in order] + list(others.values()) + [lo / tau])
    fig.add_vrect(x0=lo / tau, x1=hi / tau, fillcolor="#2ca02c", opacity=0.08, line_width=0,
                  annotation_text="band read here", annotation_position="top left")
    unread = [n for n, r in rows.items() if r["step"] is None]
    before = sum(at[n] < 1 for n in order)
    caption = (f"When each of {len(rows)} signals of {result['run']} left its plateau band, by one rule for all "
               f"({result['rule_text']}), as a fraction of τ = {tau} (▲ a rise, ▼ a fall; the bar back to the "
               f"checkpoint before: the signal's resolution; shaded: where the band is read). "
               + (f"First: {_first_words(order, at)}; last: {order[-1]} ({at[order[-1]]:.2f} τ). "
                  f"{before} of {len(order)} moved before τ. " if order else "No signal left its band. ")
               + (f"Not read: {', '.join(unread)}. " if unread else "")
               + ("Open diamonds: the existing t_form rules, each its own rule, not comparable with the order."
                  if others else ""))
    return fig, caption.strip()


def _ends(interval: Any) -> tuple[float, float, str] | None:
    """``(low, high, label)`` of an interval, as an object or read back from JSON."""
    if interval is None:
        return None
    if isinstance(interval, dict):
        return interval["low"], interval["high"], interval["label"]
    return interval.low, interval.high, interval.label


def seeds_timeline(summary: dict[str, Any], title: str | None = None) -> Captioned:
    """Each signal's median change point / tau over seeds (dots) with the order-statistic interval of the
    median (bars), and each seed's own value (small grey dots)."""
    signals, order = summary["signals"], summary["order"]
    fig = go.Figure()
    ends = {n: _ends(signals[n]["interval"]) for n in order}
    med = {n: signals[n]["median"] for n in order}
    fig.add_trace(go.Scatter(
        x=[med[n] for n in order], y=order, mode="markers", name="median over seeds",
        marker={"size": 11, "color": SIGNAL_COLOR},
        error_x={"type": "data", "symmetric": False, "thickness": 1.5,
                 "array": [ends[n][1] - med[n] if ends[n] else 0 for n in order],
                 "arrayminus": [med[n] - ends[n][0] if ends[n] else 0 for n in order]},
        customdata=[[ends[n][2] if ends[n] else "one seed", f"{signals[n]['n']}/{signals[n]['n_runs']}"]
                    for n in order],
        hovertemplate="%{y}: median %{x:.3f} τ<br>%{customdata[0]}; read in %{customdata[1]} runs<extra></extra>"))
    xs = [v for n in order for v in signals[n]["values"].values()]
    ys = [n for n in order for _ in signals[n]["values"]]
    runs = [run for n in order for run in signals[n]["values"]]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="each seed", text=runs,
                             marker={"size": 5, "color": SEED_COLOR},
                             hovertemplate="%{text}: %{x:.3f} τ<extra></extra>"))
    _frame(fig, title or f"Which signal moved first over {len(summary['runs'])} runs", order, xs)
    labels = sorted({ends[n][2] for n in order if ends[n]})
    pairs = summary.get("pairs") or []
    weakest = min(pairs, key=lambda p: (p["agree"] / p["n"] if p["n"] else 0.0), default=None)
    caption = (f"When each signal left its plateau band over {len(summary['runs'])} runs, by one rule for all "
               f"({summary['rule_text']}): the median change point / τ, bars the order-statistic interval of the "
               f"median ({'; '.join(labels) if labels else 'none: fewer than 2 seeds'}), grey dots each seed. "
               + (f"In median order: {_first_words(order, med)}. " if order else "No signal left its band. ")
               + (f"Least agreed adjacent pair: {weakest['text']}. " if weakest else "")
               + (f"Read in fewer than half the runs, left out: {', '.join(summary['sparse'])}. "
                  if summary.get("sparse") else "")
               + (f"Never read: {', '.join(summary['unread'])}." if summary.get("unread") else ""))
    return fig, caption.strip()

