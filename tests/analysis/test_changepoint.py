"""The one change-point rule (plateauscope.analysis.changepoint), which signal moved first in a run and over
seeds (plateauscope.dynamics.moved_first), its figures and its command: known answers.

The rule's accuracy is measured on simulated series with a known truth: 100 checkpoints, the band read
from the first 20 (the plateau's first half), a change of size 1 that starts at a random checkpoint in
40..70, rising in half of the series and falling in the other half, with Gaussian noise of sd 0.02,
0.05, 0.1 and 0.2 (the change is 50 to 5 noise sd), 200 series per case. With the defaults
(3 robust sd, 4 consecutive checkpoints, no smoothing), measured:

* a step: found exactly at its checkpoint in 99% of the series up to noise 0.1 (never more than one
  checkpoint off; the 1% is one checkpoint early, a noise point just before the step), in 81% at noise
  0.2 (90% within 3 checkpoints; 1% never read);
* a ramp or a sigmoid (20 checkpoints long): the rule reads where the noise-free curve crosses the
  band (3 noise sd), not where it starts: the error against that crossing has median |error| <= 1
  checkpoint up to noise 0.05 and <= 3 at 0.2 (90% within 4 at noise 0.1, within 8 at 0.2); the lag
  behind the start itself is the shape's, 3 noise sd over the slope;
* the direction is right in every series that is read; at noise 0.2, 1.5% of the gradual changes
  are never read (they end within the noise);
* false alarms on pure noise (no change; 80 checkpoints searched): 0 of 200 series with a baseline of
  20 checkpoints, 2% with 10, 9.5% with 5 (the MAD of few values is unsure; ``min_baseline`` is 5);
  with correlated noise (AR(1), coefficient 0.5) 4% with 20: a slow wander beyond the band counts as
  a move, as it is one.

The tests assert these with a margin.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from plateauscope.analysis import changepoint as CP
from plateauscope.analysis.results import MOVED_FIRST_FILE, analysis_dir, strict_json
from plateauscope.cli import moved_first as cli
from plateauscope.cli.text.analysis import moved_first_text
from plateauscope.cli.text.dynamics import over_seeds_text
from plateauscope.dynamics import moved_first as MF
from plateauscope.runs.run import Run
from plateauscope.views.timeline_figures import run_timeline, seeds_timeline
from tests.conftest import copy_run

N, BASE, WIDTH = 100, 20, 20
"""Checkpoints per simulated series, of them in the baseline window, and the length of a gradual change."""
RULE = CP.ChangePointRule()


def shape(kind: str, t: np.ndarray, t0: int) -> np.ndarray:
    """A change of size 1 starting at checkpoint ``t0`` (``none``: no change)."""
    if kind == "step":
        return (t >= t0).astype(float)
    if kind == "ramp":
        return np.clip((t - t0) / WIDTH, 0.0, 1.0)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-(t - (t0 + WIDTH / 2)) / (WIDTH / 8)))
    return np.zeros(len(t))


def simulate(kind: str, sigma: float, n_base: int = BASE, n: int = 200, seed: int = 0, ar: float = 0.0) -> dict:
    """The rule on ``n`` simulated series: per series the error (checkpoints) against the truth (a step:
    its checkpoint; a gradual change: where the noise-free curve first crosses n_sd noise sd), and counts."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    out = {"errors": [], "early": 0, "unread": 0, "wrong_way": 0, "alarms": 0}
    for i in range(n):
        t0, sign = int(rng.integers(40, 71)), (1 if i % 2 == 0 else -1)
        clean = sign * shape(kind, t, t0)
        noise = rng.standard_normal(N)
        for j in range(1, N):  # AR(1) with unit variance (ar = 0: independent)
            noise[j] = ar * noise[j - 1] + np.sqrt(1 - ar * ar) * noise[j]
        found = CP.change_point(10 * t, clean + sigma * noise, (0, 10 * (n_base - 1)), 0, RULE)
        if kind == "none":
            out["alarms"] += found is not None
            continue
        if found is None:
            out["unread"] += 1
            continue
        if (found.direction == "rise") != (sign > 0):
            out["wrong_way"] += 1
            continue
        truth = t0 if kind == "step" else int(np.argmax(np.abs(clean) > RULE.n_sd * sigma))
        out["errors"].append(found.step // 10 - truth)
        out["early"] += found.step // 10 < t0
    out["abs"] = np.abs(out["errors"])
    return out


@pytest.mark.parametrize("sigma", [0.02, 0.05, 0.1])
def test_a_step_is_found_at_its_checkpoint(sigma):
    s = simulate("step", sigma)
    assert s["unread"] == 0 and s["wrong_way"] == 0
    assert np.mean(s["abs"] == 0) >= 0.97 and s["abs"].max() <= 1
    assert s["early"] <= 4  # 2% at most: a noise point just before the step


def test_a_step_within_5_noise_sd_is_found_at_it_or_just_after():
    s = simulate("step", 0.2)
    assert s["unread"] + s["wrong_way"] <= 4
    assert np.mean(s["abs"] == 0) >= 0.75 and np.percentile(s["abs"], 90) <= 4


@pytest.mark.parametrize("kind", ["ramp", "sigmoid"])
@pytest.mark.parametrize("sigma, median_tol, p90_tol", [(0.02, 1, 2), (0.05, 1, 3), (0.1, 2, 5), (0.2, 3, 9)])
def test_a_gradual_change_is_found_where_it_leaves_the_noise(kind, sigma, median_tol, p90_tol):
    s = simulate(kind, sigma)
    assert s["wrong_way"] == 0 and s["unread"] <= (0 if sigma < 0.2 else 6)
    assert np.median(s["abs"]) <= median_tol and np.percentile(s["abs"], 90) <= p90_tol
    assert s["early"] == 0  # never before the change starts


@pytest.mark.parametrize("n_base, most", [(40, 0), (20, 2), (10, 8), (5, 30)])
def test_false_alarms_on_pure_noise_are_rare(n_base, most):
    """0 of 200 with 40 or 20 baseline checkpoints (<= 1% allowed), 2% with 10 (<= 4%), 9.5% with 5 (<= 15%)."""
    assert simulate("none", 0.1, n_base)["alarms"] <= most


def test_false_alarms_with_correlated_noise_are_stated():
    """AR(1) noise with coefficient 0.5 wanders: 4% of pure-noise series leave a 20-checkpoint band."""
    assert simulate("none", 0.1, ar=0.5)["alarms"] <= 16


def test_a_change_inside_the_baseline_window_is_still_found():
    """The median and MAD shrug off a quarter of moved values: a step at checkpoint 15 of a 20-checkpoint window."""
    rng = np.random.default_rng(1)
    t = np.arange(N)
    for sign in (1, -1):
        y = sign * (t >= 15) + 0.05 * rng.standard_normal(N)
        found = CP.change_point(t, y, (0, 19), 0, RULE)
        assert found.step == 15 and found.direction == ("rise" if sign > 0 else "fall")


def test_the_rule_is_scale_and_shift_free():
    rng = np.random.default_rng(2)
    t = np.arange(N)
    y = 0.1 * rng.standard_normal(N) - np.clip((t - 50) / 10, 0, 1)
    a = CP.change_point(t, y, (0, 19), rule=RULE)
    b = CP.change_point(t, 1000 * y + 7, (0, 19), rule=RULE)
    assert a.step == b.step and a.direction == b.direction == "fall"
    assert b.center == pytest.approx(1000 * a.center + 7) and b.half_width == pytest.approx(1000 * a.half_width)


def test_a_flat_series_has_no_change_and_a_clean_step_is_exact():
    steps = list(range(0, 1000, 10))
    assert CP.change_point(steps, [2.5] * len(steps), (0, 300)) is None
    step = [2.5 if s < 600 else 2.4 for s in steps]  # no noise at all: the floor keeps the band from zero width
    found = CP.change_point(steps, step, (0, 300))
    assert (found.step, found.bracket, found.direction, found.robust_sd) == (600, (590, 600), "fall", 0.0)
    assert found.half_width == pytest.approx(RULE.floor * 0.1) and found.band[0] < 2.5 < found.band[1]
    # k consecutive: a single spike, or k - 1 points beyond the band, is no change
    spiked = [v + (1.0 if 400 <= s < 400 + 10 * (RULE.k - 1) else 0.0) for s, v in zip(steps, [2.5] * len(steps))]
    assert CP.change_point(steps, spiked, (0, 300)) is None
    # missing values are left out; a direction asked for ignores the other way
    assert CP.change_point(steps, [None if s == 610 else v for s, v in zip(steps, step)], (0, 300)).step == 600
    assert CP.change_point(steps, step, (0, 300), rule=CP.ChangePointRule(direction="rise")) is None


@pytest.mark.parametrize("args, message", [
    (([0, 10, 20], [1.0, 2.0], (0, 10)), "one value per step"),
    (([0, 20, 10], [1.0, 2.0, 3.0], (0, 10)), "strictly increasing"),
    (([0, 10, 20], [1.0, 2.0, 3.0], (20, 0)), "ends before it starts"),
    ((list(range(10)), [1.0] * 10, (0, 3)), "at least 5"),
])
def test_bad_input_is_one_line(args, message):
    with pytest.raises(ValueError, match=message) as e:
        CP.change_point(*args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("rule, message", [
    (CP.ChangePointRule(n_sd=0.0), "n_sd"), (CP.ChangePointRule(k=0), "k must be"),
    (CP.ChangePointRule(smooth=0), "smooth"), (CP.ChangePointRule(floor=1.5), "floor"),
    (CP.ChangePointRule(min_baseline=1), "min_baseline"), (CP.ChangePointRule(direction="up"), "direction"),
])
def test_bad_rules_are_one_line(rule, message):
    with pytest.raises(ValueError, match=message):
        rule.validate()


# ---- a fake run with known change points ----------------------------------------------------

PLANTED = {"llc": 650, "delta_z": 700, "kl_conditional": 800, "loss": 900, "candidate_loss": 1000,
           "head_llc:sum": 1300, "head_llc:top": 1300}
"""The steps the signals of :func:`fake_run` change at (kl_uniform never does)."""
TAU, SPAN = 1200, [100, 1100]


def fake_run(tiny_run, path, seed: int = 0, tau: int | None = TAU):
    """A copy of the tiny run (its config and data set) with planted metrics, summary, llc.json and
    head_llc.json: every signal a step change of size >= 1 at its :data:`PLANTED` step, noise sd 0.01."""
    run = copy_run(tiny_run, path)
    rng = np.random.default_rng(seed)
    noise = lambda: 0.01 * rng.standard_normal()  # noqa: E731
    records = [{"step": s, "loss": 3.6 - (s >= 900) + noise(), "candidate_loss": 2.3 - 1.5 * (s >= 1000) + noise(),
                "delta_z": 1.0 * (s >= 700) + noise(), "kl_conditional": 3.0 - (s >= 800) + noise(),
                "kl_uniform": 0.5 + noise()} for s in range(0, 2001, 20)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"tau": tau, "plateau_span": SPAN if tau else None}))
    analysis_dir(run).mkdir(exist_ok=True)
    llc_steps = list(range(0, 2001, 50))
    (analysis_dir(run) / "llc.json").write_text(json.dumps(
        {"steps": llc_steps, "llc": [10 + 5 * (s >= 650) + noise() for s in llc_steps], "llc_half_change_step": 1100}))
    head_steps = list(range(0, 2001, 100))
    (analysis_dir(run) / "head_llc.json").write_text(json.dumps(
        {"steps": head_steps, "heads": ["L0H0", "L0H1"],
         "llc": [[2 + noise(), 3 + 4 * (s >= 1300) + noise()] for s in head_steps]}))
    return run


