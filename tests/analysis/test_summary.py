"""Pieces of the routing summary (``plateauscope.analysis.summary``) on records with a known answer."""

from plateauscope.analysis.ablate import MARGINAL_TOL
from plateauscope.analysis.summary import release_record, with_damage


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
