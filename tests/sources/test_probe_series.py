"""The induction probe's pass on imported series, against Hugging Face's own models read by hand:

* a Llama series saved by a plain loop, trained on copies at several lags and positions (BOS 1): every layer-1
  head is named, the field's scores equal mean attention to the target computed from HF's eager attentions, the
  phase change lies at the loss gap's half-rise, and all, every 5th and 14 chosen checkpoints agree;
* a GPT-NeoX series trained on one copy length at one position, which learns to copy by position: no induction
  head is named there; and ``head_detector``'s own scores beside ours.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_lens.head_detector import detect_head

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.importer import import_series
from plateauscope.tasks.probe import build_probe
from tests.sources.series_builders import SEGMENT


@pytest.fixture(scope="module")
def llama(llama_induction_series, tmp_path_factory):
    source, steps = llama_induction_series
    run = import_series(source, tmp_path_factory.mktemp("imported") / "llama").path
    return source, steps, run, analyze_imported(run, progress=False, patching=False)


@pytest.fixture(scope="module")
def neox(neox_series, tmp_path_factory):
    source, steps = neox_series
    run = import_series(source, tmp_path_factory.mktemp("imported") / "neox").path
    return source, steps, run, analyze_imported(run, progress=False, segment_len=SEGMENT)


def hf_attentions(folder, tokens):
    """HF's eager attention patterns ``[N, layers, heads, seq, seq]`` and logits."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
    return torch.stack(out.attentions, 1), out.logits


def hand_scores(attention, tokens):
    """Mean attention to the induction target (the position after an earlier occurrence of the current token) and
    to the previous token, over every query that has one, per sequence then averaged: loops, by hand."""
    n, layers, heads, seq, _ = attention.shape
    induction = torch.zeros(n, layers, heads)
    previous = torch.zeros(n, layers, heads)
    for i in range(n):
        rows = [(q, [k + 1 for k in range(q) if tokens[i, k] == tokens[i, q]]) for q in range(seq)]
        rows = [(q, ks) for q, ks in rows if ks]
        induction[i] = sum(attention[i, :, :, q, ks].sum(-1) for q, ks in rows) / len(rows)
        previous[i] = sum(attention[i, :, :, q, q - 1] for q in range(1, seq)) / (seq - 1)
    return induction.mean(0), previous.mean(0)


def test_the_scores_are_mean_attention_to_the_target_on_hf(llama):
    source, steps, _, result = llama
    probe = build_probe("induction", 64, 64, tokenizer=ImportedSeries(llama[2]).loaded_tokenizer)
    tokens = probe.scored_tokens()[:24]
    for record in (result.steps[0], result.steps[-1]):
        attention, _ = hf_attentions(source / f"step-{record.step}", tokens)
        induction, previous = hand_scores(attention, tokens)
        per_sequence = torch.tensor(record.score_sequences["induction"][:24], dtype=torch.float).mean(0)
        assert torch.allclose(per_sequence, induction, atol=1e-4)
        prev = torch.tensor(result.steps[-1].head_scores["previous_token"]) if record is result.steps[-1] else None
        if prev is not None:  # over all 128 sequences; by hand on 24: the same head stands out
            assert prev.argmax() == previous.argmax()


def test_the_start_token_is_the_series_bos_and_no_special_token_is_drawn(llama):
    tokenizer = ImportedSeries(llama[2]).loaded_tokenizer
    probe = build_probe("induction", 64, 64, tokenizer=tokenizer)
    assert tokenizer.bos_token_id == 1 and (probe.tokens[:, 0] == 1).all()
    assert not torch.isin(probe.tokens[:, 1:], torch.tensor([0, 1, 2])).any()  # pad, BOS, EOS
    assert "start token 1" in llama[3].layout
    none = build_probe("induction", 64, 64, tokenizer=tokenizer, bos="none")
    assert (none.tokens[:, 0] >= 3).all()
    chosen = build_probe("induction", 64, 64, tokenizer=tokenizer, bos=5)
    assert (chosen.tokens[:, 0] == 5).all() and not (chosen.tokens[:, 1:] == 5).any()


def test_every_layer1_head_is_named_and_no_layer0_head_inducts(llama):
    result = llama[3]
    assert sorted(result.named_heads["induction"]) == [(1, 0), (1, 1)]
    calls = {c["head"]: c for c in result.heads["induction"]}
    assert all(calls[h]["kind"] is None for h in ("L0H0", "L0H1"))
    assert all(calls[h]["interval"][0] > 0.2 and calls[h]["score"] > 0.7 for h in ("L1H0", "L1H1"))
    assert len(result.named_heads["previous_token"]) == 1 and result.named_heads["previous_token"][0][0] == 0


