"""Figures of the analysed `ci` run: the expected traces, titles, labels and captions; and the
collective-snap statistics on hand-made records with a known answer."""

from __future__ import annotations

import re

import numpy as np
import plotly.graph_objects as go
import pytest

from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.snap import snap_statistics
from plateauscope.runs.run import Run
from plateauscope.views import figures as F


@pytest.fixture(scope="module")
def data(ci_analysed):
    run = Run(ci_analysed)
    analysis = load_analysis(ci_analysed)
    sel = analysis["routing"]
    assert sel is not None and analysis["attention"] and analysis["patch"] and analysis["ablation"]
    return run, run.metrics(), analysis, sel


def check_figure(fig: go.Figure, caption: str) -> None:
    assert isinstance(fig, go.Figure)
    assert fig.layout.title.text
    assert fig.layout.xaxis.title.text or fig.layout.xaxis2.title.text  # shared x: labelled on the bottom row
    assert fig.layout.yaxis.title.text
    assert caption.endswith(".") and ". " not in caption and len(caption) > 40  # one sentence


def landmark_xs(fig: go.Figure) -> set[float]:
    return {float(s.x0) for s in fig.layout.shapes if s.x0 == s.x1 and s.x0 is not None}


def test_loss_curves_with_plateau_verdict(data):
    run, metrics, _, sel = data
    plateau = run.plateau()
    fig, caption = F.loss_curves(metrics, run.progress, sel["tau"], sel["t_form"], plateau)
    check_figure(fig, caption)
    assert [t.name for t in fig.data][-1] == "first-token set loss (nats)"
    np.testing.assert_allclose(fig.data[-1].y, [r["first_token_set_loss"] for r in metrics])
    ref = plateau["know_nothing"]["set_loss"]
    assert any(s.y0 == s.y1 == ref for s in fig.layout.shapes)  # the know-nothing line
    assert f"plateau: {plateau['verdict']}" in fig.layout.title.text and plateau["verdict"] in caption


