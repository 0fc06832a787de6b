"""The circuit-over-time page (``plateauscope.views.time_view``) on synthetic data, in real headless Chromium.

The data is built here (a 2-layer, 2-head model with MLPs over 5 analysed steps, with a step
without edge scores, one without a circuit, one without patterns and a heatmap computed at two
steps only), so nothing here trains or analyses. Every expected number is re-derived in Python
from that data: edge widths by the rule of the module docstring, heatmap values, attention
patterns decoded from their base64 blobs.

Fast (no browser): :func:`validate_view_data` rejects malformed dicts with one-line errors, the
page has no http(s) reference, and a full-size page (110 steps, 4 x 4 heads, 3 examples of 20
tokens) stays under 15 MB. Slow (``TestInChromium``): the page opened from a file:// URL and driven
through the slider, clicks, arrow keys and play, with no console error and a PNG screenshot. The
browser tests skip, loudly, only when no Chromium is installed.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plateauscope.views.time_view import (
    MAX_EDGE_WIDTH,
    MIN_EDGE_WIDTH,
    render_time_view,
    validate_view_data,
)
from tests.views.test_report_browser import Chromium, problems

PAGE_LIMIT_BYTES = 15_000_000
NO_SCORES, NO_CIRCUIT, NO_PATTERN = 2, 3, 1
"""Step indices of the synthetic data without edge scores, without a circuit, without patterns."""
ABLATION_STEPS = (0, 4)
"""Step indices at which the synthetic "ablation" heatmap is computed."""


# ---- the synthetic data ---------------------------------------------------------------------


def model_graph(n_layers: int, n_heads: int, mlp: bool) -> tuple[list[dict], list[dict]]:
    """Nodes and edges of a small transformer: every earlier component feeds every later input."""
    embed = {"id": "embed", "kind": "embed", "layer": -1, "head": None}
    logits = {"id": "logits", "kind": "logits", "layer": n_layers, "head": None}
    nodes, edges = [embed], []
    for layer in range(n_layers):
        heads = [{"id": f"L{layer}H{h}", "kind": "head", "layer": layer, "head": h} for h in range(n_heads)]
        edges += [{"sender": s["id"], "receiver": r["id"], "input": inp} for r in heads for inp in "qkv" for s in nodes]
        nodes += heads
        if mlp:
            edges += [{"sender": s["id"], "receiver": f"MLP{layer}", "input": "mlp"} for s in nodes]
            nodes.append({"id": f"MLP{layer}", "kind": "mlp", "layer": layer, "head": None})
    edges += [{"sender": s["id"], "receiver": "logits", "input": "logits"} for s in nodes]
    return nodes + [logits], edges


def causal_patterns(rng: np.random.Generator, shape: tuple[int, ...]) -> str:
    """Base64 of random causal attention patterns ``[..., P, P]`` as uint8 (round(prob * 255))."""
    n_pos = shape[-1]
    logits = rng.normal(size=shape) * 2 + np.where(np.tril(np.ones((n_pos, n_pos))) > 0, 0.0, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return base64.b64encode(np.round(probs * 255).astype(np.uint8).tobytes()).decode()


def synthetic_view_data(n_steps: int = 5, n_layers: int = 2, n_heads: int = 2, n_examples: int = 2, n_pos: int = 6,
                        mlp: bool = True, seed: int = 0) -> dict[str, Any]:
    """A view-data dict of the contract of ``plateauscope.views.time_view`` with known contents."""
    rng = np.random.default_rng(seed)
    nodes, edges = model_graph(n_layers, n_heads, mlp)
    steps = [100 * i for i in range(n_steps)]
    scores = (rng.normal(size=(n_steps, len(edges))) * np.linspace(0.05, 1.0, n_steps)[:, None]).tolist()
    scores[1][0] = None
    scores[NO_SCORES] = None
    circuit = [sorted(np.argsort([-abs(s or 0) for s in row])[:4].tolist()) if row else [] for row in scores]
    circuit[NO_CIRCUIT] = None
    grids = rng.uniform(-0.2, 1.0, size=(n_steps, n_layers, n_heads)).tolist()
    grids[0][0][0] = None
    tokens = ["<BOS>", *"abcdefghijklmnopqrstuvwxyz"]
    curve_steps = list(range(0, steps[-1] + 1, 10))
    return {
        "title": "Synthetic circuit over time",
        "steps": steps, "n_layers": n_layers, "n_heads": n_heads, "nodes": nodes, "edges": edges,
        "edge_scores": scores, "circuit": circuit,
        "heatmaps": [{"name": "attention to the cue", "values": grids},
                     {"name": "ablation", "values": [rng.normal(size=(n_layers, n_heads)).tolist()
                                                     if i in ABLATION_STEPS else None for i in range(n_steps)]}],
        "patterns": {"examples": [[tokens[(x + p) % len(tokens)] for p in range(n_pos)] for x in range(n_examples)],
                     "values": [None if i == NO_PATTERN else causal_patterns(rng, (n_layers, n_heads, n_examples, n_pos, n_pos))
                                for i in range(n_steps)]},
        "curves": {"steps": curve_steps,
                   "series": [{"name": "loss", "values": [3 * np.exp(-s / 150) + 0.1 for s in curve_steps]},
                              {"name": "set loss", "values": [None if s == 20 else 2 * np.exp(-s / 250) for s in curve_steps]}]},
        "markers": {"t_form": 150, "tau": 300},
        "caption": "Synthetic data: random edge scores growing over time, random attention patterns.",
    }


def expected_widths(data: dict[str, Any], step: int) -> list[float]:
    """Edge widths at ``step`` by the module's rule: MIN + (MAX - MIN) |s| / (max |s| over all steps)."""
    biggest = max((abs(s) for row in data["edge_scores"] if row for s in row if s is not None), default=0.0)
    row = data["edge_scores"][step] or [None] * len(data["edges"])
    return [MIN_EDGE_WIDTH if s is None or biggest == 0
            else MIN_EDGE_WIDTH + (MAX_EDGE_WIDTH - MIN_EDGE_WIDTH) * abs(s) / biggest for s in row]


