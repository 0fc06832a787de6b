"""A run at a glance, as one static SVG: the loss on its plateau and the routing forming.

Top panel: the task's progress measure over its height (candidate loss / log K) and, when the run
has a plateau reference, the set loss over the know-nothing reference; both sit at 1 on a shelf.
Bottom panel: attention to the cue of every head in the routing head's layer, the routing head in
red. Where no single head is named, the routing group (``plateauscope.analysis.summary.stated_routing``: the
heads the rule lists) is drawn instead: every head of the group's layers, the group's heads in red and
their mean dashed; where neither exists, no head is drawn in red. Vertical lines: t_form (the routing
head's attention halfway up, or the group's mean attention's) and tau (the drop).

Pure: records in, ``(svg text, caption)`` out; the caption is computed from the same records. The
report writes it next to ``report.html`` and shows it first; ``make figures`` copies the demo's to
``docs/pages/images/demo.svg`` for the README and writes the figure's own caption under it
(:func:`with_readme_caption`), so the README says what the committed figure shows and names the CPU it
was measured on. A static SVG (no script): it renders on GitHub, in
the docs and in the report, and the demo's is about 30 kB. Axis ticks are ``<text>`` elements whose
``x`` (or ``y``) is the tick's position, so the drawn values can be read back from the file
(``tests/views/test_overview.py`` does).
"""

from __future__ import annotations

import html
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import numpy as np

from plateauscope.analysis.summary import StatedRouting, plateau_stretch, stated_routing
from plateauscope.model.heads import head_label
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.views.phrases import plateau_sentence, routing_name

WIDTH, HEIGHT = 780, 440
LEFT, RIGHT = 64, 150
"""Plot area margins in px (the legend sits in the right margin)."""
TOP_PANEL = (46, 236)
"""Top and bottom y of the loss panel, in px."""
BOTTOM_PANEL = (270, 396)
"""Top and bottom y of the attention panel, in px."""
PROGRESS_COLOR, SET_LOSS_COLOR, ROUTING_COLOR, OTHER_HEAD_COLOR = "#1f77b4", "#9467bd", "#d62728", "#9a9a9a"
TAU_COLOR, T_FORM_COLOR = "#444444", "#2ca02c"
GROUP_MEAN_COLOR = "#7f0000"
"""The routing group's mean attention (its heads are drawn in ``ROUTING_COLOR``)."""


def nice_step(span: float | int, max_ticks: int = 8) -> float:
    """The smallest of 1, 2, 5 x 10^k that puts at most ``max_ticks`` ticks on ``span``."""
    if span <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(span / max_ticks))
    return float(next(m * base for m in (1, 2, 5, 10) if span / (m * base) <= max_ticks))


def _ticks(lo: float | int, hi: float | int, max_ticks: int = 8) -> list[float]:
    step = nice_step(hi - lo, max_ticks)
    return [float(v) for v in np.arange(math.ceil(lo / step) * step, hi + step * 1e-9, step)]


