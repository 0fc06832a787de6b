"""Shared fixtures: every generator seeded before each test; one `ci` and one `tiny` run, and the
`tiny` and `plateau-interventions-tiny` sweeps, per session.

The session runs are read-only for the tests: a test that writes into a run directory (an
analysis cache, a report) works on its own copy (:func:`copy_run`), so no test sees what another
one wrote, whatever the order.

``make test`` runs the suite on pytest-xdist workers (``-n 2 --dist loadfile``: a module's tests on one
worker, so its module fixtures are built once). Each worker gets an equal share of the cores' torch
threads, and the session's runs are built once for all of them (:func:`built_once`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from filelock import FileLock

from plateauscope.analysis.results import ANALYSIS_DIR
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.training.train import train


def pytest_configure(config):
    """On a pytest-xdist worker: the cores' torch threads shared between the workers, in this process and in
    the processes its tests start."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        from plateauscope.processes import available_cores

        threads = max(1, available_cores() // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """A session run or sweep, ``build(out)`` (its return value: JSON data), made once per test session.

    Under pytest-xdist the first worker that needs it builds it into the session's shared folder while
    the others wait on a file lock, then every worker reads it there (the session's runs are read-only)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        out = tmp_path_factory.mktemp("runs") / name
        return out, build(out)
    shared = tmp_path_factory.getbasetemp().parent / "session-runs"
    shared.mkdir(exist_ok=True)
    out, done = shared / name, shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            data = build(out)
            done.with_suffix(".part").write_text(json.dumps(data))
            done.with_suffix(".part").replace(done)
    return out, json.loads(done.read_text())


def pytest_collection_modifyitems(config, items):
    """Tests that train or analyse a session run, execute notebooks or drive the browser are ``slow``
    (``make test-fast`` runs the others)."""
    slow_fixtures = {"ci_run", "ci_analysed", "tiny_sweep"}
    for item in items:
        if slow_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    """The headless browser of the browser tests; they skip, loudly, only when none is installed."""
    from tests.views.test_report_browser import find_browser

    path = find_browser()
    if path is None:
        pytest.skip("CHROMIUM NOT INSTALLED: the browser tests did not run "
                    "(apt-get install chromium, or let .ci/run install it)")
    return path


@pytest.fixture(autouse=True)
def seed_everything():
    """Seed Python's, NumPy's and torch's generators before every test."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One torch thread: same numbers need the same thread count (parallel reductions round
    differently), and tiny models are fastest, and far faster on a loaded machine, on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def copy_run(src: Path, dst: Path, steps: list[int] | None = None, with_analysis: bool = False) -> Path:
    """A private copy of a run directory (``steps``: only those checkpoints; its analyses if asked).

    Checkpoints are hard links: a run never rewrites a checkpoint in place (writes are atomic
    renames), so sharing them is safe and costs nothing.
    """
    dst.mkdir(parents=True)
    for name in (rd.CONFIG_FILE, rd.DATASET_FILE, rd.METRICS_FILE, rd.SUMMARY_FILE, rd.CHECKSUMS_FILE):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    (dst / rd.CHECKPOINT_DIR).mkdir()
    keep = None if steps is None else {rd.checkpoint_name(s) for s in steps}
    for ckpt in (src / rd.CHECKPOINT_DIR).iterdir():
        if keep is None or ckpt.name in keep:
            os.link(ckpt, dst / rd.CHECKPOINT_DIR / ckpt.name)
    if with_analysis and (src / ANALYSIS_DIR).is_dir():
        shutil.copytree(src / ANALYSIS_DIR, dst / ANALYSIS_DIR)
    return dst


def trained(preset: str) -> Callable[[Path], None]:
    """A builder for :func:`built_once`: the preset trained into its folder."""
    def build(out: Path) -> None:
        train(get_preset(preset), out, device="cpu", progress=False)
    return build


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory):
    """The `ci` preset trained once for the whole session (about a minute on 2 cores)."""
    return built_once(tmp_path_factory, "ci", trained("ci"))[0]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The `tiny` preset trained once for the whole session (a second)."""
    return built_once(tmp_path_factory, "tiny", trained("tiny"))[0]


@pytest.fixture(scope="session")
def ci_analysed(ci_run, tmp_path_factory):
    """A copy of the session's `ci` run with its analysis cache (every 10th checkpoint, 6 exact steps)."""
    from plateauscope.analysis.analyze import analyze_run

    def build(out: Path) -> None:
        analyze_run(copy_run(ci_run, out), every=10, n_exact=6, progress=False)

    return built_once(tmp_path_factory, "ci_analysed", build)[0]


@pytest.fixture(scope="session")
def interventions_sweep(tmp_path_factory):
    """The `plateau-interventions-tiny` sweep (2 seeds, 14 runs) trained once per session in this
    process with one torch thread, and its outcomes (about 20 s)."""
    from plateauscope.sweeps.catalogue import get_sweep
    from plateauscope.sweeps.executors import run_sweep

    return built_once(tmp_path_factory, "plateau-interventions-tiny", lambda out: run_sweep(
        get_sweep("plateau-interventions-tiny"), out, executor="serial", threads=1, progress=False))


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """The `tiny` sweep (D = 80, 160, 320 x seeds 0, 1; every run past its tau), trained once per
    session in this process with one torch thread (about 5 s)."""
    from plateauscope.sweeps.catalogue import get_sweep
    from plateauscope.sweeps.executors import run_sweep

    out, outcomes = built_once(tmp_path_factory, "tiny-sweep", lambda out: run_sweep(
        get_sweep("tiny"), out, executor="serial", threads=1, progress=False))
    assert all(o["status"] == "done" for o in outcomes), outcomes
    return out
