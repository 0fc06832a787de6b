"""The three t_form rules on synthetic series whose answers are known by construction."""

import math

import numpy as np
import pytest

from plateauscope.analysis import formation as sel

LOG_K = math.log(10)
STEPS = list(range(0, 1000, 25))  # 40 evaluations


def test_halfway_rules_on_a_ramp():
    # 0.2 until step 300, then a linear ramp to 0.8 at step 600, flat after: halfway (0.5) at 450.
    values = [0.2 if s <= 300 else 0.8 if s >= 600 else 0.2 + 0.6 * (s - 300) / 300 for s in STEPS]
    out = sel.t_form_rules(tau=900, tau_lo=875, plateau_start=0, height=LOG_K, attention=(STEPS, values),
                           share=(STEPS[::2], values[::2]), cue_effect=(STEPS, [0.0] * len(STEPS)))
    att, share = out["rules"]["attention"], out["rules"]["patch_share"]
    assert att["t_form"] == 450 and att["t_form_bracket"] == [425, 450]
    assert share["t_form"] == 450 and share["t_form_bracket"] == [400, 450]  # every other step: coarser bracket
    assert att["lead_fraction"] == pytest.approx((900 - 450) / 900)
    assert out["rules"]["cue_effect"]["t_form"] is None  # a flat cue effect never leaves its noise
    assert out["smoothing"] == {"window": 1, "kind": "centred moving mean"}
    # Missing shares (no positive effect yet) count as 0: halfway from 0 to 0.8 is 0.4, reached at 400.
    assert sel.t_form_rules(900, 875, 0, LOG_K, (STEPS, values), (STEPS, [None] * 12 + values[12:]),
                            (STEPS, [0.0] * 40))["rules"]["patch_share"]["t_form"] == 400


def test_delta_z_threshold_from_the_baseline_noise():
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 0.01, len(STEPS))
    dz = [float(n) + (0.0 if s < 500 else 0.5) for s, n in zip(STEPS, noise)]  # a jump of 50 sigma at 500
    res = sel.noise_threshold_step(STEPS, dz, start_step=100, height=LOG_K)
    base = np.asarray(dz[4:9])  # the 5 evaluations from step 100
    assert res["baseline_steps"] == [100, 200]
    assert res["threshold"] == pytest.approx(max(base.mean() + 3 * base.std(ddof=1), sel.NOISE_FLOOR * LOG_K))
    assert res["t_form"] == 500 and res["t_form_bracket"] == [475, 500]
    # A rise smaller than the floor (2% of log K) is not counted, however quiet the baseline.
    flat = [0.0 if s < 500 else 0.01 for s in STEPS]
    assert sel.noise_threshold_step(STEPS, flat, 0, LOG_K)["t_form"] is None
    # Too short a series for a baseline: no answer rather than a guess.
    assert sel.noise_threshold_step(STEPS[:5], dz[:5], 0, LOG_K)["t_form"] is None


def test_smoothing_is_a_centred_mean_and_moves_a_spike():
    assert sel.smooth_series([0.0, 3.0, 0.0, 0.0], 3) == pytest.approx([1.5, 1.0, 1.0, 0.0])
    assert sel.smooth_series([1.0, None, 3.0], 3) == pytest.approx([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 1"):
        sel.smooth_series([1.0], 0)
    # A one-point spike on the plateau crosses the halfway line unsmoothed, not with a 5-point window.
    values = [0.0] * 10 + [0.9] + [0.0] * 19 + [1.0] * 10
    raw = sel.t_form_rules(None, None, 0, LOG_K, (STEPS, values), (STEPS, values), (STEPS, [0.0] * 40))
    smooth = sel.t_form_rules(None, None, 0, LOG_K, (STEPS, values), (STEPS, values), (STEPS, [0.0] * 40), smooth=5)
    assert raw["rules"]["attention"]["t_form"] == STEPS[10]
    # Smoothed, the spike is 0.9 / 5 < 0.5; at index 30 the window holds three of the final 1s: 0.6.
    assert smooth["rules"]["attention"]["t_form"] == STEPS[30]
    assert smooth["smoothing"]["window"] == 5 and raw["rules"]["attention"]["lead_fraction"] is None


def test_shares_of_a_vanishing_effect_count_as_zero():
    # On the plateau the summed effect is ~0 and the head "holds" 90% of it: noise, counted as 0.
    shares = [0.9, 0.8, 0.2, 0.5, 0.6, 0.6]
    totals = [0.01, 0.02, 0.5, 4.0, 9.0, 10.0]  # 5% of the final 10 is 0.5
    assert sel.gated_shares(shares, totals) == [0.0, 0.0, 0.2, 0.5, 0.6, 0.6]
    steps = [0, 10, 20, 30, 40, 50]
    form = sel.formation_step(steps, sel.gated_shares(shares, totals))
    assert form["t_form"] == 30  # halfway from 0 to 0.6; ungated, the share never rises
    assert sel.formation_step(steps, shares)["t_form"] is None


def test_chance_is_the_cues_share_of_the_keys_and_a_head_at_chance_is_no_routing_head(tiny_run, tmp_path):
    """The tiny selector prompt is <BOS>, B (6 characters), <SEP>, z (2), <SEP>: the prediction position 10
    sees 11 keys, 2 of them the cue, so uniform attention puts 2/11 on it."""
    import json
    import shutil

    from plateauscope.analysis.analyze import analyze_run
    from plateauscope.analysis.attention import chance_attention
    from plateauscope.cli.text.analysis import format_summary
    from plateauscope.runs.run import Run

    task = Run(tiny_run).task()
    assert task.pred_pos == 10 and chance_attention(task) == pytest.approx(2 / 11)
    path = shutil.copytree(tiny_run, tmp_path / "tiny")
    summary = analyze_run(path, n_exact=1, progress=False, edges=False)
    assert summary["chance"] == pytest.approx(2 / 11)
    assert summary["above_chance"] == (summary["final_value"] > 2 / 11)
    # The associative-recall case: the best head ends at 0.07 against a chance of 0.12.
    below = {**json.loads(json.dumps(summary)), "final_value": 0.07, "chance": 0.12, "above_chance": False}
    first = format_summary(below).splitlines()[0]
    assert first.startswith("routing head    none: the best head") and "not above chance (0.120" in first
    expected = ("routing head    none" if not summary["above_chance"] else f"routing head    {summary['label']}"
                if summary["named_head"] else "routing head    no single head")
    assert format_summary(summary).splitlines()[0].startswith(expected)
