"""The run at a glance (``plateauscope.views.overview``): the drawn values read back from the SVG's own axis
ticks equal the data, its caption equals the data's landmarks, and the committed demo figure agrees
with itself and with the README caption under it."""

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from plateauscope.analysis.results import OVERVIEW_FILE
from plateauscope.analysis.summary import plateau_stretch
from plateauscope.runs.metrics import compute_tau
from plateauscope.runs.run import Run
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.views.overview import overview_svg, with_readme_caption
from plateauscope.views.report import build_overview, write_report

ROOT = Path(__file__).resolve().parents[2]
DEMO_FIGURE = ROOT / "docs" / "pages" / "images" / "demo.svg"
NS = {"svg": "http://www.w3.org/2000/svg"}


def _axis(root: ET.Element, tick_class: str, coord: str) -> tuple[float, float]:
    """Slope and intercept of value = a * pixel + b, fitted to the tick labels of one axis."""
    ticks = [t for t in root.iter(f"{{{NS['svg']}}}text") if t.get("class") == tick_class]
    assert len(ticks) >= 2, tick_class
    px = np.array([float(t.get(coord)) for t in ticks])
    values = np.array([float(t.text) for t in ticks])
    a, b = np.polyfit(px, values, 1)
    assert np.allclose(a * px + b, values, atol=1e-3 * np.ptp(values)), "ticks are not linear"
    return a, b


def _read_back(root: ET.Element, element_id: str, y_ticks: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a polyline, through the axes' tick labels (not the drawing code's scale)."""
    line = root.find(f".//svg:polyline[@id='{element_id}']", NS)
    assert line is not None, element_id
    pts = np.array([[float(v) for v in p.split(",")] for p in line.get("points").split()])
    ax, bx = _axis(root, "xtick", "x")
    ay, by = _axis(root, y_ticks, "y")
    return ax * pts[:, 0] + bx, ay * pts[:, 1] + by


def _vline_step(root: ET.Element, element_id: str) -> float:
    ax, bx = _axis(root, "xtick", "x")
    return ax * float(root.find(f".//svg:line[@id='{element_id}']", NS).get("x1")) + bx


def _synthetic() -> tuple[list[dict], list[dict], dict, ProgressMeasure]:
    """A plateau at log 4 until a drop at step 600, and head L0H1's attention rising from step 300."""
    log_k = math.log(4)
    steps = list(range(0, 1001, 50))
    metrics = [{"step": s, "candidate_loss": log_k * (1.0 if s < 550 else 0.2), "delta_z": 0.0 if s < 550 else 2.0,
                "set_loss": 9.0, "loss": 1.0} for s in steps]
    attention = [{"step": s, "to_z_first": [[0.1, 0.1 + 0.8 * min(max((s - 300) / 400, 0), 1), 0.2]]}
                 for s in steps]
    selector = {"head": [0, 1], "label": "L0H1", "tau": 550, "t_form": 500, "lead_fraction": (550 - 500) / 550}
    progress = ProgressMeasure(key="candidate_loss", height=log_k, cue_effect_key="delta_z")
    return metrics, attention, selector, progress


def test_drawn_values_read_back_through_the_axis_ticks():
    metrics, attention, selector, progress = _synthetic()
    plateau = {"verdict": "shelf", "know_nothing": {"metric": "set_loss", "set_loss": 9.5}}
    svg, caption = overview_svg(metrics, attention, selector, progress, plateau, machine="Test CPU")
    root = ET.fromstring(svg)
    steps, values = _read_back(root, "progress", "ytick-loss")
    assert np.allclose(steps, [r["step"] for r in metrics], atol=0.02)
    assert np.allclose(values, [r["candidate_loss"] / progress.height for r in metrics], atol=2e-3)
    _, ref = _read_back(root, "reference-loss", "ytick-loss")
    assert np.allclose(ref, 9.0 / 9.5, atol=2e-3)
    _, routing = _read_back(root, "routing-head", "ytick-attention")
    assert np.allclose(routing, [r["to_z_first"][0][1] for r in attention], atol=2e-3)
    assert {e.get("id") for e in root.iter(f"{{{NS['svg']}}}polyline")} >= {"head-L0H0", "head-L0H2"}
    assert _vline_step(root, "tau-line") == pytest.approx(550, abs=0.05)
    assert _vline_step(root, "t-form-line") == pytest.approx(500, abs=0.05)
    assert root.find("svg:desc", NS).text == caption
    assert "τ = 550" in caption and "t_form = 500" in caption and "lead of 0.09 τ" in caption
    assert "11 of the 11 evaluations before tau" in caption and "runs from step 0 to step 500" in caption
    assert "0.947 of a know-nothing model's: verdict shelf" in caption
    assert caption.endswith("One run, trained on Test CPU.")


def test_no_records_to_draw_is_an_error():
    _, attention, selector, progress = _synthetic()
    with pytest.raises(ValueError, match="candidate_loss"):
        overview_svg([], attention, selector, progress)