def decoded_pattern(data: dict[str, Any], step: int, layer: int, head: int, example: int) -> np.ndarray:
    """The [query, key] attention probabilities of one head on one example, to 3 decimals."""
    examples = data["patterns"]["examples"]
    shape = (data["n_layers"], data["n_heads"], len(examples), len(examples[0]), len(examples[0]))
    raw = np.frombuffer(base64.b64decode(data["patterns"]["values"][step]), np.uint8).reshape(shape)
    return np.round(raw[layer, head, example] / 255, 3)


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    return synthetic_view_data()


# ---- fast: validation and the page text -----------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation putting ``value`` at ``path`` (dots; ints index lists)."""
    *head, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def mutate(d: dict) -> None:
        for k in head:
            d = d[k]
        d[last] = value
    return mutate


BAD = [
    (lambda d: d.pop("edges"), "missing keys: edges"),
    (_set("steps", [0, 200, 100, 300, 400]), "strictly ascending"),
    (_set("edge_scores", [[0.1]] * 4), "edge_scores has 4 entries, expected 5"),
    (_set("edge_scores.0", [0.1, 0.2]), r"edge_scores\[0\] has 2 entries"),
    (_set("edge_scores.4.3", "big"), r"edge_scores\[4\]\[3\] is a str"),
    (_set("edges.0.sender", "L9H9"), r"edges\[0\] has unknown sender node 'L9H9'"),
    (_set("edges.0.input", "z"), "unknown input 'z'"),
    (_set("edges.0.receiver", "MLP0"), "input 'q' enters a head node, not the mlp node 'MLP0'"),
    (_set("circuit.0", [0, 10_000]), r"circuit\[0\] must be None or a list of edge indices"),
    (_set("nodes.1.head", 7), "outside 0..1"),
    (_set("heatmaps.0.values.2", [[0.1, 0.2]]), r"heatmaps\[0\]\.values\[2\] has 1 entries, expected 2"),
    (_set("patterns.values.0", "AAAA"), r"patterns\.values\[0\] decodes to 3 bytes"),
    (_set("patterns.values.0", "not base64!"), "decodes to -1 bytes"),
    (_set("curves.series.0.values", [1.0]), r"curves\.series\[0\]\.values has 1 entries"),
    (_set("markers", {"tau": "soon"}), "markers must be a dict"),
    (_set("selected_head", [5, 0]), "selected_head"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD, ids=[m for _, m in BAD])
def test_validate_view_data_rejects_malformed_data_in_one_line(data, mutate, message):
    bad = copy.deepcopy(data)
    mutate(bad)
    with pytest.raises(ValueError, match=message) as err:
        validate_view_data(bad)
    assert "\n" not in str(err.value) and str(err.value).startswith("view data: ")


def test_validate_view_data_accepts_good_data(data):
    validate_view_data(data)
    validate_view_data(synthetic_view_data(mlp=False))
    with pytest.raises(ValueError, match="expected a dict"):
        validate_view_data([])


def test_page_references_nothing_on_the_network_and_embeds_the_data_once(data):
    text = render_time_view(data)
    assert re.search(r"https?:|//cdn|plotly", text, re.IGNORECASE) is None
    assert text.count('id="view-data"') == 1 and text.count("<script") == 2


def test_page_of_a_long_run_stays_small():
    text = render_time_view(synthetic_view_data(n_steps=110, n_layers=4, n_heads=4, n_examples=3, n_pos=20))
    assert len(text.encode()) < PAGE_LIMIT_BYTES


# ---- slow: the page in headless Chromium ----------------------------------------------------


def js(browser: Chromium, expression: str) -> Any:
    """Evaluate ``expression`` in the page; fail on an exception; the value (JSON strings decoded)."""
    res = browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
    assert "exceptionDetails" not in res, res["exceptionDetails"]
    value = res["result"].get("value")
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def press(browser: Chromium, key: str, code: int) -> None:
    """A real key press (down and up) sent to the page."""
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code})