def test_loss_curves(data):
    run, metrics, _, sel = data
    fig, caption = F.loss_curves(metrics, run.progress, sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    names = [t.name for t in fig.data]
    assert names == ["candidate loss / log K", "training loss (nats/token)", "set loss (nats)", "Δz (nats)"]
    assert list(fig.data[0].x) == [r["step"] for r in metrics]
    np.testing.assert_allclose(fig.data[0].y, [r["candidate_loss"] / run.log_k for r in metrics])
    np.testing.assert_allclose(fig.data[2].y, [r["set_loss"] for r in metrics])
    np.testing.assert_allclose(fig.data[3].y, [r["delta_z"] for r in metrics])
    assert fig.data[2].yaxis == "y2" and fig.data[3].yaxis == "y3"  # set loss on the nats axis, Δz below
    assert landmark_xs(fig) == {sel["tau"] / 2, float(sel["tau"]), float(sel["t_form"])}
    assert any(s.y0 == s.y1 == 1.0 for s in fig.layout.shapes)  # the log K line
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["linear x", "log x"]
    assert buttons[1].args[0] == {"xaxis.type": "log", "xaxis2.type": "log"}


def test_attention_figures(data):
    _, _, analysis, sel = data
    attn, head = analysis["attention"], sel["head"]
    n_layers, n_heads = np.array(attn[0]["to_z_first"]).shape
    fig, caption = F.attention_heatmap(attn, head, sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    (hm,) = fig.data
    assert hm.type == "heatmap" and np.array(hm.z).shape == (n_layers * n_heads, len(attn))
    assert list(hm.x) == [r["step"] for r in attn]
    row = head[0] * n_heads + head[1]
    assert hm.y[row] == f"L{head[0]}H{head[1]} ★"
    np.testing.assert_allclose(np.array(hm.z)[row], [r["to_z_first"][head[0]][head[1]] for r in attn])
    assert any(s.type == "rect" for s in fig.layout.shapes)

    fig, caption = F.attention_lines(attn, head, sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    assert len(fig.data) == n_layers * n_heads
    selected = [t for t in fig.data if "(routing)" in t.name]
    assert len(selected) == 1 and selected[0].line.width > max(t.line.width for t in fig.data if t is not selected[0])


def test_patching_slider(data):
    _, _, analysis, sel = data
    patches = analysis["patch"]
    fig, caption = F.patching_slider(patches, sel["head"])
    check_figure(fig, caption)
    assert len(fig.data) == 1 and fig.data[0].type == "heatmap"
    assert [f.name for f in fig.frames] == [str(r["step"]) for r in patches]
    assert [s.label for s in fig.layout.sliders[0].steps] == [str(r["step"]) for r in patches]
    last = patches[-1]["heads"]
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float),
                               np.array(last["raw"], dtype=float) - last["corrupt_metric"], rtol=1e-6)
    fig_n, _ = F.patching_slider(patches, sel["head"], value="normalised")
    np.testing.assert_allclose(np.array(fig_n.data[0].z, dtype=float), np.array(last["normalised"], dtype=float))
    with pytest.raises(ValueError):
        F.patching_slider(patches, value="other")


def test_routing_patching_lines(data):
    _, _, analysis, sel = data
    (l, h), exact, attribution = sel["head"], analysis["patch"], analysis["attribution"]
    fig, caption = F.routing_patching_lines(exact, attribution, sel["head"], sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    assert len(fig.data) == 3
    attr_tr, exact_tr, gap_tr = fig.data
    assert "attribution" in attr_tr.name and "exact" in exact_tr.name and "gap" in gap_tr.name
    assert list(exact_tr.x) == [r["step"] for r in exact] and list(attr_tr.x) == [r["step"] for r in attribution]
    np.testing.assert_allclose(exact_tr.y, [r["heads"]["raw"][l][h] - r["heads"]["corrupt_metric"] for r in exact])


def test_ablation_lines(data):
    run, _, analysis, sel = data
    abl = analysis["ablation"]
    n_layers, n_heads = np.array(abl[0]["zero"]["candidate_loss"]).shape
    fig, caption = F.ablation_lines(abl, run.log_k, sel["head"], sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    assert len(fig.data) == 1 + 2 * n_layers * n_heads
    assert fig.data[0].name == "no ablation"
    selected = [t for t in fig.data if "(routing)" in t.name]
    assert sorted(t.line.dash for t in selected) == ["dash", "solid"]
    assert all(t.line.color == F.SELECTOR_COLOR for t in selected)
    l, h = sel["head"]
    zero = next(t for t in selected if t.line.dash == "solid")
    np.testing.assert_allclose(zero.y, [r["zero"]["candidate_loss"][l][h] for r in abl])
    assert any(s.y0 == s.y1 and abs(s.y0 - run.log_k) < 1e-9 for s in fig.layout.shapes)


def test_snap_raster(data):
    _, metrics, _, sel = data
    fig, caption = F.snap_raster(metrics, sel["tau"], sel["t_form"])
    check_figure(fig, caption)
    raster, share, mean = fig.data
    n_groups = len(metrics[-1]["group_acc"])
    assert raster.type == "heatmap" and np.array(raster.z).shape == (n_groups, len(metrics))
    assert share.type == mean.type == "scatter"
    np.testing.assert_allclose(mean.y, [np.mean(r["group_acc"]) for r in metrics])


def test_all_figures(data):
    run, metrics, analysis, _ = data
    out = F.all_figures(metrics, analysis, run.progress)
    assert [k for k, *_ in out] == ["loss", "attention_heatmap", "attention_lines", "patching_slider",
                                    "routing_patching", "ablation", "head_shares", "snap"]
    for _, heading, fig, caption in out:
        assert heading
        check_figure(fig, caption)


def test_head_share_lines_on_hand_made_records():
    from plateauscope.analysis.circuit import head_shares

    effects = [[[0.0, 0.0], [0.0, 0.0]], [[1.0, 3.0], [0.0, -2.0]], [[2.0, 6.0], [2.0, 0.0]]]
    recs = [{"step": s, "shares": head_shares(e)} for s, e in zip([0, 50, 100], effects)]
    fig, caption = F.head_share_lines(recs, (0, 1), tau=80, t_form=50)
    check_figure(fig, caption)
    assert len(fig.data) == 4
    sel = next(t for t in fig.data if "(routing)" in t.name)
    assert sel.name.startswith("L0H1") and sel.line.color == F.SELECTOR_COLOR
    np.testing.assert_allclose(sel.y, [0.0, 0.75, 0.6])
    assert "L0H1 holds 60%" in caption and "2 heads together hold 80%" in caption
    assert {40.0, 80.0, 50.0} <= landmark_xs(fig)


# ---- snap statistics: hand-made records ------------------------------------------------------

STEPS = [0, 10, 20, 30, 40, 50]
GROUPS = [  # accuracy per step, one list per group
    [0.0, 0.1, 0.5, 0.9, 1.0, 1.0],  # snaps at 30; last < 0.2 before: 10 -> window 20
    [0.0, 0.0, 0.0, 0.1, 0.8, 1.0],  # exactly 0.8 counts: snaps at 40; last < 0.2 before: 30 -> window 10
    [0.0, 0.9, 1.0, 1.0, 1.0, 1.0],  # snaps at 10; window 10
    [0.0, 0.1, 0.2, 0.3, 0.5, 0.6],  # never snaps (0.2 is not below 0.2 either)
    [0.9, 0.9, 1.0, 1.0, 1.0, 1.0],  # snaps at 0: no earlier step below 0.2, so no window
]


def records(groups=GROUPS, steps=STEPS):
    return [{"step": s, "group_acc": [g[i] for g in groups]} for i, s in enumerate(steps)]


def test_snap_statistics_known_answer():
    s = snap_statistics(records(), tau=40)
    assert s["n_groups"] == 5
    assert s["half_tau_step"] == 20
    assert s["share_above_at_half_tau"] == pytest.approx(2 / 5)  # groups 2 and 4 at step 20
    assert s["snap_steps"] == [30, 40, 10, None, 0]
    assert s["windows"] == [20, 10, 10, None, None]
    assert (s["n_snapped"], s["n_windows"]) == (4, 3)
    assert s["snap_window_steps"] == 10.0
    assert s["snap_window_tau"] == pytest.approx(10 / 40)
    assert s["snap_spread_tau"] == pytest.approx((40 - 0) / 40)


def test_snap_statistics_half_tau_between_evaluations_and_no_tau():
    s = snap_statistics(records(), tau=50)  # tau/2 = 25: the last evaluation at or before it is 20
    assert s["half_tau_step"] == 20 and s["snap_window_tau"] == pytest.approx(10 / 50)
    s = snap_statistics(records(), tau=None)
    assert s["share_above_at_half_tau"] is None and s["snap_window_tau"] is None and s["snap_spread_tau"] is None
    assert s["snap_window_steps"] == 10.0  # still measured in steps


def test_snap_statistics_ignores_records_without_group_accuracy_and_handles_none():
    recs = [{"step": 0, "group_acc": None}] + records() + [{"step": 60}]
    assert snap_statistics(recs, tau=40)["snap_steps"] == [30, 40, 10, None, 0]
    empty = snap_statistics([{"step": 0}], tau=40)
    assert empty["n_groups"] == 0 and empty["n_snapped"] == 0 and empty["share_above_at_half_tau"] is None
    none_snap = snap_statistics(records([[0.0] * 6, [0.1] * 6]), tau=40)
    assert none_snap["n_snapped"] == 0 and none_snap["snap_window_tau"] is None
    assert none_snap["share_above_at_half_tau"] == 0.0


def _heads_record(step: int, clean: float, corrupt: float, effect: float) -> dict:
    """A one-head patching record: the head restores ``effect`` logits."""
    return {"step": step, "heads": {"clean_metric": clean, "corrupt_metric": corrupt, "raw": [[corrupt + effect]],
                                    "normalised": [[None]]}}


def test_no_caption_gives_a_share_of_a_negative_or_negligible_gap():
    # step 0: no gap (0.00), step 10: a negative gap (+9.6 clean, +13.9 corrupted), step 20: a gap of 2 logits
    records = [_heads_record(0, 1.0, 1.0, 0.058), _heads_record(10, 9.6, 13.9, 0.5), _heads_record(20, 3.0, 1.0, 1.5)]
    _, caption = F.routing_patching_lines(records[:2], [], (0, 0))
    assert "%" not in caption.replace("0.1 logits", "") and "no share: the gap is +0.000" in caption, caption
    assert "no share: the gap is -4.300" in caption
    _, caption = F.routing_patching_lines(records[1:], [], (0, 0))
    assert "75% of the clean-corrupt gap at step 20" in caption, caption


def test_a_negative_or_negligible_gap_is_flagged_and_not_normalised_in_the_table():
    import torch

    from plateauscope.analysis.components import PatchResult
    from plateauscope.cli.text.analysis import format_result

    effect = torch.tensor([[0.5, -0.2]])
    for clean, corrupt, flag in ((9.6, 13.9, "negative (-4.30 logits)"), (1.0, 0.98, "0.020 logits, below the 0.1 floor")):
        res = PatchResult("heads", ("layer", "head"), corrupt + effect, (effect) / (clean - corrupt), clean, corrupt)
        text = format_result(res, [], top=2)
        assert f"warning: the clean - corrupt gap is {flag}" in text and "raw effect, logits" in text, text
        assert "normalised (1 = clean" not in text and "  normalised  " not in text
        assert "L0  +0.500  -0.200" in text and "effect (logits)" in text
    res = PatchResult("heads", ("layer", "head"), 1.0 + effect, effect / 2.0, 3.0, 1.0)
    assert "warning" not in format_result(res, [], top=2) and "normalised (1 = clean" in format_result(res, [], top=2)


# ---- no single head: the routing group is drawn and named ------------------------------------


def _no_single_head() -> tuple[list[dict], dict, "object"]:
    """Hand-made records of a 1-layer, 3-head run whose summary names no single head: L0H1 and L0H2 share the
    routing (the argmax head L0H1, with t_form 350; the group's mean attention halfway up at 500)."""
    import math

    from plateauscope.analysis.circuit import head_shares
    from plateauscope.tasks.base import ProgressMeasure

    log_k = math.log(4)
    steps = list(range(0, 801, 100))
    metrics = [{"step": s, "candidate_loss": log_k * (1.0 if s < 550 else 0.2), "delta_z": 0.0 if s < 550 else 2.0,
                "loss": 1.0} for s in steps]
    attention = [{"step": s, "to_z_first": [[0.1, 0.1 + 0.4 * (s >= 300), 0.1 + 0.4 * (s >= 500)]]} for s in steps]

    def patch(s: int, method: str) -> dict:
        raw = [[0.0, 0.5 * (s >= 500), 0.5 * (s >= 500)]]
        return {"step": s, "heads": {"raw": raw, "normalised": raw, "clean_metric": 1.0, "corrupt_metric": 0.0,
                                     "method": method}}

    ablation = [{"step": s, **{kind: {"base": {"candidate_loss": 0.3}, "candidate_loss": [[0.3, 0.8, 0.9]]}
                               for kind in ("zero", "mean")}} for s in (600, 800)]
    circuit = [{"step": s, "shares": head_shares([[0.0, 1.0, 1.0]])} for s in (600, 800)]
    group = {"heads": [[0, 1], [0, 2]], "labels": ["L0H1", "L0H2"], "t_form": 500, "lead_fraction": 0.09,
             "rule": "the heads the margin cannot tell apart"}
    routing = {"head": [0, 1], "label": "L0H1", "tau": 550, "t_form": 350, "lead_fraction": 0.36, "named_head": False,
               "margin": {"heads": ["L0H1", "L0H2"], "difference": 0.01, "interval": [-0.02, 0.04], "level": 0.95},
               "routing_group": group, "top_heads": [{"head": "L0H1", "score": 0.2}, {"head": "L0H2", "score": 0.19}]}
    analysis = {"routing": routing, "attention": attention, "patch": [patch(s, "exact") for s in (600, 800)],
                "attribution": [patch(s, "attribution") for s in steps], "ablation": ablation, "circuit": circuit}
    return metrics, analysis, ProgressMeasure(key="candidate_loss", height=log_k, cue_effect_key="delta_z")


def test_no_single_head_every_figure_draws_and_names_the_routing_group():
    metrics, analysis, progress = _no_single_head()
    out = {key: (heading, fig, caption) for key, heading, fig, caption in F.all_figures(metrics, analysis, progress)}
    assert {"attention_heatmap", "attention_lines", "routing_patching", "ablation", "head_shares"} <= set(out)
    for key, (heading, fig, caption) in out.items():
        words = " ".join([heading, caption, fig.layout.title.text or "", *(t.name or "" for t in fig.data)])
        assert not re.search(r"routing head L\d|\(routing\)", words), key  # never one head of the group
        if key != "patching_slider":  # the group's t_form, not the argmax head's 350
            assert 500.0 in landmark_xs(fig) and 350.0 not in landmark_xs(fig), key
    for key in ("attention_heatmap", "attention_lines", "routing_patching", "ablation"):
        assert "routing group" in out[key][2] and "L0H1" in out[key][2] and "L0H2" in out[key][2], key
    _, heatmap, caption = out["attention_heatmap"]
    assert list(heatmap.data[0].y) == ["L0H0", "L0H1 ★", "L0H2 ★"] and len(heatmap.layout.shapes) >= 2
    assert "t_form = 500" in caption
    red = [t.name for t in out["attention_lines"][1].data if t.line.color == F.SELECTOR_COLOR]
    assert red == ["L0H1 (routing group)", "L0H2 (routing group)"]
    assert "t_form = 500" in out["attention_lines"][2]
    _, patching, caption = out["routing_patching"]
    assert "routing group L0H1 and L0H2" in patching.layout.title.text
    assert {t.name.split()[0] for t in patching.data if "effect" in t.name} == {"L0H1", "L0H2"}
    both = "restores 50% of the clean-corrupt gap at step 600 and 50% of the clean-corrupt gap at step 800"
    assert caption.count(both) == 2  # once for each head of the group
    red = {t.name for t in out["ablation"][1].data if t.line.color == F.SELECTOR_COLOR}
    assert red == {f"{h} {k}-ablated (routing group)" for h in ("L0H1", "L0H2") for k in ("zero", "mean")}
    assert "L0H1 0.800, L0H2 0.900" in out["ablation"][2] and "any other head does alone is 0.300" in out["ablation"][2]
    red = [t.name for t in out["head_shares"][1].data if t.line.color == F.SELECTOR_COLOR]
    assert red == ["L0H1 (routing group)", "L0H2 (routing group)"]


def test_no_named_head_and_no_group_draws_no_routing_and_no_t_form():
    metrics, analysis, progress = _no_single_head()
    analysis = {**analysis, "routing": {**analysis["routing"], "routing_group": None}}
    out = F.all_figures(metrics, analysis, progress)
    assert "routing_patching" not in [k for k, *_ in out]
    for key, heading, fig, caption in out:
        assert 350.0 not in landmark_xs(fig) and 500.0 not in landmark_xs(fig), key
        assert not [t for t in fig.data if getattr(t, "line", None) is not None and t.line.color == F.SELECTOR_COLOR
                    and "ablated" not in (t.name or "")], key