def test_moved_first_reads_the_planted_order_and_writes_it(tiny_run, tmp_path):
    run = fake_run(tiny_run, tmp_path / "run")
    signals = CP.run_signals(run)
    assert {"loss", "candidate_loss", "delta_z", "kl_conditional", "kl_uniform", "llc", "head_llc:top",
            "head_llc:sum"} == set(signals)
    result = CP.moved_first(run)
    rows = result["signals"]
    assert {n: rows[n]["step"] for n in PLANTED} == PLANTED
    assert result["order"] == ["llc", "delta_z", "kl_conditional", "loss", "candidate_loss", "head_llc:sum",
                               "head_llc:top"]
    assert rows["delta_z"]["fraction_of_tau"] == pytest.approx(700 / TAU) and rows["delta_z"]["direction"] == "rise"
    assert rows["loss"]["direction"] == "fall" and rows["loss"]["bracket"] == [880, 900]
    assert rows["kl_uniform"]["step"] is None and rows["kl_uniform"]["note"] == "never leaves its noise band"
    assert rows["head_llc:top"]["head"] == "L0H1" and rows["head_llc:top"]["n_baseline"] == 6
    assert result["baseline_window"] == [100, 600] and result["rule"] == RULE.to_dict()
    assert result["alternatives"]["llc half-change"]["fraction_of_tau"] == pytest.approx(1100 / TAU)
    assert any("no analysis summary" in n for n in result["notes"])
    assert json.loads((analysis_dir(run) / MOVED_FIRST_FILE).read_text())["order"] == result["order"]
    text = moved_first_text(result)
    assert text.index("llc") < text.index("delta_z") < text.index("kl_conditional") and "6=" in text
    fig, caption = run_timeline(result)
    assert "First: llc (0.54 τ), then delta_z (0.58 τ)" in caption and "Not read: kl_uniform" in caption
    assert len(fig.data) == 2 and list(fig.data[0].y) == result["order"]