def test_the_phase_change_is_the_half_rise_measured_on_hf(llama):
    source, steps, run, result = llama
    probe = build_probe("induction", 64, 64, tokenizer=ImportedSeries(run).loaded_tokenizer)
    tokens = probe.scored_tokens()
    L, F = probe.cfg.segment_len, probe.cfg.max_gap
    gaps = []
    for step in steps:  # the loss gap by hand: first copy's tokens 2..L minus the second copy's, HF's logits
        logprobs = hf_attentions(source / f"step-{step}", tokens)[1].log_softmax(-1)
        first, second = [], []
        for i, k in enumerate(probe.gaps[: len(tokens)].tolist()):
            first += [-logprobs[i, p - 1, tokens[i, p]] for p in range(k + 2, k + 1 + L)]
            second += [-logprobs[i, p - 1, tokens[i, p]] for p in range(F + L + 2, F + 2 * L + 1)]
        gaps.append(float(torch.stack(first).mean() - torch.stack(second).mean()))
    assert [r.loss_gap for r in result.steps] == pytest.approx(gaps, abs=1e-3)
    peak = int(np.argmax(gaps))
    low = min(gaps[: peak + 1])
    i = next(i for i, g in enumerate(gaps) if g >= (low + gaps[peak]) / 2)
    half = steps[i - 1] + (steps[i] - steps[i - 1]) * ((low + gaps[peak]) / 2 - gaps[i - 1]) / (gaps[i] - gaps[i - 1])
    t = result.transition
    assert abs(t["phase_change"]["step"] - half) <= 40
    lo, hi = t["phase_change"]["interval"]
    assert lo <= t["phase_change"]["step"] <= hi
    assert t["onset"]["step"] <= t["phase_change"]["step"] <= t["end"]["step"]
    co = result.co_occurrence
    assert co["heads"] == ["L1H1", "L1H0"] or sorted(co["heads"]) == ["L1H0", "L1H1"]
    assert co["same_window"] and abs(co["lag"]) <= 40


def test_all_every_fifth_and_fourteen_chosen_checkpoints_agree(llama):
    _, steps, run, result = llama
    every5 = analyze_imported(run, every=5, progress=False, patching=False)
    chosen = [steps[i] for i in np.linspace(0, len(steps) - 1, 14).round().astype(int)]
    fourteen = analyze_imported(run, steps=chosen, progress=False, patching=False)
    intervals = [r.transition["phase_change"]["interval"] for r in (result, every5, fourteen)]
    assert max(lo for lo, _ in intervals) <= min(hi for _, hi in intervals)  # one step lies in all three
    assert every5.named_heads["induction"] == fourteen.named_heads["induction"] == result.named_heads["induction"]


def test_a_series_trained_at_one_lag_has_fixed_lag_copiers_and_no_induction_head(tmp_path):
    """A Llama trained on copies that move but always follow at lag 12 copies from 11 tokens back: the probe, with
    copies at lags 12..20, names no induction head and reports the copiers at lag 12, which Hugging Face's own
    attention confirms (by hand: the copier's attention 11 tokens back, on sequences of every lag)."""
    from tests.sources.series_builders import train_llama_induction_series

    steps = train_llama_induction_series(tmp_path / "src", steps=600, save_every=200, one_lag=True)
    run = import_series(tmp_path / "src", tmp_path / "run").path
    result = analyze_imported(run, progress=False, patching=False)
    assert result.named_heads["induction"] == []
    copiers = [c for c in result.heads["induction"] if c["kind"] == "fixed_lag"]
    assert copiers and all(12 in c["lags"] for c in copiers if c["layer"] == 1) and copiers[0]["layer"] == 1
    probe = build_probe("induction", 64, 64, tokenizer=ImportedSeries(run).loaded_tokenizer)
    tokens = probe.scored_tokens()[:32]
    attention, _ = hf_attentions(tmp_path / "src" / f"step-{steps[-1]}", tokens)
    strongest = copiers[0]
    second_half = range(1 + probe.cfg.max_gap + probe.cfg.segment_len, tokens.shape[1])
    back = torch.stack([attention[:, strongest["layer"], strongest["index"], q, q - 11] for q in second_half])
    assert back.mean() > 0.5  # it looks 11 back whatever the sequence's lag: position, not content


def test_a_series_that_copies_by_position_has_no_induction_head(neox):
    result = neox[3]
    assert result.named_heads["induction"] == []
    calls = result.heads["induction"]
    assert all(c["kind"] != "named" for c in calls)
    for c in calls:  # where a head copies, its null (the same position with no repeat) draws as much attention
        for lag, (score, null, chance) in c["by_lag"].items():
            if score - chance > 0.2:
                assert null > score - 0.2, (c["head"], lag)


