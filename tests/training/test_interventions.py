"""Interventions during training (plateauscope.runs.interventions): the hidden cue and the zeroed heads are
checked by invariance (the outputs do not move when the hidden tokens or the zeroed heads' weights
do), in both forwards and in evaluation; a transplant is the donor's part and the run's own init
elsewhere, with both halves restored it is the donor at its logged loss; frozen weights stay put;
a killed intervention run resumes bit for bit; impossible requests are one line."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics

import pytest
import torch

from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.formation import RULES
from plateauscope.cli.text.dynamics import lead_table_text, reading
from plateauscope.cli.train import main
from plateauscope.dynamics.interventions import condition_label, intervention_rows, intervention_table, release_leads
from plateauscope.errors import ConfigError
from plateauscope.model.backend import build_model, hooked_parameters, load_hooked_state_dict
from plateauscope.model.fused import fused_logits
from plateauscope.runs import run as rd
from plateauscope.runs.interventions import Interventions, in_part, transplanted
from plateauscope.runs.presets import get_preset
from plateauscope.sweeps.executors import run_sweep
from plateauscope.sweeps.spec import SweepSpec, expand
from plateauscope.tasks.loading import build_task
from plateauscope.training.ensemble import train_ensemble
from plateauscope.training.train import evaluation_record, train

TOL = 1e-5


def _setup(preset: str = "ci", **train_options):
    cfg = get_preset(preset).replace(**train_options)
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=0)
    iv = Interventions.build(cfg.train, task, cfg.model.n_layers, cfg.model.n_heads)
    return cfg, task, model, iv


def _both_forwards(model, iv, tokens, step=0):
    with torch.no_grad():
        fused = fused_logits(model.cfg, hooked_parameters(model), tokens, **iv.fused_options(step))
        with iv.applied(model, step):
            hooked = model(tokens)
    return fused, hooked


def test_a_hidden_cue_is_invisible_in_both_forwards_until_its_release():
    cfg, task, model, iv = _setup(hide_cue_until=100)
    z0, z1 = task.layout.z_span
    assert iv.hidden_keys == tuple(range(z0, z1))
    tokens = task.tokens[:32, : task.input_len]
    other = tokens.clone()
    other[:, z0:z1] = tokens.roll(1, 0)[:, z0:z1]  # another group's selector in the same prompt
    fused, hooked = _both_forwards(model, iv, tokens)
    torch.testing.assert_close(fused, hooked, atol=TOL, rtol=TOL)
    fused_other, hooked_other = _both_forwards(model, iv, other)
    # Positions after z see no z at all (the z positions themselves read their own token's embedding).
    torch.testing.assert_close(hooked_other[:, z1:], hooked[:, z1:], atol=TOL, rtol=TOL)
    torch.testing.assert_close(fused_other[:, z1:], fused[:, z1:], atol=TOL, rtol=TOL)
    # From step 100 on, the cue is read again: the same swap moves the outputs.
    released, released_hooked = _both_forwards(model, iv, tokens, step=100)
    released_other, _ = _both_forwards(model, iv, other, step=100)
    torch.testing.assert_close(released, released_hooked, atol=TOL, rtol=TOL)
    assert (released_other[:, z1:] - released[:, z1:]).abs().max() > 1e-3
    assert not model.mod_dict["blocks.0.attn.hook_attn_scores"].fwd_hooks  # applied() leaves no hook behind


def test_evaluation_under_a_hidden_cue_logs_no_cue_effect():
    cfg, task, model, iv = _setup(hide_cue_until=100)
    evalset = task.build_evalset(8, 8, 0)
    with iv.applied(model, 0):
        hidden = evaluation_record(model, task, evalset, 0, cfg.train, 0.0)
    seen = evaluation_record(model, task, evalset, 0, cfg.train, 0.0)
    assert abs(hidden["delta_z"]) < 1e-5 < abs(seen["delta_z"])


def test_zeroed_heads_write_nothing_in_both_forwards():
    cfg, task, model, iv = _setup(masked_heads=("0.1", "1.3"))
    tokens = task.tokens[:16, : task.input_len]
    fused, hooked = _both_forwards(model, iv, tokens)
    torch.testing.assert_close(fused, hooked, atol=TOL, rtol=TOL)
    with torch.no_grad():  # the zeroed heads' own weights no longer matter
        for layer, head in ((0, 1), (1, 3)):
            for w in ("W_Q", "W_K", "W_V", "W_O"):
                getattr(model.blocks[layer].attn, w)[head].normal_()
    fused_moved, hooked_moved = _both_forwards(model, iv, tokens)
    torch.testing.assert_close(hooked_moved, hooked, atol=TOL, rtol=TOL)
    torch.testing.assert_close(fused_moved, fused, atol=TOL, rtol=TOL)
    plain, _ = _both_forwards(model, Interventions(), tokens)
    assert (plain - fused).abs().max() > 1e-3


@pytest.fixture(scope="module")
def donor_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("donor") / "run"
    train(get_preset("tiny"), out, device="cpu", progress=False)
    return out


def test_a_transplant_is_the_donors_part_on_the_runs_own_init(donor_run, tmp_path):
    donor_path = donor_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(40)
    donor, _ = rd.load_checkpoint(donor_path)
    init, _ = rd.load_checkpoint(donor_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(0))
    cfg = get_preset("tiny").replace(transplant="routing", donor=str(donor_path), freeze_transplant=True, max_steps=10)
    train(cfg, tmp_path / "t", device="cpu", progress=False)
    start, _ = rd.load_checkpoint(tmp_path / "t" / rd.CHECKPOINT_DIR / rd.checkpoint_name(0))
    end, _ = rd.load_checkpoint(tmp_path / "t" / rd.CHECKPOINT_DIR / rd.checkpoint_name(10))
    routing = [k for k in start if in_part(k, "routing")]
    assert {"embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q"} <= set(routing)
    for key in start:
        torch.testing.assert_close(start[key], (donor if in_part(key, "routing") else init)[key], atol=0, rtol=0)
        moved = not torch.equal(end[key], start[key])
        assert moved == (not in_part(key, "routing")) or key.endswith(("IGNORE", "mask")), key  # frozen: exact


def test_both_halves_restored_are_the_donor_at_its_logged_loss(donor_run):
    donor, step = rd.load_checkpoint(donor_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(40))
    init, _ = rd.load_checkpoint(donor_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(0))
    both = transplanted(transplanted(init, donor, "routing"), donor, "readout")
    assert all(torch.equal(both[k], donor[k]) for k in donor)
    cfg = get_preset("tiny")
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=1)
    load_hooked_state_dict(model, both)
    record = evaluation_record(model, task, task.build_evalset(cfg.train.eval_groups, cfg.train.tracked_groups,
                                                               cfg.train.seed), step, cfg.train, 0.0)
    logged = next(r for r in rd.read_jsonl(donor_run / rd.METRICS_FILE) if r["step"] == step)
    assert math.isclose(record["candidate_loss"], logged["candidate_loss"], rel_tol=1e-6)


@pytest.mark.parametrize("forward", ["fused", "hooked"])
def test_a_killed_intervention_run_resumes_bit_for_bit(tmp_path, forward):
    cfg = get_preset("tiny").replace(hide_cue_until=20, masked_heads=("0.1",), forward=forward)
    train(cfg, tmp_path / "whole", device="cpu", progress=False)
    train(cfg, tmp_path / "killed", device="cpu", progress=False, stop_at_step=15)
    train(cfg, tmp_path / "killed", resume=True, device="cpu", progress=False)
    a, _ = rd.load_checkpoint(tmp_path / "whole" / rd.CHECKPOINT_DIR / rd.checkpoint_name(40))
    b, _ = rd.load_checkpoint(tmp_path / "killed" / rd.CHECKPOINT_DIR / rd.checkpoint_name(40))
    assert all(torch.equal(a[k], b[k]) for k in a)
    stored = json.loads((tmp_path / "whole" / rd.CONFIG_FILE).read_text())["run"]["train"]
    assert stored["hide_cue_until"] == 20 and stored["masked_heads"] == ["0.1"]


def test_analyses_load_a_checkpoint_with_the_interventions_of_its_step(tmp_path):
    cfg = get_preset("tiny").replace(hide_cue_until=20, masked_heads=("0.1",))
    train(cfg, tmp_path / "r", device="cpu", progress=False)
    run = rd.Run(tmp_path / "r")
    task = run.task()
    tokens = task.tokens[:16, : task.input_len]
    for step in (10, 40):
        model = run.model(step)
        params = hooked_parameters(model)
        hidden = run.config.train.hide_cue_until > step
        expected = fused_logits(model.cfg, params, tokens, hidden_keys=tuple(range(*task.layout.z_span)) if hidden else (),
                                zeroed_heads=((0, 1),))
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), expected, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("flags, message", [
    (["--hide-cue-until", "40"], "hide_cue_until=40 is outside the run"),
    (["--mask-heads", "0.2"], "masked head 0.2 does not exist"),
    (["--mask-heads", "zero"], "write heads as L.H"),
    (["--transplant", "routing"], "transplant and donor go together"),
    (["--freeze-transplant"], "freeze_transplant needs a transplant"),
    (["--transplant", "readout", "--donor", "missing.safetensors"], "no such checkpoint file"),
    (["--hide-cue-until", "5", "--set", "no_z=true"], "has no cue to hide"),
    (["--hide-cue-until", "5", "--task", "induction"], "sits at different positions"),
])
def test_impossible_interventions_are_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
    assert main(["--preset", "tiny", "--no-progress", "--out", str(tmp_path / "r"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_a_donor_of_another_shape_is_refused(donor_run, tmp_path, capsys):
    donor = donor_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(40)
    assert main(["--preset", "ci", "--out", str(tmp_path / "r"), "--transplant", "routing", "--donor", str(donor)]) == 2
    assert "a checkpoint of another shape (embed.W_E" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_seed_ensembles_refuse_interventions(tmp_path):
    cfg = get_preset("tiny").replace(masked_heads=("0.1",))
    with pytest.raises(ConfigError, match="train solo runs"):
        train_ensemble([cfg, dataclasses.replace(cfg.replace(seed=1))], [tmp_path / "a", tmp_path / "b"], device="cpu")


# ---- the intervention sweep: points relative to each seed's own run ------------------------


def test_relative_points_take_S_and_the_donor_from_their_own_seeds_run(interventions_sweep):
    out, outcomes = interventions_sweep
    assert [o["status"] for o in outcomes] == ["done"] * len(outcomes) == ["done"] * 14
    for seed in (0, 1):
        base = out / f"ds{seed}_seed{seed}"
        tau_0 = json.loads((base / rd.SUMMARY_FILE).read_text())["tau"]
        last = max(p.name for p in (base / rd.CHECKPOINT_DIR).glob("step_*.safetensors"))
        for frac in (0.5, 1.0):
            stored = json.loads((out / f"ds{seed}_hide{frac:g}_seed{seed}" / rd.CONFIG_FILE).read_text())
            assert stored["run"]["train"]["hide_cue_until"] == max(1, round(frac * tau_0))
        for name in (f"ds{seed}_give_routing_seed{seed}", f"ds{seed}_frozenTrue_give_routing_seed{seed}"):
            train_cfg = json.loads((out / name / rd.CONFIG_FILE).read_text())["run"]["train"]
            assert train_cfg["donor"] == str((base / rd.CHECKPOINT_DIR / last).resolve())
        only = json.loads((out / f"ds{seed}_only0.0_seed{seed}" / rd.CONFIG_FILE).read_text())
        assert only["run"]["train"]["masked_heads"] == ["0.1"]  # tiny has 2 heads: head 0.0 is the only route


def test_the_intervention_table_is_the_runs_own_numbers(interventions_sweep):
    out, _ = interventions_sweep
    rows = intervention_rows(out)
    assert len(rows) == 12  # 6 interventions x 2 seeds
    for r in rows:
        summary = json.loads((out / r["name"] / rd.SUMMARY_FILE).read_text())
        tau_0 = json.loads((out / f"ds{r['seed']}_seed{r['seed']}" / rd.SUMMARY_FILE).read_text())["tau"]
        S = json.loads((out / r["name"] / rd.CONFIG_FILE).read_text())["run"]["train"]["hide_cue_until"] or 0
        end = summary["tau"] if summary["tau"] is not None else summary["final_step"]  # censored: a lower bound
        assert r["censored"] == (summary["tau"] is None)
        assert r["wait_ratio"] == pytest.approx((end - S) / tau_0)
    table = intervention_table(rows)
    for t in table:
        mine = [r for r in rows if r["condition"] == t["condition"]]
        assert t["wait_ratio"] == statistics.median([r["wait_ratio"] for r in mine])
        assert t["reached"] == sum(not r["censored"] for r in mine)
    lines = reading(table)
    assert lines[0].startswith("Cue hidden") and "cue hidden until 0.5 tau_0" in lines[0]
    assert any(line.startswith("Transplants") for line in lines)


def test_the_lead_from_the_release_on_a_planted_summary(tmp_path):
    """tau = 1,000, the cue released at S = 400, attention halfway up at 700: the lead from the release is
    (1000 - 700) / (1000 - 400) = 0.5 by hand; the cue-effect t_form at tau leads by 0 (written under
    an older summary's key, delta_z); a rule without t_form has none."""
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "routing.json").write_text(json.dumps({"t_form_rules": {
        "attention": {"t_form": 700, "start_value": 0.1, "final_value": 0.4},
        "patch_share": {"t_form": None}, "delta_z": {"t_form": 1000}}}))
    assert release_leads(tmp_path, 1000, 400) == {"lead_attention": 0.5, "lead_patch_share": None,
                                                  "lead_cue_effect": 0.0, "attention_start": 0.25}
    assert release_leads(tmp_path, 1000, 0)["lead_attention"] == pytest.approx(0.3)  # no release: the plain lead
    assert release_leads(tmp_path, 400, 400)["lead_attention"] is None  # tau at the release: no lead to count


