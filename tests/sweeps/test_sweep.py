"""Sweeps: names and points, idempotence and resume, and the same numbers from every executor
(local pool, submitit's local executor, in-process) and from a seed ensemble."""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from plateauscope.cli.sweep import main
from plateauscope.errors import ConfigError
from plateauscope.model.backend import default_backend
from plateauscope.runs import run as rd
from plateauscope.runs.run import Run
from plateauscope.sweeps.catalogue import SWEEPS, get_sweep
from plateauscope.sweeps.executors import run_sweep
from plateauscope.sweeps.spec import SweepSpec, expand, run_name
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.train import train

ENSEMBLE_TOL = 1e-5
"""Ensemble members against solo runs with the hooked forward: vmap's batched matmuls may round
differently in the last float32 bits (on the tiny preset they agree exactly today), so metrics are
compared to 1e-5. With the fused forward (the default) a member runs a solo run's kernels: exact."""

# The tiny preset's machinery, 40 steps, no early stop: two seeds of one configuration.
TINY_2 = SweepSpec(name="tiny-2", base="tiny", fixed={"max_steps": 40}, grids=({"seed": (0, 1)},))


def _metrics(path):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in Run(path).metrics()]


def _close(a, b, tol):
    """Metric records equal, floats (and lists of floats) to ``tol``."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            va, vb = ra[k], rb[k]
            if isinstance(va, float) or (isinstance(va, list) and va and isinstance(va[0], float)):
                xs, ys = (va, vb) if isinstance(va, list) else ([va], [vb])
                assert all(math.isclose(x, y, rel_tol=tol, abs_tol=tol) for x, y in zip(xs, ys)), k
            else:
                assert va == vb, (k, va, vb)


def test_points_names_and_configs():
    assert run_name({"seed": 3, "lr": 0.003, "direction": "forward", "K": 10, "D": 5000, "batch_size": 64}) == \
        "forward_K10_D5000_lr0.003_bs64_seed3"
    points = expand(get_sweep("quick-k"))
    assert [p.cfg.task.n_b for p in points[::3]] == [1680, 504, 140]  # D = 5,040 for K = 3, 10, 36
    assert {p.cfg.task.D for p in points} == {5040} and points[0].cfg.train.stop_after_tau == 1.4
    # The batch block's default batch equals the lr block's default lr: one run, not two.
    noise = expand(get_sweep("quick-noise"))
    assert len(noise) == 14 and len({p.name for p in noise}) == 14
    assert [p.cfg.train.seed for p in expand(get_sweep("tiny"), seeds=[7])] == [7, 7, 7]
    # The seed ensembles vary the model / training seed and the data set's seed together.
    for name, preset in (("seeds-ci", "ci"), ("seeds-demo", "demo")):
        pts = expand(get_sweep(name))
        assert [(p.cfg.task.seed, p.cfg.model.seed, p.cfg.train.seed) for p in pts] == [(i, i, i) for i in range(5)]
        assert {p.cfg.preset for p in pts} == {preset} and pts[0].name == "ds0_seed0"
        assert len({p.cfg.task.seed for p in pts}) == 5  # five different data sets, not one
    for spec in SWEEPS.values():  # every shipped sweep expands to valid configs
        assert expand(spec)
    with pytest.raises(ConfigError, match="not a multiple of K"):
        expand(SweepSpec("bad", "tiny", ({"D": (81,)},)))
    with pytest.raises(ConfigError, match="unknown sweep preset"):
        get_sweep("nope")


def test_sweep_is_idempotent_and_resumes_a_killed_run(tmp_path, one_thread):
    out = tmp_path / "sweep"
    points = expand(TINY_2)
    # A run killed at step 23 (its last checkpoint is at 20), before the sweep ever ran.
    train(points[0].cfg, out / points[0].name, device="cpu", progress=False, stop_at_step=23)
    assert not (out / points[0].name / rd.SUMMARY_FILE).exists()
    first = run_sweep(TINY_2, out, executor="serial", threads=1, progress=False)
    assert [o["status"] for o in first] == ["done", "done"]
    # The resumed run has the numbers of an uninterrupted one.
    train(points[0].cfg, tmp_path / "ref", device="cpu", progress=False)
    assert _metrics(out / points[0].name) == _metrics(tmp_path / "ref")
    # Run again: nothing left to do, nothing rewritten.
    stamp = (out / points[1].name / rd.SUMMARY_FILE).stat().st_mtime_ns
    again = run_sweep(TINY_2, out, executor="serial", threads=1, progress=False)
    assert [o["status"] for o in again] == ["skipped", "skipped"]
    assert (out / points[1].name / rd.SUMMARY_FILE).stat().st_mtime_ns == stamp
    # More seeds extend the same sweep directory and its manifest.
    more = run_sweep(TINY_2, out, executor="serial", threads=1, progress=False, seeds=[1, 2])
    assert [o["status"] for o in more] == ["skipped", "done"]
    assert len(rd.read_json(out / "sweep.json")["points"]) == 3
    with pytest.raises(ConfigError, match="holds the sweep 'tiny-2'"):
        run_sweep(get_sweep("tiny"), out, executor="serial")


@pytest.mark.slow
def test_every_executor_and_the_ensemble_give_the_same_numbers(tmp_path, one_thread):
    outs = {}
    for executor, ensemble in [("serial", False), ("local", False), ("submitit-local", False), ("serial", True)]:
        out = tmp_path / f"{executor}{'-ensemble' if ensemble else ''}"
        outcomes = run_sweep(TINY_2, out, executor=executor, workers=2, ensemble=ensemble, threads=1, progress=False)
        assert [o["status"] for o in outcomes] == ["done", "done"], outcomes
        assert all(o["members"] == (2 if ensemble else 1) for o in outcomes)
        outs[out.name] = out
    for p in expand(TINY_2):
        ref = _metrics(outs["serial"] / p.name)
        assert _metrics(outs["local"] / p.name) == ref
        assert _metrics(outs["submitit-local"] / p.name) == ref
        assert _metrics(outs["serial-ensemble"] / p.name) == ref
        assert sorted(f.name for f in (outs["serial-ensemble"] / p.name).iterdir()) == \
            sorted(f.name for f in (outs["serial"] / p.name).iterdir())


def test_ensemble_equals_solo_runs_when_members_stop_apart_and_after_a_kill(tmp_path, tiny_sweep, one_thread):
    # The tiny sweep's D = 80 runs stop at 1.5 tau: seed 0 at step 110, seed 1 at step 90.
    names = ["D80_seed0", "D80_seed1"]
    cfgs = [Run(tiny_sweep / n).config for n in names]
    outs = [tmp_path / n for n in names]
    assert train_ensemble(cfgs, outs, device="cpu", progress=False, stop_at_step=50) == [{"stopped_at": 50}] * 2
    summaries = train_ensemble(cfgs, outs, resume=True, device="cpu", progress=False)
    for n, out, summary in zip(names, outs, summaries):
        solo = Run(tiny_sweep / n)
        assert summary["final_step"] == solo.summary["final_step"] and summary["tau"] == solo.summary["tau"]
        assert _metrics(out) == _metrics(solo.path)
        last = solo.steps[-1]
        a = rd.load_checkpoint(out / rd.CHECKPOINT_DIR / rd.checkpoint_name(last))[0]
        b = rd.load_checkpoint(solo.checkpoint_path(last))[0]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # A member's resume state is a solo run's: a solo `train(resume=True)` of a finished member is a no-op.
    again = train(cfgs[0], outs[0], resume=True, device="cpu", progress=False)
    assert again["final_step"] == summaries[0]["final_step"]
    with pytest.raises(ConfigError, match="differ in their seed only"):
        train_ensemble([cfgs[0], cfgs[0].replace(lr=1e-2)], [tmp_path / "x", tmp_path / "y"], device="cpu")


def test_hooked_ensemble_equals_solo_runs_to_float_rounding(tmp_path, one_thread):
    cfgs = [p.cfg.replace(forward="hooked") for p in expand(TINY_2)]
    outs = [tmp_path / f"ensemble{i}" for i in range(len(cfgs))]
    if default_backend() != "hooked":  # a vmap over HookedTransformer, which TransformerLens 4 removed
        with pytest.raises(ConfigError, match="forward=hooked trains a seed ensemble"):
            train_ensemble(cfgs, outs, device="cpu", progress=False)
        assert not any(o.exists() for o in outs)
        return
    train_ensemble(cfgs, outs, device="cpu", progress=False)
    for cfg, out in zip(cfgs, outs):
        solo = train(cfg, tmp_path / f"solo_{out.name}", device="cpu", progress=False)
        assert solo["final_step"] == Run(out).summary["final_step"]
        _close(_metrics(out), _metrics(tmp_path / f"solo_{out.name}"), ENSEMBLE_TOL)


def test_cli(tmp_path, capsys, monkeypatch):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SWEEPS) and "steps" in listed
    out = tmp_path / "s"
    assert main(["--base", "tiny", "--grid", "seed=0,1", "--set", "max_steps=3", "--out", str(out), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("to train") == 2
    cases = [
        (["--preset", "nope", "--out", str(out)], "unknown sweep preset"),
        (["--out", str(out)], "give --preset"),
        (["--preset", "tiny", "--grid", "K=3", "--out", str(out)], "not both"),
        (["--base", "tiny", "--grid", "K", "--out", str(out)], "expects KEY=VALUE"),
        (["--base", "tiny", "--grid", "bogus=1", "--out", str(out)], "no option named 'bogus': the selector task has"),
        (["--preset", "tiny", "--seeds", "a,b", "--out", str(out)], "invalid literal"),
        (["--preset", "tiny", "--workers", "0", "--out", str(out)], "--workers must be at least 1"),
    ]
    if shutil.which("srun") is None:  # submitit installed, but this is no Slurm cluster
        cases.append((["--preset", "tiny", "--executor", "slurm", "--out", str(tmp_path / "c"), "--no-progress"],
                      "are you indeed on a slurm cluster"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if the cluster extra were not installed
    assert main(["--preset", "tiny", "--executor", "slurm", "--out", str(tmp_path / "c"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs submitit: pip install 'plateauscope[cluster]'" in err[0], err


def test_marginal_search_grid():
    from plateauscope.sweeps.executors import plan_jobs

    points = expand(get_sweep("marginal-search"))
    variants = {p.cfg.task.variant_label() for p in points}
    assert len(points) == 30 and len(variants) == 10 and "default" in variants and "no_z=True" in variants
    assert "a_len=1,target_uniqueness=group,order=zb" in variants  # a pair: short A with z before B
    ci_model = get_sweep_model("ci")
    assert all(p.cfg.preset == "ci" and p.cfg.model == dataclasses.replace(ci_model, seed=p.cfg.model.seed)
               for p in points)
    assert sorted({p.cfg.train.seed for p in points}) == [0, 1, 2]
    jobs, done = plan_jobs(points, Path("/nonexistent"), ensemble=True)
    assert len(jobs) == 10 and all(len(j) == 3 for j in jobs) and not done  # one seed ensemble per variant
    tiny = expand(get_sweep("marginal-search-tiny"))
    assert {p.cfg.task.variant_label() for p in tiny} == variants


def get_sweep_model(preset):
    from plateauscope.runs.presets import get_preset

    return get_preset(preset).model


def test_a_killed_sweep_stops_its_workers(tmp_path):
    """SIGTERM to `plateauscope sweep` stops the spawned workers too: none goes on writing its run."""
    import signal
    import subprocess
    import time

    out = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-m", "plateauscope", "sweep", "--base", "tiny", "--grid", "seed=0,1",
                             "--set", "max_steps=1000000", "--set", "eval_every=5", "--out", str(out),
                             "--workers", "2", "--no-progress"],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    metrics = [out / name / rd.METRICS_FILE for name in ("seed0", "seed1")]
    deadline = time.monotonic() + 120
    while not all(m.exists() and m.stat().st_size > 0 for m in metrics):
        assert time.monotonic() < deadline and proc.poll() is None, "the workers never started"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted: run the same command again" in err
    time.sleep(1)
    sizes = [m.stat().st_size for m in metrics]
    time.sleep(3)
    assert [m.stat().st_size for m in metrics] == sizes  # nobody writes them any more
