"""The circuit analysis on hand-built models with a known answer: one head copies z, or two share it."""

import math

import numpy as np
import pytest

from plateauscope.analysis.ablate import MARGINAL_TOL, ablate_each_head
from plateauscope.analysis.circuit import (
    SUFFICIENT_TOL,
    circuit_record,
    circuit_summary,
    head_set_mask,
    head_shares,
    loses_cue,
    set_masks,
    verdict,
)
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.cli.text.analysis import format_circuit
from plateauscope.views.phrases import reads_cue_text
from tests.handbuilt import (
    ALPHA,
    COUNTER_HEAD,
    DAMAGE_HEAD,
    SELECTOR_HEAD,
    SPLIT_HEADS,
    K,
    handbuilt_task,
    selector_copy_model,
)

LOG_K = math.log(K)


@pytest.fixture(scope="module")
def task():
    return handbuilt_task()


def _record(task, split=False, conjunctive=False):
    model = selector_copy_model(task, split=split, conjunctive=conjunctive)
    return circuit_record(model, task, prompt_pairs(task, 64, seed=0), n_groups=4, seed=0)


def test_one_head_copies_z_single_head(task):
    rec = _record(task, split=False)
    layer, head = SELECTOR_HEAD
    sh = rec["shares"]
    assert sh["top"] == [layer, head]
    assert sh["share"][layer][head] == pytest.approx(1.0, abs=1e-5)
    assert sh["layer_share"][layer][head] == pytest.approx(1.0, abs=1e-5) and sh["n_for_80"] == 1
    # Cue-mean-ablating the copying head alone, or its whole layer, gives the marginal: candidate loss log K.
    assert rec["ablation"]["alone"][layer][head] == pytest.approx(LOG_K, abs=1e-4)
    assert rec["ablation"]["layer"][layer] == pytest.approx(LOG_K, abs=1e-4)
    assert rec["ablation"]["layer_but"][layer][head] < 0.01  # the others do not matter
    v = verdict(rec, LOG_K, after_drop=True)
    assert v["verdict"] == "single head" and v["heads"] == [f"L{layer}H{head}"]
    assert v["necessary"] == [f"L{layer}H{head}"]
    # Sufficient: with the BOS head mean-ablated (the only other head of its layer), nothing changes.
    assert v["sufficiency"]["kept"] == [f"L{layer}H{head}"] and v["sufficiency"]["sufficient"]
    assert v["sufficiency"]["progress"] == pytest.approx(rec["ablation"]["base"]["candidate_loss"], abs=1e-5)
    assert verdict(rec, LOG_K, after_drop=False)["verdict"] == "none"
    # It reads z at the last <SEP>: patching its output there alone restores the clean answer;
    # at the z positions (where the head's query is zero) it does nothing.
    assert rec["reads_z"]["labels"] == ["z1", "z2", "SEP"]  # the positions come from the layout
    norm = np.asarray(rec["reads_z"]["normalised"], dtype=float)  # [layer, position, head]
    assert norm[layer, -1, head] == pytest.approx(1.0, abs=1e-4)
    assert np.abs(norm[layer, :-1, head]).max() < 1e-4
    summary = circuit_summary([{"step": 10, **rec}], SELECTOR_HEAD, LOG_K, tau=5)
    assert reads_cue_text(summary, SELECTOR_HEAD) == "z1 +0.00, z2 +0.00, SEP +1.00"
    chosen = summary["chosen"]
    assert summary["verdict"] == "single head" and chosen["alone"]["near_height"] and chosen["alone"]["loses_cue"]
    assert chosen["others"]["L0H0"]["loses_cue"] is False and chosen["layer"]["loses_cue"]
    assert chosen["alone"]["interval"] == pytest.approx([LOG_K, LOG_K], abs=1e-4)  # every eval group at log K
    assert circuit_summary([{"step": 10, **rec}], SELECTOR_HEAD, LOG_K, tau=None)["verdict"] == "none"


