"""The analysis over the series: selector rule, t_form / lead arithmetic, the cache, the CLI."""

import json

import pytest

from interp import selector as sel
from interp.analyze import (ABLATION_FILE, ANALYSIS_DIR, ATTENTION_FILE, PATCH_FILE, analyze_run, exact_steps,
                            load_analysis, main, pick_steps)
from training.metrics import compute_tau
from training.run import Run, RunError


def test_pick_selector_head_rule():
    attn = [[0.9, 0.1], [0.2, 0.6]]
    effect = [[-0.5, 0.9], [0.1, 0.8]]  # L0H0 looks at z but its patch hurts: not the selector
    (layer, head), scores = sel.pick_selector_head(attn, effect)
    assert (layer, head) == (1, 1)
    assert scores[0][0] == 0.0 and scores[1][1] == pytest.approx(0.48)
    # NaN effects (a plateau checkpoint) fall back to attention alone
    assert sel.pick_selector_head(attn, [[None, None], [None, None]])[0] == (0, 0)


def test_formation_step_and_lead_fraction_by_hand():
    steps = [0, 10, 20, 30, 40, 50]
    values = [0.1, 0.1, 0.2, 0.35, 0.5, 0.5]  # halfway from 0.1 to 0.5 is 0.3: first reached at 30
    form = sel.formation_step(steps, values, start_step=0)
    assert form["t_form"] == 30 and form["t_form_bracket"] == [20, 30]
    lead = sel.lead_fraction(tau=60, tau_lo=50, t_form=30, t_lo=20)
    assert lead["lead_fraction"] == pytest.approx(0.5)
    assert lead["lead_bracket"] == pytest.approx([(50 - 30) / 50, (60 - 20) / 60])
    assert sel.formation_step(steps, values[::-1])["t_form"] is None  # never rises
    assert sel.lead_fraction(None, None, 30, 20)["lead_fraction"] is None


def test_step_choice():
    assert pick_steps([0, 5, 10, 15, 20, 25], every=2) == [0, 10, 20, 25]
    with pytest.raises(RunError, match="no checkpoint at step"):
        pick_steps([0, 5], steps=[3])
    chosen = exact_steps(list(range(0, 1000, 10)), 4, landmarks=[505])
    assert 0 in chosen and 990 in chosen and 500 in chosen or 510 in chosen


@pytest.fixture(scope="module")
def analysed(ci_run):
    return analyze_run(ci_run, every=10, n_exact=5, n_examples=128, ablation_groups=4, progress=False)


def test_series_end_to_end_on_the_ci_run(ci_run, analysed):
    run = Run(ci_run)
    tau = compute_tau(run.metrics(), run.log_k)
    assert analysed["tau"] == tau is not None
    assert analysed["t_form"] is not None and 0 <= analysed["t_form"] <= run.steps()[-1]
    lo, hi = analysed["lead_bracket"]
    assert lo <= analysed["lead_fraction"] <= hi
    assert analysed["lead_fraction"] == pytest.approx((tau - analysed["t_form"]) / tau)
    layer, head = analysed["head"]
    cache = load_analysis(ci_run)
    series = {r["step"]: r["to_z_first"][layer][head] for r in cache["attention"]}
    assert series[analysed["t_form"]] >= analysed["start_value"] + 0.5 * (analysed["final_value"] - analysed["start_value"])
    assert analysed["agreement"] and all(a["max_abs_err"] >= 0 for a in analysed["agreement"])
    # After the drop, the selector head matters: zero-ablating it costs candidate loss.
    end = analysed["ablation"]["end"]
    assert end["zero_candidate_loss"] > end["base_candidate_loss"]


def test_cache_is_reused_and_extended(ci_run, analysed):
    folder = ci_run / ANALYSIS_DIR
    before = {f: (folder / f).read_text() for f in (ATTENTION_FILE, PATCH_FILE, ABLATION_FILE)}
    again = analyze_run(ci_run, every=10, n_exact=5, n_examples=128, ablation_groups=4, progress=False)
    assert {f: (folder / f).read_text() for f in before} == before  # nothing recomputed
    assert again["head"] == analysed["head"] and again["t_form"] == analysed["t_form"]
    extra = Run(ci_run).steps()[1]
    analyze_run(ci_run, steps=[extra], n_exact=0, n_examples=128, progress=False)
    steps = [json.loads(line)["step"] for line in (folder / ATTENTION_FILE).read_text().splitlines()]
    assert steps.count(extra) == 1 and (folder / ATTENTION_FILE).read_text().startswith(before[ATTENTION_FILE])


def test_analyze_cli_errors(tmp_path, capsys, ci_run):
    assert main(["--run", str(tmp_path / "nope"), "--no-progress"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["--run", str(ci_run), "--steps", "7777", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint at step(s) 7777" in err and len(err.splitlines()) == 1
    assert main(["--run", str(ci_run), "--every", "0"]) == 2
