"""The conformance matrix: every verb on a tiny series of each family (``tests/sources/families.py``), saved with
``save_pretrained`` as a user's loop would, and each number checked against Hugging Face's own model by hand:
logits at every checkpoint, attention patterns against the eager implementation's ``output_attentions``, head
patching and single edges against forward hooks on the Hugging Face modules, and the built-in measures against
numpy on the Hugging Face parameters and hidden states.

Each test that passes writes its cell to ``RESULTS`` (a JSON lines file, when ``PLATEAUSCOPE_MATRIX`` names one):
``bench/family_matrix.py`` runs this file with it and writes the manual's matrix from the cells."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

import plateauscope as ps
from plateauscope.analysis.analyze import load_analysis
from plateauscope.analysis.inputs import last_logit_diff, prompt_pairs
from plateauscope.model.measures import collapse_positions
from plateauscope.runs.run import Run
from tests.sources.families import FAMILIES
from tests.sources.series_builders import SEGMENT, train_hf_series

pytestmark = pytest.mark.slow

STEPS = tuple(range(0, 121, 20))
N_EXAMPLES = 16
MATRIX = os.environ.get("PLATEAUSCOPE_MATRIX")
POST_NORM = {"gemma2", "olmo2"}
"""Families whose blocks normalise the attention output before the residual stream: edges are refused."""

# How each family's Hugging Face modules are laid out: the by-hand side of every check (never the toolkit's path).
# layers, input norm, q/k/v projections (or a joint one and its layout), attention output, the norm and module
# the MLP reads through, the final norm.
_SEPARATE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj"}
LAYOUT: dict[str, dict] = {
    "gpt2": dict(layers="transformer.h", ln="ln_1", qkv=("attn.c_attn", "blocks"), o="attn.c_proj", mlp_ln="ln_2",
                 mlp="mlp", final="transformer.ln_f"),
    "gpt_neox": dict(layers="gpt_neox.layers", ln="input_layernorm", qkv=("attention.query_key_value", "headwise"),
                     o="attention.dense", mlp_ln="post_attention_layernorm", mlp="mlp",
                     final="gpt_neox.final_layer_norm"),
    "phi": dict(layers="model.layers", ln="input_layernorm", qkv=_SEPARATE, o="self_attn.dense",
                mlp_ln="input_layernorm", mlp="mlp", final="model.final_layernorm"),
    "gptj": dict(layers="transformer.h", ln="ln_1", qkv={x: f"attn.{x}_proj" for x in "qkv"}, o="attn.out_proj",
                 mlp_ln="ln_1", mlp="mlp", final="transformer.ln_f"),
    "opt": dict(layers="model.decoder.layers", ln="self_attn_layer_norm", qkv=_SEPARATE, o="self_attn.out_proj",
                mlp_ln="final_layer_norm", mlp="fc1", final="model.decoder.final_layer_norm"),
    "bloom": dict(layers="transformer.h", ln="input_layernorm", qkv=("self_attention.query_key_value", "headwise"),
                  o="self_attention.dense", mlp_ln="post_attention_layernorm", mlp="mlp", final="transformer.ln_f"),
}
for _name in ("llama", "mistral", "qwen2", "qwen3", "olmo", "mixtral", "gemma2", "olmo2"):
    LAYOUT[_name] = dict(layers="model.layers", ln="input_layernorm", qkv=_SEPARATE, o="self_attn.o_proj",
                         mlp_ln="post_attention_layernorm", mlp="mlp", final="model.norm")


def record_cell(family: str, verb: str, outcome: str, detail: str = "") -> None:
    """One cell of the matrix, appended to ``PLATEAUSCOPE_MATRIX`` (when set)."""
    if MATRIX:
        with open(MATRIX, "a") as f:
            f.write(json.dumps({"family": family, "verb": verb, "outcome": outcome, "detail": detail}) + "\n")


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """A family's series, imported and analysed with ``plateauscope import`` and ``analyze`` as a user runs them."""
    from plateauscope.cli import main as cli

    name = request.param
    folder = tmp_path_factory.mktemp(name)
    train_hf_series(folder / "src", FAMILIES[name](), steps=STEPS[-1], save_every=STEPS[1], lr=5e-3,
                    trainer_state=False)
    for step in STEPS:  # as a plain loop saves them: step-N/ folders
        (folder / "src" / f"checkpoint-{step}").rename(folder / "src" / f"step-{step}")
    run = folder / "run"
    assert cli(["import", str(folder / "src"), "--out", str(run)]) == 0
    record_cell(name, "import", "tested", f"series.json of {len(STEPS)} save_pretrained step-N folders")
    argv = ["analyze", "--run", str(run), "--probe-length", str(SEGMENT), "--n-examples", str(N_EXAMPLES),
            "--ablation-groups", "2", "--n-exact", "2", "--circuit-pairs", "8", "--n-exact-edges", "4",
            "--no-progress", "--workers", "1"]
    code = cli(argv)
    return name, folder / "src", run, code