def open_page(binary: str, html_path: Path, profile: Path) -> Chromium:
    """Chromium with ``html_path`` loaded from disk and its script run."""
    browser = Chromium(binary, profile)
    browser.open_page()
    browser.send("Page.navigate", {"url": html_path.resolve().as_uri()})
    browser.wait_event("Page.loadEventFired", 60)
    assert js(browser, "typeof window.timeView") == "object", problems(browser.events)
    return browser


@pytest.fixture(scope="module")
def page(chromium_binary, data, tmp_path_factory) -> Iterator[Chromium]:
    folder = tmp_path_factory.mktemp("time_view")
    path = folder / "time_view.html"
    path.write_text(render_time_view(data), encoding="utf-8")
    browser = open_page(chromium_binary, path, folder / "profile")
    yield browser
    browser.close()


SLIDE_JS = """(() => { const s = document.getElementById("step-slider");
  s.value = "%d"; s.dispatchEvent(new Event("input", {bubbles: true})); })()"""
READ_JS = """JSON.stringify({
  step: window.timeView.state.step,
  label: document.getElementById("step-label").textContent,
  note: document.getElementById("step-note").textContent,
  edges: [...document.querySelectorAll("#graph [data-edge]")].map(e => [+e.dataset.edge, +e.dataset.width,
      +e.getAttribute("stroke-width"), e.dataset.score, e.classList.contains("in-circuit")]),
  heatmaps: [...document.querySelectorAll("svg[id^=heatmap-]")].map(s => [...s.querySelectorAll("[data-layer]")]
      .map(c => [+c.dataset.layer, +c.dataset.head, c.dataset.value])),
  heatmapNotes: [...document.querySelectorAll("[id$=-note][id^=heatmap-]")].map(n => n.textContent),
  marker: document.getElementById("step-marker").dataset.step,
})"""
PATTERN_JS = """JSON.stringify({
  title: document.getElementById("pattern-title").textContent,
  note: document.getElementById("pattern-note").textContent,
  cells: [...document.querySelectorAll("#pattern .pt-cell")].map(c => [+c.dataset.q, +c.dataset.k, c.dataset.value]),
  labels: [...document.querySelectorAll("#pattern text")].map(t => t.textContent),
  head: window.timeView.state.head,
})"""
CLICK_JS = """document.querySelector(%s).dispatchEvent(new MouseEvent("click", {bubbles: true}))"""


def click(browser: Chromium, selector: str) -> None:
    js(browser, CLICK_JS % json.dumps(selector))


def pattern_matrix(read: dict[str, Any]) -> np.ndarray:
    n = int(len(read["cells"]) ** 0.5)
    out = np.full((n, n), np.nan)
    for q, k, v in read["cells"]:
        out[q, k] = float(v) if v != "" else np.nan
    return out


