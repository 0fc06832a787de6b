"""The analysis over the series: selector rule, t_form / lead arithmetic, the cache, the CLI."""

import json

import numpy as np
import pytest

from plateauscope.analysis import formation as sel
from plateauscope.analysis.analyze import (
    AnalysisSettings,
    analyze_run,
    exact_steps,
    load_analysis,
)
from plateauscope.analysis.circuit import VERDICTS
from plateauscope.analysis.results import (
    ABLATION_FILE,
    ATTENTION_FILE,
    CIRCUIT_FILE,
    PATCH_FILE,
    ROUTING_FILE,
    analysis_dir,
    pick_steps,
)
from plateauscope.cli.analyze import main
from plateauscope.runs.run import Run, RunError
from tests.conftest import copy_run


def test_pick_routing_head_rule():
    attn = [[0.9, 0.1], [0.2, 0.6]]
    effect = [[-0.5, 0.9], [0.1, 0.8]]  # L0H0 looks at z but its patch hurts: not the selector
    (layer, head), scores = sel.pick_routing_head(attn, effect)
    assert (layer, head) == (1, 1)
    assert scores[0][0] == 0.0 and scores[1][1] == pytest.approx(0.48)
    # NaN effects (a plateau checkpoint) fall back to attention alone
    assert sel.pick_routing_head(attn, [[None, None], [None, None]])[0] == (0, 0)


def test_formation_step_and_lead_fraction_by_hand():
    steps = [0, 10, 20, 30, 40, 50]
    values = [0.1, 0.1, 0.2, 0.35, 0.5, 0.5]  # halfway from 0.1 to 0.5 is 0.3: first reached at 30
    form = sel.formation_step(steps, values, start_step=0)
    assert form["t_form"] == 30 and form["t_form_bracket"] == [20, 30]
    lead = sel.lead_fraction(tau=60, tau_lo=50, t_form=30, t_lo=20)
    assert lead["lead_fraction"] == pytest.approx(0.5)
    assert lead["lead_bracket"] == pytest.approx([(50 - 30) / 50, (60 - 20) / 60])
    assert sel.formation_step(steps, values[::-1])["t_form"] is None  # never rises
    assert sel.lead_fraction(None, None, 30, 20)["lead_fraction"] is None


def test_step_choice():
    assert pick_steps([0, 5, 10, 15, 20, 25], every=2) == [0, 10, 20, 25]
    with pytest.raises(RunError, match="no checkpoint at step"):
        pick_steps([0, 5], steps=[3])
    chosen = exact_steps(list(range(0, 1000, 10)), 4, landmarks=[505])
    # 100 steps: linspace(0, 99, 4) picks indices 0, 33, 66, 99; 505 is as near 500 as 510, and the
    # first of the two wins.
    assert chosen == [0, 330, 500, 660, 990]


SMALL = AnalysisSettings(n_examples=128, ablation_groups=4)


@pytest.fixture(scope="module")
def analysed_run(ci_run, tmp_path_factory):
    """A private copy of the session's ci run (every 10th checkpoint), analysed with SMALL settings."""
    run = Run(ci_run)
    out = copy_run(ci_run, tmp_path_factory.mktemp("analyse") / "ci", steps=run.steps[::10] + run.steps[-1:])
    return out, analyze_run(out, n_exact=5, settings=SMALL, progress=False)


