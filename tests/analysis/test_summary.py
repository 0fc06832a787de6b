"""Pieces of the routing summary (``plateauscope.analysis.summary``) on records with a known answer."""

import pytest

from plateauscope.analysis.ablate import MARGINAL_TOL
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.summary import (
    head_margin,
    plateau_stretch,
    release_record,
    routing_group,
    stated_routing,
    top_heads,
    with_damage,
)
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.views.phrases import named_head_text, plateau_sentence, routing_name
from tests.handbuilt import SELECTOR_HEAD, handbuilt_task, selector_copy_model


def test_the_release_record_reads_the_evaluations_around_the_release():
    records = [{"step": s, "loss": v} for s, v in [(0, 3.0), (90, 2.3), (100, 2.9), (110, 2.8)]]
    got = release_record(records, 100, "loss")
    assert got == {"step": 100, "key": "loss", "before": {"step": 90, "value": 2.3}, "after": {"step": 100, "value": 2.9}}
    assert release_record(records, 0, "loss")["before"] is None


def test_damage_names_the_heads_that_push_the_measure_past_the_band():
    height = 2.0
    assert MARGINAL_TOL == 0.25  # the band this test's numbers sit around
    ablations = [{"step": 100, "mean": {"candidate_loss": [[2.4, 2.6], [None, 1.0]]}},
                 {"step": 500, "mean": {"candidate_loss": [[9.0, 9.0], [9.0, 9.0]]}}]
    circuit = {"step": 120, "verdict": "single head"}
    got = with_damage(circuit, ablations, height)["damage"]
    assert got["step"] == 100 and got["heads"] == {"L0H0": 2.4, "L0H1": 2.6, "L1H0": None, "L1H1": 1.0}
    assert got["past_height"] == ["L0H1"]  # past (1 + MARGINAL_TOL) x height = 2.5; 2.4 is inside the band
    assert with_damage(None, ablations, height) is None and with_damage(circuit, [], height) == circuit


def _grokking_like(inside_at: set[int], n: int = 20, height: float = 4.0) -> list[dict]:
    """A held-out loss at the height (``height``) at the evaluations ``inside_at``, far above it (memorising)
    elsewhere, then below half the height at evaluation ``n`` (tau): a non-monotone measure."""
    values = [height if i in inside_at else height * (2 + i % 3) for i in range(n)] + [0.5, 0.1]
    return [{"step": 10 * i, "heldout_loss": v} for i, v in enumerate(values)]


def test_the_plateau_is_the_longest_stretch_inside_the_band_and_absent_below_half():
    progress = ProgressMeasure("heldout_loss", 4.0, "log_p", height_label="log p", label="held-out loss")
    # inside at the first three and the last three evaluations before tau (6 of 20): no plateau at log p,
    # though the first and last evaluations inside span 0..190
    counts = plateau_stretch(_grokking_like({0, 1, 2, 17, 18, 19}), progress, tau=200)
    assert (counts["n_before"], counts["n_inside"], counts["holds"]) == (20, 6, False)
    assert counts["stretch"] == [0, 20] and counts["n_stretch"] == 3  # the first of two equal stretches
    assert counts["range"] == [4.0, 16.0]
    text = plateau_sentence(counts, progress.label, progress.height_label)
    assert text == ("No plateau at log p (4): 6 of the 20 evaluations before tau lie within 10% of it; "
                    "the held-out loss ranges from 4 to 16 there.")
    # inside at 12 of 20, the longest run of them 8 long (evaluations 5..12, steps 50..120)
    inside = {0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12, 19}
    counts = plateau_stretch(_grokking_like(inside), progress, tau=200)
    assert (counts["n_inside"], counts["holds"], counts["stretch"], counts["n_stretch"]) == (12, True, [50, 120], 8)
    assert plateau_sentence(counts, progress.label, progress.height_label) == (
        "The held-out loss lies within 10% of log p at 12 of the 20 evaluations before tau; the longest stretch "
        "inside, 8 evaluations in a row, runs from step 50 to step 120.")


