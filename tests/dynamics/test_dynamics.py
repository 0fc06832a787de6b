"""Dynamics across a sweep: the fits on synthetic runs with known answers, the table and the
report on the session's tiny sweep, and the CLI's one-line errors."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest

from plateauscope.analysis.circuit import VERDICTS
from plateauscope.analysis.formation import RULES
from plateauscope.analysis.results import SWEEP_REPORT_FILE, VARIANTS_CSV_FILE
from plateauscope.cli import dynamics as dynamics_cli
from plateauscope.cli.text.dynamics import seed_lines, variant_table_text
from plateauscope.dynamics.fits import (
    analyze_sweep,
    batch_effect,
    direction_ratios,
    k_dependence,
    lr_effect,
    power_law,
    scaling_law,
    seed_summary,
)
from plateauscope.dynamics.sweep import load_sweep, marginal_stage, tau_key
from plateauscope.dynamics.variants import variant_table
from plateauscope.runs.run import Run
from plateauscope.views.phrases import summary_lines
from plateauscope.views.sweep_figures import sweep_figures


def _row(D=5000, K=10, lr=1e-3, batch_size=128, direction="backward", seed=0, tau=1000, **extra):
    taus = {tau_key(t): (None if tau is None else round(tau * f)) for t, f in ((0.3, 1.2), (0.5, 1.0), (0.7, 0.85))}
    return {"name": f"{direction}_K{K}_D{D}_lr{lr}_bs{batch_size}_s{seed}", "direction": direction, "preset": "ci",
            "D": D, "K": K, "n_b": D // K, "lr": lr, "batch_size": batch_size, "seed": seed, "complete": True,
            "final_step": 6000, "tau": taus[tau_key(0.5)], **taus, "tokens_per_step": batch_size * 4,
            "t_acc50": None if tau is None else round(1.3 * tau), "snap_groups": 50, "snap_share_at_half_tau": 0.0,
            "snap_window_tau": 0.4, "snap_spread_tau": 0.3, **extra}


def test_fit_recovers_a_known_exponent_from_noisy_runs():
    rng = np.random.default_rng(1)
    alpha = 1.3
    rows = [_row(D=D, seed=s, tau=2e-2 * D**alpha * np.exp(rng.normal(0, 0.1)))
            for D in (1000, 2000, 4000, 8000, 16000) for s in range(5)]
    # Runs at another K (a K grid) must not leak into the D fit: it takes the largest family.
    rows += [_row(D=5000, K=K, seed=s, tau=3000) for K in (3, 36) for s in range(2)]
    fit = scaling_law(rows)
    assert fit["n_runs"] == 25 and fit["values"] == [1000, 2000, 4000, 8000, 16000] and fit["family"]["K"] == 10
    assert abs(fit["slope"] - alpha) < 0.08
    lo, hi = fit["ci"]
    assert lo < alpha < hi and hi - lo < 0.3
    # Threshold sensitivity: taus scaled by a constant change c, not the exponent.
    assert abs(scaling_law(rows, threshold=0.3)["slope"] - fit["slope"]) < 0.01
    # Two runs: a slope, but no interval (a least-squares t interval needs 3).
    assert power_law([_row(D=D, tau=D) for D in (100, 200)], "D", "tau")["ci"] is None
    assert fit["ci"].label == "95% least-squares t interval (n = 25)"
    assert power_law([_row(D=100, tau=5)], "D", "tau") is None


def test_k_independence_noise_factors_and_direction():
    rng = np.random.default_rng(2)
    k_rows = [_row(D=5040, K=K, seed=s, tau=1000 * np.exp(rng.normal(0, 0.05))) for K in (3, 10, 36) for s in range(3)]
    k = k_dependence(k_rows)
    assert abs(k["slope"]) < 0.1 and k["ci"].low < 0 < k["ci"].high
    # Batch: tau in tokens falls with batch size (smallest batch 1.8x the largest).
    b_rows = [_row(D=3000, batch_size=b, tau=t) for b, t in ((32, 3600), (64, 1400), (128, 600), (256, 280))]
    b = batch_effect(b_rows)
    assert b["reference"] == 256 and b["trend"] == "falling"
    assert b["values"][0]["ratio"] == pytest.approx(3600 * 32 / (280 * 256), rel=1e-3)
    # Learning rate: tau rises monotonically, the largest 3x the smallest.
    lr_rows = [_row(D=3000, lr=lr, tau=t, seed=s) for lr, t in ((3e-4, 500), (1e-3, 700), (3e-3, 1500)) for s in (0, 1)]
    lr = lr_effect(lr_rows)
    assert lr["trend"] == "rising" and lr["max_ratio"] == pytest.approx(3.0) and lr["values"][0]["n"] == 2
    # Direction: matched D, forward 2x slower; a forward run that never got there is a lower bound.
    d_rows = [_row(D=2000, tau=500), _row(D=2000, direction="forward", tau=1000),
              _row(D=3000, tau=800), _row(D=3000, direction="forward", tau=None, final_step=6000)]
    ratios = direction_ratios(d_rows)
    assert [(d["D"], d["ratio"], d["censored"]) for d in ratios] == [(2000, 2.0, False), (3000, 7.5, True)]
    result = analyze_sweep(k_rows + b_rows + lr_rows + d_rows)
    assert result["main"]["snap"]["groups_above_at_half_tau"] == 0
    text = "\n".join(f"{a}: {b}" for a, b in summary_lines(result))
    assert "paper 1.19" in text and "D=3000: >=" in text and "tau@0.3" in text


def test_seed_summary_medians_intervals_heads_and_verdicts():
    leads = {"attention": [0.5, 0.4, 0.6, 0.55, 0.45], "patch_share": [0.3, 0.3, 0.3, 0.3, 0.3],
             "cue_effect": [0.8, None, 0.7, 0.9, 0.6]}
    heads = ["L0H1", "L0H2", "L2H0", "L0H1", "L0H3"]
    rows = [_row(seed=i, routing_head=heads[i], routing_layer=int(heads[i][1]), circuit="distributed",
                 circuit_heads="L0H1 L0H2", **{f"lead_{r}": leads[r][i] for r in RULES}) for i in range(5)]
    rows.append(_row(seed=9))  # not analysed: left out
    s = seed_summary(rows)
    assert s["runs"] == 5 and s["layer0"] == 4
    assert s["lead"]["attention"]["median"] == pytest.approx(0.5) and s["lead"]["cue_effect"]["n"] == 4
    assert s["lead"]["cue_effect"]["median"] == pytest.approx(0.75)  # mean of the middle two of 0.6 0.7 0.8 0.9
    assert tuple(s["lead"]["patch_share"]["ci"]) == pytest.approx((0.3, 0.3))  # no spread, no interval width
    # Five runs: the order-statistic interval of the median is the range, with coverage 1 - 2 / 2^5.
    ci = s["lead"]["attention"]["ci"]
    assert (ci.low, ci.high, ci.coverage) == pytest.approx((0.4, 0.6, 0.9375))
    assert s["lead"]["cue_effect"]["ci"].coverage == pytest.approx(0.875)  # 4 runs with a lead by the cue effect
    assert seed_summary([_row()]) is None
    text = "\n".join(seed_lines(s))
    assert "routing head in layer 0: 4 of 5" in text and "head L2H0, circuit distributed (L0H1 L0H2)" in text


def test_analyze_every_run_then_the_seed_summary(tiny_sweep, tmp_path, capsys):
    sweep_dir = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    assert dynamics_cli.main(["--sweep", str(sweep_dir), "--analyze", "--every", "10", "--n-exact", "3"]) == 0
    out = capsys.readouterr().out
    assert "over 6 analysed runs" in out and "routing head in layer 0: 6 of 6" in out  # a 1-layer model
    for r in load_sweep(sweep_dir).rows:
        assert r["routing_head"] and r["circuit"] in VERDICTS


def test_table_fits_and_report_on_a_tiny_sweep(tiny_sweep, tmp_path, capsys):
    tiny_sweep = shutil.copytree(tiny_sweep, tmp_path / "sweep")  # the report is written into the sweep
    sweep = load_sweep(tiny_sweep)
    assert len(sweep.rows) == 6 and len(sweep.curves) == 6
    for r in sweep.rows:  # the table's tau is the run's own summary tau
        run = Run(tiny_sweep / r["name"])
        assert r["tau"] == run.summary["tau"] and r["tau_tokens"] == r["tau"] * 32 * 4  # batch 32, 4 target characters
        assert r[tau_key(0.3)] >= r["tau"] >= r[tau_key(0.7)]
    fit = analyze_sweep(sweep.rows)["main"]["scaling"]
    assert fit["values"] == [80, 160, 320] and fit["slope"] > 0.5 and fit["ci"] is not None
    csv_path = tmp_path / "t.csv"
    assert dynamics_cli.main(["--sweep", str(tiny_sweep), "--csv", str(csv_path), "--report"]) == 0
    printed = capsys.readouterr().out
    assert "scaling law alpha" in printed and "D160_seed1" in printed
    with open(csv_path) as f:
        assert len(list(csv.DictReader(f))) == 6
    page = (tiny_sweep / SWEEP_REPORT_FILE).read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "Scaling law" in page
    # Self-contained: plotly.js inlined once, nothing loaded from elsewhere; one div per figure.
    assert page.count("* plotly.js v") == 1 and "<script src=" not in page
    assert page.count('<div id="fig-') == len(sweep_figures(sweep, analyze_sweep(sweep.rows)))


def test_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for argv, message in [(["--sweep", str(tmp_path / "missing")], "no such sweep directory"),
                          (["--sweep", str(tmp_path / "empty")], "no runs with metrics")]:
        assert dynamics_cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_marginal_stage_and_variant_table_known_answers():
    lk = float(np.log(10))
    # set loss below 0.1 log K from step 200 to 500 with the candidate loss at log K; tau = 1000.
    recs = [{"step": s, "set_loss": 0.01 if 200 <= s <= 500 else 5.0, "candidate_loss": lk if s < 800 else 0.3 * lk}
            for s in range(0, 1100, 100)]
    assert marginal_stage(recs, lk, 1000) == pytest.approx(0.3)
    assert marginal_stage(recs, lk, None) is None
    rows = [_row(seed=s, tau=t, model="2L d64", variant="a_len=1", verdict=v, t_marginal=tm,
                 t_marginal_over_tau=tm / t, plateau_share=0.4, first_token_set_loss_plateau=f,
                 set_loss_plateau=0.1, marginal_stage_tau=ms)
            for s, t, v, tm, f, ms in [(0, 1000, "marginal", 200, 0.1, 0.35), (1, 1200, "marginal", 300, 0.3, 0.3),
                                       (2, 800, "mixed", 400, 0.2, 0.1)]]
    rows.append(_row(seed=0, tau=500, model="2L d64", variant="default", verdict="shelf", t_marginal=None,
                     t_marginal_over_tau=None, plateau_share=0.3, first_token_set_loss_plateau=1.3,
                     set_loss_plateau=11.9, marginal_stage_tau=0.0))
    table = {r["variant"]: r for r in variant_table(rows)}
    a = table["a_len=1"]
    assert a["seeds"] == 3 and a["verdict"] == "marginal/mixed (3)"
    assert a["tau"] == pytest.approx(1000) and (a["tau_lo"], a["tau_hi"]) == (800, 1200)
    assert a["first_token_set_loss_plateau"] == pytest.approx(0.2)
    assert a["t_marginal_over_tau"] == pytest.approx((0.2 + 0.25 + 0.5) / 3)
    assert not a["true_marginal"]  # seed 2's marginal stage is only 0.1 tau
    d = table["default"]
    assert d["verdict"] == "shelf (1)" and d["t_marginal"] is None and d["never_marginal"] == 1
    text = variant_table_text(list(table.values()))
    assert "marginal/mixed (3)" in text and "1000 [800, 1200]" in text


def test_variant_table_on_a_tiny_variant_sweep(tmp_path, capsys):
    from plateauscope.sweeps.executors import run_sweep
    from plateauscope.sweeps.spec import SweepSpec

    spec = SweepSpec("tiny-variants", "tiny", ({"a_len": (4,), "seed": (0, 1)},
                                               {"a_len": (1,), "target_uniqueness": ("group",), "order": ("zb",),
                                                "seed": (0, 1)},
                                               {"no_z": (True,), "seed": (0,)}),
                     fixed={"max_steps": 40})
    outcomes = run_sweep(spec, tmp_path / "s", executor="serial", threads=1, progress=False)
    assert all(o["status"] == "done" for o in outcomes), outcomes
    sweep = load_sweep(tmp_path / "s")
    table = {r["variant"]: r for r in variant_table(sweep.rows)}
    assert set(table) == {"default", "a_len=1,target_uniqueness=group,order=zb", "no_z=True"}
    for name, row in table.items():
        runs = [Run(tmp_path / "s" / r["name"]) for r in sweep.rows if r["variant"] == name]
        verdicts = sorted((run.summary["plateau"]["verdict"] or "none") for run in runs)
        assert row["verdict"] == "/".join(sorted(set(verdicts))) + f" ({len(runs)})"
    assert dynamics_cli.main(["--sweep", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "plateau kind per task variant" in out and (tmp_path / "s" / VARIANTS_CSV_FILE).exists()