@cache
def hf_model(folder: Path, step: int, eager: bool = False) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    kw = {"attn_implementation": "eager"} if eager else {}
    return AutoModelForCausalLM.from_pretrained(folder / f"step-{step}", **kw).eval()


def module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def layer(model: torch.nn.Module, name: str, index: int) -> torch.nn.Module:
    return module(model, LAYOUT[name]["layers"])[index]


def test_analyze_runs_every_analysis_or_refuses_edges_in_one_line(family, capsys):
    name, _, run, code = family
    cache_ = load_analysis(run)
    for analysis in ("attention", "attribution", "measures", "patterns", "patch", "circuit", "ablation"):
        assert cache_[analysis], analysis
    assert Run(run).summary["ladder"] is not None  # the stages from the probe's references
    if name in POST_NORM:
        assert code == 2 and not cache_["edges"]
        routing = json.loads((run / "analysis" / "routing.json").read_text())
        assert "edges are undefined" in routing["refused"]["edges"] and name in routing["refused"]["edges"]
        record_cell(name, "analyze", "tested", "probe pass, attention, measures, patching, ablation, circuit, stages")
        record_cell(name, "edges", "refused", routing["refused"]["edges"].split(": ", 1)[1])
    else:
        assert code == 0
        assert cache_["edges"] and cache_["edge_circuit"] and cache_["edge_exact"]
        record_cell(name, "analyze", "tested", "probe pass, attention, measures, patching, ablation, circuit, stages")
    from plateauscope.cli import main as cli

    capsys.readouterr()
    if cli(["moved_first", "--run", str(run)]) == 0:
        record_cell(name, "moved_first", "tested")
    else:  # 7 checkpoints: too few before the loss gap's rise for a noise band, or no rise: one line, the data's
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("no band before its rise" in err or "no transition" in err)
        record_cell(name, "moved_first", "refused", "this tiny series: " + err.split(": ", 2)[-1])