@pytest.mark.slow
class TestInChromium:
    """The page driven in headless Chromium; the last test checks the console of the whole session."""

    @pytest.mark.parametrize("step", range(5))
    def test_slider_moves_graph_heatmaps_and_marker_together(self, page, data, step):
        js(page, SLIDE_JS % step)
        got = js(page, READ_JS)
        assert got["step"] == step and got["marker"] == str(data["steps"][step])
        assert got["label"].startswith(f"step {data['steps'][step]} ")
        want = expected_widths(data, step)
        got["edges"].sort()  # circuit edges are moved to the end of the DOM (drawn on top)
        assert [e[0] for e in got["edges"]] == list(range(len(data["edges"])))
        np.testing.assert_allclose([e[1] for e in got["edges"]], want, atol=0.01)
        assert [e[1] for e in got["edges"]] == [e[2] for e in got["edges"]]  # data-width is the drawn width
        circuit = data["circuit"][step]
        assert {e[0] for e in got["edges"] if e[4]} == set(circuit or [])
        assert ("no edge scores at this step" in got["note"]) == (step == NO_SCORES)
        assert ("no circuit at this step" in got["note"]) == (step == NO_CIRCUIT)
        for hm, cells, note in zip(data["heatmaps"], got["heatmaps"], got["heatmapNotes"]):
            grid = hm["values"][step]
            assert (note == "not computed at this step") == (grid is None)
            for layer, head, value in cells:
                want_v = None if grid is None else grid[layer][head]
                assert (value == "") == (want_v is None)
                if want_v is not None:
                    assert float(value) == pytest.approx(want_v, rel=1e-3, abs=1e-9)
            assert len(cells) == data["n_layers"] * data["n_heads"]

    def test_clicking_a_head_shows_its_attention_pattern(self, page, data):
        step = len(data["steps"]) - 1
        js(page, f"window.timeView.setStep({step}); window.timeView.selectHead(0, 0)")
        before = js(page, PATTERN_JS)
        click(page, '#graph [data-node="L1H0"]')
        after = js(page, PATTERN_JS)
        assert after["head"] == [1, 0] and "L1H0" in after["title"] and f"step {data['steps'][step]}" in after["title"]
        np.testing.assert_allclose(pattern_matrix(after), decoded_pattern(data, step, 1, 0, 0), atol=1e-9)
        assert not np.allclose(pattern_matrix(before), pattern_matrix(after))
        assert data["patterns"]["examples"][0][0] in after["labels"]
        js(page, """(() => { const s = document.getElementById("example-select");
                    s.value = "1"; s.dispatchEvent(new Event("change")); })()""")
        np.testing.assert_allclose(pattern_matrix(js(page, PATTERN_JS)), decoded_pattern(data, step, 1, 0, 1), atol=1e-9)
        click(page, '#heatmap-0 [data-layer="0"][data-head="1"]')  # a heatmap cell selects its head too
        read = js(page, PATTERN_JS)
        assert read["head"] == [0, 1] and "L0H1" in read["title"]
        np.testing.assert_allclose(pattern_matrix(read), decoded_pattern(data, step, 0, 1, 1), atol=1e-9)
        js(page, SLIDE_JS % NO_PATTERN)
        read = js(page, PATTERN_JS)
        assert read["note"] == "no pattern at this step" and all(v == "" for _, _, v in read["cells"])

    def test_clicking_an_edge_plots_its_score_over_time(self, page, data):
        i = next(i for i, e in enumerate(data["edges"]) if e["input"] == "q" and e["sender"] != "embed")
        e = data["edges"][i]
        click(page, f'#graph [data-edge="{i}"]')
        got = js(page, """JSON.stringify({title: document.querySelector("#edge-plot #edge-plot-title").textContent,
            lines: document.querySelectorAll("#edge-plot polyline.series").length,
            dots: document.querySelectorAll("#edge-plot circle.dot").length, edge: window.timeView.state.edge})""")
        assert got["title"] == f"{e['sender']} -> {e['receiver']} ({e['input']})" == "L0H0 -> L1H0 (q)"
        assert got["edge"] == i and got["lines"] == 1
        assert got["dots"] == sum(row is not None and row[i] is not None for row in data["edge_scores"])

    def test_arrow_keys_and_play_move_the_step(self, page, data):
        js(page, "window.timeView.setStep(2); document.activeElement && document.activeElement.blur()")
        press(page, "ArrowLeft", 37)
        assert js(page, "window.timeView.state.step") == 1
        press(page, "ArrowRight", 39)
        press(page, "ArrowRight", 39)
        assert js(page, "window.timeView.state.step") == 3
        assert js(page, 'document.getElementById("step-slider").value') == "3"
        js(page, "window.timeView.setStep(0)")
        click(page, "#play")
        deadline = time.monotonic() + 10
        while js(page, "window.timeView.state.step") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        click(page, "#play")
        assert js(page, "window.timeView.state.step") >= 2 and js(page, "window.timeView.state.playing") is False

    def test_edge_cases_render(self, chromium_binary, tmp_path):
        """Attention only, no heatmaps, no markers, no scores, circuits or patterns, no curves."""
        sparse = synthetic_view_data(mlp=False)
        n = len(sparse["steps"])
        sparse.update(heatmaps=[], edge_scores=[None] * n, circuit=[None] * n, curves={"steps": [], "series": []})
        sparse["patterns"]["values"] = [None] * n
        del sparse["markers"]
        path = tmp_path / "sparse.html"
        path.write_text(render_time_view(sparse), encoding="utf-8")
        browser = open_page(chromium_binary, path, tmp_path / "profile")
        try:
            js(browser, SLIDE_JS % 1)
            got = js(browser, READ_JS)
            assert got["note"] == "no edge scores at this step; no circuit at this step"
            assert {e[1] for e in got["edges"]} == {MIN_EDGE_WIDTH} and not any(e[4] for e in got["edges"])
            assert js(browser, 'document.querySelectorAll("#tform-line, #tau-line, .node.mlp").length') == 0
            assert js(browser, PATTERN_JS)["note"] == "no pattern at this step"
            time.sleep(0.3)
            assert problems(list(browser.events)) == ([], [])
        finally:
            browser.close()

    def test_no_console_errors_and_a_screenshot(self, page, data, tmp_path):
        js(page, "window.timeView.setStep(4); window.timeView.selectEdge(5)")
        time.sleep(0.3)  # let late errors arrive
        remote, errors = problems(list(page.events))
        assert remote == [] and errors == [], (remote, errors)
        height = js(page, "Math.ceil(document.documentElement.scrollHeight)")
        shot = page.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                    "clip": {"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1}})
        path = tmp_path / "time_view.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


# ---- the view of a real analysed run, against its analysis files ------------------------------


@pytest.fixture(scope="module")
def ci_view(ci_analysed, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The session `ci` run's view (written outside the read-only run) and its data."""
    from plateauscope.views.time_data import time_view_data
    from plateauscope.views.view import write_view

    path = write_view(ci_analysed, tmp_path_factory.mktemp("ci_view") / "view.html")
    return path, time_view_data(ci_analysed)


def test_the_view_of_a_real_run_holds_its_analysis_files(ci_analysed, ci_view):
    from plateauscope.analysis.analyze import load_analysis

    path, data = ci_view
    cache = load_analysis(ci_analysed)
    assert data["steps"] == [r["step"] for r in cache["edges"]] == [r["step"] for r in cache["attention"]]
    assert data["edge_scores"] == [r["effect"] for r in cache["edges"]]
    searched = {r["step"] for r in cache["edge_circuit"]}
    assert [c is not None for c in data["circuit"]] == [
        s in searched and bool(next(r for r in cache["edge_circuit"] if r["step"] == s)["circuit"]) for s in data["steps"]]
    assert (f"searched at {len(searched)} of these" in data["caption"]) == (len(searched) < len(data["steps"]))
    assert path.stat().st_size < PAGE_LIMIT_BYTES
    assert data["markers"]["tau"] == cache["routing"]["tau"]


def test_the_per_head_llc_heatmap_holds_its_file_at_its_steps(ci_analysed, tmp_path):
    """A head_llc.json at two of the view's steps (one head left out) is the per-head LLC heatmap there,
    cell by cell, and "not computed" (None) at every other step and for the head left out."""
    from plateauscope.analysis.results import HEAD_LLC_SUMMARY_FILE, analysis_dir
    from plateauscope.runs.run import RunError
    from plateauscope.views.time_data import time_view_data
    from tests.conftest import copy_run

    run = copy_run(ci_analysed, tmp_path / "run", with_analysis=True)
    before = time_view_data(run)
    assert "per-head LLC" not in [h["name"] for h in before["heatmaps"]]
    steps = before["steps"]
    n_layers, n_heads = before["n_layers"], before["n_heads"]
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)][1:]
    at = [steps[1], steps[-1]]
    llc = [[10.0 * i + layer + head / 10 for layer, head in heads] for i in range(len(at))]
    (analysis_dir(run) / HEAD_LLC_SUMMARY_FILE).write_text(json.dumps(
        {"steps": at, "heads": [f"L{layer}H{head}" for layer, head in heads], "llc": llc}))
    data = time_view_data(run)
    grids = next(h for h in data["heatmaps"] if h["name"] == "per-head LLC")["values"]
    assert [g is not None for g in grids] == [s in at for s in steps]
    for i, step in enumerate(at):
        grid = grids[steps.index(step)]
        assert grid[0][0] is None
        assert [grid[layer][head] for layer, head in heads] == llc[i]
    (analysis_dir(run) / HEAD_LLC_SUMMARY_FILE).write_text(json.dumps({"steps": at, "heads": ["L9H0"], "llc": [[1.0]]}))
    with pytest.raises(RunError, match=r"head_llc\.json: not a per-head LLC summary \(head L9H0 does not exist"):
        time_view_data(run)