def test_a_run_without_tau_or_metrics_is_one_line(tiny_run, tmp_path):
    run = fake_run(tiny_run, tmp_path / "run", tau=None)
    with pytest.raises(CP.RunError, match="no tau"):
        CP.moved_first(run)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(CP.RunError, match="no metrics.jsonl"):
        CP.moved_first(run)


# ---- over seeds -----------------------------------------------------------------------------


def seed_result(run: str, fractions: dict[str, float | None]) -> dict:
    """A moved_first result with only what the over-seeds summary reads."""
    return {"run": run, "rule": RULE.to_dict(), "rule_text": RULE.describe(),
            "signals": {n: {"fraction_of_tau": f, "direction": "rise" if f is not None else None, "head": None}
                        for n, f in fractions.items()}}


def test_over_seeds_gives_the_median_order_and_how_many_seeds_follow_it():
    a = [0.2, 0.25, 0.3, 0.22, 0.5]
    b = [0.4, 0.45, 0.35, 0.41, 0.42]  # seed 4 has b before a
    c = [0.6, 0.45, None, 0.7, 0.65]  # seed 1 ties c with b; seed 2 never reads c
    rare = [0.1, 0.15, None, None, None]  # read in 2 of 5 runs: left out of the order
    results = [seed_result(f"s{i}", {"c": c[i], "a": a[i], "b": b[i], "never": None, "rare": rare[i]})
               for i in range(5)]
    results.append({"run": "s5", "error": "s5: the run has no tau"})
    s = MF.over_seeds(results)
    assert s["order"] == ["a", "b", "c"] and s["unread"] == ["never"] and s["skipped"][0]["run"] == "s5"
    assert s["sparse"] == ["rare"] and s["signals"]["rare"]["median"] == pytest.approx(0.125)
    assert s["signals"]["a"]["median"] == pytest.approx(0.25)
    ci = s["signals"]["a"]["interval"]  # 5 seeds: the range, which covers the median with 93.75%
    assert (ci.low, ci.high, ci.coverage) == (0.2, 0.5, pytest.approx(0.9375))
    assert s["signals"]["c"]["n"] == 4 and s["signals"]["c"]["interval"].coverage == pytest.approx(0.875)
    assert [p["text"] for p in s["pairs"]] == ["a before b in 4 of 5 seeds", "b before c in 3 of 4 seeds (1 tied)"]
    assert MF.seeds_agreeing(s["signals"], "c", "a")["text"] == "c before a in 0 of 4 seeds"
    three = MF.over_seeds([seed_result(f"s{i}", {"a": a[i], "b": b[i]}) for i in range(3)])
    assert three["signals"]["a"]["interval"].coverage == pytest.approx(0.75)  # 3 seeds: the range, 75%
    text = over_seeds_text(s)
    assert "93.75% order statistics interval (n = 5)" in text and "a before b in 4 of 5 seeds" in text
    assert "never read" in text and "skipped s5" in text and "rare (2/5, median 0.125)" in text
    back = json.loads(json.dumps(strict_json(s)))  # the figure reads the JSON as well as the dict
    for summary in (s, back):
        fig, caption = seeds_timeline(summary)
        assert "a (0.25 τ), then b (0.41 τ)" in caption and "b before c in 3 of 4 seeds" in caption
        assert "left out: rare" in caption
        assert list(fig.data[0].y) == ["a", "b", "c"] and len(fig.data[1].x) == 14  # each seed of a, b and c
    with pytest.raises(MF.RunError, match="no tau"):
        MF.over_seeds(results[-1:])