def test_two_heads_split_the_copy_redundant(task):
    rec = _record(task, split=True)
    sh = rec["shares"]
    for layer, head in SPLIT_HEADS:
        assert sh["share"][layer][head] == pytest.approx(0.5, abs=1e-4)
    assert sh["n_for_80"] == 2 and sorted(map(tuple, sh["heads_for_80"])) == sorted(SPLIT_HEADS)
    # Either head ablated alone leaves a margin of ~ALPHA/2 (loss far below log K); both: log K.
    for layer, head in SPLIT_HEADS:
        assert rec["ablation"]["alone"][layer][head] < 0.1 * LOG_K
    assert rec["ablation"]["layer"][0] == pytest.approx(LOG_K, abs=1e-4)
    assert ALPHA / 2 > 3  # the margin that keeps one head's ablation away from log K
    v = verdict(rec, LOG_K, after_drop=True)
    assert v["verdict"] == "redundant" and sorted(v["heads"]) == ["L0H0", "L0H1"] and v["necessary"] == []
    assert v["cover_ablated_progress"] == pytest.approx(LOG_K, abs=1e-4) and v["cover_ablated_loses_cue"]
    # ... and each head alone keeps the answer (the other ablated: a margin of ALPHA / 2, loss ~ (K-1) e^-5)
    assert v["cover_each_alone_suffices"] == {"L0H0": True, "L0H1": True}
    each = rec["sets"]["cover"]["each_alone"]
    assert each["L0H0"]["ablated"] == pytest.approx((K - 1) * math.exp(-ALPHA / 2), rel=0.05)
    # They are the whole of layer 0: keeping them ablates nothing, so sufficiency is not tested.
    assert v["sufficiency"]["others_ablated"] == 0 and v["sufficiency"]["sufficient"] is None


def test_each_of_two_heads_needed_conjunctive(task):
    rec = _record(task, conjunctive=True)
    sh = rec["shares"]
    for layer, head in SPLIT_HEADS:  # each restores the clean answer when patched in: half the positive effect
        assert sh["share"][layer][head] == pytest.approx(0.5, abs=1e-4)
        # ... and cue-mean-ablating either alone leaves the mean copy + 1 - 1: every candidate equal, log K exactly
        assert rec["ablation"]["alone"][layer][head] == pytest.approx(LOG_K, abs=1e-4)
    layer, head = COUNTER_HEAD
    assert sh["share"][layer][head] == 0.0 and rec["ablation"]["alone"][layer][head] < 0.01  # without it: 2 copies
    v = verdict(rec, LOG_K, after_drop=True)
    assert v["verdict"] == "conjunctive" and v["heads"] == ["L0H0", "L0H1"] == v["necessary"]
    assert v["top_layer_share"] == pytest.approx(0.5, abs=1e-4)  # no single head by share either
    # The two heads are the whole of layer 0 (the counter head sits elsewhere): sufficiency is not tested.
    assert v["sufficiency"]["others_ablated"] == 0 and v["sufficiency"]["sufficient"] is None
    lines = format_circuit(circuit_summary([{"step": 10, **rec}], SPLIT_HEADS[1], LOG_K, tau=5), LOG_K, SPLIT_HEADS[1])
    assert lines[0].startswith("circuit verdict conjunctive: L0H0, L0H1")
    assert any(line.startswith("necessary       heads whose ablation alone loses the cue: L0H0, L0H1") for line in lines)
    assert any("not tested (no other head in their layers)" in line for line in lines)


def test_the_verdict_names_the_route_not_the_damage(task):
    """One head carries z; another carries B in a cancellation that mean ablation breaks (the model
    is then worse than the marginal). The verdict names only the z head; mean ablation is damage."""
    pairs = prompt_pairs(task, 64, seed=0)
    layer, head = DAMAGE_HEAD
    model = selector_copy_model(task, damage=True)
    mean = ablate_each_head(model, task, "mean", n_groups=4)
    assert float(mean.candidate_loss[layer, head]) > 3 * LOG_K  # far past the marginal: damage
    rec = circuit_record(model, task, pairs, n_groups=4, seed=0)
    assert rec["ablation"]["kind"] == "cue_mean"
    base = rec["ablation"]["base"]["candidate_loss"]
    assert base < 0.01 and rec["ablation"]["alone"][layer][head] == pytest.approx(base, abs=1e-5)  # no z in it
    v = verdict(rec, LOG_K, after_drop=True)
    assert v["verdict"] == "single head" and v["heads"] == ["L0H1"] == v["necessary"]
    # The copy split over two heads, with the same damage: read by mean ablation with overshoot
    # counted, both layer-1 heads would be "necessary" (a conjunctive verdict on the wrong heads).
    model = selector_copy_model(task, split=True, damage=True)
    by_mean = circuit_record(model, task, pairs, kind="mean", n_groups=4, seed=0)
    assert all(by_mean["ablation"]["alone"][1][h] > (1 + MARGINAL_TOL) * LOG_K for h in (0, 1))
    assert verdict(by_mean, LOG_K, after_drop=True)["necessary"] == []  # overshoot decides nothing
    v = verdict(circuit_record(model, task, pairs, n_groups=4, seed=0), LOG_K, after_drop=True)
    assert v["verdict"] == "redundant" and sorted(v["heads"]) == ["L0H0", "L0H1"] and v["necessary"] == []