def test_report_view_and_the_python_twins(family, capsys):
    from plateauscope.cli import main as cli

    name, _, run, _ = family
    assert cli(["report", "--run", str(run)]) == 0
    assert "imported series of" in (run / "report.html").read_text()
    record_cell(name, "report", "tested")
    capsys.readouterr()
    if name in POST_NORM:  # the view draws the edge circuit, which this family has none of
        assert cli(["view", "--run", str(run)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "edges are undefined" in err and not (run / "view.html").exists()
        record_cell(name, "view", "refused", "the time view draws the edge circuit: edges are undefined here")
    else:
        assert cli(["view", "--run", str(run)]) == 0 and (run / "view.html").exists()
        record_cell(name, "view", "tested")
    imported = ps.Run(run)
    assert imported.model(STEPS[-1]).cfg.n_layers == 2
    assert [r.step for r in imported.analysis().attention] == list(STEPS)
    assert ps.verify(run) == ([], len(STEPS))
    assert ps.write_report(run).name == "report.html"
    record_cell(name, "ps.Run", "tested", "model(step), metrics, analysis; ps.verify, ps.write_report")


def test_llc_of_the_whole_model_and_of_one_head(family):
    pytest.importorskip("devinterp")
    from plateauscope.cli import main as cli

    name, _, run, _ = family
    assert cli(["llc", "--run", str(run), "--steps", str(STEPS[-1]), "--chains", "1", "--draws", "8",
                "--burnin", "4", "--no-calibration", "--no-progress"]) == 0
    record_cell(name, "llc", "tested", "on the probe's sequences")
    assert cli(["llc", "--run", str(run), "--per-head", "--heads", "L1H0", "--steps", str(STEPS[-1]), "--draws", "8",
                "--burnin", "4", "--no-calibration", "--no-progress"]) == 0
    summary = json.loads((run / "analysis" / "head_llc.json").read_text())
    assert summary["heads"] == ["L1H0"] and np.isfinite(summary["llc"][0][0])
    assert summary["frozen_max_change"] == 0.0  # SGLD moved the head's weights only
    record_cell(name, "llc --per-head", "tested", "the head's weights: masks checked against hooks")


def test_a_heads_weights_are_its_rows_and_columns_of_the_hugging_face_projections(family):
    """What the per-head LLC samples (``head_masks``): zeroing head 2's query rows and output columns on the bridge
    computes what Hugging Face's model computes with that head's query and its output zeroed by hooks."""
    from plateauscope.analysis.head_llc import head_masks

    name, source, run, _ = family
    imported = Run(run)
    model = imported.model(STEPS[-1])
    masks = head_masks(model, 1, 2, ("W_Q", "b_Q", "W_O"))
    with torch.no_grad():
        for p, mask in zip(model.parameters(), masks):
            p[mask] = 0.0
    hf = hf_model(source, STEPS[-1])
    cfg = hf.config
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    path, cut = _columns(name, "q", 2, d_head, cfg.hidden_size)
    second = layer(hf, name, 1)

    def no_query(m, args, out):
        out = out.clone()
        out[..., cut] = 0.0
        return out

    def no_output(m, args):
        z = args[0].clone()
        z[..., 2 * d_head: 3 * d_head] = 0.0
        return (z, *args[1:])

    handles = [module(second, path).register_forward_hook(no_query),
               module(second, LAYOUT[name]["o"]).register_forward_pre_hook(no_output)]
    tokens = imported.task().tokens[:8, : imported.task().input_len]
    with torch.no_grad():
        by_hand, ours = hf(tokens).logits, model(tokens)
    for handle in handles:
        handle.remove()
    assert torch.allclose(ours, by_hand, atol=1e-4), (name, float((ours - by_hand).abs().max()))
    assert (ours - imported.model(STEPS[-1])(tokens)).abs().max() > 1e-4  # the head mattered: the check can fail


def test_logits_equal_hugging_faces_at_every_checkpoint(family):
    name, source, run, _ = family
    imported = Run(run)
    tokens = imported.task().tokens[:8, : imported.task().input_len]
    model = None
    for step in imported.steps:
        model = imported.model(step, reuse=model)
        with torch.no_grad():
            ours, theirs = model(tokens), hf_model(source, step)(tokens).logits
        assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (name, step, float((ours - theirs).abs().max()))
    record_cell(name, "logits", "tested", "every checkpoint, to 1e-4")


def test_attention_patterns_equal_the_eager_implementation(family):
    name, source, run, _ = family
    imported = Run(run)
    tokens = imported.task().tokens[:8, : imported.task().input_len]
    model = imported.model(STEPS[-1])
    with torch.no_grad():
        _, cache_ = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        theirs = hf_model(source, STEPS[-1], eager=True)(tokens, output_attentions=True).attentions
    for index, expected in enumerate(theirs):
        assert torch.allclose(cache_[f"blocks.{index}.attn.hook_pattern"], expected, atol=1e-5), (name, index)
    record_cell(name, "attention", "tested", "hook_pattern = output_attentions (eager)")


def test_head_patching_equals_hooks_on_the_hugging_face_model(family):
    """The analysis's exact head patching (the cached record) against each head's output patched by hand: the input
    of the attention's output projection, that head's slice, from the clean run into the corrupted one."""
    name, source, run, _ = family
    imported = Run(run)
    record = load_analysis(run)["patch"][-1]
    hf = hf_model(source, record["step"])
    pairs = prompt_pairs(imported.task(), N_EXAMPLES, 0)
    n_heads = hf.config.num_attention_heads
    d_head = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // n_heads
    raw = torch.tensor(record["heads"]["raw"])
    for index in range(raw.shape[0]):
        out_proj = module(layer(hf, name, index), LAYOUT[name]["o"])
        seen = {}
        handle = out_proj.register_forward_pre_hook(lambda m, args: seen.update(z=args[0]))
        with torch.no_grad():
            hf(pairs.clean)
        handle.remove()
        for head in range(n_heads):
            cut = slice(head * d_head, (head + 1) * d_head)

            def patch(m, args, cut=cut):
                z = args[0].clone()
                z[..., cut] = seen["z"][..., cut]
                return (z, *args[1:])

            handle = out_proj.register_forward_pre_hook(patch)
            with torch.no_grad():
                by_hand = last_logit_diff(hf(pairs.corrupt).logits[:, pairs.pred_pos], pairs)
            handle.remove()
            assert float(raw[index, head]) == pytest.approx(float(by_hand), abs=1e-4), (name, index, head)
    assert raw.max() - raw.min() > 1e-3  # the heads differ: the check can fail
    record_cell(name, "head patching", "tested", "against forward pre-hooks on the output projection")


def _columns(name: str, which: str, head: int, d_head: int, d_model: int) -> tuple[str, slice]:
    """The projection module of ``which`` and the columns of its output that are ``head``'s (a key/value head's)."""
    spec = LAYOUT[name]["qkv"]
    if isinstance(spec, dict):
        return spec[which], slice(head * d_head, (head + 1) * d_head)
    path, kind = spec
    i = "qkv".index(which)
    if kind == "blocks":  # GPT-2: all queries, then all keys, then all values
        return path, slice(i * d_model + head * d_head, i * d_model + (head + 1) * d_head)
    return path, slice((3 * head + i) * d_head, (3 * head + i + 1) * d_head)  # per head: its q, k, v


def test_single_edges_equal_hooks_on_the_hugging_face_model(family):
    """Exact patching of single edges from a layer-0 head (``patch_each_edge``) against Hugging Face's forward with
    the clean-minus-corrupted output of that head added where the receiver reads it, by hand: a query, a key and a
    value input (through the block's input norm and projection: under grouped keys, a key/value head's), the next
    MLP (through its norm), the logits (through the final norm)."""
    from plateauscope.analysis.edges import EdgeRuns, patch_each_edge

    name, source, run, _ = family
    if name in POST_NORM:
        pytest.skip("edges are refused for this family (test_analyze_runs_every_analysis_or_refuses_edges_in_one_line)")
    imported, lay = Run(run), LAYOUT[name]
    hf = hf_model(source, STEPS[-1])
    pairs = prompt_pairs(imported.task(), N_EXAMPLES, 0)
    runs = EdgeRuns.of(imported.model(STEPS[-1]), pairs)
    cfg = hf.config
    n_heads, d_model = cfg.num_attention_heads, cfg.hidden_size
    d_head = getattr(cfg, "head_dim", None) or d_model // n_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    group = n_heads // n_kv
    first, second = layer(hf, name, 0), layer(hf, name, 1)
    out_proj = module(first, lay["o"])
    sender = 1

    def sender_output(tokens: torch.Tensor) -> torch.Tensor:
        seen = {}
        handle = out_proj.register_forward_pre_hook(lambda m, args: seen.update(z=args[0]))
        with torch.no_grad():
            hf(tokens)
        handle.remove()
        cut = slice(sender * d_head, (sender + 1) * d_head)
        w = out_proj.weight[cut, :] if type(out_proj).__name__ == "Conv1D" else out_proj.weight[:, cut].T
        return seen["z"][..., cut] @ w

    delta = sender_output(pairs.clean) - sender_output(pairs.corrupt)

    def head_input(which: str, head: int) -> list:
        path, cut = _columns(name, which, head, d_head, d_model)
        proj, norm, seen = module(second, path), module(second, lay["ln"]), {}

        def replace(m, args, out):
            alt = m.forward(norm.forward(seen["x"] + delta))
            out = out.clone()
            out[..., cut] = alt[..., cut]
            return out

        return [norm.register_forward_pre_hook(lambda m, args: seen.update(x=args[0])),
                proj.register_forward_hook(replace)]

    def mlp_input() -> list:
        norm, entry, seen = module(second, lay["mlp_ln"]), module(second, lay["mlp"]), {}
        return [norm.register_forward_pre_hook(lambda m, args: seen.update(x=args[0])),
                entry.register_forward_pre_hook(  # OPT runs its MLP on [batch * pos, d]
                    lambda m, args: (norm.forward(seen["x"] + delta.reshape(seen["x"].shape)), *args[1:]))]

    def metric(handles: list) -> float:
        with torch.no_grad():
            logits = hf(pairs.corrupt).logits[:, pairs.pred_pos]
        for handle in handles:
            handle.remove()
        return float(last_logit_diff(logits, pairs))

    corrupt = metric([])
    names = runs.graph.edge_names()
    cases = [("L1H0", "q", lambda: head_input("q", 0)),
             (f"L1H{group}", "k", lambda: head_input("k", 1)),  # the second key/value head
             ("L1H0", "v", lambda: head_input("v", 0)),
             ("MLP1", "mlp", mlp_input),
             ("logits", "logits",
              lambda: [module(hf, lay["final"]).register_forward_pre_hook(lambda m, args: (args[0] + delta,))])]
    largest = 0.0
    for receiver, kind, handles in cases:
        index = next(i for i, e in enumerate(names) if (e["sender"], e["receiver"], e["input"]) ==
                     (f"L0H{sender}", receiver, kind))
        expected = metric(handles()) - corrupt
        got = float(patch_each_edge(runs, [index]).effect[index])
        assert got == pytest.approx(expected, abs=1e-4, rel=1e-3), (name, receiver, kind)
        largest = max(largest, abs(expected))
    assert largest > 1e-3  # an edge that matters: the check can fail
    record_cell(name, "edges", "tested", "single edges against forward hooks (q, k, v, MLP, logits)")


def test_measures_equal_numpy_on_the_hugging_face_model(family):
    name, source, run, _ = family
    imported = Run(run)
    record = next(r for r in load_analysis(run)["measures"] if r["step"] == STEPS[-1])["values"]
    hf = hf_model(source, STEPS[-1])
    unique = {id(p): (n, p.detach().double().numpy()) for n, p in hf.named_parameters(remove_duplicate=False)}
    squares = {n: float(np.square(p).sum()) for n, p in unique.values()}
    assert record["weight_norm"] == pytest.approx(sum(squares.values()) ** 0.5, rel=1e-9)
    prefix = LAYOUT[name]["layers"]
    for index in range(2):
        by_hand = sum(v for n, v in squares.items() if n.startswith(f"{prefix}.{index}.")) ** 0.5
        assert record["weight_norm_layer"][index] == pytest.approx(by_hand, rel=1e-9)
    s = np.linalg.svd(hf.get_input_embeddings().weight.detach().double().numpy(), compute_uv=False)
    p = s[s > 0] / s.sum()
    assert record["embedding_rank"] == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-6)

    task = imported.task()
    tokens = task.tokens[task.sample_examples(N_EXAMPLES, 0)][:, : task.input_len]
    outputs: list[np.ndarray] = []
    handles = [layer(hf, name, i).register_forward_hook(
        lambda m, args, out: outputs.append((out[0] if isinstance(out, tuple) else out).double().numpy()))
        for i in range(2)]
    with torch.no_grad():
        logits = hf(tokens).logits.numpy()
    for handle in handles:
        handle.remove()
    positions = collapse_positions(task.loss_positions, task.input_len)
    for index, hidden in enumerate(outputs):
        unit = hidden[:, positions] / np.linalg.norm(hidden[:, positions], axis=-1, keepdims=True)
        sims = np.einsum("npd,nqd->npq", unit, unit)
        n = len(positions)
        pairwise = (sims.sum((1, 2)) - np.trace(sims, axis1=1, axis2=2)) / (n * (n - 1))
        assert record["collapse"][index] == pytest.approx(float(pairwise.mean()), abs=1e-5)
    predicted = logits[:, task.loss_positions].argmax(-1)
    assert record["repetition_bias"] == pytest.approx(float((predicted[:, 1:] == predicted[:, :-1]).mean()), abs=1e-9)
    record_cell(name, "measures", "tested", "weight norm, effective rank, collapse, repetition bias against numpy")


@pytest.mark.parametrize("family", ["llama"], indirect=True)
def test_a_llama_series_reports_and_views_in_chromium(family, chromium_binary, tmp_path):
    """A Llama series saved as ``step-N/`` by a plain loop, analysed to the end: its report and time view open in
    headless Chromium, every figure drawn, nothing fetched, no error."""
    from plateauscope.cli import main as cli
    from tests.views.test_report_browser import render
    from tests.views.test_time_view_browser import js, open_page

    _, _, run, _ = family
    assert cli(["report", "--run", str(run)]) == 0 and cli(["view", "--run", str(run)]) == 0
    probe = render(chromium_binary, run / "report.html", tmp_path / "report-profile")
    assert probe["figures"] > 0 and probe["figuresRendered"] == probe["figures"]
    assert not probe["remote"] and not probe["errors"], probe
    browser = open_page(chromium_binary, run / "view.html", tmp_path / "view-profile")
    try:
        assert js(browser, "document.querySelectorAll('[data-node]').length") > 0
    finally:
        browser.close()