def test_a_sweep_of_fake_runs(tiny_run, tmp_path):
    sweep = tmp_path / "sweep"
    for i in range(3):
        fake_run(tiny_run, sweep / f"seed{i}", seed=i)
    fake_run(tiny_run, sweep / "seed3", tau=None)
    s = MF.over_seeds(MF.sweep_moved_first(sweep))
    assert s["runs"] == ["seed0", "seed1", "seed2"] and s["skipped"][0]["run"] == "seed3"
    assert s["order"][:5] == ["llc", "delta_z", "kl_conditional", "loss", "candidate_loss"]
    assert s["pairs"][0]["text"] == "llc before delta_z in 3 of 3 seeds"
    assert (analysis_dir(sweep / "seed1") / MOVED_FIRST_FILE).exists()


# ---- the command --------------------------------------------------------------------------------


def test_the_command_prints_the_table_and_writes_the_json(tiny_run, tmp_path, capsys):
    run = fake_run(tiny_run, tmp_path / "sweep" / "seed0")
    fake_run(tiny_run, tmp_path / "sweep" / "seed1", seed=1)
    assert cli.main(["--run", str(run), "--json", str(tmp_path / "one.json")]) == 0
    out = capsys.readouterr().out
    assert "delta_z" in out and "rule: first of 4 consecutive" in out and MOVED_FIRST_FILE in out
    assert json.loads((tmp_path / "one.json").read_text())["order"][0] == "llc"
    assert cli.main(["--sweep", str(tmp_path / "sweep"), "--json", str(tmp_path / "seeds.json"), "--k", "3"]) == 0
    assert "llc before delta_z in 2 of 2 seeds" in capsys.readouterr().out
    assert json.loads((tmp_path / "seeds.json").read_text())["rule"]["k"] == 3