def _synthetic(alone_top: float, cover: float | None, necessary: list[str], kept: float, share: float = 0.4,
               each: tuple[float, float] = (0.1, 0.1)) -> dict:
    """A circuit record by hand: 1 layer x 3 heads, the top head L0H0; ``each``: the cover set's heads
    each kept alone (the other ablated)."""
    return {"shares": {"top": [0, 0], "top_share": share, "top_layer_share": share, "total_positive": 1.0,
                       "heads_for_80": [[0, 0], [0, 1]]},
            "ablation": {"kind": "cue_mean", "base": {"candidate_loss": 0.1}, "alone": [[alone_top, 0.2, 0.2]],
                         "layer_but": [[kept, 0.0, 0.0]]},
            "sets": {"cover": {"heads": ["L0H0", "L0H1"], "ablated": cover, "kept": kept,
                               "each_alone": {"L0H0": {"ablated": each[0], "interval": None},
                                              "L0H1": {"ablated": each[1], "interval": None}}},
                     "necessary": {"heads": necessary, "kept": kept}}}


def test_verdict_rules_by_hand():
    log_k = 2.0
    # One head needed, but without the share: neither single head nor conjunctive.
    v = verdict(_synthetic(alone_top=2.5, cover=2.5, necessary=["L0H0"], kept=0.1), log_k, True)
    assert v["verdict"] == "unresolved" and v["heads"] == ["L0H0", "L0H1"]
    assert verdict(_synthetic(2.5, 2.5, ["L0H0"], 0.1, share=0.7), log_k, True)["verdict"] == "single head"
    # Overshoot is damage: the top head's ablation far above log K does not make it the single head.
    v = verdict(_synthetic(6.0, 2.0, [], 0.1, share=0.7), log_k, True)
    assert v["verdict"] == "redundant" and v["top_alone_damage"] and not v["top_alone_loses_cue"]
    # The cover set ablated does not return the loss to log K: not redundant.
    assert verdict(_synthetic(0.2, 1.0, [], 0.1), log_k, True)["verdict"] == "unresolved"
    # Redundant needs each head alone to keep the answer: one that does not leaves it unresolved.
    v = verdict(_synthetic(0.2, 1.9, [], 0.1, each=(0.1, 0.1 + SUFFICIENT_TOL * log_k + 0.01)), log_k, True)
    assert v["verdict"] == "unresolved" and v["cover_each_alone_suffices"] == {"L0H0": True, "L0H1": False}
    v = verdict(_synthetic(0.2, 1.9, [], 0.1 + SUFFICIENT_TOL * log_k + 0.01), log_k, True)
    assert v["verdict"] == "redundant" and not v["sufficiency"]["sufficient"]
    assert verdict(_synthetic(0.2, 1.9, [], 0.1), log_k, False) ["verdict"] == "none"
    # keep=True: every other head of the kept heads' layers
    m = head_set_mask([(1, 0), (1, 2)], 3, 3, keep=True)
    assert m.tolist() == [[False] * 3, [False, True, False], [False] * 3]
    assert head_set_mask([(0, 1)], 2, 2).tolist() == [[False, True], [False, False]]


def test_shares_and_masks_by_hand():
    sh = head_shares([[3.0, -1.0, 1.0], [0.0, 4.0, 2.0]])  # positive sum 10
    assert np.allclose(sh["share"], [[0.3, 0.0, 0.1], [0.0, 0.4, 0.2]])
    assert np.allclose(sh["layer_share"], [[0.75, 0.0, 0.25], [0.0, 4 / 6, 2 / 6]])
    assert sh["top"] == [1, 1] and sh["n_for_80"] == 3  # 0.4 + 0.3 + 0.2 >= 0.8
    assert head_shares([[0.0, -1.0]])["n_for_80"] == 0
    # Back to log K: at least 0.75 log K; overshooting counts, a loss still well below does not.
    # Back at the height: within 0.25 of it, over the whole interval; overshoot is damage, not a lost cue.
    assert loses_cue(0.76, None, 1.0) and loses_cue(1.2, [0.8, 1.25], 1.0)
    assert not loses_cue(3.0, None, 1.0) and not loses_cue(0.7, None, 1.0) and not loses_cue(1.0, [0.7, 1.3], 1.0)
    m = set_masks(2, 3)
    assert m.shape == (1 + 6 + 2 + 6, 2, 3) and not m[0].any()
    assert m[1 + 6 + 1].sum() == 3 and m[1 + 6 + 1][1].all()  # layer 1 whole
    but = m[1 + 6 + 2 + 4]  # layer 1 but head 1
    assert but[1].tolist() == [True, False, True] and not but[0].any()
