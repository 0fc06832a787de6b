"""Every analysis that does not need the training data, on an imported GPT-NeoX series (rotary embeddings,
parallel attention and MLP): ``plateauscope analyze``, the report, the time view and ``ps.Run``; one number
checked against TransformerLens's own patching, the probe's evaluation against Hugging Face's forward, and
the Hessian refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens import patching

import plateauscope as ps
from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.edges import EdgeGraph
from plateauscope.analysis.inputs import last_logit_diff, prompt_pairs
from plateauscope.analysis.results import analysis_dir
from plateauscope.runs.imported import PROBE_FILE, PROBE_METRICS_FILE, ImportedRun
from plateauscope.runs.run import Run
from plateauscope.sources.importer import import_series
from tests.sources.series_builders import SEGMENT

STEPS = (0, 60, 120)
N_EXAMPLES = 16


@pytest.fixture(scope="module")
def analysed(neox_series, tmp_path_factory):
    """The imported series analysed at three steps with small settings (the CLI, as a user runs it)."""
    from plateauscope.cli.analyze import main

    source, _ = neox_series
    run = import_series(source, tmp_path_factory.mktemp("imported") / "run").path
    argv = ["--run", str(run), "--steps", *map(str, STEPS), "--probe-length", str(SEGMENT),
            "--n-examples", str(N_EXAMPLES), "--ablation-groups", "2", "--n-exact", "2", "--circuit-pairs", "8",
            "--n-exact-edges", "8", "--no-progress", "--workers", "1"]
    assert main(argv) == 0
    return source, run


def test_analyze_runs_every_analysis_on_the_probe(analysed):
    _, run = analysed
    folder = analysis_dir(run)
    assert json.loads((folder / PROBE_FILE).read_text()) == {"probe": "induction", "options": {"segment_len": SEGMENT}}
    cache = load_analysis(run)
    for name in ("attention", "attribution", "edges", "measures", "patterns"):  # the cheap pass: every step
        assert [r["step"] for r in cache[name]] == list(STEPS), name
    for name in ("patch", "circuit", "ablation", "edge_circuit", "edge_exact"):  # the expensive pass: landmarks
        assert cache[name], name
    routing = cache["routing"]
    assert routing is not None and routing["plan"]["steps"]
    metrics = Run(run).metrics()
    assert [r["step"] for r in metrics] == list(STEPS)
    assert all("loss" not in r for r in metrics)  # no training loss is made up
    # this series copies at one lag and position (tests/sources/test_probe_series.py), and the probe copies at
    # several: whether its repeat loss crosses half its height is the data's answer; routing.json says the same
    expected = next((r["step"] for r in metrics if r["repeat_loss"] < 0.5 * Run(run).progress.height), None)
    assert routing["tau"] == expected


def test_head_patching_equals_transformer_lens(analysed):
    _, run = analysed
    imported = Run(run)
    record = load_analysis(run)["patch"][-1]
    model = imported.model(record["step"])
    pairs = prompt_pairs(imported.task(), N_EXAMPLES, 0)
    _, clean_cache = model.run_with_cache(pairs.clean)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return last_logit_diff(logits[:, pairs.pred_pos], pairs)

    expected = patching.get_act_patch_attn_head_out_all_pos(model, pairs.corrupt, clean_cache, metric)
    assert torch.allclose(torch.tensor(record["heads"]["raw"]), expected.float(), atol=1e-4)
    assert expected.abs().max() > 0.1  # the heads matter at the last step: the check can fail


def test_the_probe_evaluation_is_hugging_faces(analysed):
    from transformers import AutoModelForCausalLM

    source, run = analysed
    imported = Run(run)
    task, tc = imported.task(), imported.config.train
    evalset = task.build_evalset(tc.eval_groups, tc.tracked_groups, tc.seed)
    hf = AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{STEPS[-1]}").eval()
    with torch.no_grad():
        logp = hf(evalset.repeats[:, : task.input_len]).logits.log_softmax(-1)
    pos = torch.tensor(task.loss_positions)
    target = evalset.repeats[:, pos + 1]
    repeat_loss = -logp[:, pos].gather(-1, target[..., None]).mean()
    assert imported.metrics()[-1]["repeat_loss"] == pytest.approx(float(repeat_loss), abs=1e-4)


def test_the_edge_graph_of_parallel_attention(analysed):
    _, run = analysed
    graph = EdgeGraph.of(Run(run).model(0))
    assert graph.parallel
    names = graph.edge_names()
    # the MLP reads the layer's input: no head of its own layer sends to it
    assert not any(e["sender"].startswith("L0H") and e["receiver"] == "MLP0" for e in names)
    assert any(e["sender"].startswith("L0H") and e["receiver"] == "MLP1" for e in names)
    assert len(names) == len(EdgeGraph(2, 2, True).edges) - 2 * 2  # the two layers' heads -> their own MLP: gone


def test_report_and_view_render(analysed):
    from plateauscope.cli.report import main as report
    from plateauscope.cli.view import main as view

    _, run = analysed
    assert report(["--run", str(run)]) == 0
    assert view(["--run", str(run)]) == 0
    text = (run / "report.html").read_text()
    assert "imported series of GPTNeoXForCausalLM" in text and "the probe&#x27;s own sequences" in text
    assert "tau at thresholds" not in text  # summary.json's, which an imported run has none of
    assert "training loss (nats" not in text  # no curve of a training loss it does not have
    view_text = (run / "view.html").read_text()
    assert f"{run.name}: the circuit over training" in view_text and "repeat loss" in view_text


def test_ps_run_in_a_notebook(analysed):
    _, run = analysed
    notebook = ps.Run(run)
    assert isinstance(notebook, ImportedRun) and isinstance(notebook, ps.Run)
    assert set(notebook.summary) == {"ladder"} and notebook.steps[0] == 0  # the probe's stages, nothing trained
    last = notebook.metrics()[-1]  # on repeats the in-context bigram is the copy, one-hot: KL = the repeat loss
    assert last["kl_bigram"] == pytest.approx(last["repeat_loss"], abs=1e-4)
    analysis = notebook.analysis()
    assert [r.step for r in analysis.attention] == list(STEPS)
    assert (analysis_dir(run) / PROBE_METRICS_FILE).exists()
    model = notebook.model(STEPS[-1])
    assert model.cfg.n_layers == notebook.config.model.n_layers == 2


def test_the_hessian_says_why_not(analysed, capsys):
    from plateauscope.cli.hessian import main as hessian

    _, run = analysed
    assert hessian(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs the training data" in err and "Hessian" in err


def test_edges_of_parallel_attention_equal_hugging_faces_forward(analysed):
    """Exact patching of single edges on the bridge (``patch_each_edge``: rotary keys, parallel attention and MLP)
    against Hugging Face's own GPT-NeoX forward with the clean head output added where that receiver reads:
    a head's key (through the layer norm, the fused QKV projection and the rotary embedding), the MLP of the
    next layer, the logits."""
    from transformers import AutoModelForCausalLM

    from plateauscope.analysis.edges import EdgeRuns, patch_each_edge

    source, run = analysed
    imported = Run(run)
    pairs = prompt_pairs(imported.task(), N_EXAMPLES, 0)
    runs = EdgeRuns.of(imported.model(STEPS[-1]), pairs)
    hf = AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{STEPS[-1]}").eval()
    layers, d_head = hf.gpt_neox.layers, hf.config.hidden_size // hf.config.num_attention_heads
    sender = 1  # L0H1: its edges are the strongest at the last step

    def sender_output(tokens: torch.Tensor) -> torch.Tensor:  # L0H1's share of layer 0's dense projection
        seen = {}
        handle = layers[0].attention.dense.register_forward_pre_hook(lambda m, args: seen.update(z=args[0]))
        with torch.no_grad():
            hf(tokens)
        handle.remove()
        cut = slice(sender * d_head, (sender + 1) * d_head)
        return seen["z"][..., cut] @ layers[0].attention.dense.weight[:, cut].T

    delta = sender_output(pairs.clean) - sender_output(pairs.corrupt)

    def head_input(head: int, which: int) -> list:  # one head's q / k / v (0 / 1 / 2) from the patched stream
        seen = {}

        def replace(module, args, out):
            norm = layers[1].input_layernorm  # called as functions: the hooks stay out of it
            normed = torch.nn.functional.layer_norm(seen["x"] + delta, norm.normalized_shape, norm.weight, norm.bias,
                                                    norm.eps)
            alt = torch.nn.functional.linear(normed, module.weight, module.bias)
            shape = (*out.shape[:-1], -1, 3 * d_head)
            out, alt = out.view(shape).clone(), alt.view(shape)
            cut = slice(which * d_head, (which + 1) * d_head)
            out[..., head, cut] = alt[..., head, cut]
            return out.flatten(-2)

        return [layers[1].input_layernorm.register_forward_pre_hook(lambda m, args: seen.update(x=args[0])),
                layers[1].attention.query_key_value.register_forward_hook(replace)]

    def metric(handles: list) -> float:
        with torch.no_grad():
            logits = hf(pairs.corrupt).logits[:, pairs.pred_pos]
        for handle in handles:
            handle.remove()
        return float(last_logit_diff(logits, pairs))

    def added(module: torch.nn.Module) -> list:
        return [module.register_forward_pre_hook(lambda m, args: (args[0] + delta,))]

    corrupt = metric([])
    names = runs.graph.edge_names()
    for receiver, kind, handles in (("L1H1", "k", lambda: head_input(1, 1)), ("L1H0", "v", lambda: head_input(0, 2)),
                                    ("MLP1", "mlp", lambda: added(layers[1].post_attention_layernorm)),
                                    ("logits", "logits", lambda: added(hf.gpt_neox.final_layer_norm))):
        index = next(i for i, e in enumerate(names)
                     if (e["sender"], e["receiver"], e["input"]) == (f"L0H{sender}", receiver, kind))
        expected = metric(handles()) - corrupt
        assert abs(expected) > 0.01, receiver  # an edge that matters: the check can fail
        assert float(patch_each_edge(runs, [index]).effect[index]) == pytest.approx(expected, abs=1e-4), receiver


def test_the_llc_samples_on_the_probes_sequences(analysed, capsys):
    """The LLC of an imported run: its loss at the checkpoint is Hugging Face's model's task loss on the probe's
    sequences (computed by hand)."""
    pytest.importorskip("devinterp")
    from transformers import AutoModelForCausalLM

    from plateauscope.cli.llc import main as llc

    source, run = analysed
    steps = (STEPS[0], STEPS[-1])
    argv = ["--run", str(run), "--steps", *map(str, steps), "--chains", "2", "--draws", "30", "--burnin", "10",
            "--no-calibration", "--no-progress"]
    assert llc(argv) == 0
    assert "the loss on 512 probe sequences" in capsys.readouterr().out
    summary = json.loads((analysis_dir(run) / "llc.json").read_text())
    task = Run(run).task()
    assert summary["data"].startswith(f"{len(task.tokens)} probe sequences")
    records = {r["step"]: r for r in map(json.loads, (analysis_dir(run) / "llc.jsonl").read_text().splitlines())}
    for step in steps:
        hf = AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{step}").eval()
        with torch.no_grad():
            logp = hf(task.tokens[:, : task.input_len]).logits.log_softmax(-1)
        pos = torch.tensor(task.loss_positions)
        by_hand = -logp[:, pos].gather(-1, task.tokens[:, pos + 1, None]).mean()
        assert records[step]["init_loss"] == pytest.approx(float(by_hand), abs=1e-4)


def test_an_unexpected_error_is_one_line_naming_where_with_the_traceback_in_a_log(analysed, capsys, monkeypatch):
    """A bug inside one analysis (here injected into the attention patterns' record) is no traceback on the screen:
    one line naming the analysis, the checkpoint and the family, exit code 1, and the traceback in the run's log."""
    from plateauscope.analysis import analyze as driver
    from plateauscope.cli.analyze import main
    from plateauscope.cli.common import ERROR_LOG

    def broken(*args, **kwargs):
        raise RuntimeError("injected\nsecond line")

    monkeypatch.setattr(driver, "pattern_record", broken)
    _, run = analysed
    argv = ["--run", str(run), "--steps", str(STEPS[-1]), "--probe-length", str(SEGMENT), "--n-examples", "8",
            "--seed", "7", "--no-edges", "--n-exact", "0", "--no-progress", "--workers", "1"]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"patterns at step {STEPS[-1]} on gpt_neox (GPTNeoXForCausalLM" in err and "RuntimeError: injected" in err
    log = run / ERROR_LOG
    assert str(log) in err and "Traceback" in log.read_text() and "in broken" in log.read_text()


def test_ps_analyze_is_the_cli_on_an_imported_run(analysed, tmp_path):
    """``ps.import_series`` and ``ps.analyze(run, probe=...)``: the same records as the command line's."""
    source, cli_run = analysed
    run = ps.import_series(source, tmp_path / "run").path
    summary = ps.analyze(run, steps=list(STEPS), probe="induction", probe_options={"segment_len": SEGMENT},
                         progress=False, workers=1, n_exact=2, n_examples=N_EXAMPLES, ablation_groups=2,
                         circuit_pairs=8, n_exact_edges=8)
    assert summary["probe"]["probe"] == "induction" and [s["step"] for s in summary["probe"]["steps"]] == list(STEPS)
    assert json.loads((analysis_dir(run) / PROBE_FILE).read_text())["options"] == {"segment_len": SEGMENT}
    ours, theirs = load_analysis(run), load_analysis(cli_run)
    assert [r["heads"]["raw"] for r in ours["patch"]] == [r["heads"]["raw"] for r in theirs["patch"]]
    assert [r["effect"] for r in ours["edges"]] == [r["effect"] for r in theirs["edges"]]
