
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
// the measures of the cheap pass, each scaled to its range
let measuresPlot = null, measuresMarker = null;
if (D.measures) {
  const svg = $("measures");
  measuresPlot = linePlot(svg, {w: 1160, h: 260, xs: D.measures.steps, legend: true, xDomain: curvePlot.xDomain,
    series: D.measures.series.map((s, i) => ({name: s.name, values: s.values, color: CFG.series[i % CFG.series.length]}))});
  measuresMarker = vline(svg, measuresPlot, D.steps[state.step], {id: "measures-marker", class: "step-marker"});
}
function drawCurveMarker() {
  for (const [marker, plot] of [[stepMarker, curvePlot], [ladderMarker, ladderPlot], [measuresMarker, measuresPlot]]) {
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