def test_the_lead_is_counted_from_the_release_and_is_the_selectors_lead_without_one(interventions_sweep, tmp_path):
    out = shutil.copytree(interventions_sweep[0], tmp_path / "pi")  # analysed here: the session's sweep stays as trained
    base, hidden = out / "ds0_seed0", out / "ds0_hide1_seed0"
    for run_dir in (base, hidden):
        analyze_run(run_dir, n_exact=4, progress=False, edges=False)
    rows = {r["name"]: r for r in intervention_rows(out, with_baselines=True)}
    assert len(rows) == 14 and list(rows)[:2] == ["ds0_seed0", "ds1_seed1"]  # the unmodified runs first
    assert rows["ds0_seed0"]["condition"] == "unmodified" and rows["ds0_seed0"]["wait_ratio"] == 1
    rules = json.loads((base / "analysis" / "routing.json").read_text())["t_form_rules"]
    for rule in RULES:  # S = 0: the selector's own lead fraction
        assert rows["ds0_seed0"][f"lead_{rule}"] == pytest.approx(rules[rule]["lead_fraction"])
    assert rows["ds0_hide1_seed0"]["lead_attention"] is not None  # the hidden run's lead, from its own analysis
    # Its t_form rules start at the release S (before it the mask, not learning, sets attention and delta_z),
    # and the summary shows the candidate loss at the evaluations around the release.
    hidden_summary = json.loads((hidden / "analysis" / "routing.json").read_text())
    S = rd.Run(hidden).config.train.hide_cue_until
    assert S and hidden_summary["rules_start"] == max(hidden_summary["plateau_start"], S)
    assert all(rule["t_form"] is None or rule["t_form"] > S for rule in hidden_summary["t_form_rules"].values())
    metrics = {r["step"]: r["candidate_loss"] for r in rd.Run(hidden).metrics()}
    around = hidden_summary["release"]
    assert around["before"]["step"] == max(s for s in metrics if s < S)
    assert around["after"]["step"] == min(s for s in metrics if s >= S)
    assert around["before"]["value"] == metrics[around["before"]["step"]]
    assert around["after"]["value"] == metrics[around["after"]["step"]]
    assert json.loads((base / "analysis" / "routing.json").read_text())["release"] is None
    assert rows["ds1_seed1"]["lead_attention"] is None  # not analysed
    table = intervention_table(list(rows.values()))
    assert table[0]["condition"] == "unmodified" and table[0]["lead_attention_n"] == 1
    text = lead_table_text(table)
    assert "unmodified" in text and f"{rows['ds0_seed0']['lead_attention']:.2f}" in text
    assert any(line.startswith("Lead from the release") for line in reading(table))