class _Axes:
    """A linear map from data to pixels for one panel."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], panel: tuple[int, int]):
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        if self.x1 == self.x0:  # one evaluation so far (a run followed live): a unit-wide axis
            self.x1 = self.x0 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1
        self.top, self.bottom = panel

    def px(self, x: float | int) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def py(self, y: float | int) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _polyline(ax: _Axes, xs: Sequence[float | int], ys: Sequence[float | int | None], color: str, width: float,
              element_id: str, dash: str | None = None, label: str = "") -> str:
    points = " ".join(f"{ax.px(x):.2f},{ax.py(y):.2f}" for x, y in zip(xs, ys) if y is not None and math.isfinite(y))
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline id="{element_id}" data-label="{html.escape(label)}" fill="none" stroke="{color}" '
            f'stroke-width="{width}"{dash_attr} points="{points}"/>')


def _frame(ax: _Axes, y_ticks: list[float], y_title: str, tick_class: str, x_ticks: list[float] | None) -> list[str]:
    right = WIDTH - RIGHT
    parts = [f'<rect x="{LEFT}" y="{ax.top}" width="{right - LEFT}" height="{ax.bottom - ax.top}" fill="none" '
             f'stroke="#bbbbbb"/>']
    for v in y_ticks:
        y = ax.py(v)
        parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.2f}" y2="{y:.2f}" stroke="#eeeeee"/>')
        parts.append(f'<text class="{tick_class}" x="{LEFT - 6}" y="{y:.2f}" text-anchor="end" '
                     f'dominant-baseline="middle">{v:g}</text>')
    mid = (ax.top + ax.bottom) / 2
    parts.append(f'<text x="16" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 16 {mid:.1f})">'
                 f'{html.escape(y_title)}</text>')
    for v in x_ticks or []:
        x = ax.px(v)
        parts.append(f'<text class="xtick" x="{x:.2f}" y="{ax.bottom + 16}" text-anchor="middle">{v:g}</text>')
    return parts


def _vline(axes: Sequence[_Axes], x: float | int, color: str, dash: str | None, element_id: str, label: str) -> list[str]:
    px = axes[0].px(x)
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return [f'<line id="{element_id}" x1="{px:.2f}" x2="{px:.2f}" y1="{axes[0].top}" y2="{axes[-1].bottom}" '
            f'stroke="{color}" stroke-width="1.5"{dash_attr}/>',
            f'<text x="{px:.2f}" y="{axes[0].top - 6}" text-anchor="middle" fill="{color}">{html.escape(label)}</text>']


def overview_svg(metrics: list[dict[str, Any]], attention: list[dict[str, Any]], selector: dict[str, Any],
                 progress: ProgressMeasure, plateau: dict[str, Any] | None = None,
                 machine: str | None = None, field: str = "to_z_first") -> tuple[str, str]:
    """The SVG and its caption from a run's ``metrics.jsonl`` records, its attention analysis records,
    its ``routing.json`` and ``summary.json``'s ``plateau`` block; ``machine`` names where it trained."""
    key, height, hl = progress.key, progress.height, progress.height_label
    rec = [r for r in metrics if r.get(key) is not None]
    if not rec:
        raise ValueError(f"no evaluation records with {key!r} to draw")
    steps = [int(r["step"]) for r in rec]
    drawn = stated_routing(selector)
    tau, head = selector.get("tau"), selector.get("head")
    t_form = drawn.t_form if drawn else None
    group = drawn.heads if drawn is not None and drawn.is_group else ()
    ref_metric = (plateau or {}).get("know_nothing", {}).get("metric", "set_loss") if plateau else None
    ref = plateau["know_nothing"][ref_metric] if plateau else None
    progress_y = [r[key] / height for r in rec]
    ref_y = [r.get(ref_metric) / ref if r.get(ref_metric) is not None else None for r in rec] if ref else []
    y_max = max(1.2, math.ceil(max(v for v in [*progress_y, *ref_y] if v is not None) * 5) / 5)
    x_range = (0.0, float(max(steps[-1], max((int(r["step"]) for r in attention), default=0))))
    att_steps = [int(r["step"]) for r in attention]
    grid = np.array([r[field] for r in attention], dtype=float) if attention else np.zeros((0, 1, 1))
    layer = head[0] if head else 0
    layers = sorted({la for la, _ in group}) or [layer]  # the routing group's layers, or the routing head's
    att_max = min(1.0, max(0.2, math.ceil(float(np.nanmax(grid[:, layers], initial=0.0)) * 10) / 10))  # the rise
    loss_ax = _Axes(x_range, (0.0, y_max), TOP_PANEL)
    attn_ax = _Axes(x_range, (0.0, att_max), BOTTOM_PANEL)

    parts = _frame(loss_ax, _ticks(0.0, y_max, 6), "loss / its reference", "ytick-loss", None)
    parts += _frame(attn_ax, _ticks(0.0, att_max, 5), "attention to the cue", "ytick-attention",
                    _ticks(*x_range))
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">step</text>')
    legend = [(PROGRESS_COLOR, f"{progress.label} / {hl}")]
    parts.append(_polyline(loss_ax, steps, progress_y, PROGRESS_COLOR, 2.2, "progress", label=legend[0][1]))
    if ref:
        what = ref_metric.replace("_", " ")
        legend.append((SET_LOSS_COLOR, f"{what} / know-nothing"))
        parts.append(_polyline(loss_ax, steps, ref_y, SET_LOSS_COLOR, 1.6, "reference-loss", dash="6 3",
                               label=legend[-1][1]))
    # attention to the cue: every head of the routing head's layer, the routing head last (on top); a head
    # the rule does not name is drawn like the others
    named_head = head if drawn is not None and not group else None
    heads = sorted(range(grid.shape[2]), key=lambda h: named_head is not None and h == named_head[1])
    for h in heads if not group else []:
        routing = named_head is not None and h == named_head[1]
        parts.append(_polyline(attn_ax, att_steps, grid[:, layer, h].tolist(),
                               ROUTING_COLOR if routing else OTHER_HEAD_COLOR, 2.2 if routing else 1.0,
                               "routing-head" if routing else f"head-{head_label(layer, h)}", label=head_label(layer, h)))
    if named_head is not None:
        legend.append((ROUTING_COLOR, f"routing head {selector.get('label')}"))
        legend.append((OTHER_HEAD_COLOR, f"other layer-{layer} heads"))
    elif group:  # every head of the group's layers, the group's heads and their mean on top
        others = [(la, h) for la in layers for h in range(grid.shape[2]) if (la, h) not in group]
        parts += [_polyline(attn_ax, att_steps, grid[:, la, h].tolist(), OTHER_HEAD_COLOR, 1.0,
                            f"head-{head_label(la, h)}", label=head_label(la, h)) for la, h in others]
        parts += [_polyline(attn_ax, att_steps, grid[:, la, h].tolist(), ROUTING_COLOR, 2.2,
                            f"routing-head-{head_label(la, h)}", label=head_label(la, h)) for la, h in group]
        mean = grid[:, [la for la, _ in group], [h for _, h in group]].mean(-1)
        parts.append(_polyline(attn_ax, att_steps, mean.tolist(), GROUP_MEAN_COLOR, 2.6, "routing-group-mean",
                               dash="6 3", label="the routing group's mean"))
        legend += [(ROUTING_COLOR, "routing group"), (None, ", ".join(drawn.labels)), (GROUP_MEAN_COLOR, "its mean"),
                   *([(OTHER_HEAD_COLOR, "other heads")] if others else [])]
    elif head is not None:
        legend.append((OTHER_HEAD_COLOR, f"layer-{layer} heads (no routing head named)"))
    if t_form is not None:
        parts += _vline([loss_ax, attn_ax], t_form, T_FORM_COLOR, "5 3", "t-form-line", "t_form")
    if tau is not None:
        parts += _vline([loss_ax, attn_ax], tau, TAU_COLOR, None, "tau-line", "τ")
    for i, (color, text) in enumerate(legend):  # an entry without a colour continues the one above
        y = TOP_PANEL[0] + 10 + 18 * i
        parts.append((f'<line x1="{WIDTH - RIGHT + 10}" x2="{WIDTH - RIGHT + 28}" y1="{y}" y2="{y}" stroke="{color}" '
                      f'stroke-width="2.5"/>' if color else "")
                     + f'<text x="{WIDTH - RIGHT + 33}" y="{y}" dominant-baseline="middle">{html.escape(text)}</text>')

    caption = _caption(rec, progress, tau, plateau, ref_y, steps, machine, drawn)
    title = (f"{progress.label} and the routing {'group' if group else 'head'}'s attention to the cue over training"
             if drawn is not None else f"{progress.label} and attention to the cue over training")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif" font-size="11">\n'
           f"<title>{html.escape(title)}</title>\n<desc>{html.escape(caption)}</desc>\n"
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>\n'
           f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>\n'
           + "\n".join(parts) + "\n</svg>\n")
    return svg, caption


