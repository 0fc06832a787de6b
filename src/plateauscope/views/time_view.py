"""The circuit over training time: ONE self-contained HTML page with one time control.

:func:`render_time_view` turns a view-data dict (built from a run's analysis files) into a page
that opens from disk with no network and no server: the data is embedded once as JSON
(``<script type="application/json" id="view-data">``) and a small inline script draws
everything as hand-written SVG. One slider (``#step-slider``, its value the index of an analysed
step), a play/pause button (``#play``) and the left/right arrow keys move through the analysed
steps; ``#step-label`` names the step. Each move updates together:

* the circuit graph (``svg#graph``): embed at the bottom, logits at the top, the heads of a layer
  side by side with three input ports (q, k, v, left to right) on their bottom edge, the layer's
  MLP after its heads and slightly above. Every edge is a ``path.edge`` with ``data-edge`` (its
  index), ``data-score`` (empty when none) and ``data-width`` (its stroke width); blue for a
  positive score, red for a negative one, grey without a score; the step's circuit edges have the
  class ``in-circuit`` and full opacity, the others are faded;
* one heatmap per entry of ``heatmaps`` (``svg#heatmap-<i>``): layers x heads cells
  (``g.hm-cell`` with ``data-layer``, ``data-head``, ``data-value``, empty when none), the number
  written in the cell, one colour scale per heatmap over all steps (white to blue, white to red
  for negative values); "not computed at this step" where the step has none;
* the attention pattern of the selected head on the selected example (``svg#pattern``, heading
  ``#pattern-title``, example choice ``#example-select``): a query x key grid of ``rect.pt-cell``
  with ``data-q``, ``data-k`` and ``data-value`` (the probability, 3 decimals), token labels on
  both axes;
* the loss curves (``svg#curves``, one ``polyline.series`` per series, a legend): the vertical line
  ``#step-marker`` (``data-step``) at the step, and ``#tform-line`` / ``#tau-line`` (labelled) at
  t_form and tau when those are known;
* with a ladder of reference predictors (``ladder``), the KL from each rung (``svg#ladder``), the
  stages shaded (``rect.stage`` with ``data-stage``, the rung's name) and the same step marker
  (``#ladder-marker``).

The page opens at the last step, or, with a link such as ``view.html#step=1500``, at the analysed
step nearest training step 1500 (for screenshots and for pointing a reader at a moment).

Clicking a head (its graph node or a heatmap cell) selects it for the attention pattern; clicking
an edge plots its score over all analysed steps (``svg#edge-plot``, title ``#edge-plot-title``,
e.g. "L0H1 -> L1H0 (q)"; filled dots: in the circuit at that step). Tests drive the page
through ``window.timeView = {setStep(i), selectHead(layer, head), selectEdge(i), state}``.

Edge width rule: with ``M`` the largest ``|score|`` over every edge and every step (after the
rounding below), an edge with score ``s`` at a step is drawn
``MIN_EDGE_WIDTH + (MAX_EDGE_WIDTH - MIN_EDGE_WIDTH) * |s| / M`` px wide, so widths compare across
time; an edge without a score at that step (or every edge when ``M`` is 0) is ``MIN_EDGE_WIDTH``
wide. ``data-width`` is that width to 3 decimals.

The data contract (keys the page reads)::

    title: str; caption: str (one paragraph, shown under the title)
    steps: [int, ...]                       S analysed checkpoints, strictly ascending
    n_layers: int; n_heads: int
    nodes: [{"id", "kind": embed|head|mlp|logits, "layer": int, "head": int | None}, ...]
    edges: [{"sender": node id, "receiver": node id, "input": q|k|v|mlp|logits}, ...]    E edges
    edge_scores: [[float | None] * E | None] * S   in the unit of score_unit
    circuit: [[edge index, ...] | None] * S
    heatmaps: [{"name": str, "values": [[[float | None] * n_heads] * n_layers | None] * S}, ...]
    patterns: {"examples": [[token label] * P] * X,
               "values": [base64 of uint8 [n_layers, n_heads, X, P, P] (query, key),
                          round(prob * 255), row-major | None] * S}
    curves: {"steps": [int, ...], "series": [{"name": str, "values": [float | None, ...]}, ...]}
    markers: {"t_form": int | None, "tau": int | None}   optional: missing means both None
    ladder: {"steps": [int, ...], "series": [{"name": str, "stage": str, "values": [float | None, ...]}, ...],
             "segments": [{"stage": str | None, "start": int, "end": int}, ...]}    optional
    selected_head: [layer, head]                        optional: default the first head node
    score_unit: str                                     optional: what a score is measured in
                                                        (default DEFAULT_SCORE_UNIT)

Numbers are embedded compactly: scores, heatmap values and curve values rounded to
``SIGNIFICANT_DIGITS`` significant digits, NaN and infinities as ``null`` (110 steps of a
4 x 4 model with 3 examples of 20 tokens make a page of a few MB). :func:`validate_view_data`
rejects a malformed dict with a one-line ``ValueError``.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import math
import numbers
from typing import Any

from plateauscope.views.pages import page

MIN_EDGE_WIDTH = 0.5
"""Stroke width (px) of an edge with score 0 or no score."""
MAX_EDGE_WIDTH = 9.0
"""Stroke width (px) of the edge with the largest |score| over all steps."""
POSITIVE_COLOR, NEGATIVE_COLOR, MISSING_COLOR, PATTERN_COLOR = "#2166ac", "#b2182b", "#bbbbbb", "#3b4cc0"
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
PLAY_INTERVAL_MS = 450
"""Time per step while playing."""
SIGNIFICANT_DIGITS = 4
"""Significant digits of the numbers embedded in the page."""

REQUIRED_KEYS = ("title", "steps", "n_layers", "n_heads", "nodes", "edges", "edge_scores", "circuit", "heatmaps",
                 "patterns", "curves", "caption")
RECEIVER_KIND = {"q": "head", "k": "head", "v": "head", "mlp": "mlp", "logits": "logits"}
"""The kind of node each edge input enters."""
NODE_KINDS = ("embed", "head", "mlp", "logits")

CSS = """
.tv-controls { position: sticky; top: 0; z-index: 5; background: #fff; display: flex; flex-wrap: wrap; gap: 12px;
               align-items: center; padding: 10px 0; border-bottom: 1px solid #ddd; }
#step-slider { flex: 1 1 420px; }
#step-label { font-weight: 600; min-width: 170px; font-variant-numeric: tabular-nums; }
#step-note { color: #a33; }
.tv-row { display: flex; flex-wrap: wrap; gap: 20px; align-items: flex-start; }
.tv-col { display: flex; flex-direction: column; gap: 20px; flex: 1 1 440px; }
.tv-row > .tv-panel { flex: 0 1 auto; max-width: 680px; }
.tv-panel { border: 1px solid #eee; padding: 6px 10px; }
.tv-panel h3 { margin: 4px 0 6px; font-size: 1em; }
.tv-panel svg { max-width: 100%; height: auto; display: block; }
svg text { font-size: 11px; fill: #333; }
.node { cursor: pointer; } .node rect { fill: #fff; stroke: #aaa; } .node.in-circuit rect { stroke: #222; stroke-width: 2; }
.node.selected rect { fill: #ffe9a8; } .port circle { fill: #fff; stroke: #888; } text.port-label { font-size: 7px; }
.edge { fill: none; pointer-events: none; }
.hit { fill: none; stroke: transparent; stroke-width: 8; pointer-events: stroke; cursor: pointer; }
.hit.selected { stroke: rgba(255, 170, 0, 0.45); }
.hm-cell { cursor: pointer; } .hm-cell rect { stroke: #fff; } .hm-cell.selected rect { stroke: #000; stroke-width: 2; }
.frame { fill: none; stroke: #bbb; } .grid { stroke: #eee; } .zero { stroke: #999; stroke-dasharray: 3 3; }
.step-marker { stroke: #ff7f00; stroke-width: 2; } .landmark { stroke: #444; stroke-dasharray: 5 4; }
.dot { fill: #fff; stroke: #333; } .dot.in-circuit { fill: #333; }
text.plot-title { font-weight: 600; font-size: 12px; }
"""


# ---- validation ---------------------------------------------------------------------------


def _check(ok: bool, message: str) -> None:
    """Raise the one-line ``ValueError`` of a malformed view-data dict unless ``ok``."""
    if not ok:
        raise ValueError(f"view data: {message}")


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_list(value: Any, n: int, name: str, per: str) -> list:
    """``value`` if it is a list of ``n`` entries (one per ``per``), else the error."""
    _check(isinstance(value, list), f"{name} must be a list, got {type(value).__name__}")
    _check(len(value) == n, f"{name} has {len(value)} entries, expected {n} (one per {per})")
    return value


def _check_numbers(value: Any, n: int, name: str, per: str) -> None:
    """``value`` must be a list of ``n`` numbers or None."""
    values = _check_list(value, n, name, per)
    bad = next((i for i, x in enumerate(values) if x is not None and not _is_number(x)), None)
    _check(bad is None, f"{name}[{bad}] is a {type(values[bad]).__name__}, not a number or None" if bad is not None else "")


def _check_nodes(nodes: Any, n_layers: int, n_heads: int) -> dict[str, str]:
    """Check the node list; return ``{id: kind}``."""
    _check(isinstance(nodes, list) and len(nodes) > 0, "nodes must be a non-empty list")
    kinds: dict[str, str] = {}
    heads: set[tuple[int, int]] = set()
    for i, n in enumerate(nodes):
        _check(isinstance(n, dict) and {"id", "kind", "layer", "head"} <= set(n),
               f"nodes[{i}] must be a dict with id, kind, layer and head")
        nid, kind, layer, head = n["id"], n["kind"], n["layer"], n["head"]
        _check(isinstance(nid, str) and nid not in kinds, f"nodes[{i}] id {nid!r} is not a new string")
        _check(kind in NODE_KINDS, f"node {nid!r} has unknown kind {kind!r}")
        _check(_is_int(layer), f"node {nid!r} layer {layer!r} is not an int")
        if kind in ("head", "mlp"):
            _check(0 <= layer < n_layers, f"node {nid!r} layer {layer} is outside 0..{n_layers - 1}")
        if kind == "head":
            _check(_is_int(head) and 0 <= head < n_heads, f"head node {nid!r} head {head!r} is outside 0..{n_heads - 1}")
            _check((layer, head) not in heads, f"head node {nid!r} repeats layer {layer} head {head}")
            heads.add((layer, head))
        else:
            _check(head is None, f"{kind} node {nid!r} must have head None")
        kinds[nid] = kind
    return kinds


def _check_edges(edges: Any, kinds: dict[str, str]) -> int:
    """Check the edge list against the nodes; return its length."""
    _check(isinstance(edges, list), "edges must be a list")
    for i, e in enumerate(edges):
        _check(isinstance(e, dict) and {"sender", "receiver", "input"} <= set(e),
               f"edges[{i}] must be a dict with sender, receiver and input")
        for end in ("sender", "receiver"):
            _check(e[end] in kinds, f"edges[{i}] has unknown {end} node {e[end]!r}")
        _check(e["input"] in RECEIVER_KIND, f"edges[{i}] has unknown input {e['input']!r}")
        _check(kinds[e["receiver"]] == RECEIVER_KIND[e["input"]], f"edges[{i}] input {e['input']!r} enters a "
               f"{RECEIVER_KIND[e['input']]} node, not the {kinds[e['receiver']]} node {e['receiver']!r}")
    return len(edges)


def _check_patterns(patterns: Any, n_steps: int, n_layers: int, n_heads: int) -> None:
    _check(isinstance(patterns, dict) and {"examples", "values"} <= set(patterns),
           "patterns must be a dict with examples and values")
    examples = patterns["examples"]
    _check(isinstance(examples, list) and all(isinstance(x, list) and all(isinstance(t, str) for t in x)
                                              for x in examples), "patterns.examples must be lists of token labels")
    lengths = {len(x) for x in examples}
    _check(len(lengths) <= 1, f"patterns.examples have different lengths {sorted(lengths)}")
    size = n_layers * n_heads * len(examples) * (lengths.pop() if lengths else 0) ** 2
    for i, v in enumerate(_check_list(patterns["values"], n_steps, "patterns.values", "step")):
        if v is None:
            continue
        _check(isinstance(v, str), f"patterns.values[{i}] must be a base64 string or None")
        try:
            n = len(base64.b64decode(v, validate=True))
        except (binascii.Error, ValueError):
            n = -1
        _check(n == size, f"patterns.values[{i}] decodes to {n} bytes, expected {size} "
                          f"({n_layers} layers x {n_heads} heads x {len(examples)} examples x positions^2)")


def _check_curves(curves: Any) -> None:
    _check(isinstance(curves, dict) and {"steps", "series"} <= set(curves), "curves must be a dict with steps and series")
    steps = curves["steps"]
    _check(isinstance(steps, list) and all(_is_int(s) for s in steps), "curves.steps must be a list of ints")
    _check(isinstance(curves["series"], list), "curves.series must be a list")
    for i, s in enumerate(curves["series"]):
        _check(isinstance(s, dict) and isinstance(s.get("name"), str), f"curves.series[{i}] must have a name")
        _check_numbers(s.get("values"), len(steps), f"curves.series[{i}].values", "curve step")


def validate_view_data(data: Any) -> None:
    """Raise ``ValueError`` (one line, naming the first problem) unless ``data`` keeps to the contract
    of the module docstring: every per-step list has one entry per step, edges name known nodes and
    enter a node of the right kind, circuits hold edge indices, pattern blobs have the right size."""
    _check(isinstance(data, dict), f"expected a dict, got {type(data).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    _check(not missing, f"missing keys: {', '.join(missing)}")
    _check(isinstance(data["title"], str) and isinstance(data["caption"], str), "title and caption must be strings")
    steps = data["steps"]
    _check(isinstance(steps, list) and steps and all(_is_int(s) for s in steps), "steps must be a non-empty list of ints")
    _check(all(a < b for a, b in zip(steps, steps[1:])), "steps must be strictly ascending")
    n_steps, n_layers, n_heads = len(steps), data["n_layers"], data["n_heads"]
    _check(_is_int(n_layers) and n_layers >= 1 and _is_int(n_heads) and n_heads >= 1,
           "n_layers and n_heads must be positive ints")
    n_edges = _check_edges(data["edges"], _check_nodes(data["nodes"], n_layers, n_heads))
    for i, row in enumerate(_check_list(data["edge_scores"], n_steps, "edge_scores", "step")):
        if row is not None:
            _check_numbers(row, n_edges, f"edge_scores[{i}]", "edge")
    for i, c in enumerate(_check_list(data["circuit"], n_steps, "circuit", "step")):
        _check(c is None or (isinstance(c, list) and all(_is_int(e) and 0 <= e < n_edges for e in c)),
               f"circuit[{i}] must be None or a list of edge indices in 0..{n_edges - 1}")
    _check(isinstance(data["heatmaps"], list), "heatmaps must be a list")
    for j, hm in enumerate(data["heatmaps"]):
        _check(isinstance(hm, dict) and isinstance(hm.get("name"), str), f"heatmaps[{j}] must have a name")
        for i, grid in enumerate(_check_list(hm.get("values"), n_steps, f"heatmaps[{j}].values", "step")):
            if grid is not None:
                for layer, row in enumerate(_check_list(grid, n_layers, f"heatmaps[{j}].values[{i}]", "layer")):
                    _check_numbers(row, n_heads, f"heatmaps[{j}].values[{i}][{layer}]", "head")
    _check_patterns(data["patterns"], n_steps, n_layers, n_heads)
    _check_curves(data["curves"])
    ladder = data.get("ladder")
    if ladder is not None:
        _check_curves(ladder)
        names = {s.get("stage") for s in ladder["series"]}
        _check(isinstance(ladder.get("segments"), list) and all(
            isinstance(g, dict) and (g.get("stage") is None or g.get("stage") in names) and _is_int(g.get("start"))
            and _is_int(g.get("end")) for g in ladder["segments"]),
            "ladder.segments must be a list of {stage: a series' stage or None, start: int, end: int}")
    markers = data.get("markers") or {}
    _check(isinstance(markers, dict) and all(markers.get(k) is None or _is_int(markers[k]) for k in ("t_form", "tau")),
           "markers must be a dict whose t_form and tau are ints or None")
    head = data.get("selected_head")
    _check(head is None or (isinstance(head, (list, tuple)) and len(head) == 2 and all(map(_is_int, head))
                            and 0 <= head[0] < n_layers and 0 <= head[1] < n_heads),
           f"selected_head {head!r} is not a [layer, head] of the model")


# ---- the page -----------------------------------------------------------------------------


def _round(x: float | None) -> float | None:
    """``x`` to :data:`SIGNIFICANT_DIGITS` significant digits; None for None, NaN and infinities."""
    return None if x is None or not math.isfinite(x) else float(f"{float(x):.{SIGNIFICANT_DIGITS}g}")


DEFAULT_SCORE_UNIT = "share of the clean - corrupt metric gap"


def _rounded(values: list | None) -> list | None:
    return None if values is None else [_round(x) for x in values]


def compact_view_data(data: dict[str, Any]) -> dict[str, Any]:
    """The dict as the page embeds it: plain ints, numbers rounded (:func:`_round`), defaults filled in."""
    markers = data.get("markers") or {}
    return {
        **data,
        "steps": [int(s) for s in data["steps"]],
        "n_layers": int(data["n_layers"]), "n_heads": int(data["n_heads"]),
        "nodes": [{**n, "layer": int(n["layer"]), "head": None if n["head"] is None else int(n["head"])}
                  for n in data["nodes"]],
        "edge_scores": [_rounded(row) for row in data["edge_scores"]],
        "circuit": [None if c is None else [int(e) for e in c] for c in data["circuit"]],
        "heatmaps": [{**hm, "values": [None if g is None else [_rounded(r) for r in g] for g in hm["values"]]}
                     for hm in data["heatmaps"]],
        "curves": {"steps": [int(s) for s in data["curves"]["steps"]],
                   "series": [{**s, "values": _rounded(s["values"])} for s in data["curves"]["series"]]},
        "markers": {k: None if markers.get(k) is None else int(markers[k]) for k in ("t_form", "tau")},
        "ladder": None if data.get("ladder") is None else {
            **data["ladder"], "steps": [int(s) for s in data["ladder"]["steps"]],
            "series": [{**s, "values": _rounded(s["values"])} for s in data["ladder"]["series"]]},
        "selected_head": None if data.get("selected_head") is None else [int(v) for v in data["selected_head"]],
    }


def _panel(heading: str, body: str, note: str = "", note_id: str | None = None) -> str:
    """A bordered box: an h3 heading (HTML), ``body`` (HTML) and a note paragraph (text)."""
    nid = f' id="{note_id}"' if note_id else ""
    return f'<div class="tv-panel"><h3>{heading}</h3>{body}<p class="note"{nid}>{html.escape(note)}</p></div>'


def _config() -> str:
    """The script's constants, as a JSON object."""
    return json.dumps({"minWidth": MIN_EDGE_WIDTH, "maxWidth": MAX_EDGE_WIDTH, "positive": POSITIVE_COLOR,
                       "negative": NEGATIVE_COLOR, "missing": MISSING_COLOR, "pattern": PATTERN_COLOR,
                       "series": SERIES_COLORS, "playMs": PLAY_INTERVAL_MS})


def render_time_view(data: dict[str, Any]) -> str:
    """The page of the module docstring for ``data`` (checked by :func:`validate_view_data`) as one
    self-contained HTML string."""
    validate_view_data(data)
    last = len(data["steps"]) - 1
    unit = data.get("score_unit") or DEFAULT_SCORE_UNIT
    payload = json.dumps(compact_view_data(data), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    heatmaps = [_panel(html.escape(hm["name"]), f'<svg id="heatmap-{i}"></svg>', note_id=f"heatmap-{i}-note")
                for i, hm in enumerate(data["heatmaps"])] or ['<p class="note">No heatmaps in this view.</p>']
    parts = [
        f"<style>{CSS}</style>",
        f"<h1>{html.escape(data['title'])}</h1>",
        f'<p class="caption">{html.escape(data["caption"])}</p>',
        '<div class="tv-controls"><button id="play" type="button">Play</button>'
        f'<input type="range" id="step-slider" min="0" max="{last}" step="1" value="{last}" '
        'aria-label="analysed step"><span id="step-label"></span><span id="step-note"></span></div>',
        '<p class="note">Left / right arrow keys: previous / next analysed step. Click a head (graph node or heatmap '
        "cell) for its attention pattern, an edge for its score over time.</p>",
        '<div class="tv-row">',
        _panel("Circuit graph", '<svg id="graph"></svg>',
               f"Edge width: |score| ({unit}), scaled by the largest |score| of "
               "all steps; blue positive, red negative, grey no score; opaque edges and dark nodes: the step's "
               "circuit. Ports under a head: its q, k, v inputs (left to right)."),
        '<div class="tv-col">',
        _panel('<span id="pattern-title"></span>',
               '<select id="example-select" aria-label="example"></select><svg id="pattern"></svg>',
               note_id="pattern-note"),
        _panel("Edge score over time", '<svg id="edge-plot"></svg>',
               f"Score ({unit}); filled dots: in the circuit at that step."),
        "</div></div>",
        "<h2>Heads over time</h2>", '<div class="tv-row">', *heatmaps, "</div>",
        "<h2>Loss curves</h2>", _panel("Training curves", '<svg id="curves"></svg>',
                                       "Orange: the analysed step shown; dashed: t_form and tau."),
        *([_panel("Distance to each reference predictor", '<svg id="ladder"></svg>',
                  "KL(reference || model) in nats per token; a shaded band is a stage, where one rung is the "
                  "closest by the margin.")] if data.get("ladder") else []),
        f'<script type="application/json" id="view-data">{payload}</script>',
        f"<script>{_SCRIPT.replace('__CONFIG__', _config())}</script>",
    ]
    return page(data["title"], parts)


_SCRIPT = r"""
(() => {
"use strict";
const CFG = __CONFIG__;
const D = JSON.parse(document.getElementById("view-data").textContent);
const $ = id => document.getElementById(id);
const NS = $("graph").namespaceURI;  // the inline <svg>'s namespace: no URL literal in the page
const S = D.steps.length, L = D.n_layers, H = D.n_heads;
const heads = D.nodes.filter(n => n.kind === "head");
const circuits = D.circuit.map(c => c ? new Set(c) : null);
const state = {step: S - 1, head: null, edge: null, example: 0, playing: false};

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function size(svg, w, h) {
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`); svg.setAttribute("width", w); svg.setAttribute("height", h);
}
const cellText = v => Math.abs(v) >= 100 ? v.toExponential(1) : Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(2);
const tickText = v => String(+v.toPrecision(6));
const headName = (l, h) => (heads.find(n => n.layer === l && n.head === h) || {id: `L${l}H${h}`}).id;
const edgeName = i => `${D.edges[i].sender} -> ${D.edges[i].receiver} (${D.edges[i].input})`;
function mix(color, t) {  // white -> color at t in [0, 1]
  const c = [1, 3, 5].map(i => parseInt(color.slice(i, i + 2), 16));
  return `rgb(${c.map(x => Math.round(255 + (x - 255) * t)).join(",")})`;
}
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const base = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  const step = [1, 2, 5, 10].map(m => m * base).find(s => (hi - lo) / s <= n);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

// ---- line plots (loss curves, edge score) ----
function linePlot(svg, o) {
  svg.replaceChildren();
  size(svg, o.w, o.h);
  const m = {l: 56, r: o.legend ? 200 : 14, t: o.title ? 28 : 12, b: 34};
  let y0 = Infinity, y1 = -Infinity;
  for (const s of o.series) for (const v of s.values) if (v !== null) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
  if (o.zero || y0 > y1) { y0 = Math.min(y0, 0); y1 = Math.max(y1, 0); }
  const pad = y1 > y0 ? 0.06 * (y1 - y0) : 1;
  y0 -= pad; y1 += pad;
  const [x0, x1] = o.xDomain;
  const X = v => m.l + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (o.w - m.l - m.r);
  const Y = v => o.h - m.b - (v - y0) / (y1 - y0) * (o.h - m.t - m.b);
  const bottom = o.h - m.b;
  for (const t of niceTicks(y0, y1, 5)) {
    el("line", {x1: m.l, x2: o.w - m.r, y1: Y(t), y2: Y(t), class: "grid"}, svg);
    el("text", {x: m.l - 6, y: Y(t) + 4, "text-anchor": "end"}, svg, tickText(t));
  }
  for (const t of niceTicks(x0, x1, 7)) el("text", {x: X(t), y: bottom + 15, "text-anchor": "middle"}, svg, tickText(t));
  el("rect", {x: m.l, y: m.t, width: o.w - m.l - m.r, height: bottom - m.t, class: "frame"}, svg);
  if (o.zero) el("line", {x1: m.l, x2: o.w - m.r, y1: Y(0), y2: Y(0), class: "zero"}, svg);
  el("text", {x: (m.l + o.w - m.r) / 2, y: o.h - 4, "text-anchor": "middle"}, svg, "step");
  if (o.title) el("text", {x: m.l, y: 17, class: "plot-title", id: o.titleId || ""}, svg, o.title);
  o.series.forEach((s, i) => {
    const pts = [];
    s.values.forEach((v, j) => { if (v !== null) pts.push(`${X(o.xs[j]).toFixed(1)},${Y(v).toFixed(1)}`); });
    el("polyline", {class: "series", "data-name": s.name, points: pts.join(" "), fill: "none", stroke: s.color,
                    "stroke-width": 1.6}, svg);
    if (o.legend) {
      const y = m.t + 10 + 18 * i, x = o.w - m.r + 12;
      el("line", {x1: x, x2: x + 22, y1: y, y2: y, stroke: s.color, "stroke-width": 3}, svg);
      el("text", {x: x + 28, y: y + 4}, svg, s.name);
    }
  });
  return {X, Y, top: m.t, bottom, xDomain: o.xDomain};
}
function vline(svg, plot, x, attrs, label, row) {
  const line = el("line", {x1: plot.X(x), x2: plot.X(x), y1: plot.top, y2: plot.bottom, "data-step": x, ...attrs}, svg);
  if (label) el("text", {x: plot.X(x) + 3, y: plot.top + 12 + 14 * (row || 0)}, svg, label);
  return line;
}

// ---- the circuit graph ----
const G = {w: 640, pad: 30, nodeW: 58, nodeH: 24, gap: 84, mlpRise: 44, port: 17};
const PORTS = {q: -G.port, k: 0, v: G.port};
const hasMlp = D.nodes.some(n => n.kind === "mlp");
const rise = {embed: 0};
let top = 0;
for (let l = 0; l < L; l++) {
  top += G.gap; rise[`head${l}`] = top;
  if (hasMlp) { top += G.mlpRise; rise[`mlp${l}`] = top; }
}
rise.logits = top + G.gap;
const graphH = rise.logits + 2 * G.pad + G.nodeH;
const colW = (G.w - 2 * G.pad) / (H + (hasMlp ? 1 : 0));
function place(n) {
  const x = n.kind === "head" ? G.pad + colW * (n.head + 0.5) : n.kind === "mlp" ? G.pad + colW * (H + 0.5)
          : G.pad + colW * H / 2;
  const r = n.kind === "embed" || n.kind === "logits" ? rise[n.kind] : rise[`${n.kind}${n.layer}`];
  return {x, y: graphH - G.pad - G.nodeH / 2 - r};
}
const graph = $("graph");
size(graph, G.w, graphH);
const pos = new Map(D.nodes.map(n => [n.id, place(n)]));
const edgeLayer = el("g", {}, graph), hitLayer = el("g", {}, graph), nodeLayer = el("g", {}, graph);
const edgeEls = [], hitEls = [], nodeEls = new Map();
let maxAbs = 0;
for (const row of D.edge_scores) if (row) for (const s of row) if (s !== null) maxAbs = Math.max(maxAbs, Math.abs(s));
const edgeWidth = s => s === null || maxAbs === 0 ? CFG.minWidth
                     : CFG.minWidth + (CFG.maxWidth - CFG.minWidth) * Math.abs(s) / maxAbs;
D.edges.forEach((e, i) => {
  const a = pos.get(e.sender), b = pos.get(e.receiver);
  const sx = a.x, sy = a.y - G.nodeH / 2, rx = b.x + (PORTS[e.input] || 0), ry = b.y + G.nodeH / 2, my = (sy + ry) / 2;
  const d = `M${sx.toFixed(1)},${sy.toFixed(1)} C${sx.toFixed(1)},${my.toFixed(1)} ${rx.toFixed(1)},${my.toFixed(1)} `
          + `${rx.toFixed(1)},${ry.toFixed(1)}`;
  edgeEls.push(el("path", {d, class: "edge", "data-edge": i}, edgeLayer));
  const hit = el("path", {d, class: "hit", "data-hit": i}, hitLayer);
  el("title", {}, hit, edgeName(i));
  hitEls.push(hit);
});
for (const n of D.nodes) {
  const p = pos.get(n.id), w = n.kind === "embed" || n.kind === "logits" ? G.nodeW * 1.6 : G.nodeW;
  const g = el("g", {class: `node ${n.kind}`, "data-node": n.id, "data-kind": n.kind, "data-layer": n.layer,
                     "data-head": n.head === null ? "" : n.head}, nodeLayer);
  el("rect", {x: p.x - w / 2, y: p.y - G.nodeH / 2, width: w, height: G.nodeH, rx: 4}, g);
  el("text", {x: p.x, y: p.y + 3, "text-anchor": "middle"}, g, n.id);
  if (n.kind === "head") {
    for (const [input, dx] of Object.entries(PORTS)) {
      const port = el("g", {class: "port"}, g);
      el("circle", {cx: p.x + dx, cy: p.y + G.nodeH / 2, r: 5}, port);
      el("text", {x: p.x + dx, y: p.y + G.nodeH / 2 + 2.5, "text-anchor": "middle", class: "port-label"}, port, input);
    }
  }
  nodeEls.set(n.id, g);
}
graph.addEventListener("click", ev => {
  const edge = ev.target.closest("[data-edge], [data-hit]"), node = ev.target.closest("[data-node]");
  if (node && node.dataset.kind === "head") selectHead(+node.dataset.layer, +node.dataset.head);
  else if (edge) selectEdge(+(edge.dataset.edge ?? edge.dataset.hit));
});
function drawGraph() {
  const scores = D.edge_scores[state.step], circuit = circuits[state.step], inNodes = new Set();
  edgeEls.forEach((e, i) => {
    const s = scores ? scores[i] : null, w = edgeWidth(s).toFixed(3), inside = !!circuit && circuit.has(i);
    e.setAttribute("stroke-width", w);
    e.setAttribute("stroke", s === null ? CFG.missing : s < 0 ? CFG.negative : CFG.positive);
    e.setAttribute("stroke-opacity", circuit ? (inside ? 1 : 0.15) : 0.55);
    e.dataset.width = w;
    e.dataset.score = s === null ? "" : s;
    e.classList.toggle("in-circuit", inside);
    if (inside) { edgeLayer.appendChild(e); inNodes.add(D.edges[i].sender); inNodes.add(D.edges[i].receiver); }
  });
  nodeEls.forEach((g, id) => g.classList.toggle("in-circuit", inNodes.has(id)));
  $("step-note").textContent = [scores ? "" : "no edge scores at this step", circuit ? "" : "no circuit at this step"]
    .filter(Boolean).join("; ");
}

// ---- heatmaps ----
const HM = {cell: 50, row: 26, left: 30, top: 18};
const heatmaps = D.heatmaps.map((hm, i) => {
  const svg = $(`heatmap-${i}`);
  let vmax = 0, neg = false;
  for (const grid of hm.values) if (grid) for (const row of grid) for (const v of row)
    if (v !== null) { vmax = Math.max(vmax, Math.abs(v)); neg = neg || v < 0; }
  const w = HM.left + H * HM.cell + 8, gridBottom = HM.top + L * HM.row;
  size(svg, w, gridBottom + 34);
  for (let h = 0; h < H; h++) el("text", {x: HM.left + HM.cell * (h + 0.5), y: HM.top - 5, "text-anchor": "middle"}, svg, `H${h}`);
  const cells = [];
  for (let l = 0; l < L; l++) {
    el("text", {x: HM.left - 4, y: HM.top + HM.row * (l + 0.5) + 4, "text-anchor": "end"}, svg, `L${l}`);
    cells.push([]);
    for (let h = 0; h < H; h++) {
      const g = el("g", {class: "hm-cell", "data-layer": l, "data-head": h}, svg);
      const x = HM.left + HM.cell * h, y = HM.top + HM.row * l;
      cells[l].push({g, rect: el("rect", {x, y, width: HM.cell, height: HM.row}, g),
                     text: el("text", {x: x + HM.cell / 2, y: y + HM.row / 2 + 4, "text-anchor": "middle"}, g)});
    }
  }
  const lo = neg ? -vmax : 0, n = 12, bw = H * HM.cell / n;  // colour bar
  for (let k = 0; k < n; k++) {
    const v = lo + (vmax - lo) * (k + 0.5) / n;
    el("rect", {x: HM.left + k * bw, y: gridBottom + 8, width: bw + 0.5, height: 8, fill: heatColor(v, vmax)}, svg);
  }
  el("text", {x: HM.left, y: gridBottom + 30}, svg, cellText(lo));
  el("text", {x: HM.left + H * HM.cell, y: gridBottom + 30, "text-anchor": "end"}, svg, cellText(vmax));
  svg.addEventListener("click", ev => {
    const c = ev.target.closest(".hm-cell");
    if (c) selectHead(+c.dataset.layer, +c.dataset.head);
  });
  return {hm, cells, vmax, note: $(`heatmap-${i}-note`)};
});
function heatColor(v, vmax) {
  if (v === null) return CFG.missing;
  return mix(v < 0 ? CFG.negative : CFG.positive, vmax > 0 ? Math.min(1, Math.abs(v) / vmax) : 0);
}
function drawHeatmaps() {
  for (const {hm, cells, vmax, note} of heatmaps) {
    const grid = hm.values[state.step];
    note.textContent = grid ? "" : "not computed at this step";
    cells.forEach((row, l) => row.forEach((c, h) => {
      const v = grid ? grid[l][h] : null;
      c.g.dataset.value = v === null ? "" : v;
      c.rect.setAttribute("fill", heatColor(v, vmax));
      c.text.textContent = v === null ? "" : cellText(v);
      c.text.setAttribute("fill", v !== null && vmax > 0 && Math.abs(v) / vmax > 0.6 ? "#fff" : "#222");
      c.g.classList.toggle("selected", !!state.head && state.head[0] === l && state.head[1] === h);
    }));
  }
}

// ---- the attention pattern ----
const examples = D.patterns.examples, X = examples.length, P = X ? examples[0].length : 0;
const PT = {cell: 18, left: 78, top: 66};
const pattern = $("pattern"), select = $("example-select"), decoded = new Map();
const short = t => t.length > 9 ? t.slice(0, 8) + "\u2026" : t;
size(pattern, PT.left + P * PT.cell + 8, PT.top + P * PT.cell + 8);
examples.forEach((tokens, x) => {
  const text = tokens.join(" ");
  select.appendChild(new Option(`example ${x}: ${text.length > 48 ? text.slice(0, 47) + "\u2026" : text}`, x));
});
const keyLabels = [], queryLabels = [], patternCells = [];
for (let i = 0; i < P; i++) {
  const c = PT.left + PT.cell * (i + 0.5);
  keyLabels.push(el("text", {x: c, y: PT.top - 4, transform: `rotate(-60 ${c} ${PT.top - 4})`}, pattern));
  queryLabels.push(el("text", {x: PT.left - 4, y: PT.top + PT.cell * (i + 0.5) + 4, "text-anchor": "end"}, pattern));
}
for (let q = 0; q < P; q++) for (let k = 0; k < P; k++)
  patternCells.push(el("rect", {class: "pt-cell", x: PT.left + PT.cell * k, y: PT.top + PT.cell * q, width: PT.cell - 1,
                                height: PT.cell - 1, "data-q": q, "data-k": k}, pattern));
const tooltip = el("title", {}, pattern);
pattern.addEventListener("mouseover", ev => {
  const c = ev.target.closest(".pt-cell");
  if (c) tooltip.textContent = `query ${c.dataset.q} -> key ${c.dataset.k}: ${c.dataset.value || "n/a"}`;
});
select.addEventListener("change", () => { state.example = +select.value; drawPattern(); });
function patternBytes(step) {
  const b64 = D.patterns.values[step];
  if (b64 === null) return null;
  if (!decoded.has(step)) decoded.set(step, Uint8Array.from(atob(b64), ch => ch.charCodeAt(0)));
  return decoded.get(step);
}
function drawPattern() {
  const bytes = patternBytes(state.step), tokens = examples[state.example] || [], hd = state.head;
  $("pattern-title").textContent = hd ? `Attention pattern of ${headName(hd[0], hd[1])}, example ${state.example}, `
    + `step ${D.steps[state.step]}` : "Attention pattern: click a head";
  $("pattern-note").textContent = !X ? "no attention patterns in this view" : bytes ? "query (rows) attends to key (columns)"
    : "no pattern at this step";
  tokens.forEach((t, i) => { keyLabels[i].textContent = short(t); queryLabels[i].textContent = short(t); });
  const base = hd ? ((hd[0] * H + hd[1]) * X + state.example) * P * P : 0;
  patternCells.forEach((c, i) => {
    const v = bytes && hd ? bytes[base + i] / 255 : null;
    c.dataset.value = v === null ? "" : v.toFixed(3);
    c.setAttribute("fill", v === null ? "#f0f0f0" : mix(CFG.pattern, v));
  });
}

// ---- loss curves and the edge plot ----
const marks = D.markers || {};
const curveSvg = $("curves");
const allX = [...D.curves.steps, ...D.steps, marks.t_form, marks.tau].filter(v => v !== null && v !== undefined);
const curvePlot = linePlot(curveSvg, {w: 1160, h: 300, xs: D.curves.steps, legend: true,
  xDomain: [allX.reduce((a, b) => Math.min(a, b)), allX.reduce((a, b) => Math.max(a, b))],
  series: D.curves.series.map((s, i) => ({name: s.name, values: s.values, color: CFG.series[i % CFG.series.length]}))});
[["t_form", "tform-line"], ["tau", "tau-line"]].forEach(([key, id], row) => {
  if (marks[key] !== null && marks[key] !== undefined)
    vline(curveSvg, curvePlot, marks[key], {id, class: "landmark"}, `${key} = ${marks[key]}`, row);
});
const stepMarker = vline(curveSvg, curvePlot, D.steps[state.step], {id: "step-marker", class: "step-marker"});
// the reference ladder: one line per rung, each stage a band in its rung's colour
let ladderPlot = null, ladderMarker = null;
if (D.ladder) {
  const svg = $("ladder"), colour = {};
  ladderPlot = linePlot(svg, {w: 1160, h: 260, xs: D.ladder.steps, legend: true, xDomain: curvePlot.xDomain,
    series: D.ladder.series.map((s, i) => {
      colour[s.stage] = CFG.series[i % CFG.series.length];
      return {name: s.name, values: s.values, color: colour[s.stage]};
    })});
  for (const g of D.ladder.segments) {
    if (g.stage === null) continue;
    const x0 = ladderPlot.X(g.start), x1 = ladderPlot.X(g.end);
    el("rect", {x: x0, y: ladderPlot.top, width: Math.max(x1 - x0, 2), height: ladderPlot.bottom - ladderPlot.top,
                class: "stage", "data-stage": g.stage, fill: colour[g.stage], "fill-opacity": 0.13}, svg);
  }
  ladderMarker = vline(svg, ladderPlot, D.steps[state.step], {id: "ladder-marker", class: "step-marker"});
}
function drawCurveMarker() {
  for (const [marker, plot] of [[stepMarker, curvePlot], [ladderMarker, ladderPlot]]) {
    if (!marker) continue;
    const x = plot.X(D.steps[state.step]);
    marker.setAttribute("x1", x); marker.setAttribute("x2", x);
    marker.dataset.step = D.steps[state.step];
  }
}
function drawEdgePlot() {
  const svg = $("edge-plot"), i = state.edge;
  hitEls.forEach((h, j) => h.classList.toggle("selected", j === i));
  if (i === null) {
    svg.replaceChildren(); size(svg, 480, 40);
    el("text", {x: 4, y: 20, id: "edge-plot-title", class: "plot-title"}, svg, "Click an edge of the graph");
    return;
  }
  const values = D.edge_scores.map(row => row ? row[i] : null);
  const plot = linePlot(svg, {w: 480, h: 220, xs: D.steps, zero: true, xDomain: [D.steps[0], D.steps[S - 1]],
                              title: edgeName(i), titleId: "edge-plot-title",
                              series: [{name: edgeName(i), values, color: "#555"}]});
  values.forEach((v, j) => {
    if (v !== null) el("circle", {cx: plot.X(D.steps[j]), cy: plot.Y(v), r: 3,
                                  class: circuits[j] && circuits[j].has(i) ? "dot in-circuit" : "dot"}, svg);
  });
  vline(svg, plot, D.steps[state.step], {id: "edge-step-marker", class: "step-marker"});
}

// ---- the controls ----
const slider = $("step-slider"), play = $("play");
let timer = null;
function setStep(i) {
  i = Math.round(Number(i));
  if (!Number.isFinite(i)) return;
  state.step = Math.max(0, Math.min(S - 1, i));
  slider.value = String(state.step);
  $("step-label").textContent = `step ${D.steps[state.step]} (${state.step + 1} / ${S})`;
  drawGraph(); drawHeatmaps(); drawPattern(); drawCurveMarker(); drawEdgePlot();
}
function selectHead(layer, head) {
  if (!(layer >= 0 && layer < L && head >= 0 && head < H)) return;
  state.head = [layer, head];
  const id = headName(layer, head);
  nodeEls.forEach((g, nid) => g.classList.toggle("selected", nid === id));
  drawHeatmaps(); drawPattern();
}
function selectEdge(i) {
  state.edge = i === null || !(i >= 0 && i < D.edges.length) ? null : Math.trunc(i);
  drawEdgePlot();
}
function togglePlay() {
  if (timer) { clearInterval(timer); timer = null; }
  else {
    if (state.step >= S - 1) setStep(0);
    timer = setInterval(() => { if (state.step >= S - 1) togglePlay(); else setStep(state.step + 1); }, CFG.playMs);
  }
  state.playing = !!timer;
  play.textContent = timer ? "Pause" : "Play";
}
slider.addEventListener("input", () => setStep(slider.value));
play.addEventListener("click", togglePlay);
document.addEventListener("keydown", ev => {
  if (ev.target.closest && ev.target.closest("input, select, textarea")) return;  // they handle arrows themselves
  if (ev.key !== "ArrowLeft" && ev.key !== "ArrowRight") return;
  ev.preventDefault();
  setStep(state.step + (ev.key === "ArrowRight" ? 1 : -1));
});

const first = D.selected_head || (heads.length ? [heads[0].layer, heads[0].head] : null);
if (first) selectHead(first[0], first[1]);
// a link such as view.html#step=1500 opens at the analysed step nearest training step 1500
const asked = /step=(\d+)/.exec(location.hash);
const nearest = asked ? D.steps.reduce((best, s, j) => Math.abs(s - asked[1]) < Math.abs(D.steps[best] - asked[1]) ? j : best, 0)
                      : S - 1;
setStep(nearest);
window.timeView = {setStep, selectHead, selectEdge, state};
})();
"""