@pytest.mark.slow
def test_report_writes_the_overview_of_an_analysed_run(ci_analysed, tmp_path):
    run = Run(ci_analysed)
    svg, caption = build_overview(ci_analysed)
    root = ET.fromstring(svg)
    summary = run.summary
    # the plateau's verdict is stated only where the counts find a plateau at the reference height
    counts = plateau_stretch(run.metrics(), run.progress, summary["tau"])
    assert f"τ = {summary['tau']}" in caption
    assert (f"verdict {summary['plateau']['verdict']}" in caption) == counts["holds"]
    assert f"{counts['n_inside']} of the {counts['n_before']} evaluations" in caption
    assert summary["machines"] and summary["machines"][-1]["cpu"] in caption
    steps, values = _read_back(root, "progress", "ytick-loss")
    recs = run.metrics()
    assert np.allclose(values, [r["candidate_loss"] / run.log_k for r in recs], atol=2e-3)
    assert _vline_step(root, "tau-line") == pytest.approx(summary["tau"], abs=0.05)
    out = tmp_path / "report.html"
    write_report(ci_analysed, out)
    assert (tmp_path / OVERVIEW_FILE).read_text() == svg and svg in out.read_text()


def test_the_committed_demo_figure_agrees_with_itself_and_with_the_readme():
    root = ET.parse(DEMO_FIGURE).getroot()
    caption = root.find("svg:desc", NS).text
    tau = int(re.search(r"τ = (\d+)", caption).group(1))
    t_form = int(re.search(r"t_form = (\d+)", caption).group(1))
    # tau drawn where the caption says, and where the drawn candidate loss first falls below half of log K
    assert _vline_step(root, "tau-line") == pytest.approx(tau, abs=0.5)
    assert _vline_step(root, "t-form-line") == pytest.approx(t_form, abs=0.5)
    steps, values = _read_back(root, "progress", "ytick-loss")
    records = [{"step": round(s), "candidate_loss": float(v)} for s, v in zip(steps, values)]
    assert compute_tau(records, ProgressMeasure(key="candidate_loss", height=1.0)) == tau
    # the README shows this figure with this caption
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "docs/pages/images/demo.svg" in readme
    assert " ".join(caption.split()) in readme.replace("*", ""), "README's caption differs from the figure's <desc>"


def test_no_single_head_the_overview_draws_and_names_the_routing_group():
    """The demo on another CPU: the rule names no single head. The figure draws the group's heads and their mean
    (read back through the ticks), the group's t_form line, and a caption and legend that name the group."""
    metrics, attention, selector, progress = _synthetic()
    group = {"heads": [[0, 1], [0, 2]], "labels": ["L0H1", "L0H2"], "t_form": 450, "lead_fraction": 100 / 550}
    unnamed = {**selector, "named_head": False, "routing_group": group}
    svg, caption = overview_svg(metrics, attention, unnamed, progress, machine="Another CPU")
    root = ET.fromstring(svg)
    lines = {e.get("id"): e for e in root.iter(f"{{{NS['svg']}}}polyline")}
    assert "routing-head" not in lines and {"routing-head-L0H1", "routing-head-L0H2", "head-L0H0"} <= set(lines)
    for h in (1, 2):
        _, drawn = _read_back(root, f"routing-head-L0H{h}", "ytick-attention")
        assert np.allclose(drawn, [r["to_z_first"][0][h] for r in attention], atol=2e-3)
    _, mean = _read_back(root, "routing-group-mean", "ytick-attention")
    assert np.allclose(mean, [(r["to_z_first"][0][1] + r["to_z_first"][0][2]) / 2 for r in attention], atol=2e-3)
    assert _vline_step(root, "t-form-line") == pytest.approx(450, abs=0.05)  # the group's, not L0H1's 500
    legend = [t.text for t in root.iter(f"{{{NS['svg']}}}text")]
    assert "routing group" in legend and "L0H1, L0H2" in legend and not any("routing head" in (t or "") for t in legend)
    assert "routing group" in root.find("svg:title", NS).text
    assert ("No single routing head: the mean attention to the cue of the routing group L0H1 and L0H2 (red; the mean "
            "dashed) is halfway up at t_form = 450, a lead of 0.18 τ.") in caption
    assert "The routing head" not in caption and "t_form = 500" not in caption
    # no named head and no group: no head drawn as the routing, no t_form
    svg, caption = overview_svg(metrics, attention, {**selector, "named_head": False}, progress)
    root = ET.fromstring(svg)
    assert root.find(".//svg:line[@id='t-form-line']", NS) is None and "t_form" not in caption
    assert not [e for e in root.iter(f"{{{NS['svg']}}}polyline") if e.get("stroke") == "#d62728"]


def test_the_readme_caption_is_written_from_the_figure():
    readme = (ROOT / "README.md").read_text()
    assert with_readme_caption(readme, DEMO_FIGURE.read_text()) == readme  # the committed pair agrees
    metrics, attention, selector, progress = _synthetic()
    svg, caption = overview_svg(metrics, attention, selector, progress, machine="Test CPU")
    rewritten = with_readme_caption(readme, svg)
    assert f"*{caption}*\n" in rewritten and rewritten.count("docs/pages/images/demo.svg") == 1
    assert rewritten.replace(f"*{caption}*\n", "") == readme.replace(
        next(line for line in readme.splitlines(keepends=True) if line.startswith("*The candidate loss")), "")
    with pytest.raises(ValueError, match="no image"):
        with_readme_caption("# no figure here\n", svg)
