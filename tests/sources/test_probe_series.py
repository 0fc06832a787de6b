"""The induction probe's cheap pass on an imported GPT-NeoX series: the heads TransformerLens's head_detector
names, and the change point where the in-context loss gap jumps."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.head_detector import detect_head

from plateauscope.analysis.probe_pass import HEAD_THRESHOLD, analyze_imported, named_heads
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.importer import import_series
from tests.sources.series_builders import SEGMENT


@pytest.fixture(scope="module")
def imported(neox_series, tmp_path_factory):
    source, steps = neox_series
    run = import_series(source, tmp_path_factory.mktemp("imported") / "run").path
    return source, steps, run, analyze_imported(run, progress=False, segment_len=SEGMENT)


def test_the_named_heads_are_head_detectors(imported):
    _, steps, run, result = imported
    series = ImportedSeries(run)
    model = None
    for record in (result.steps[0], result.steps[len(steps) // 2], result.steps[-1]):
        model = series.model(record.step, reuse=model)
        model.to_tokens = lambda seq: seq if torch.is_tensor(seq) else torch.zeros(1, 2, dtype=torch.long)
        from plateauscope.tasks.probe import build_probe

        probe = build_probe("induction", model.cfg.d_vocab, model.cfg.n_ctx, segment_len=SEGMENT)
        sequences = [row[None] for row in probe.scored_tokens()]
        for name, head in (("previous_token", "previous_token_head"), ("induction", "induction_head")):
            expected = detect_head(model, sequences, head)
            assert torch.allclose(torch.tensor(record.head_scores[name]), expected.float(), atol=1e-5)
            if record is result.steps[-1]:
                assert result.named_heads[name] == named_heads(expected)
    assert result.named_heads["induction"]  # they formed
    assert all(layer >= 1 for layer, _ in result.named_heads["induction"])  # an induction head reads a layer before it
    assert torch.tensor(result.steps[0].head_scores["induction"]).max() < HEAD_THRESHOLD


def test_the_loss_gap_changes_where_it_jumps(imported):
    from transformers import AutoModelForCausalLM

    from plateauscope.tasks.probe import build_probe

    source, steps, _, result = imported
    probe = build_probe("induction", 24, 64, segment_len=SEGMENT)

    tokens = probe.scored_tokens()
    gaps = []  # the gap measured on Hugging Face's own models: independent of the bridge
    for step in steps:
        hf = AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{step}").eval()
        with torch.no_grad():
            first, second = probe.copy_losses(hf(tokens).logits, tokens)
        gaps.append(first - second)
    assert [r.loss_gap for r in result.steps] == pytest.approx(gaps, abs=1e-4)
    change = result.loss_gap_change
    assert change is not None and change["direction"] == "rise"
    half = next(s for s, g in zip(steps, gaps) if g > gaps[-1] / 2)
    before = [g for s, g in zip(steps, gaps) if s < change["step"]]
    assert change["step"] <= half and max(before) < gaps[-1] / 4


def test_head_patching_names_an_induction_head_at_the_end(imported):
    result = imported[3]
    last = torch.tensor(result.steps[-1].head_patching)
    strongest = divmod(int(last.argmax()), last.shape[1])
    assert strongest in result.named_heads["induction"]


def test_analyze_runs_the_probe_on_an_imported_run_and_the_hessian_says_why_not(imported, capsys):
    from plateauscope.cli import main as cli_main

    run = imported[2]
    capsys.readouterr()
    assert cli_main(["analyze", "--run", str(run), "--no-progress", "--probe-length", str(SEGMENT), "--steps", *map(str, imported[1][-3:]),
                     "--n-examples", "16", "--ablation-groups", "2", "--n-exact", "2", "--circuit-pairs", "8",
                     "--n-exact-edges", "8", "--workers", "1"]) == 0  # then the full analysis on the probe: kept small
    out = capsys.readouterr().out
    assert "probe induction on 3 checkpoints of GPTNeoXForCausalLM" in out and "induction heads at the last step: L1" in out
    assert cli_main(["hessian", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the training data" in err
