"""The probe pass's figure and captions on records built here: the phase change drawn and shaded where the record
puts it, captions that state the record's numbers in the sentences the command line prints, and a missing part
said by its note, never as a template."""

from __future__ import annotations

import numpy as np
import pytest

from plateauscope.analysis.head_naming import HeadCall
from plateauscope.analysis.transition import co_occurrence, transition
from plateauscope.views.phrases import head_call_text, landmark_text, probe_head_lines, transition_lines
from plateauscope.views.probe_report import (
    head_rows,
    pass_rows,
    phase_change_caption,
    phase_change_figure,
    sentences,
)
from plateauscope.views.time_view import _curves_note

STEPS = list(range(0, 420, 20))
TEMPLATES = ("n/a", "none [", "onset none", "τ =", "named when a head is named")
SELECTOR_WORDS = ("cue", "selector", "routing", "t_form")


def rise(steps, at, n=32, seed=0, height=4.0):
    """Per-sequence values ``[S, n]`` rising from 0 to ``height`` around step ``at``, with noise."""
    rng = np.random.default_rng(seed)
    curve = height / (1 + np.exp(-(np.array(steps) - at) / 8.0))
    return curve[:, None] + 0.05 * rng.standard_normal((len(steps), n))


def call(head, layer, index, score, null, kind):
    named = kind == "named"
    return HeadCall(head, layer, index, score, null, score - null, [score - null - 0.02, score - null + 0.02], named,
                    kind).to_dict()


def record(with_gap=True, baseline_steps=STEPS):
    """A probe record as ``plateauscope.analysis.probe_pass`` writes it: two layers of two heads, L1H1 and L1H0
    named induction heads, L0H0 a previous-token head, L0H1 a fixed-lag copier; the loss gap rises at step 300."""
    gap = rise(baseline_steps, 300)
    scores = rise(baseline_steps, 296, height=0.8, seed=1) + 0.1
    steps = []
    for i, s in enumerate(baseline_steps):
        level = float(scores[i].mean())
        steps.append({
            "step": s,
            "head_scores": {"previous_token": [[0.1 + level * 0.9, 0.05], [0.03, 0.04]],
                            "induction": [[0.0, 0.02], [level * 0.95, level]]},
            "null_scores": {"previous_token": [[0.1, 0.1], [0.1, 0.1]], "induction": [[0.1, 0.1], [0.1, 0.1]]},
            "detector_scores": {}, "head_patching": [[0.0, 0.1], [0.3, 0.6]],
            "loss_gap": float(gap[i].mean()) if with_gap else None,
            "loss_gap_sequences": gap[i].tolist() if with_gap else None,
            "score_sequences": {}})
    heads = {"previous_token": [call("L0H0", 0, 0, steps[-1]["head_scores"]["previous_token"][0][0], 0.1, "named"),
                                call("L0H1", 0, 1, 0.05, 0.1, None)],
             "induction": [call("L1H1", 1, 1, steps[-1]["head_scores"]["induction"][1][1], 0.1, "named"),
                           call("L1H0", 1, 0, steps[-1]["head_scores"]["induction"][1][0], 0.1, "named"),
                           {**call("L0H1", 0, 1, 0.4, 0.1, "fixed_lag"), "lags": [12]}]}
    out = {"probe": "induction", "architecture": "LlamaForCausalLM", "layout": "induction probe (V=64)",
           "rule": "named where the 95% interval of (score - null) over the probe's sequences lies above 0.2",
           "steps": steps, "heads": heads, "named_heads": {"previous_token": [[0, 0]], "induction": [[1, 1], [1, 0]]},
           "transition": None, "co_occurrence": None}
    if with_gap:
        passed = transition(baseline_steps, gap)
        out["transition"] = passed.to_dict()
        out["co_occurrence"] = co_occurrence(baseline_steps, gap, scores, "induction", ["L1H1", "L1H0"],
                                             passed).to_dict()
    return out


def words_absent(text: str) -> None:
    for word in TEMPLATES + SELECTOR_WORDS:
        assert word not in text, (word, text)