def test_a_head_is_named_only_when_its_margin_is_clear_of_the_noise():
    task = handbuilt_task()
    pairs = prompt_pairs(task, 64, 0)
    # one routing head (L0H1): its score is 1, every other head's 0, on every resample
    alone = head_margin(selector_copy_model(task), task, pairs, SELECTOR_HEAD, (0, 0), n_boot=200)
    assert alone["clear"] and alone["difference"] == pytest.approx(1.0, abs=1e-3) and alone["interval"][0] > 0.9
    # the copy split between L0H0 and L0H1: equal scores, no single head
    split = head_margin(selector_copy_model(task, split=True), task, pairs, SELECTOR_HEAD, (0, 0), n_boot=200)
    assert not split["clear"] and split["interval"][0] <= 0 <= split["interval"][1]
    tops = top_heads([[0.5, 0.5], [0.1, 0.0]])
    text = named_head_text({"label": "L0H1", "named_head": False, "margin": split, "top_heads": tops})
    assert text.startswith("no single head: the margin over the runner-up is within the evaluation noise")
    assert text.endswith("top heads: L0H0 0.5, L0H1 0.5, L1H0 0.1")
    assert named_head_text({"label": "L0H1", "named_head": True, "margin": alone, "top_heads": tops}).startswith(
        "L0H1 (margin over the runner-up: L0H1 - L0H0 = 1")


def _two_heads_rising(steps: list[int]) -> list[dict]:
    """Attention to the cue of two layer-0 heads: L0H0 from 0.1 to 0.5 over steps 200..400, L0H1 from 0.1 to
    0.9 over steps 400..800, L0H2 flat at 0.2."""
    def ramp(s: int, a: int, b: int, top: float) -> float:
        return 0.1 + (top - 0.1) * min(max((s - a) / (b - a), 0.0), 1.0)
    return [{"step": s, "to_z_first": [[ramp(s, 200, 400, 0.5), ramp(s, 400, 800, 0.9), 0.2]]} for s in steps]


def test_the_routing_group_forms_when_its_mean_attention_is_halfway_up():
    steps = list(range(0, 1001, 50))
    group = routing_group(_two_heads_rising(steps), [(0, 1), (0, 0)], rules_start=0, tau=900, tau_lo=850)
    # the mean goes from 0.1 to 0.7; halfway (0.4) it first reaches at step 500 (0.5 and 0.3; at 450: 0.5 and
    # 0.2 -> 0.35), where neither head alone is halfway (L0H0 from step 300, L0H1 from 600)
    assert group["heads"] == [[0, 1], [0, 0]] and group["labels"] == ["L0H1", "L0H0"]
    assert group["start_value"] == pytest.approx(0.1) and group["final_value"] == pytest.approx(0.7)
    assert group["t_form"] == 500 and group["t_form_bracket"] == [450, 500]
    assert group["lead_fraction"] == pytest.approx((900 - 500) / 900)


def test_the_stated_routing_is_the_named_head_the_group_or_nothing():
    group = {"heads": [[0, 2], [0, 1]], "labels": ["L0H2", "L0H1"], "t_form": 700, "lead_fraction": 0.5}
    base = {"head": [0, 2], "label": "L0H2", "t_form": 620, "lead_fraction": 0.56}
    named = stated_routing({**base, "named_head": True, "routing_group": None})
    assert named.heads == ((0, 2),) and named.t_form == 620 and not named.is_group
    assert stated_routing(base) == named  # a summary written before the rule: its head
    unnamed = stated_routing({**base, "named_head": False, "routing_group": group})
    assert unnamed.heads == ((0, 2), (0, 1)) and unnamed.t_form == 700 and unnamed.lead_fraction == 0.5
    assert unnamed.is_group and routing_name(unnamed) == "routing group L0H2 and L0H1"
    assert stated_routing({**base, "named_head": False, "routing_group": None}) is None  # no head, no t_form
    text = named_head_text({**base, "named_head": False, "routing_group": group, "top_heads": [],
                            "margin": {"heads": ["L0H2", "L0H1"], "difference": 0.0206, "interval": [-0.0043, 0.0479],
                                       "level": 0.95}})
    assert text.startswith("no single head") and "L0H2 - L0H1 = 0.0206" in text
    assert text.endswith("the routing group L0H2 and L0H1: their mean attention to the cue is halfway up at "
                         "t_form = 700, a lead of 0.50 tau")