def test_series_end_to_end_on_the_ci_run(analysed_run):
    path, analysed = analysed_run
    run = Run(path)
    log_k = run.log_k
    first_below = next(r["step"] for r in run.metrics() if r["candidate_loss"] < 0.5 * log_k)
    assert analysed["tau"] == first_below
    assert analysed["t_form"] is not None and 0 <= analysed["t_form"] <= run.steps[-1]
    lo, hi = analysed["lead_bracket"]
    assert lo <= analysed["lead_fraction"] <= hi
    assert 0 < analysed["lead_fraction"] < 1  # the head forms during the plateau, before the drop
    layer, head = analysed["head"]
    cache = load_analysis(path)
    series = {r["step"]: r["to_z_first"][layer][head] for r in cache["attention"]}
    assert series[analysed["t_form"]] >= analysed["start_value"] + 0.5 * (analysed["final_value"] - analysed["start_value"])
    # The agreement rows hold the largest |exact - attribution| difference of the cached head patching.
    attribution = {r["step"]: r for r in cache["attribution"]}
    assert analysed["agreement"]
    for a in analysed["agreement"]:
        exact = next(r for r in cache["patch"] if r["step"] == a["step"])["heads"]["raw"]
        approx = attribution[a["step"]]["heads"]["raw"]
        assert a["max_abs_err"] == pytest.approx(float(np.abs(np.subtract(exact, approx)).max()), rel=1e-5, abs=1e-6)
    check_circuit_against_patching(cache, analysed)
    # After the drop, the selector head matters: zero-ablating it costs candidate loss.
    end = analysed["ablation"]["end"]
    assert end["zero_ablated"] > end["unablated"]


def check_circuit_against_patching(cache, analysed):
    """The circuit's shares are the cached exact head patching's positive effects over their sum, at the
    same steps; the steps with exact patching only are those of the patch-share bisection (one may
    also be tau/2, where head ablation alone runs)."""
    circuit = {r["step"]: r for r in cache["circuit"]}
    patched = {r["step"] for r in cache["patch"]}
    plan = analysed["plan"]["steps"]
    bisection_only = {int(s) for s, why in plan.items() if all(w.startswith("bisecting") for w in why)}
    # a step only bisected or only ablated (tau/2) has no circuit record; a bisected one is patched
    partial = {int(s) for s, why in plan.items() if all(w.startswith(("bisecting", "tau/2 (head ablation only)"))
                                                        for w in why)}
    assert set(circuit) == patched - partial and bisection_only <= patched
    for p in cache["patch"]:
        if p["step"] not in circuit:
            continue
        heads = p["heads"]
        sign = 1.0 if heads["clean_metric"] >= heads["corrupt_metric"] else -1.0
        pos = np.clip((np.asarray(heads["raw"], dtype=float) - heads["corrupt_metric"]) * sign, 0.0, None)
        expected = pos / pos.sum() if pos.sum() > 0 else np.zeros_like(pos)
        np.testing.assert_allclose(circuit[p["step"]]["shares"]["share"], expected, atol=1e-9)
    last = max(circuit)
    after = analysed["tau"] is not None and last >= analysed["tau"]
    assert (analysed["circuit"]["verdict"] != "none") == after and analysed["circuit"]["step"] == last


def test_cache_is_reused_and_extended(analysed_run):
    path, analysed = analysed_run
    folder = analysis_dir(path)
    before = {f: (folder / f).read_text() for f in (ATTENTION_FILE, PATCH_FILE, ABLATION_FILE)}
    again = analyze_run(path, n_exact=5, settings=SMALL, progress=False)
    assert {f: (folder / f).read_text() for f in before} == before  # nothing recomputed
    assert again["head"] == analysed["head"] and again["t_form"] == analysed["t_form"]
    extra = Run(path).steps[1]
    analyze_run(path, steps=[extra], n_exact=0, settings=SMALL, progress=False)
    steps = [json.loads(line)["step"] for line in (folder / ATTENTION_FILE).read_text().splitlines()]
    assert steps.count(extra) == 1 and (folder / ATTENTION_FILE).read_text().startswith(before[ATTENTION_FILE])