@pytest.mark.slow
def test_the_view_of_a_real_run_in_chromium(chromium_binary, ci_analysed, ci_view, tmp_path):
    """Open at the step nearest tau (``#step=TAU``), slide away and back: the edge scores, the attention-to-cue heatmap and the marker are
    those of the analysis files at that step; a click on a head shows its cached pattern."""
    from plateauscope.analysis.analyze import load_analysis

    path, data = ci_view
    cache = load_analysis(ci_analysed)
    tau = cache["routing"]["tau"]
    index = min(range(len(data["steps"])), key=lambda i: abs(data["steps"][i] - tau))
    step = data["steps"][index]
    browser = Chromium(chromium_binary, tmp_path / "profile")
    try:
        browser.open_page()  # a link to a training step opens the page at the analysed step nearest it
        browser.send("Page.navigate", {"url": f"{path.resolve().as_uri()}#step={tau}"})
        browser.wait_event("Page.loadEventFired", 60)
        assert js(browser, "window.timeView.state.step") == index
        js(browser, SLIDE_JS % 0)
        js(browser, SLIDE_JS % index)
        got = js(browser, READ_JS)
        assert got["marker"] == str(step)
        effect = next(r for r in cache["edges"] if r["step"] == step)["effect"]
        scores = sorted((e[0], float(e[3])) for e in got["edges"])
        np.testing.assert_allclose([s for _, s in scores], effect, rtol=1e-3, atol=1e-6)
        circuit = next((r for r in cache["edge_circuit"] if r["step"] == step), {}).get("circuit")
        assert {e[0] for e in got["edges"] if e[4]} == set(circuit["edges"] if circuit else [])
        attention = next(r for r in cache["attention"] if r["step"] == step)["to_z_first"]
        for layer, head, value in got["heatmaps"][0]:
            assert float(value) == pytest.approx(attention[layer][head], rel=1e-3, abs=1e-6)
        click(browser, '#graph [data-node="L1H0"]')
        shown = pattern_matrix(js(browser, PATTERN_JS))
        record = next(r for r in cache["patterns"] if r["step"] == step)
        cached = np.frombuffer(base64.b64decode(record["values"]), np.uint8).reshape(record["shape"])[1, 0, 0] / 255
        np.testing.assert_allclose(shown, np.round(cached, 3), atol=1e-9)
        # the ladder: a band per stage of summary.json, in its rung's name, and the marker at the step
        stages = js(browser, '[...document.querySelectorAll("#ladder rect.stage")].map(r => r.dataset.stage)')
        assert stages == [g["stage"] for g in data["ladder"]["segments"] if g["stage"] is not None] != []
        assert js(browser, 'document.getElementById("ladder-marker").dataset.step') == str(step)
        remote, errors = problems(list(browser.events))
        assert remote == [] and errors == [], (remote, errors)
    finally:
        browser.close()
