"""Shared fixtures: every generator seeded before each test; one `ci` run per session."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from training.presets import get_preset
from training.train import train


@pytest.fixture(autouse=True)
def seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory):
    """The `ci` preset trained once for the whole session (about a minute on 2 cores)."""
    out = tmp_path_factory.mktemp("runs") / "ci"
    train(get_preset("ci"), out, device="cpu", progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    train(get_preset("tiny"), out, device="cpu", progress=False)
    return out


@pytest.fixture(scope="session")
def ci_analysed(ci_run):
    """The session's `ci` run with its analysis cache (every 10th checkpoint, 6 exact steps)."""
    from interp.analyze import analyze_run

    analyze_run(ci_run, every=10, n_exact=6, progress=False)
    return ci_run


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """The `tiny` sweep (D = 80, 160, 320 x seeds 0, 1; every run past its tau), trained once per
    session in this process with one torch thread (about 5 s)."""
    from training.sweep import get_sweep, run_sweep

    out = tmp_path_factory.mktemp("sweeps") / "tiny"
    outcomes = run_sweep(get_sweep("tiny"), out, executor="serial", threads=1, progress=False)
    assert all(o["status"] == "done" for o in outcomes), outcomes
    return out
