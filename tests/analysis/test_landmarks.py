"""The adaptive analysis: landmarks found from a cheap pass with a known transition, and the same
findings as the exhaustive plan on a trained run."""

from __future__ import annotations

import pytest

from plateauscope.analysis.landmarks import fastest_change, landmark_steps

STEPS = list(range(0, 201, 10))
HEIGHT = 2.3


def _grid(value: float, at: tuple[int, int] = (0, 1), fill: float = 0.0) -> list[list[float]]:
    g = [[fill, fill], [fill, fill]]
    g[at[0]][at[1]] = value
    return g


def _cheap(attention_rise: int = 110, attribution_rise: int = 130) -> tuple[list[dict], list[dict]]:
    """Two layers of two heads; L0H1 is the routing head: its attention to the cue jumps from 0.1 to
    0.9 at ``attention_rise``, its attribution from 0 to 1 at ``attribution_rise`` (the others stay 0)."""
    attention = [{"step": s, "to_z_first": _grid(0.9 if s >= attention_rise else 0.1, fill=0.05)} for s in STEPS]
    attribution = [{"step": s, "heads": {"normalised": _grid(1.0 if s >= attribution_rise else 0.0)}} for s in STEPS]
    return attention, attribution


def _metrics(cue_rise: int = 110, drop: int = 150) -> list[dict]:
    """The progress measure at the plateau height until ``drop``; the cue effect jumps at ``cue_rise``
    (a small alternating noise before it)."""
    return [{"step": s, "candidate_loss": HEIGHT if s < drop else 0.5,
             "delta_z": 1.0 if s >= cue_rise else 0.001 * (s // 10 % 2)} for s in STEPS]


def _landmarks(budget: int, **kw) -> dict[int, list[str]]:
    attention, attribution = _cheap(**kw)
    return landmark_steps(STEPS, attention, attribution, _metrics(), "candidate_loss", "delta_z", HEIGHT,
                          tau=150, tau_lo=140, plateau_stretch=[10, 130], rules_start=10, budget=budget)


def test_the_landmarks_of_a_known_transition():
    """Always: plateau start and middle, tau, the last step, and each rule's t_form (not tau/2:
    the adaptive analysis runs head ablation alone there): the attention rule at the rise of attention,
    the patch-share rule at the rise of attribution, the cue-effect rule at the cue effect's jump.
    Within the budget, then: the step before each t_form, in the rules' order, and the evaluation
    before tau."""
    got = _landmarks(budget=0)
    assert sorted(got) == [10, 70, 110, 130, 150, 200]
    assert got[70] == ["plateau middle"]
    assert "t_form by attention (cheap)" in got[110] and "t_form by cue_effect (cheap)" in got[110]
    assert got[130] == ["t_form by patch_share (cheap)"]
    one_more = _landmarks(budget=7)  # the first bracket (before t_form by attention) and no other new step
    assert sorted(one_more) == [10, 70, 100, 110, 130, 150, 200]
    assert one_more[100] == ["before t_form by attention (cheap)", "before t_form by cue_effect (cheap)"]
    every = _landmarks(budget=9)
    assert sorted(every) == [10, 70, 100, 110, 120, 130, 140, 150, 200]
    assert every[120] == ["before t_form by patch_share (cheap)"]
    assert every[140] == ["evaluation before tau"]


def test_the_budget_adds_the_steps_of_fastest_change():
    """A rise of attention over two steps (to 0.5 at 160, to 0.9 at 170) adds both when the budget
    allows, and only the steps where some cheap signal changes."""
    attention, attribution = _cheap()
    for r in attention:
        r["to_z_first"][0][1] += 0.2 * (r["step"] >= 160) + 0.2 * (r["step"] >= 170)
    base = landmark_steps(STEPS, attention, attribution, _metrics(), "candidate_loss", "delta_z", HEIGHT,
                          150, 140, [10, 130], 10, budget=9)  # the landmarks and their brackets
    assert len(base) == 9
    more = landmark_steps(STEPS, attention, attribution, _metrics(), "candidate_loss", "delta_z", HEIGHT,
                          150, 140, [10, 130], 10, budget=100)
    assert set(more) - set(base) == {160, 170}
    assert more[160] == more[170] == ["fast change"]
    within = landmark_steps(STEPS, attention, attribution, _metrics(), "candidate_loss", "delta_z", HEIGHT,
                            150, 140, [10, 130], 10, budget=len(base) + 1)
    assert len(within) == len(base) + 1


def test_fastest_change_sums_each_signal_scaled_by_its_range():
    assert fastest_change([0, 1, 2, 3], [[0.0, 0.0, 1.0, 1.0], [0.0, 5.0, 10.0, 10.0]]) == [2, 1]
    assert fastest_change([0, 1, 2], [[3.0, 3.0, 3.0]]) == []  # a flat signal adds nothing
    assert fastest_change([0, 1, 2], [[0.0, None, 1.0]]) == []  # no change measured across a gap


def test_an_empty_cheap_pass_is_refused():
    with pytest.raises(ValueError, match="cheap pass"):
        landmark_steps(STEPS, [], [], _metrics(), "candidate_loss", "delta_z", HEIGHT, 150, 140, None, 0)


@pytest.mark.slow
def test_the_adaptive_plan_keeps_the_findings_of_the_full_one(tiny_run, tmp_path):
    """On a trained run, analysed both ways from empty caches: tau, t_form and the lead by the
    attention and cue-effect rules, the routing head, the circuit verdict and the edge circuit at
    the last step are the same; the records the two plans share are equal; the adaptive plan
    searches fewer circuits."""
    from plateauscope.analysis.analyze import AnalysisSettings, analyze_run, load_analysis
    from plateauscope.runs.run import Run
    from tests.conftest import copy_run

    settings = AnalysisSettings(n_examples=32, ablation_groups=2)
    runs = {plan: copy_run(tiny_run, tmp_path / plan) for plan in ("adaptive", "full")}
    got = {plan: analyze_run(path, n_exact=4, settings=settings, progress=False, full=plan == "full")
           for plan, path in runs.items()}
    a, f = got["adaptive"], got["full"]
    assert a["plan"]["mode"] == "adaptive" and f["plan"]["mode"] == "full"
    for key in ("head", "tau", "t_form", "lead_fraction"):
        assert a[key] == f[key], key
    for rule in ("attention", "cue_effect"):
        assert a["t_form_rules"][rule] == f["t_form_rules"][rule], rule
    # patch share reads the exact records: bisected to neighbouring checkpoints, inside the full plan's bracket
    share_a, share_f = a["t_form_rules"]["patch_share"], f["t_form_rules"]["patch_share"]
    assert (share_a["t_form"] is None) == (share_f["t_form"] is None)
    if share_a["t_form"] is not None:
        lo, hi = share_f["t_form_bracket"]
        assert lo < share_a["t_form"] <= hi
        steps = Run(runs["adaptive"]).steps
        assert steps.index(share_a["t_form_bracket"][1]) - steps.index(share_a["t_form_bracket"][0]) == 1
    assert a["circuit"]["verdict"] == f["circuit"]["verdict"]
    assert a["edges"]["final_circuit"] == f["edges"]["final_circuit"]
    caches = {plan: load_analysis(path, settings) for plan, path in runs.items()}
    for name in ("attention", "attribution", "edges", "patch", "circuit", "edge_circuit"):
        full_by_step = {r["step"]: r for r in caches["full"][name]}
        shared = [r for r in caches["adaptive"][name] if r["step"] in full_by_step]
        assert shared and all(r == full_by_step[r["step"]] for r in shared), name
    assert len(caches["adaptive"]["edge_circuit"]) < len(caches["full"]["edge_circuit"])