def test_the_phase_change_is_drawn_and_shaded_where_the_record_puts_it():
    rec = record()
    t = rec["transition"]
    assert t["onset"] and t["phase_change"] and t["end"]  # the record has all three parts
    fig, caption = phase_change_figure(rec)
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    for key in ("onset", "phase_change", "end"):
        low, high = t[key]["interval"]
        assert any(r.x0 == low and r.x1 == high for r in rects), key  # shaded over its interval, on both rows
        assert any(s.type == "line" and s.x0 == t[key]["step"] for s in fig.layout.shapes)
    labels = [a.text for a in fig.layout.annotations]
    assert f"phase change {t['phase_change']['step']:.0f} [{t['phase_change']['interval'][0]:.0f}, " \
           f"{t['phase_change']['interval'][1]:.0f}]" in labels
    traces = {tr.name: tr for tr in fig.data}
    assert list(traces["in-context loss gap"].y) == [s["loss_gap"] for s in rec["steps"]]
    for la, h in rec["named_heads"]["induction"]:  # the named heads' scores as recorded
        assert list(traces[f"L{la}H{h} induction score"].y) == [s["head_scores"]["induction"][la][h]
                                                                for s in rec["steps"]]
    assert "L0H0 previous-token score" in traces and "L0H1 induction score" not in traces  # not named: grey
    # the caption: the sentences the command line prints, with the record's numbers
    assert sentences(transition_lines(rec)) in caption and sentences(probe_head_lines(rec)[1:]) in caption
    assert f"phase change (half-rise) {landmark_text(t['phase_change'])}" in caption
    assert f"Onset {landmark_text(t['onset'])}" in caption and f"end {landmark_text(t['end'])}" in caption
    assert f"rises from {t['low']:.3f} to {t['high']:.3f}" in caption
    for c in rec["heads"]["induction"][:2]:
        assert head_call_text(c) in caption
    assert "copies at lag 12 only" in caption  # the fixed-lag copier, with its lag
    words_absent(caption)


def test_a_missing_part_is_its_note_not_a_template():
    rec = record(baseline_steps=[0, 260, 280, 300, 320, 340, 400])  # two checkpoints before the rise: no onset
    t = rec["transition"]
    assert t["onset"] is None and t["notes"] and t["phase_change"]
    fig, caption = phase_change_figure(rec)
    assert t["notes"][0] in caption and "Onset" not in caption  # no "onset none": the note says why
    assert "the phase change and end" in caption  # only the parts shaded are named
    assert not any(a.text.startswith("onset") for a in fig.layout.annotations)
    if rec["co_occurrence"]["lag"] is not None:
        assert "window from the first checkpoint" in caption  # the window's start is said as it is read
    words_absent(caption)


def test_a_probe_with_no_loss_gap_draws_its_heads_alone():
    rec = record(with_gap=False)
    fig, caption = phase_change_figure(rec)
    assert "in-context loss gap" not in {tr.name for tr in fig.data} and not fig.layout.shapes
    assert "the probe measures no loss gap: no transition is read" in transition_lines(rec)
    assert "The probe measures no loss gap: no transition is read." in caption
    assert dict(pass_rows(rec, 21))["the in-context loss gap"] == "The probe measures no loss gap: no transition is read."
    words_absent(caption)


def test_the_head_table_gives_every_heads_verdict_and_patching():
    rows = dict(head_rows(record()))
    assert rows["induction: L1H1"].startswith("named: L1H1 ")
    assert "head patching +0.60" in rows["induction: L1H1"]
    assert rows["induction: L0H1"].startswith("fixed-lag copier (not by content): L0H1 0.400 (null 0.100), copies at "
                                              "lag 12 only")
    assert rows["previous-token: L0H1"].startswith("not named: ")


@pytest.mark.parametrize(("markers", "note"), [
    ({"t_form": 10, "tau": 20}, "Orange: the analysed step shown; dashed: t_form and tau."),
    ({"t_form": None, "tau": 20}, "Orange: the analysed step shown; dashed: tau."),
    ({}, "Orange: the analysed step shown."),
])
def test_the_time_views_curves_note_names_only_the_landmarks_drawn(markers, note):
    assert _curves_note(markers) == note