def test_the_commands_errors_are_one_line_exit_2(tiny_run, tmp_path, capsys):
    no_tau = copy_run(tiny_run, tmp_path / "tiny")  # the tiny run stops on its plateau
    assert Run(no_tau).summary["tau"] is None
    no_metrics = copy_run(tiny_run, tmp_path / "no_metrics")
    (no_metrics / "metrics.jsonl").unlink()
    for argv, message in ((["--run", str(tmp_path / "missing")], "no such run directory"),
                          (["--run", str(no_tau)], "no tau"),
                          (["--run", str(no_metrics)], "no metrics.jsonl"),
                          (["--sweep", str(tmp_path / "missing")], "no such sweep directory"),
                          (["--run", str(no_tau), "--n-sd", "-1"], "n_sd must be")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
    shutil.rmtree(no_metrics)
    with pytest.raises(SystemExit) as stop:
        cli.main(["--run", str(no_tau), "--sweep", str(tmp_path)])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_a_real_analysed_run_has_the_caches_signals(ci_analysed):
    """The session's analysed ci run: the cache's signals are read, by role, with their heads."""
    result = CP.moved_first(ci_analysed, write=False)
    rows = result["signals"]
    summary = json.loads((analysis_dir(ci_analysed) / "routing.json").read_text())
    if summary.get("named_head", True):
        routing = summary["label"]
        assert rows["attention:routing"]["head"] == routing and rows["attribution_share:routing"]["head"] == routing
        assert set(result["alternatives"]) >= {"t_form attention", "t_form patch_share", "t_form cue_effect"}
    else:  # no single head named (the margin within the noise on this machine): the routing group's signal
        group = "+".join(summary["routing_group"]["labels"])
        assert rows["attention:routing_group"]["head"] == group and "attention:routing" not in rows
        assert "t_form routing group" in result["alternatives"] and "t_form attention" not in result["alternatives"]
    assert {"attention:max", "attribution_total", "edge_circuit_mass", "edge_circuit_effect", "loss"} <= set(rows)
    assert result["order"] and all(rows[n]["fraction_of_tau"] > 0 for n in result["order"])


def test_no_single_head_the_routing_signals_are_the_groups(tiny_run, tmp_path):
    """Where ``routing.json`` names no single head, no signal or rule follows one routing head: the routing
    group's mean attention is the routing signal, and its t_form the alternative rule."""
    group = {"heads": [[0, 1], [0, 0]], "labels": ["L0H1", "L0H0"], "t_form": 800, "t_form_bracket": [780, 800],
             "lead_fraction": 1 / 3}
    routing = {"head": [0, 1], "label": "L0H1", "named_head": False, "routing_group": group,
               "t_form_rules": {"attention": {"t_form": 500, "t_form_bracket": [480, 500]}}}
    attention = [{"step": s, "to_z_first": [[0.1 + 0.001 * s, 0.3]]} for s in (0, 500, 1000)]
    run = fake_run(tiny_run, tmp_path / "run")
    assert CP.routing_head(Run(run), {"routing": routing}) is None
    assert CP.routing_head(Run(run), {"routing": {**routing, "named_head": True}}) == (0, 1)
    signal = CP.routing_group_signal(attention, routing)["attention:routing_group"]
    assert signal.values == pytest.approx([0.2, 0.45, 0.7]) and signal.head == "L0H1+L0H0"
    assert CP.routing_group_signal(attention, {**routing, "named_head": True}) == {}
    (analysis_dir(run) / "routing.json").write_text(json.dumps(routing))
    rules = CP.alternative_rules(Run(run), TAU)
    assert "t_form attention" not in rules and rules["t_form routing group"]["step"] == 800
    assert "L0H1, L0H0" in rules["t_form routing group"]["rule"]
