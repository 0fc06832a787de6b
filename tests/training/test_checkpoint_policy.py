"""The adaptive checkpoint policy: its window on metrics with a known plateau, and on a trained run
the same bytes as a dense run in the window, a coarse series elsewhere, through a kill and resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from plateauscope.errors import ConfigError
from plateauscope.runs import run as rd
from plateauscope.runs.files import save_checkpoint
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.training.checkpoint_policy import WINDOW_END_TAU, transition_window
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.schedule import scheduled_steps
from plateauscope.training.train import train

LOSS = ProgressMeasure(key="loss", height=1.0, cue_effect_key="cue")
# A run that leaves its warm-up at step 40, sits on the plateau (loss 1, cue effect 0) until 600, leaves
# it, and drops below half the height at 700 (tau). Evaluations every 10 steps.
KNOWN = [{"step": s, "loss": 3.0 if s < 40 else 1.0 if s <= 600 else 0.7 if s < 700 else 0.2,
          "cue": 0.0 if s <= 600 else 0.5} for s in range(0, 1001, 10)]


def test_window_of_a_known_plateau_and_its_bound_before_tau():
    start, end = transition_window(KNOWN, LOSS)
    assert (start, end) == ((40 + 600) // 2, math.ceil(WINDOW_END_TAU * 700))
    # Before tau the window is open on the right, and its start never passes the final one (so no
    # checkpoint that ends up in the window is deleted on the way).
    for n in range(1, len(KNOWN)):
        s, e = transition_window(KNOWN[:n], LOSS)
        assert s <= start
        assert (e is None) == (KNOWN[n - 1]["step"] < 700)


def test_window_without_a_plateau_starts_at_half_tau_and_ends_with_a_run_that_never_drops():
    accuracy = ProgressMeasure(key="acc", height=1.0, falls=False)
    rising = [{"step": s, "acc": s / 1000} for s in range(0, 1001, 100)]
    assert transition_window(rising, accuracy) == (600 // 2, math.ceil(WINDOW_END_TAU * 600))
    flat = [{"step": s, "loss": 1.0, "cue": 0.0} for s in range(0, 501, 100)]
    assert transition_window(flat, LOSS) == (250, None)
    assert transition_window(flat, LOSS, complete=True) == (250, 500)


def test_the_same_weights_give_the_same_checkpoint_bytes(tmp_path):
    # safetensors writes its metadata from a hash map whose order changes between calls.
    weights = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    blobs = set()
    for i in range(8):
        save_checkpoint(tmp_path / f"{i}.safetensors", weights, step=7)
        blobs.add((tmp_path / f"{i}.safetensors").read_bytes())
    assert len(blobs) == 1
    got = load_file(tmp_path / "0.safetensors")
    assert all(torch.equal(got[k], weights[k]) for k in weights)
    header = json.loads(next(iter(blobs))[8:8 + int.from_bytes(next(iter(blobs))[:8], "little")])
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])


def expected_steps(run: Run, coarse_every: int) -> set[int]:
    """The checkpoints an adaptive run keeps, from its summary (not from the policy's own code): the
    dense ones from the middle of the plateau's stretch (none: tau / 2) to 1.3 tau, and outside the early
    ones, every ``coarse_every``-th, the resume points and the last step."""
    summary, tc = rd.read_json(run.path / rd.SUMMARY_FILE), run.config.train
    span, tau, last = summary["plateau_stretch"], summary["tau"], summary["final_step"]
    dense = {s for s in scheduled_steps(tc.ckpt_every, tc.max_steps, tc.early_log_points) if s <= last} | {last}
    start, end = (span[0] + span[1]) // 2 if span else tau // 2, math.ceil(1.3 * tau)
    return {s for s in dense if start <= s <= end or s < tc.ckpt_every or s % coarse_every == 0
            or s % tc.resume_every == 0 or s == last}


def test_adaptive_keeps_the_dense_runs_bytes_in_the_window_through_a_kill(tmp_path, ci_run):
    dense = Run(ci_run)  # the session's dense `ci` run, trained in this process with the same threads
    summary = rd.read_json(ci_run / rd.SUMMARY_FILE)
    span, tau = summary["plateau_stretch"], summary["tau"]
    assert span[0] < span[1] < tau
    adaptive = get_preset("ci").replace(checkpoints="adaptive", coarse_every=50)
    kill = (span[0] + span[1]) // 2 + 7  # in the plateau's second half, between two resume points
    train(adaptive, tmp_path / "a", device="cpu", progress=False, stop_at_step=kill)
    train(adaptive, tmp_path / "a", resume=True, device="cpu", progress=False)
    kept = Run(tmp_path / "a")
    assert set(kept.steps) == expected_steps(kept, 50)
    assert len(kept.steps) < len(dense.steps)
    for step in kept.steps:
        assert kept.checkpoint_path(step).read_bytes() == dense.checkpoint_path(step).read_bytes(), step
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in dense.metrics()]
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in kept.metrics()] == strip


# The tiny model with a short plateau and a tau within 600 steps: cheap enough for an ensemble.
TINY = get_preset("tiny").replace(lr=3e-3, stop_after_tau=1.5, max_steps=600, eval_every=10, ckpt_every=10,
                                  n_b=40, K=8)


def test_an_adaptive_ensemble_keeps_each_members_own_window(tmp_path, one_thread):
    cfgs = [TINY.replace(seed=s, checkpoints="adaptive", coarse_every=100) for s in (0, 1)]
    train_ensemble(cfgs, [tmp_path / "s0", tmp_path / "s1"], device="cpu", progress=False)
    for name in ("s0", "s1"):
        run = Run(tmp_path / name)
        assert set(run.steps) == expected_steps(run, 100)


def test_a_run_resumes_with_the_policy_it_started_with(tmp_path, tiny_run, caplog):
    # A dense run (or one from before the policy existed) resumed as adaptive keeps every checkpoint.
    tiny = get_preset("tiny")
    train(tiny, tmp_path / "r", device="cpu", progress=False, stop_at_step=23)
    with caplog.at_level("INFO"):
        train(tiny.replace(checkpoints="adaptive", coarse_every=10), tmp_path / "r", resume=True, device="cpu",
              progress=False)
    assert "resumed with its own checkpoint policy (checkpoints=dense, coarse_every=100)" in caplog.text
    assert Run(tmp_path / "r").steps == Run(tiny_run).steps
    assert rd.read_json(tmp_path / "r" / rd.CONFIG_FILE)["run"]["train"]["checkpoints"] == "dense"


@pytest.mark.parametrize("options, message", [
    ({"checkpoints": "sparse"}, "checkpoints must be one of dense, adaptive"),
    ({"checkpoints": "adaptive", "coarse_every": 25}, "coarse_every=25 must be a multiple of ckpt_every=10"),
])
def test_bad_policies_get_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        TINY.replace(**options).validate()
