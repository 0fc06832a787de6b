"""Graft bisection (plateauscope.dynamics.graft): the bisection against every boundary of a synthetic
monotone test, and against a checkpoint series built so that its part becomes sufficient at a known
step (the run's own step-0 weights before it, its trained weights from it on); a transplanted head's
QK or OV is that slice of the donor and nothing else; bad requests are one line."""

from __future__ import annotations

import pytest
import torch

from plateauscope.cli.graft import main
from plateauscope.dynamics.graft import (
    GRAFT_FILE,
    GRAFTS_DIR,
    bisect_boundary,
    bisection_dir,
    boundary_table,
    graft_bisection,
    max_trials,
)
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import transplanted
from tests.conftest import copy_run


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 33])
def test_the_bisection_finds_every_boundary_within_its_trial_bound(n):
    for boundary in range(n + 1):  # boundary n: no candidate passes
        calls = []
        found = bisect_boundary(n, lambda i: calls.append(i) or i >= boundary)
        assert found.first_passing == (boundary if boundary < n else None)
        assert found.last_failing == (boundary - 1 if boundary > 0 else None)
        assert len(calls) == len(set(calls)) <= max_trials(n)
        assert found.tried == {i: i >= boundary for i in calls}


def test_a_heads_qk_and_ov_are_its_slices_of_the_donor():
    own = {"blocks.0.attn.W_Q": torch.zeros(4, 8, 2), "blocks.0.attn.W_V": torch.zeros(4, 8, 2),
           "blocks.0.attn.b_O": torch.zeros(8), "embed.W_E": torch.zeros(5, 8)}
    donor = {k: torch.ones_like(v) for k, v in own.items()}
    qk = transplanted(own, donor, "0.2:qk")
    assert qk["blocks.0.attn.W_Q"][2].eq(1).all() and qk["blocks.0.attn.W_Q"][[0, 1, 3]].eq(0).all()
    assert qk["blocks.0.attn.W_V"].eq(0).all() and own["blocks.0.attn.W_Q"].eq(0).all()  # the run's own: untouched
    ov = transplanted(own, donor, "0.1:ov")
    assert ov["blocks.0.attn.W_V"][1].eq(1).all() and ov["blocks.0.attn.W_V"].sum() == 16
    assert ov["blocks.0.attn.b_O"].eq(0).all() and ov["embed.W_E"].eq(0).all()  # b_O is every head's
    assert transplanted(own, donor, "embeddings")["embed.W_E"].eq(1).all()


@pytest.fixture(scope="module")
def tiny_tau_run(tiny_sweep, tmp_path_factory):
    """A copy of the tiny sweep's first run (D = 80, seed 0: past its tau)."""
    name = rd.read_json(tiny_sweep / rd.MANIFEST_FILE)["points"][0]["name"]
    return copy_run(tiny_sweep / name, tmp_path_factory.mktemp("graft") / "run")


@pytest.mark.slow
def test_the_bisection_finds_the_step_where_a_synthetic_series_becomes_sufficient(tiny_tau_run, tmp_path):
    run = rd.Run(tiny_tau_run)
    steps, tau_0 = run.steps, run.summary["tau"]
    start, _ = rd.load_checkpoint(run.checkpoint_path(0))
    trained, _ = rd.load_checkpoint(run.checkpoint_path(steps[-1]))
    known = steps[len(steps) // 3]
    series = copy_run(tiny_tau_run, tmp_path / "series")
    for step in steps:  # before `known`: the run's own init (grafting it changes nothing); from it: trained
        rd.save_checkpoint(series / rd.CHECKPOINT_DIR / rd.checkpoint_name(step), start if step < known else trained, step)
    result = graft_bisection(series, "routing", criterion=0.5)
    assert result["first_sufficient_step"] == known
    assert result["last_insufficient_step"] == steps[steps.index(known) - 1]
    assert len(result["trials"]) <= max_trials(len(steps)) == result["max_trials"]
    failing = [t for t in result["trials"] if not t["passes"]]
    assert failing and all(t["tau"] is None or t["tau"] > 0.5 * tau_0 for t in failing)
    assert all(t["tau"] <= 0.5 * tau_0 for t in result["trials"] if t["passes"])
    assert rd.read_json(bisection_dir(series, "routing", 0.5) / GRAFT_FILE)["first_sufficient_step"] == known
    # Run again, it reuses every finished trial: the same answer, no training.
    again = graft_bisection(series, "routing", criterion=0.5)
    assert again["trials"] == result["trials"]
    table = boundary_table([result, result, result])
    assert table[0]["median"] == known / tau_0 and table[0]["interval"].n == 3


@pytest.mark.parametrize("flags, message", [
    (["--part", "layer3"], "the model has 1 layer(s)"),
    (["--part", "heads"], "transplant part 'heads': give one of"),
    (["--part", "routing", "--criterion", "0"], "--criterion must lie in (0, 1]"),
])
def test_bad_requests_are_one_line(tiny_tau_run, capsys, flags, message):
    assert main(["--run", str(tiny_tau_run), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert not (tiny_tau_run / GRAFTS_DIR).exists()


def test_a_run_without_tau_is_refused_in_one_line(tiny_run, capsys):
    assert main(["--run", str(tiny_run), "--part", "routing"]) == 2
    err = capsys.readouterr().err.strip()
    assert "never reached tau" in err and "\n" not in err
