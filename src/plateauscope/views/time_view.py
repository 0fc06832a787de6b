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
  (``#ladder-marker``);
* with measures (``measures``), each measure's series scaled to its range (``svg#measures``) and the
  same step marker (``#measures-marker``).

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
    measures: {"steps": [int, ...], "series": [{"name": str, "values": [float | None, ...]}, ...]}    optional:
             the measures of the cheap pass, each scaled to [0, 1] over its range (the name gives the range)
    selected_head: [layer, head]                        optional: default the first head node
    curves_title: str                                   optional: the loss curves' heading (default "Training
                                                        curves"; an imported run's: the probe's evaluation)
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
from importlib.resources import files
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

CSS = (files("plateauscope.views") / "assets" / "time_view.css").read_text()
"""The page's style (package data: ``assets/time_view.css``)."""
_SCRIPT = (files("plateauscope.views") / "assets" / "time_view.js").read_text()
"""The page's script (package data: ``assets/time_view.js``); ``__CONFIG__`` in it becomes :func:`_config`."""


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
    if data.get("measures") is not None:
        _check_curves(data["measures"])
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
        "measures": None if data.get("measures") is None else {
            "steps": [int(s) for s in data["measures"]["steps"]],
            "series": [{**s, "values": _rounded(s["values"])} for s in data["measures"]["series"]]},
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


def _curves_note(markers: dict[str, Any]) -> str:
    """The loss curves' note: the step marker, and the dashed landmarks that are drawn (none: not said)."""
    drawn = [key for key in ("t_form", "tau") if markers.get(key) is not None]
    return "Orange: the analysed step shown" + (f"; dashed: {' and '.join(drawn)}." if drawn else ".")


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
        "<h2>Loss curves</h2>", _panel(html.escape(data.get("curves_title") or "Training curves"),
                                       '<svg id="curves"></svg>', _curves_note(data.get("markers") or {})),
        *([_panel("Distance to each reference predictor", '<svg id="ladder"></svg>',
                  "KL(reference || model) in nats per token; a shaded band is a stage, where one rung is the "
                  "closest by the margin.")] if data.get("ladder") else []),
        *([_panel("Measures", '<svg id="measures"></svg>',
                  "Each measure scaled to its own range over the analysed steps (the legend gives the range).")]
          if data.get("measures") else []),
        f'<script type="application/json" id="view-data">{payload}</script>',
        f"<script>{_SCRIPT.replace('__CONFIG__', _config())}</script>",
    ]
    return page(data["title"], parts)