def test_an_unfinished_run_counts_as_censored_at_its_last_evaluation(interventions_sweep, tmp_path):
    out = tmp_path / "stopped"
    shutil.copytree(interventions_sweep[0], out)
    run_dir = out / "ds0_give_readout_seed0"  # as if the sweep had been killed before it reached tau
    (run_dir / rd.SUMMARY_FILE).unlink()
    tau_0 = json.loads((out / "ds0_seed0" / rd.SUMMARY_FILE).read_text())["tau"]
    records = [r for r in rd.read_jsonl(run_dir / rd.METRICS_FILE)
               if r["candidate_loss"] > 0.5 * math.log(4)][:3]  # tiny: K = 4; still on the plateau
    (run_dir / rd.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    row = next(r for r in intervention_rows(out) if r["name"] == run_dir.name)
    assert not row["finished"] and row["censored"] and row["tau"] is None
    assert row["wait_ratio"] == pytest.approx(records[-1]["step"] / tau_0)
    table = {t["condition"]: t for t in intervention_table(intervention_rows(out))}
    assert table["readout given (trained)"]["unfinished"] == 1
    assert table["embeddings and layer 0 given (trained)"]["unfinished"] == 0


def test_a_relative_point_whose_baseline_never_reached_tau_fails_in_one_line(tmp_path):
    spec = SweepSpec(name="t", base="tiny", fixed={"max_steps": 10},
                     grids=({"seed": (0,)}, {"seed": (0,), "hide_cue_at": (0.5,)}))
    outcomes = run_sweep(spec, tmp_path / "s", executor="serial", threads=1, progress=False)
    assert outcomes[0]["status"] == "done" and outcomes[1]["status"] == "failed"
    assert "never reached tau" in outcomes[1]["error"] and "\n" not in outcomes[1]["error"]
    with pytest.raises(ConfigError, match="need their baseline runs"):
        expand(SweepSpec(name="t", base="tiny", grids=({"seed": (0,), "hide_cue_at": (0.5,)},)))


def _row(condition: str, seed: int, ratio: float, censored: bool = False) -> dict:
    return {"name": f"{condition}{seed}", "seed": seed, "condition": condition, "S": 0, "censored": censored,
            "wait_ratio": ratio, "verdict": "shelf", "start_loss_over_height": 1.0, "set_loss_at_S": None,
            "baseline_set_loss_at_S": None}


@pytest.mark.parametrize("ratios, censored, expected", [
    ((0.95, 1.0, 1.05, 1.1, 0.98), False, "nothing learned without the cue shortens it"),
    ((0.4, 0.5, 0.45, 0.5, 0.42), False, "spent on something learnable without the cue"),
    ((2.5, 2.4, 2.6, 2.5, 2.45), True, "it lengthens it"),
    ((0.5, 2.5, 0.6, 2.4, 0.55), True, "do not agree"),  # an interval across 1, the median far from it
])
def test_the_reading_follows_the_intervals(ratios, censored, expected):
    rows = [_row("cue hidden until 0.5 tau_0", i, r, censored and r > 2) for i, r in enumerate(ratios)]
    table = intervention_table(rows)
    assert table[0]["lower_bound"] == (censored and sorted(ratios)[2] > 2)
    assert expected in reading(table)[0]


def test_the_transplant_reading_names_the_bottleneck_only_when_the_intervals_part():
    # --transplant routing is labelled by what it gives (the embeddings and all of layer 0), not "the routing"
    assert condition_label({"transplant": "routing"}) == "embeddings and layer 0 given (trained)"
    def table_of(routing, readout):
        return intervention_table([_row("embeddings and layer 0 given (trained)", i, r) for i, r in enumerate(routing)]
                                  + [_row("readout given (trained)", i, r) for i, r in enumerate(readout)])
    assert "the wait is in the embeddings and layer 0" in reading(table_of((0.3, 0.35, 0.32), (0.8, 0.9, 0.85)))[0]
    assert "the readout is the bottleneck" in reading(table_of((0.8, 0.9, 0.85), (0.3, 0.35, 0.32)))[0]
    assert "neither half" in reading(table_of((0.3, 0.9, 0.5), (0.4, 0.8, 0.6)))[0]


@pytest.mark.parametrize("starts, expected", [
    ((0.96, 1.0, 0.98), "the attention to z is there from step 0"),
    ((0.3, 0.5, 0.4), "its t_form times the routing's formation"),
])
def test_the_lead_reading_says_routed_at_start_only_when_the_attention_starts_near_its_final_value(starts, expected):
    rows = [{**_row("embeddings and layer 0 given (trained)", i, 0.3), "lead_attention": 0.5, "attention_start": s}
            for i, s in enumerate(starts)]
    assert expected in reading(intervention_table(rows))[-1]


@pytest.mark.parametrize("ratios, expected", [
    ((0.80, 0.84, 0.82, 0.88, 0.76), "every clamp leaves at least 0.76 tau_0 of the wait"),
    ((0.30, 0.25, 0.35, 0.28, 0.33), "the plateau waits mostly for where to look"),
    ((0.30, 0.9, 0.35, 0.95, 0.6), "do not settle"),
    ((1.38, 1.50, 1.57, 1.45, 1.6), "every clamp lengthens the wait, to at least 1.38 tau_0"),
])
def test_the_clamp_reading_follows_the_intervals(ratios, expected):
    rows = [_row("routing head clamped to the cue (a = 1)", i, r, False) for i, r in enumerate(ratios)]
    line = next(line for line in reading(intervention_table(rows)) if line.startswith("Attention clamped"))
    assert expected in line
