"""Training loop: determinism, exact resume, checkpoints that load into plain TransformerLens,
the `ci` preset's plateau and drop, and the CLI's one-line errors."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from plateauscope.cli.train import main
from plateauscope.model.backend import build_model, hooked_parameters, hooked_state_dict, installed_transformer_lens
from plateauscope.model.fused import fused_logits
from plateauscope.runs import run as rd
from plateauscope.runs.machine import lowered_kernels, machine_record
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run, RunError
from plateauscope.tasks.loading import build_task
from plateauscope.training.schedule import resume_steps, scheduled_steps
from plateauscope.training.train import train


def _strip_wall(records):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


def test_ci_preset_shows_plateau_then_drop(ci_run):
    run = Run(ci_run)
    summary = run.summary
    records = run.metrics()
    log_k = run.log_k
    tau = summary["tau"]
    assert tau is not None, "the ci run never left the plateau"
    assert tau == next(r["step"] for r in records if r["candidate_loss"] < 0.5 * log_k)  # from metrics.jsonl
    # The plateau by counts, recounted here: candidate loss within 10% of log K with z unused ...
    before = [r for r in records if r["step"] < tau]
    inside = [abs(r["candidate_loss"] - log_k) <= 0.1 * log_k and r["delta_z"] < 0.1 * log_k for r in before]
    runs = [len(run_) for run_ in "".join("x" if i else " " for i in inside).split()]
    counts, (first, last) = summary["plateau_counts"], summary["plateau_stretch"]
    assert (counts["n_before"], counts["n_inside"], counts["n_stretch"]) == (len(before), sum(inside), max(runs))
    stretch = [i for i, r in enumerate(before) if first <= r["step"] <= last]
    assert len(stretch) == max(runs) and all(inside[i] for i in stretch)  # the longest run of them in a row
    # ... for a good share of tau
    assert (last - first) >= 0.2 * tau
    # ... then the drop, with z in use.
    final = records[-1]
    assert final["candidate_loss"] < 0.5 * log_k
    assert final["delta_z"] > 0.5 * log_k
    # Dense: many checkpoints before tau.
    assert sum(s < tau for s in run.steps) >= 100


@pytest.mark.slow
def test_same_seed_same_numbers(tmp_path):
    cfg = get_preset("ci").replace(max_steps=60)
    a = train(cfg, tmp_path / "a", device="cpu", progress=False)
    b = train(cfg, tmp_path / "b", device="cpu", progress=False)
    assert _strip_wall(Run(tmp_path / "a").metrics()) == _strip_wall(Run(tmp_path / "b").metrics())
    assert a["final"]["loss"] == b["final"]["loss"]
    wa = load_file(tmp_path / "a" / rd.CHECKPOINT_DIR / rd.checkpoint_name(60))
    wb = load_file(tmp_path / "b" / rd.CHECKPOINT_DIR / rd.checkpoint_name(60))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_run_equals_a_plain_loop_with_torchs_default_adamw(tiny_run):
    """train() steps its AdamW with foreach=True; a loop written here with torch's default (the
    single-tensor AdamW on a CPU), the same initial weights and the same minibatch order, ends on
    the same weights bit for bit."""
    cfg = get_preset("tiny")
    tc = cfg.train
    task = build_task(cfg.task_name, cfg.task)
    model = build_model(task.hooked_config(cfg.model), seed=cfg.model.seed)
    params = hooked_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=tc.betas)
    assert not opt.defaults["foreach"] and tc.warmup_steps == 0 and tc.grad_clip is None
    gen = torch.Generator().manual_seed(tc.seed)
    perm, cursor = torch.randperm(len(task.tokens), generator=gen), 0
    for _ in range(tc.max_steps):
        if cursor + tc.batch_size > len(task.tokens):  # a fresh permutation each epoch
            perm, cursor = torch.randperm(len(task.tokens), generator=gen), 0
        batch = task.tokens[perm[cursor: cursor + tc.batch_size]]
        cursor += tc.batch_size
        opt.zero_grad(set_to_none=True)
        task.loss(fused_logits(model.cfg, params, batch[:, : task.input_len]), batch).backward()
        opt.step()
    trained = load_file(tiny_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(tc.max_steps))
    weights = hooked_state_dict(model)
    assert trained.keys() == weights.keys()
    assert all(torch.equal(trained[k], v) for k, v in weights.items())


def test_kill_and_resume_is_bit_identical(tmp_path, tiny_run):
    # Checkpoints every 5 steps, resume points every 20 (the same weights as tiny_run's: resume_every
    # decides only where the resume state is written). Killed after step 23: the resume replays 20 -> 23.
    cfg = get_preset("tiny").replace(resume_every=20)
    train(cfg, tmp_path / "r", device="cpu", progress=False, stop_at_step=23)
    assert not (tmp_path / "r" / rd.SUMMARY_FILE).exists()
    assert torch.load(tmp_path / "r" / rd.RESUME_FILE, weights_only=True)["step"] == 20
    with open(tmp_path / "r" / rd.METRICS_FILE, "a") as f:
        f.write('{"step": 999, "torn')  # a line cut by the kill
    train(cfg, tmp_path / "r", resume=True, device="cpu", progress=False)
    final = cfg.train.max_steps
    ref = load_file(tiny_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(final))
    got = load_file(tmp_path / "r" / rd.CHECKPOINT_DIR / rd.checkpoint_name(final))
    assert ref.keys() == got.keys()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert _strip_wall(Run(tmp_path / "r").metrics()) == _strip_wall(Run(tiny_run).metrics())
    # Resuming a finished run is a no-op that returns its summary.
    again = train(cfg, tmp_path / "r", resume=True, device="cpu", progress=False)
    assert again["final_step"] == final


def plain_transformer_lens_model(cfg: dict, state: dict) -> torch.nn.Module:
    """A checkpoint opened with TransformerLens alone, as the docs show (``checkpoints/README.md``):
    ``HookedTransformer`` on 3.x; on 4.x ``TransformerBridge.boot_native``, the weights converted by
    ``convert_tl_checkpoint``, in compatibility mode."""
    if installed_transformer_lens().startswith("3."):
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        plain = HookedTransformer(HookedTransformerConfig(**cfg))
        plain.load_state_dict(state, strict=False)
        return plain
    from transformer_lens import TransformerBridge, TransformerBridgeConfig
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    bridge_cfg = TransformerBridgeConfig(**cfg)
    plain = TransformerBridge.boot_native(bridge_cfg)
    plain.load_state_dict(convert_tl_checkpoint(state, bridge_cfg), strict=False)
    plain.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return plain


def test_checkpoint_loads_into_plain_transformer_lens(tiny_run):
    run = Run(tiny_run)
    cfg = json.loads((tiny_run / rd.CONFIG_FILE).read_text())
    step = run.steps[-1]
    plain = plain_transformer_lens_model(cfg["hooked_transformer_config"],
                                         load_file(tiny_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(step)))
    ours = run.model(step)
    tokens = run.task().tokens[:8, : run.task().input_len]
    torch.testing.assert_close(plain(tokens), ours(tokens), rtol=0, atol=1e-5)
    assert cfg["vocab"][:2] == ["<BOS>", "<SEP>"] and cfg["layout"]["first_target_pred_pos"] == 10


def test_series_api(tiny_run):
    run = Run(tiny_run)
    steps = run.steps
    assert steps[0] == 0 and steps == sorted(steps)
    loaded = [s for s, _ in run.models(steps[:2])]
    assert loaded == steps[:2]
    assert len(run.task().records()) == run.config.task.D
    with pytest.raises(RunError, match="no checkpoint at step 7 "):
        run.checkpoint_path(7)


def test_checkpoints_written_under_the_former_name_still_load(tmp_path, tiny_run):
    weights, _ = rd.load_checkpoint(tiny_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(5))
    assert rd.CHECKPOINT_FORMAT == "plateauscope-checkpoint-v1"
    old = tmp_path / "old.safetensors"
    save_file(weights, old, metadata={"format": "synass-lens-checkpoint-v1", "step": "5"})
    loaded, step = rd.load_checkpoint(old)
    assert step == 5 and all(torch.equal(loaded[k], weights[k]) for k in weights)
    renamed = tmp_path / "other.safetensors"
    save_file(weights, renamed, metadata={"format": "some-other-tool-v1", "step": "5"})
    with pytest.raises(RunError, match="not a checkpoint of this toolkit"):
        rd.load_checkpoint(renamed)


def test_truncated_and_foreign_files_give_one_line(tmp_path, tiny_run):
    src = tiny_run / rd.CHECKPOINT_DIR / rd.checkpoint_name(0)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(RunError, match=r"cut\.safetensors: not a readable safetensors checkpoint") as info:
        rd.load_checkpoint(cut)
    assert "\n" not in str(info.value)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign)
    with pytest.raises(RunError, match="not a checkpoint of this toolkit"):
        rd.load_checkpoint(foreign)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / rd.CONFIG_FILE).write_text("{not json")
    with pytest.raises(RunError, match="config.json: not valid JSON"):
        Run(tmp_path / "broken")
    with pytest.raises(RunError, match="no such run directory"):
        Run(tmp_path / "nowhere")


def test_forward_direction_trains_and_has_no_candidates(tmp_path):
    cfg = get_preset("tiny").replace(direction="forward", max_steps=10)
    summary = train(cfg, tmp_path / "f", device="cpu", progress=False)
    rec = Run(tmp_path / "f").metrics()[-1]
    assert rec["candidate_loss"] is None and rec["delta_z"] is None
    assert 0 < rec["loss"] < 10 and summary["direction"] == "forward"


def test_cli_errors_are_one_line_with_exit_2(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["--preset", "tiny", "--out", str(out), "--no-progress", "--max-steps", "5"]) == 0
    assert "tau not reached" in capsys.readouterr().out  # 5 steps: no drop yet
    cases = [
        (["--preset", "tiny", "--out", str(out), "--no-progress"], "already holds a run"),
        (["--preset", "tiny", "--out", str(out), "--resume", "--lr", "0.5", "--no-progress"], "different configuration"),
        (["--preset", "tiny", "--set", "K=2000", "--out", str(tmp_path / "d")], "K=2000 is larger"),
        (["--preset", "tiny", "--batch-size", "9999", "--out", str(tmp_path / "e")], "larger than the data set"),
        (["--preset", "tiny", "--device", "tpu", "--out", str(tmp_path / "g")], "--device must be"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_log_spaced_early_checkpoints(tiny_run):
    steps = Run(tiny_run).steps
    assert {1, 2, 3} <= set(steps) and math.gcd(*[s for s in steps if s >= 5]) == 5


def test_resume_points_are_the_first_checkpoint_at_each_multiple_and_the_last():
    ckpts = scheduled_steps(30, 250, 3)  # 0, 1, 3, 10, 30, 60, ..., 240, 250
    assert resume_steps(ckpts, 100) == {0, 120, 210, 250}
    assert resume_steps(scheduled_steps(5, 3000, 12), 100) == set(range(0, 3001, 100))
    assert resume_steps(ckpts, 1) == ckpts  # every checkpoint, as before resume_every existed


def test_summary_lists_the_machine_and_a_resume_elsewhere_warns(tmp_path, caplog):
    cfg = get_preset("tiny").replace(max_steps=20)
    train(cfg, tmp_path / "r", device="cpu", progress=False, stop_at_step=12)
    here = machine_record("cpu")
    state = torch.load(tmp_path / "r" / rd.RESUME_FILE, weights_only=True)
    assert state["machines"] == [here]
    # The same machine: no warning, one entry.
    with caplog.at_level("WARNING"):
        summary = train(cfg, tmp_path / "r", resume=True, device="cpu", progress=False)
    assert summary["machines"] == [here] and "not bit-identical" not in caplog.text
    assert here["cpu"] and here["threads"] == torch.get_num_threads() and here["torch"] == str(torch.__version__)
    assert here["transformer_lens"] == installed_transformer_lens() and summary["machines"][0]["transformer_lens"]
    # A record written before the TransformerLens version was kept is the same machine: no warning.
    train(cfg, tmp_path / "old", device="cpu", progress=False, stop_at_step=12)
    state = torch.load(tmp_path / "old" / rd.RESUME_FILE, weights_only=True)
    legacy = {k: v for k, v in here.items() if k != "transformer_lens"}
    rd.save_resume_state(tmp_path / "old" / rd.RESUME_FILE, {**state, "machines": [legacy]})
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert train(cfg, tmp_path / "old", resume=True, device="cpu", progress=False)["machines"] == [legacy]
    assert "not bit-identical" not in caplog.text
    # Another machine trained it so far (its record edited into the resume state): one warning line.
    train(cfg, tmp_path / "s", device="cpu", progress=False, stop_at_step=12)
    other = {**here, "cpu": "Some Other CPU", "isa": ["avx2"], "kernels": "AVX2"}
    state = torch.load(tmp_path / "s" / rd.RESUME_FILE, weights_only=True)
    rd.save_resume_state(tmp_path / "s" / rd.RESUME_FILE, {**state, "machines": [other]})
    caplog.clear()
    with caplog.at_level("WARNING"):
        summary = train(cfg, tmp_path / "s", resume=True, device="cpu", progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Some Other CPU [avx2; torch kernels AVX2]" in warnings[0] and "not bit-identical" in warnings[0]
    assert "\n" not in warnings[0]
    assert summary["machines"] == [other, here]


def test_the_machine_record_names_torchs_kernels_and_when_they_were_set_below_the_cpus_best():
    # ATEN_CPU_CAPABILITY picks torch's kernels at import: a fresh interpreter with it set to the scalar
    # ones records them, and they are below any CPU with AVX2 (every x86 CPU this project runs on).
    code = "import json; from plateauscope.runs.machine import lowered_kernels, machine_record; print(json.dumps(machine_record()))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    lowered = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                        check=True).stdout)
    assert lowered["kernels"] == "DEFAULT" and lowered["isa"] == machine_record()["isa"]
    assert lowered_kernels(lowered) == ("DEFAULT" if "avx2" in lowered["isa"] else None)
    assert lowered_kernels({"isa": ["avx2", "avx512f"], "kernels": "AVX2"}) == "AVX2"
    assert lowered_kernels({"isa": ["avx2", "avx512f"], "kernels": "AVX512"}) is None
    assert lowered_kernels({"isa": ["avx2"]}) is None  # a record written before the kernels were kept


def test_hooks_see_every_step_and_evaluation_and_change_nothing(tmp_path):
    from plateauscope.training.train import TrainingHooks

    cfg = get_preset("tiny").replace(max_steps=12)
    steps, evaluations, entered = [], [], []

    class Counting:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    hooks = TrainingHooks(on_step=lambda step, loss: steps.append((step, float(loss))),
                          on_evaluation=lambda record, seconds: evaluations.append((record["step"], seconds)),
                          step_context=Counting)
    train(cfg, tmp_path / "hooked", device="cpu", progress=False, hooks=hooks)
    train(cfg, tmp_path / "plain", device="cpu", progress=False)
    records = Run(tmp_path / "hooked").metrics()
    assert [s for s, _ in steps] == list(range(1, 13)) and len(entered) == 12
    assert [s for s, _ in evaluations] == [r["step"] for r in records] and all(t >= 0 for _, t in evaluations)
    assert all(math.isfinite(loss) for _, loss in steps)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_s"} for r in rs]  # noqa: E731
    assert strip(records) == strip(Run(tmp_path / "plain").metrics())


def test_data_order_walks_fresh_permutations_and_resumes_where_it_was():
    """DataOrder (a solo run's and each ensemble member's minibatch order) walks one permutation per
    epoch, dropping the ragged tail, exactly as a loop written out here does; restored from a resume
    point it continues with the same rows as one that never stopped."""
    from plateauscope.runs.files import ResumePoint
    from plateauscope.training.train import DataOrder

    n, batch, seed = 50, 16, 3  # three minibatches an epoch, two rows dropped
    gen = torch.Generator().manual_seed(seed)
    perm, cursor, expected = torch.randperm(n, generator=gen), 0, []
    for _ in range(10):
        if cursor + batch > n:
            perm, cursor = torch.randperm(n, generator=gen), 0
        expected.append(perm[cursor: cursor + batch])
        cursor += batch
    order = DataOrder(seed, n)
    got = [order.next_rows(batch) for _ in range(4)]
    saved = ResumePoint(step=4, weights={}, optimizer={}, data_gen=order.generator.get_state(), perm=order.perm.clone(),
                        cursor=order.cursor, wall_s=0.0, torch_rng=torch.get_rng_state(), records=[], complete=False)
    got += [order.next_rows(batch) for _ in range(6)]
    resumed = DataOrder(seed, n, saved)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert all(torch.equal(resumed.next_rows(batch), b) for b in expected[4:])


def test_evaluation_log_cuts_metrics_back_then_appends_and_stops_after_tau(tmp_path):
    """EvaluationLog (a solo run's and each ensemble member's metrics): opening it keeps only the
    records given (those before the resume point); log() appends one flushed line, fixes tau at the
    first crossing and raises the stop flag once the step reaches stop_after_tau * tau."""
    from plateauscope.tasks.base import ProgressMeasure
    from plateauscope.training.train import EvaluationLog

    measure = ProgressMeasure(key="candidate_loss", height=1.0)
    tc = get_preset("tiny").replace(stop_after_tau=2.0).train
    rec = lambda step, loss: {"step": step, "candidate_loss": loss}  # noqa: E731
    (tmp_path / rd.METRICS_FILE).write_text("".join(json.dumps(rec(s, 1.0)) + "\n" for s in (0, 10, 20))
                                            + '{"step": 30, "torn')
    evaluations = EvaluationLog(tmp_path, [rec(0, 1.0), rec(10, 1.0)], measure, tc)
    assert rd.read_jsonl(tmp_path / rd.METRICS_FILE) == [rec(0, 1.0), rec(10, 1.0)]
    assert evaluations.tau is None and not evaluations.stop
    evaluations.log(rec(20, 0.2))  # tau = 20: stop at step 40
    assert rd.read_jsonl(tmp_path / rd.METRICS_FILE)[-1] == rec(20, 0.2)  # on disk before close
    assert evaluations.tau == 20 and not evaluations.stop
    evaluations.log(rec(30, 1.0))  # tau stays fixed
    assert evaluations.tau == 20 and not evaluations.stop
    evaluations.log(rec(40, 0.1))
    assert evaluations.stop
    evaluations.close()
    evaluations.close()  # a second close is a no-op (a finished ensemble member closes before the loop ends)
    assert [r["step"] for r in evaluations.records] == [0, 10, 20, 30, 40]
    assert [r["step"] for r in rd.read_jsonl(tmp_path / rd.METRICS_FILE)] == [0, 10, 20, 30, 40]


def test_schedule_checkpoints_and_resumes_where_a_run_stops():
    from plateauscope.training.train import Schedule

    tc = get_preset("tiny").train
    schedule = Schedule.of(tc)
    ckpts = scheduled_steps(tc.ckpt_every, tc.max_steps, tc.early_log_points)
    assert schedule.evaluate == scheduled_steps(tc.eval_every, tc.max_steps, tc.early_log_points)
    assert schedule.checkpoint == ckpts and schedule.resume == resume_steps(ckpts, tc.resume_every)
    off_schedule = next(s for s in range(tc.max_steps) if s not in ckpts)
    assert not schedule.checkpoints(off_schedule, stop=False) and schedule.checkpoints(off_schedule, stop=True)
    assert schedule.resumes(off_schedule, stop=True) and not schedule.resumes(off_schedule, stop=False)


def test_no_tracked_examples_trains_and_logs_no_per_example_accuracy(tmp_path):
    """tracked_groups is optional: 0 trains the same weights as any other count and logs no group_acc."""
    cfg = get_preset("tiny").replace(max_steps=10)
    train(cfg.replace(tracked_groups=0), tmp_path / "none", device="cpu", progress=False)
    train(cfg, tmp_path / "some", device="cpu", progress=False)
    assert all(not rec.get("group_acc") for rec in Run(tmp_path / "none").metrics())
    assert any(rec.get("group_acc") for rec in Run(tmp_path / "some").metrics())
    final = rd.checkpoint_name(10)
    assert torch.equal(load_file(tmp_path / "none" / rd.CHECKPOINT_DIR / final)["embed.W_E"],
                       load_file(tmp_path / "some" / rd.CHECKPOINT_DIR / final)["embed.W_E"])