def _caption(rec: list[dict[str, Any]], progress: ProgressMeasure, tau: int | None, plateau: dict[str, Any] | None,
             ref_y: list[float | None], steps: list[int], machine: str | None, drawn: StatedRouting | None) -> str:
    counts = plateau_stretch(rec, progress, tau)
    span = counts["stretch"] if counts["holds"] else None
    text = (plateau_sentence(counts, progress.label, progress.height_label)[:-1]
            + (f"; it drops below half of {progress.height_label} at τ = {tau}." if tau is not None
               else f"; it does not drop below half of {progress.height_label} in the run."))
    if plateau is not None and span is not None:
        on = [y for s, y in zip(steps, ref_y) if span[0] <= s <= span[1] and y is not None]
        if on:
            what = plateau["know_nothing"].get("metric", "set_loss").replace("_", " ")
            text += (f" On the plateau the {what} is {float(np.median(on)):.3f} of a know-nothing model's: "
                     f"verdict {plateau.get('verdict') or 'none'}.")
    if drawn is not None:
        lead = drawn.lead_fraction
        text += ((f" The routing head {drawn.labels[0]}'s attention to the cue" if not drawn.is_group else
                  f" No single routing head: the mean attention to the cue of the {routing_name(drawn)} "
                  "(red; the mean dashed)")
                 + (f" is halfway up at t_form = {drawn.t_form}" if drawn.t_form is not None
                    else " does not rise halfway (no t_form)")
                 + (f", a lead of {lead:.2f} τ." if lead is not None else "."))
    return text + (f" One run, trained on {machine}." if machine else "")


README_FIGURE = "docs/pages/images/demo.svg"
"""Where the README's figure lives (``make figures`` copies the demo run's ``overview.svg`` there)."""


def with_readme_caption(readme: str, svg: str, figure: str = README_FIGURE) -> str:
    """``readme`` with the italic caption under the image of ``figure`` replaced by the figure's own caption
    (its ``<desc>``, computed from the run it draws); a ValueError in one line when the README shows no such
    image or the figure has no caption."""
    desc = ET.fromstring(svg).find("{http://www.w3.org/2000/svg}desc")
    if desc is None or not desc.text:
        raise ValueError(f"{figure} has no <desc> caption")
    image = re.search(rf"^!\[[^\]]*\]\({re.escape(figure)}\)\n\n(\*[^\n]*\*\n)?", readme, flags=re.MULTILINE)
    if image is None:
        raise ValueError(f"the README shows no image of {figure}")
    head = image.group(0)[: len(image.group(0)) - len(image.group(1) or "")]
    return readme[: image.start()] + head + f"*{desc.text}*\n" + readme[image.end():]