def test_other_settings_recompute_and_keep_both(ci_run, tmp_path):
    run = Run(ci_run)
    steps = [run.steps[0], run.steps[-1]]
    path = copy_run(ci_run, tmp_path / "ci", steps=steps)
    folder = analysis_dir(path)
    first = analyze_run(path, n_exact=1, settings=AnalysisSettings(n_examples=32, ablation_groups=2), progress=False)
    n_lines = len((folder / ATTENTION_FILE).read_text().splitlines())
    second = analyze_run(path, n_exact=1, settings=AnalysisSettings(n_examples=48, ablation_groups=2),
                         progress=False)
    attention = [json.loads(line) for line in (folder / ATTENTION_FILE).read_text().splitlines()]
    assert len(attention) == 2 * n_lines  # recomputed for the new settings, the old records kept
    assert sorted({r["settings"]["n_examples"] for r in attention}) == [32, 48]
    assert first["settings"]["n_examples"] == 32 and second["settings"]["n_examples"] == 48
    # Records follow the settings asked for; by default those of the latest analysis (routing.json).
    new = load_analysis(path)
    assert json.loads((folder / ROUTING_FILE).read_text())["settings"]["n_examples"] == 48
    assert all(r["settings"]["n_examples"] == 48 for r in new["attention"]) and new["routing"] is not None
    old = load_analysis(path, AnalysisSettings(n_examples=32, ablation_groups=2))
    assert [r["step"] for r in old["attention"]] == steps and old["routing"] is None
    # Patching with 32 pairs and with 48 gives different numbers: the cache did not hand back the old ones.
    assert old["patch"][-1]["heads"]["n_pairs"] == 32 and new["patch"][-1]["heads"]["n_pairs"] == 48
    # Only ablation depends on ablation_groups: changing it recomputes ablation alone.
    analyze_run(path, n_exact=1, settings=AnalysisSettings(n_examples=48, ablation_groups=3), progress=False)
    assert len((folder / ATTENTION_FILE).read_text().splitlines()) == 2 * n_lines
    assert {json.loads(line)["settings"]["ablation_groups"]
            for line in (folder / ABLATION_FILE).read_text().splitlines()} == {2, 3}