def test_the_detector_scores_are_head_detectors(neox):
    _, steps, run, result = neox
    series = ImportedSeries(run)
    model = None
    probe = build_probe("induction", 24, 64, segment_len=SEGMENT)
    sequences = [row[None] for row in probe.scored_tokens()]
    for record in (result.steps[0], result.steps[-1]):
        model = series.model(record.step, reuse=model)
        model.to_tokens = lambda seq: seq if torch.is_tensor(seq) else torch.zeros(1, 2, dtype=torch.long)
        for name, head in (("previous_token", "previous_token_head"), ("induction", "induction_head")):
            expected = detect_head(model, sequences, head)
            assert torch.allclose(torch.tensor(record.detector_scores[name]), expected.float(), atol=1e-5)


def test_analyze_prints_the_heads_and_the_transition_and_the_hessian_says_why_not(llama, capsys):
    from plateauscope.cli import main as cli_main

    run, steps = llama[2], llama[1]
    capsys.readouterr()
    assert cli_main(["analyze", "--run", str(run), "--no-progress", "--steps", *map(str, steps[-4:]),
                     "--n-examples", "16", "--ablation-groups", "2", "--n-exact", "2", "--circuit-pairs", "8",
                     "--n-exact-edges", "8", "--workers", "1"]) == 0  # then the full analysis on the probe: kept small
    out = capsys.readouterr().out
    assert "probe induction on 4 checkpoints of LlamaForCausalLM" in out and "induction heads: L1H" in out
    assert cli_main(["hessian", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the training data" in err
    assert cli_main(["analyze", "--run", str(run), "--bos", "banana", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--bos banana" in err


def test_moved_first_and_the_measures_read_the_probes_transition(llama, tmp_path):
    """One record: the loss gap's onset in the probe's pass is where moved_first (and the report's Measures table,
    which reads it) says the measured gap changes, from the same band."""
    import shutil

    from plateauscope.analysis.changepoint import moved_first
    from plateauscope.analysis.probe_pass import analyze_series
    from plateauscope.cli.text.analysis import moved_first_text

    run = tmp_path / "run"
    shutil.copytree(llama[2], run)
    passed, _ = analyze_series(run, every=2, progress=False, n_exact=1, edges=False)
    onset = passed.transition["onset"]
    moved = moved_first(run)
    row = moved["signals"]["measure:in_context_loss_gap"]
    assert moved["baseline_window"] == passed.transition["baseline"]
    assert row["step"] == round(onset["step"]) and row["bracket"] == onset["bracket"]
    assert moved["tau"] == round(passed.transition["phase_change"]["step"])
    t = passed.transition
    assert t["onset"]["step"] <= t["phase_change"]["step"] <= t["end"]["step"]  # in order, even at coarse steps
    text = moved_first_text(moved)
    assert "phase change at step" in text and "plateau" not in text and "tau" not in text.split("\n")[0]


def test_a_pass_killed_midway_resumes_with_the_missing_steps_only_and_the_same_bytes(llama, tmp_path):
    import shutil
    import signal
    import subprocess
    import sys

    from plateauscope.analysis.results import probe_pass_path

    _, steps, run, _ = llama
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    for folder in (whole, killed):
        shutil.copytree(run, folder)
        shutil.rmtree(folder / "analysis")
    chosen = steps[::4]
    kill_after = 4  # the child process dies by SIGKILL after its 4th step, as kill -9 does
    script = (f"import os, signal\nfrom plateauscope.analysis.probe_pass import analyze_imported\ndone = []\n"
              f"def step(s):\n    done.append(s)\n    if len(done) == {kill_after}: os.kill(os.getpid(), signal.SIGKILL)\n"
              f"analyze_imported({str(killed)!r}, steps={chosen!r}, progress=False, on_step=step)\n")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert child.returncode == -signal.SIGKILL and not probe_pass_path(killed, "induction").exists()
    computed = []
    analyze_imported(killed, steps=chosen, progress=False, on_step=computed.append)
    assert computed == chosen[kill_after:]  # only the missing steps
    analyze_imported(whole, steps=chosen, progress=False)
    assert probe_pass_path(killed, "induction").read_bytes() == probe_pass_path(whole, "induction").read_bytes()


def test_probe_only_runs_the_pass_alone_and_is_refused_on_a_run_trained_here(neox_series, tiny_run, tmp_path, capsys):
    """``analyze --probe-only``: the probe's record and its per-step cache, no analysis of the probe's data (no
    routing.json), and a report of the pass; on a run trained here, one line and exit code 2."""
    from plateauscope.analysis.results import probe_pass_path, routing_summary_path
    from plateauscope.cli import main as cli_main

    source, steps = neox_series
    run = import_series(source, tmp_path / "neox", steps=steps[-3:]).path
    assert cli_main(["analyze", "--run", str(run), "--probe-only", "--probe-length", str(SEGMENT),
                     "--no-progress"]) == 0
    assert "probe induction on 3 checkpoints" in capsys.readouterr().out
    assert probe_pass_path(run, "induction").exists() and not routing_summary_path(run).exists()
    assert cli_main(["report", "--run", str(run)]) == 0
    assert cli_main(["analyze", "--run", str(tiny_run), "--probe-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--probe-only" in err
