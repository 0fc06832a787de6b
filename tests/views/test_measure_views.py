"""The measures in the report (a row per series, with its change point) and in the time view (per-head
measures as heatmaps, every series scaled to its range), from hand-made records with known values."""

from __future__ import annotations

import pytest

from plateauscope.views.figures import heldout_curves
from plateauscope.views.report import measure_rows
from plateauscope.views.time_data import head_measures, measure_curves
from plateauscope.views.time_view import render_time_view, validate_view_data
from tests.views.test_time_view_browser import synthetic_view_data

RECORDS = [{"step": s, "per": {"weight_norm": "model", "dist": "head"},
            "values": {"weight_norm": 10.0 - s / 100, "dist": [[0.5, 1.0 - s / 400], [0.2, 0.2]]}}
           for s in (0, 100, 200, 300, 400)]


def test_the_time_view_scales_each_measure_to_its_range():
    curves = measure_curves(RECORDS)
    assert curves["steps"] == [0, 100, 200, 300, 400]
    by_name = {s["name"]: s["values"] for s in curves["series"]}
    assert by_name["weight norm (6 to 10)"] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    # the per-head measure as its mean over heads: (0.5 + 1 - s/400 + 0.4) / 4, from 0.475 to 0.225
    assert by_name["dist:mean (0.225 to 0.475)"] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert head_measures(RECORDS) == ["dist"] and measure_curves([]) is None


def test_the_view_accepts_measures_and_refuses_a_malformed_series():
    data = synthetic_view_data(n_steps=5)
    validate_view_data({**data, "measures": measure_curves(RECORDS)})
    page = render_time_view({**data, "measures": measure_curves(RECORDS)})
    assert '<svg id="measures">' in page and '<svg id="measures">' not in render_time_view(data)
    with pytest.raises(ValueError):
        validate_view_data({**data, "measures": {"steps": [0, 1], "series": [{"name": "x", "values": [1.0]}]}})


def test_the_report_rows_give_each_series_and_its_change_point():
    moved = {"signals": {"measure:weight_norm": {"step": 100, "fraction_of_tau": 0.25, "direction": "fall"},
                         "measure:dist:top": {"step": None, "fraction_of_tau": None}}}
    rows = dict(measure_rows(RECORDS, moved))
    assert rows["weight_norm"] == "10 at step 0 -> 6 at step 400; changes at step 100 (0.25 tau, fall)"
    assert rows["dist:top (L0H1)"].endswith("no change point")
    assert "changes" not in dict(measure_rows(RECORDS, None))["weight_norm"]


def test_training_and_held_out_curves_appear_under_their_own_names_only_with_a_held_out_field():
    records = [{"step": s, "loss": 1.0 / (s + 1), "heldout_loss": 2.0 + s, "accuracy": 0.5} for s in (0, 10, 20)]
    fig, caption = heldout_curves(records, tau=10)
    assert [t.name for t in fig.data] == ["training loss", "held-out loss"]
    assert list(fig.data[1].y) == [2.0, 12.0, 22.0] and "held-out split (dashed)" in caption
    assert heldout_curves([{"step": 0, "loss": 1.0}]) is None