def test_analyze_cli_errors(tmp_path, capsys, ci_run):
    assert main(["--run", str(tmp_path / "nope"), "--no-progress"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["--run", str(ci_run), "--steps", "7777", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint at step(s) 7777" in err and len(err.splitlines()) == 1
    assert main(["--run", str(ci_run), "--every", "0"]) == 2
    for flags, message in ((["--edge-target", "0"], "--edge-target must be in (0, 1]"),
                           (["--circuit-pairs", "0"], "--circuit-pairs must be at least 1"),
                           (["--n-exact-edges", "-1"], "--n-exact-edges must be at least 0"),
                           (["--workers", "0"], "--workers must be at least 1"),
                           (["--follow", "--workers", "2"], "not with --steps, --every, --full or --workers")):
        capsys.readouterr()
        assert main(["--run", str(ci_run), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


def test_view_cli_errors(tmp_path, capsys, tiny_run):
    from plateauscope.cli.view import main as view_main

    assert view_main(["--run", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    path = copy_run(tiny_run, tmp_path / "tiny")
    analyze_run(path, settings=AnalysisSettings(n_examples=16, ablation_groups=2), progress=False, edges=False)
    assert view_main(["--run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no edge analysis; run plateauscope analyze" in err and len(err.splitlines()) == 1
    assert view_main(["--run", str(path), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert view_main(["--run", str(path), "--every", "0"]) == 2
    assert "--every must be at least 1" in capsys.readouterr().err


def test_edge_cache_follows_its_settings(tiny_run, tmp_path):
    """Edge attribution is cached at every analysed step, the faithful circuit and the exact edges at
    the expensive pass's steps; a second call computes nothing; another faithfulness target recomputes
    the circuits (and nothing else) and keeps both; the full plan searches the circuit at every step."""
    import dataclasses

    from plateauscope.analysis.results import EDGE_CIRCUIT_FILE, EDGE_EXACT_FILE, EDGES_FILE, PATTERNS_FILE
    from plateauscope.runs.run import read_jsonl

    run = Run(tiny_run)
    steps = run.steps
    path = copy_run(tiny_run, tmp_path / "tiny", steps=steps)
    folder = analysis_dir(path)
    base = AnalysisSettings(n_examples=16, ablation_groups=2)

    def steps_of(file: str) -> list[int]:
        return [r["step"] for r in read_jsonl(folder / file)]

    summary = analyze_run(path, n_exact=1, settings=base, progress=False)
    assert steps_of(EDGES_FILE) == steps_of(PATTERNS_FILE) == steps
    exact = steps_of(EDGE_EXACT_FILE)
    planned = summary["plan"]["steps"]  # step -> why; a step picked only to bisect t_form runs exact patching only
    patch_only = {int(s) for s, why in planned.items() if all(w.startswith("bisecting") for w in why)}
    assert sorted(steps_of(PATCH_FILE)) == sorted(map(int, planned))
    assert exact == steps_of(EDGE_CIRCUIT_FILE) == sorted(set(map(int, planned)) - patch_only)
    assert steps[-1] in exact
    before = {f.name: f.read_text() for f in folder.iterdir() if f.suffix == ".jsonl"}
    analyze_run(path, n_exact=1, settings=base, progress=False)
    assert {f.name: f.read_text() for f in folder.iterdir() if f.suffix == ".jsonl"} == before
    analyze_run(path, n_exact=1, settings=dataclasses.replace(base, edge_target=0.5), progress=False)
    after = {f.name: f.read_text() for f in folder.iterdir() if f.suffix == ".jsonl"}
    assert {name for name in after if after[name] != before[name]} == {EDGE_CIRCUIT_FILE}
    assert len(read_jsonl(folder / EDGE_CIRCUIT_FILE)) == 2 * len(exact)
    analyze_run(path, n_exact=1, settings=base, progress=False, full=True)
    assert sorted(set(steps_of(EDGE_CIRCUIT_FILE))) == steps


def test_circuit_cache_follows_its_settings(tiny_run, tmp_path):
    """The circuit cache is keyed on its settings: another ablation kind recomputes it (and nothing else);
    the smoothing window only changes the summary, which records it."""
    run = Run(tiny_run)
    steps = [run.steps[0], run.steps[-1]]
    path = copy_run(tiny_run, tmp_path / "tiny", steps=steps)
    folder = analysis_dir(path)
    base = AnalysisSettings(n_examples=16, ablation_groups=2)
    first = analyze_run(path, n_exact=2, settings=base, progress=False)
    circuit = [json.loads(line) for line in (folder / CIRCUIT_FILE).read_text().splitlines()]
    assert [r["step"] for r in circuit] == steps and all(r["ablation"]["kind"] == "cue_mean" for r in circuit)
    assert first["circuit"]["verdict"] in VERDICTS
    assert set(first["t_form_rules"]) == set(sel.RULES) and first["smoothing"]["window"] == 1
    others = {f: (folder / f).read_text() for f in (ATTENTION_FILE, PATCH_FILE, ABLATION_FILE)}
    second = analyze_run(path, n_exact=2, settings=AnalysisSettings(16, 0, 2, circuit_ablation="zero"), progress=False)
    kinds = [json.loads(line)["ablation"]["kind"] for line in (folder / CIRCUIT_FILE).read_text().splitlines()]
    assert kinds == ["cue_mean", "cue_mean", "zero", "zero"]  # recomputed, the old records kept
    assert {f: (folder / f).read_text() for f in others} == others
    assert second["circuit"]["chosen"]["kind"] == "zero"
    before = (folder / CIRCUIT_FILE).read_text()
    smoothed = analyze_run(path, n_exact=2, settings=AnalysisSettings(16, 0, 2, smooth=3), progress=False)
    assert (folder / CIRCUIT_FILE).read_text() == before and smoothed["smoothing"]["window"] == 3
    assert json.loads((folder / ROUTING_FILE).read_text())["settings"]["smooth"] == 3


def test_an_older_analysis_summary_is_read_and_then_replaced(tiny_run, tmp_path):
    """Run directories analysed before the summary was renamed hold ``analysis/selector.json``: it is
    read as the summary, and the next analysis writes ``routing.json`` in its place."""
    from plateauscope.analysis.results import LEGACY_ROUTING_FILE
    from plateauscope.views.report import write_report

    run = Run(tiny_run)
    path = copy_run(tiny_run, tmp_path / "tiny", steps=[run.steps[0], run.steps[-1]])
    folder = analysis_dir(path)
    settings = AnalysisSettings(n_examples=16, ablation_groups=2)
    summary = analyze_run(path, n_exact=1, settings=settings, progress=False, edges=False)
    # the older file spoke the selector task's words: write it with those keys
    new = json.loads((folder / ROUTING_FILE).read_text())
    older = json.loads(json.dumps(new)
                       .replace('"height"', '"log_k"').replace('"unablated"', '"base_candidate_loss"')
                       .replace('"zero_ablated"', '"zero_candidate_loss"').replace('"cue_effect"', '"delta_z"')
                       .replace('"reads_cue"', '"reads_z"').replace('"progress"', '"candidate_loss"'))
    assert "log_k" in older and "delta_z" in older["t_form_rules"] and "reads_z" in older["circuit"]
    (folder / LEGACY_ROUTING_FILE).write_text(json.dumps(older))
    (folder / ROUTING_FILE).unlink()
    read = load_analysis(path)["routing"]
    assert read == new and read["height"] == summary["height"]
    assert read["ablation"]["end"]["unablated"] == summary["ablation"]["end"]["unablated"]
    assert write_report(path).exists()  # the report finds the older summary
    analyze_run(path, n_exact=1, settings=settings, progress=False, edges=False)
    assert (folder / ROUTING_FILE).exists() and not (folder / LEGACY_ROUTING_FILE).exists()


def test_workers_write_the_records_of_one(tiny_run, tmp_path):
    """The cheap pass's checkpoints analysed side by side on two threads write the same cache files, byte for
    byte and in step order, as one checkpoint at a time (torch on one thread in each worker, and in the serial
    run, so the arithmetic is the same); the pool gives torch its threads back; a worker's error reaches the
    caller after the steps before it are written. (The expensive pass runs one checkpoint at a time on the
    process's threads, so its floats round as the thread count says: on some CPUs 1 and 2 threads differ in
    the last bits, which is not the workers' doing.)"""
    import torch

    run = Run(tiny_run)
    settings = AnalysisSettings(n_examples=16, ablation_groups=2)
    files = {}
    threads = torch.get_num_threads()
    try:
        for workers in (1, 2):
            torch.set_num_threads(workers)  # 2 workers: one thread each
            path = copy_run(tiny_run, tmp_path / f"w{workers}", steps=run.steps)
            analyze_run(path, settings=settings, progress=False, workers=workers, expensive=False)
            files[workers] = {f.name: f.read_bytes() for f in analysis_dir(path).iterdir() if f.suffix == ".jsonl"}
            assert torch.get_num_threads() == workers
    finally:
        torch.set_num_threads(threads)
    assert files[1] == files[2] and len(files[1]) == 5  # attention, attribution, edges, patterns, measures
    broken = copy_run(tiny_run, tmp_path / "broken", steps=run.steps)
    last = Run(broken).checkpoint_path(run.steps[-1])
    last.unlink()  # a hard link to the session's run: replaced, not written through
    last.write_bytes(b"not a checkpoint")
    with pytest.raises(RunError):
        analyze_run(broken, settings=settings, progress=False, workers=2, expensive=False)
    assert [r["step"] for r in load_analysis(broken, settings)["attention"]] == run.steps[:-1]
