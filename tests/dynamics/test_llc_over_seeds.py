"""The LLC's departure from its plateau value over seeds (plateauscope.dynamics.llc): known answers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from plateauscope.analysis.results import LLC_SUMMARY_FILE, analysis_dir
from plateauscope.cli import dynamics as dynamics_cli
from plateauscope.cli.text.dynamics import llc_summary_lines
from plateauscope.dynamics import llc as LS
from plateauscope.dynamics.sweep import sweep_runs
from plateauscope.runs.run import Run
from tests.analysis.test_llc import TINY, needs_devinterp

STEPS = list(range(0, 1001, 20))


def series(rise_at: int, noise: float = 0.1, seed: int = 0) -> list[float]:
    """Flat at 5 (+- noise) up to ``rise_at``, then a ramp of 1 per 20 steps."""
    rng = np.random.default_rng(seed)
    return [5 + noise * rng.standard_normal() + max(0, (s - rise_at) / 20) for s in STEPS]


def loss_records(fall_at: int) -> list[dict]:
    """3.6 up to ``fall_at``, then 1.2% lower per 10 steps."""
    return [{"step": s, "loss": 3.6 * (1 - 0.0012 * max(0, s - fall_at))} for s in range(0, 1001, 10)]


def test_departure_and_loss_fall_by_hand():
    llc = series(rise_at=400)
    d = LS.llc_departure(STEPS, llc, (0, 250))
    base = [v for s, v in zip(STEPS, llc) if s <= 250]
    assert d["baseline_n"] == 13 and d["baseline_mean"] == pytest.approx(np.mean(base))
    limit = np.mean(base) + 3 * np.std(base, ddof=1)
    assert d["t_llc"] == next(s for s, v in zip(STEPS, llc) if s > 250 and v > limit)
    assert 400 < d["t_llc"] <= 440  # the ramp clears 3 sd of 0.1 within two checkpoints
    # One checkpoint above the limit is not a departure; two in a row are.
    spiked = [v + (10.0 if s == 300 else 0.0) for s, v in zip(STEPS, llc)]
    assert LS.llc_departure(STEPS, spiked, (0, 250))["t_llc"] == d["t_llc"]
    assert LS.llc_departure(STEPS, spiked, (0, 250), consecutive=1)["t_llc"] == 300
    assert LS.llc_departure(STEPS, llc, (0, 30))["t_llc"] is None  # two values: no plateau value
    # The loss falls 1.2% per 10 steps from 600: 4.8% below its plateau mean at 640, 6% at 650.
    assert LS.loss_fall_step(loss_records(600), (0, 250)) == 650
    assert LS.loss_fall_step(loss_records(2000), (0, 250)) is None
    assert LS.loss_fall_at(loss_records(600), (0, 250), 655) == pytest.approx(0.06)
    assert LS.loss_fall_at(loss_records(600), (0, 250), None) is None
    assert LS.plateau_window([10, 510]) == (10, 260) and LS.plateau_window(None) is None


def rows_for(rises: list[int], falls: list[int], tau: int = 1000) -> list[dict]:
    return [{"name": f"s{i}", "seed": i, "tau": tau, "t_llc": r, "t_loss": f, "loss_fall_at_llc": 0.01,
             "t_form_attention": 300,
             "t_form_patch_share": 400, "t_form_cue_effect": 200} for i, (r, f) in enumerate(zip(rises, falls))]


@pytest.mark.parametrize("rises, falls", [
    ([300, 320, 340, 360, 380], [500, 520, 540, 560, 580]),
    ([600, 620, 640, 660, 680], [500, 520, 540, 560, 580]),
    ([500], [400]),
])
def test_summary_gives_medians_with_their_order_statistic_interval_and_reads_no_lead(rises, falls):
    s = LS.llc_summary(rows_for(rises, falls))
    q = s["quantities"]["(t_llc - t_loss) / tau"]
    assert q["median"] == pytest.approx(np.median(np.subtract(rises, falls)) / 1000)
    differences = sorted(np.subtract(rises, falls) / 1000)
    if len(rises) == 5:  # the range of 5 values: 93.75% coverage for the median, stated as such
        assert (q["ci"].low, q["ci"].high) == pytest.approx((differences[0], differences[-1]))
        assert q["ci"].coverage == pytest.approx(0.9375)
    else:
        assert q["ci"] is None
    assert s["quantities"]["(t_llc - t_form attention) / tau"]["median"] == pytest.approx(
        (np.median(rises) - 300) / 1000)
    text = "\n".join(llc_summary_lines(s))
    assert "who moves first is not read" in text and "leads" not in text
    assert ("93.75% order statistics interval (n = 5)" in text) == (len(rises) == 5)


def write_llc(run_dir, steps: list[int], llc: list[float]) -> None:
    """An llc.json as plateauscope.analysis.llc writes it (only the fields the sweep summary reads)."""
    run = Run(run_dir)
    analysis_dir(run_dir).mkdir(exist_ok=True)
    tau = (run.summary or {})["tau"]
    (analysis_dir(run_dir) / LLC_SUMMARY_FILE).write_text(
        json.dumps({"steps": steps, "llc": llc, "tau": tau, "all_stationary": True}))


def test_rows_of_a_sweep_read_each_runs_llc_and_plateau(tiny_sweep, tmp_path):
    """Each run gets a planted LLC (flat, then 5 higher after ``rise``) and a planted loss (2.0, then
    1.0 from ``fall``): the rows must find those steps."""
    sweep_dir = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    runs = [sweep_dir / name for name in sweep_runs(sweep_dir)[1]]
    planted = {}
    for i, path in enumerate(runs[1:]):  # the first run has no LLC: it has no row
        run = Run(path)
        if i % 2:  # a plateau long enough for a plateau value (the tiny runs' own are a few checkpoints)
            summary = {**run.summary, "plateau_stretch": [0, run.summary["tau"]]}
            (path / "summary.json").write_text(json.dumps(summary))
        rise = (run.plateau_stretch() or [0, run.summary["tau"] // 2])[1]
        write_llc(path, run.steps, [1.0 + 0.01 * (k % 2) + (5.0 if s > rise else 0.0)
                                      for k, s in enumerate(run.steps)])
        records = run.metrics()
        fall = records[len(records) * 3 // 4]["step"]
        (path / "metrics.jsonl").write_text("".join(json.dumps({**r, "loss": 2.0 if r["step"] < fall else 1.0}) + "\n"
                                                   for r in records))
        planted[path.name] = rise, fall
    rows = LS.llc_rows(sweep_dir)
    assert [r["name"] for r in rows] == [p.name for p in runs[1:]]
    for r, path in zip(rows, runs[1:]):
        run, (rise, fall) = Run(path), planted[path.name]
        window = LS.plateau_window(run.summary["plateau_stretch"])
        assert r["window"] == window and r["tau"] == run.summary["tau"]
        if window is None:
            assert r["t_llc"] is None and r["t_loss"] is None
            continue
        enough = sum(window[0] <= s <= window[1] for s in run.steps) >= LS.MIN_BASELINE
        assert r["t_llc"] == (next(s for s in run.steps if s > max(rise, window[1])) if enough else None)
        evaluated = [rec["step"] for rec in run.metrics()]
        assert r["t_loss"] == next(s for s in evaluated if s > window[1] and s >= fall)
        if r["t_llc"] is not None:
            last = max(s for s in evaluated if s <= r["t_llc"])
            assert r["loss_fall_at_llc"] == pytest.approx(0.5 if last >= fall else 0.0)
    assert any(r["t_llc"] is not None for r in rows)


@needs_devinterp
def test_llc_over_a_sweep_from_the_command_line(tiny_sweep, tmp_path, capsys):
    sweep_dir = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    assert dynamics_cli.main(["--sweep", str(sweep_dir), "--llc", "0"]) == 2
    assert "--llc must be at least 1" in capsys.readouterr().err
    done = dynamics_cli.llc_all(sweep_dir, every=20, settings=TINY, progress=False)
    assert len(done) == len(LS.llc_rows(sweep_dir)) == 6
    assert dynamics_cli.main(["--sweep", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "the LLC against the training loss" in out and "(t_llc - t_loss) / tau" in out
