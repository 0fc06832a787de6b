"""Edges of the residual-stream graph (``plateauscope.analysis.edges``), against independent computations.

* The graph: edge counts of the demo and induction shapes counted by hand, no edge upstream.
* Exact edge patching against a brute force written with TransformerLens hooks alone: the receiver's
  read is recomputed from the corrupted run's residual stream plus the sender's clean-minus-corrupted
  output (taken from ``hook_result`` with ``use_attn_result``, not from ``z @ W_O``), through the
  block's own LayerNorm and weights, and swapped in after the projection.
* Attribution against a finite difference of the same patch in float64: the first-order term.
* Faithfulness at its two ends (every edge: 1, no edge: 0).
* Hand-built models with known circuits: the faithful circuit is exactly the built edges.
* The circuit's stability rule on made-up series; the summary and the analysis cache on a tiny run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformer_lens.utilities import get_act_name

from plateauscope.analysis.edges import (
    EdgeGraph,
    EdgeRuns,
    edge_attribution,
    faithful_circuit,
    faithfulness,
    jaccard_to_last,
    patch_each_edge,
    patch_edges,
    stable_from,
)
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.model.backend import Model, initial_hooked_state, model_from_hooked_state
from plateauscope.tasks.base import PromptPairs
from tests.handbuilt import handbuilt_task, selector_copy_model
from tests.handbuilt_induction import handbuilt_induction_task, induction_model


def random_model(dtype: torch.dtype = torch.float32, attn_only: bool = False) -> Model:
    cfg = dict(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=32, d_vocab=17, d_vocab_out=17, n_ctx=9,
               act_fn="gelu", normalization_type="LN", attn_only=attn_only, default_prepend_bos=False)
    # larger weights than the default init, so that the model is far from linear
    state = {k: 4.0 * v if v.is_floating_point() else v for k, v in initial_hooked_state(cfg, seed=3).items()}
    return model_from_hooked_state(cfg, state).to(dtype).eval()


def random_pairs(n: int = 12, pos: int = 9, diverge: int = 4) -> PromptPairs:
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 17, (n, pos), generator=gen)
    corrupt = clean.clone()
    corrupt[:, diverge:] = torch.randint(0, 17, (n, pos - diverge), generator=gen)
    answers = torch.randint(0, 17, (2, n), generator=gen)
    return PromptPairs(clean, corrupt, answers[0], (answers[1] + 1 + answers[0]) % 17, torch.arange(n), pos - 1)


def test_graph_counts():
    demo = EdgeGraph(4, 4, True)  # heads of layer l read 1 + 5l senders, the MLP of l 5 + 5l, the logits 21
    assert len(demo.edges) == 12 * (1 + 6 + 11 + 16) + (5 + 10 + 15 + 20) + 21 == 479
    attn_only = EdgeGraph(2, 2, False)
    assert len(attn_only.edges) == 6 * 1 + 6 * 3 + 5 == 29
    rank = {name: r for name, r in demo.senders}
    for s, r in demo.edges:
        assert rank[demo.senders[s][0]] < demo.receivers[r][2]
    assert [n["id"] for n in demo.nodes()][:3] == ["embed", "L0H0", "L0H1"] and demo.nodes()[-1]["id"] == "logits"


def brute_force_edge(model: Model, pairs: PromptPairs, sender: str, receiver: str, kind: str) -> float:
    """The corrupted run with ``receiver`` reading ``sender`` from the clean run: hooks only (a head's
    output is its ``hook_z`` times its ``W_O``: TransformerLens 4's bridge has no ``hook_result``)."""
    _, clean = model.run_with_cache(pairs.clean)
    _, corrupt = model.run_with_cache(pairs.corrupt)

    def output(cache, name: str) -> torch.Tensor:
        if name == "embed":
            return cache[get_act_name("resid_pre", 0)]
        if name.startswith("MLP"):
            return cache[get_act_name("mlp_out", int(name[3:]))]
        layer, head = map(int, name[1:].split("H"))
        return cache[get_act_name("z", layer)][:, :, head] @ model.blocks[layer].attn.W_O[head]

    delta = output(clean, sender) - output(corrupt, sender)
    hooks = []
    if receiver == "logits":
        final = corrupt[get_act_name("resid_post", model.cfg.n_layers - 1)] + delta
        logits = model.unembed(model.ln_final(final))
    else:
        if receiver.startswith("MLP"):
            layer = int(receiver[3:])
            block = model.blocks[layer]
            read = block.mlp(block.ln2(corrupt[get_act_name("resid_mid", layer)] + delta))
            hooks.append((get_act_name("mlp_out", layer), lambda act, hook: read))
        else:
            layer, head = map(int, receiver[1:].split("H"))
            attn = model.blocks[layer].attn
            x = model.blocks[layer].ln1(corrupt[get_act_name("resid_pre", layer)] + delta)
            W, b = {"q": (attn.W_Q, attn.b_Q), "k": (attn.W_K, attn.b_K), "v": (attn.W_V, attn.b_V)}[kind]
            read = x @ W[head] + b[head]

            def swap(act, hook):
                act = act.clone()
                act[:, :, head] = read
                return act
            hooks.append((get_act_name(kind, layer), swap))
        logits = model.run_with_hooks(pairs.corrupt, fwd_hooks=hooks)
    last = logits[:, pairs.pred_pos]
    diff = last.gather(1, pairs.clean_answer[:, None]) - last.gather(1, pairs.corrupt_answer[:, None])
    return diff.mean().item()


@torch.no_grad()
def test_exact_edge_patching_equals_a_brute_force_with_hooks():
    model, pairs = random_model(torch.float64), random_pairs()  # float64: 1e-5 measures the method, not rounding
    runs = EdgeRuns.of(model, pairs)
    names = runs.graph.edge_names()
    chosen = [i for i, e in enumerate(names) if (e["sender"], e["receiver"], e["input"]) in {
        ("embed", "L0H1", "q"), ("embed", "L0H2", "k"), ("embed", "L0H0", "v"), ("L0H1", "L1H2", "q"),
        ("L0H0", "L1H1", "k"), ("MLP0", "L1H0", "v"), ("L0H2", "MLP0", "mlp"), ("MLP0", "MLP1", "mlp"),
        ("embed", "logits", "logits"), ("L1H1", "logits", "logits"), ("MLP1", "logits", "logits")}]
    assert len(chosen) == 11
    exact = patch_each_edge(runs, chosen)
    for i in chosen:
        e = names[i]
        brute = brute_force_edge(model, pairs, e["sender"], e["receiver"], e["input"])
        assert exact.effect[i].item() + runs.corrupt == pytest.approx(brute, abs=1e-5), e
    assert abs(exact.effect[chosen]).max() > 0.05  # the check is not vacuous
    assert torch.isnan(exact.effect[[i for i in range(len(names)) if i not in chosen]]).all()


def test_patches_split_into_passes_by_their_memory_give_the_same_metrics(monkeypatch):
    """A pass holds at most ``PASS_BYTES`` of differences (an imported model's width would take gigabytes): the
    patches, one pass each, equal the brute force as they do side by side."""
    from plateauscope.analysis import edges

    model, pairs = random_model(torch.float64), random_pairs()
    runs = EdgeRuns.of(model, pairs)
    n = len(runs.graph.edges)
    masks = torch.rand(6, n, generator=torch.Generator().manual_seed(0)) < 0.5
    together = faithfulness(runs, masks)
    monkeypatch.setattr(edges, "PASS_BYTES", 1)
    assert faithfulness(runs, masks).tolist() == pytest.approx(together.tolist(), abs=1e-9)
    chosen = [i for i, e in enumerate(runs.graph.edge_names()) if e["sender"] == "L0H1"]
    exact = patch_each_edge(runs, chosen)
    for i in chosen:
        e = runs.graph.edge_names()[i]
        brute = brute_force_edge(model, pairs, e["sender"], e["receiver"], e["input"])
        assert exact.effect[i].item() + runs.corrupt == pytest.approx(brute, abs=1e-5), e


def test_attribution_is_the_first_order_term_of_the_edge_patch():
    model, pairs = random_model(torch.float64), random_pairs()
    runs = EdgeRuns.of(model, pairs)
    scores = edge_attribution(runs)
    # the patch with the sender moved eps from the corrupted output towards (and away from) the clean
    # one, every edge on its own: a central difference
    eps = 1e-6
    delta = runs.clean_out - runs.corrupt_out
    patched = torch.eye(len(runs.graph.edges), dtype=torch.bool)
    plus, minus = (patch_edges(runs, runs.pairs.corrupt, runs.corrupt_out + sign * eps * delta, patched)
                   for sign in (1, -1))
    slope = (plus - minus) / (2 * eps)
    assert torch.allclose(scores.effect.double(), slope, atol=1e-3, rtol=1e-4), (scores.effect - slope).abs().max()
    assert scores.effect.abs().max() > 0.1
    # and away from linear, the exact patch differs from it (so the two checks above are distinct)
    exact = patch_each_edge(runs, list(range(len(runs.graph.edges))))
    assert (exact.effect - scores.effect).abs().max() > 1e-3


def test_attribution_on_the_clean_run_differs_only_in_where_the_gradient_is_taken():
    model, pairs = random_model(torch.float64), random_pairs()
    runs = EdgeRuns.of(model, pairs)
    swapped = EdgeRuns.of(model, PromptPairs(pairs.corrupt, pairs.clean, pairs.corrupt_answer, pairs.clean_answer,
                                             pairs.examples, pairs.pred_pos))
    # on the clean run == the corrupted-run attribution of the swapped pairs (metric and delta both flip)
    assert torch.allclose(edge_attribution(runs, on="clean").effect, edge_attribution(swapped).effect, atol=1e-9)
    with pytest.raises(ValueError, match="on must be"):
        edge_attribution(runs, on="both")


def test_faithfulness_of_every_edge_is_one_and_of_none_is_zero():
    model, pairs = random_model(), random_pairs()
    runs = EdgeRuns.of(model, pairs)
    n = len(runs.graph.edges)
    ends = faithfulness(runs, torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)]))
    assert ends.tolist() == pytest.approx([1.0, 0.0], abs=1e-4)


def edge_set(runs: EdgeRuns, edges: list[int]) -> set[tuple[str, str, str]]:
    names = runs.graph.edge_names()
    return {(names[i]["sender"], names[i]["receiver"], names[i]["input"]) for i in edges}


@pytest.mark.parametrize("split", [False, True])
def test_the_circuit_of_the_handbuilt_selector_model_is_the_built_one(split):
    task = handbuilt_task()
    runs = EdgeRuns.of(selector_copy_model(task, split=split), prompt_pairs(task, 64, 0))
    circuit = faithful_circuit(runs, edge_attribution(runs))
    heads = ["L0H0", "L0H1"] if split else ["L0H1"]  # the routing: z's embedding read by value, written to the logits
    built = {("embed", h, "v") for h in heads} | {(h, "logits", "logits") for h in heads}
    assert edge_set(runs, circuit.edges) == built
    assert circuit.faithfulness == pytest.approx(1.0, abs=1e-5)


def test_the_circuit_of_the_handbuilt_induction_model_is_the_built_one():
    task = handbuilt_induction_task()
    runs = EdgeRuns.of(induction_model(task), prompt_pairs(task, 64, 0))
    circuit = faithful_circuit(runs, edge_attribution(runs))
    # the induction head reads the cue token by value and writes it to the logits; its key (the
    # previous-token head's output) is the same in both runs where it matters
    assert edge_set(runs, circuit.edges) == {("embed", "L1H1", "v"), ("L1H1", "logits", "logits")}
    assert circuit.faithfulness == pytest.approx(1.0, abs=1e-4)


def test_no_circuit_when_clean_and_corrupted_agree():
    model, pairs = random_model(), random_pairs()
    same = dataclasses.replace(pairs, corrupt=pairs.clean, corrupt_answer=pairs.clean_answer)
    runs = EdgeRuns.of(model, same)
    assert faithful_circuit(runs, edge_attribution(runs)) is None


def test_stable_from():
    steps = [0, 10, 20, 30, 40]
    assert stable_from(steps, [[1], None, [1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4]]) == 30  # Jaccard 0.8 from 30
    assert stable_from(steps, [[9], [1, 2], [1, 2], [1, 2], [1, 2]]) == 10
    assert stable_from(steps, [[1], [1], [1], [1], None]) is None
    assert stable_from(steps, [[1], [1], [2], [1], [1]]) == 30
    assert stable_from(steps, [[1], [1], [1], [2], [1]]) is None  # only the last step itself: no evidence
    assert jaccard_to_last([[1, 2], None, [2, 3], [2]]) == [0.5, None, 0.5, 1.0]


def test_the_circuit_search_finds_the_fewest_edges_below_a_non_monotone_curve(monkeypatch):
    """Faithfulness by hand, non-monotone in k: the top 3 edges reach the target, 4 to 7 fall back,
    8 and more reach it again. Doubling then bisecting would stop at 8; the scan below the first
    hit finds 3, and the record says the curve was not monotone. The scan stops at its first batch
    with a hit."""
    from plateauscope.analysis import edges as E

    runs = EdgeRuns.of(random_model(), random_pairs())
    scores = edge_attribution(runs)
    order = scores.ranking()

    def by_size(curve):
        return lambda runs, masks: torch.tensor([curve(int(m.sum())) for m in masks], dtype=torch.float32)

    monkeypatch.setattr(E, "faithfulness", by_size(lambda k: 0.9 if k == 3 else 0.85 if k >= 8 else 0.1))
    circuit = E.faithful_circuit(runs, scores, target=0.8)
    assert circuit.edges == order[:3] and circuit.faithfulness == pytest.approx(0.9) and not circuit.monotone
    assert set(range(1, 9)) <= set(circuit.evaluated)  # every k below the grid's first hit is measured
    # the scan goes upwards in batches and stops at the first batch with a hit: k = 5 here, found in
    # the batch (3, 5) below the grid's first hit at 16; 6 and 7, above it, are never measured
    monkeypatch.setattr(E, "SCAN_BATCH", 2)
    monkeypatch.setattr(E, "faithfulness", by_size(lambda k: 0.9 if k == 5 or k >= 16 else 0.1))
    circuit = E.faithful_circuit(runs, scores, target=0.8)
    assert circuit.edges == order[:5] and {3, 5} <= set(circuit.evaluated) and not {6, 7} & set(circuit.evaluated)
    monkeypatch.setattr(E, "faithfulness", by_size(lambda k: min(1.0, k / 10)))
    circuit = E.faithful_circuit(runs, scores, target=0.8)
    assert circuit.edges == order[:8] and circuit.monotone


def test_exact_edge_agreement_covers_a_random_sample_outside_the_top():
    """Exact patching checks attribution on the strongest edges and on a seeded random sample of
    the others; each effect equals that edge patched alone into the clean run, edge by edge."""
    from plateauscope.analysis.edges import edges_summary, exact_edge_record

    model, pairs = random_model(), random_pairs()
    record = exact_edge_record(model, pairs, 4)
    top, sample = record["edges"], record["sample"]["edges"]
    assert len(top) == len(sample) == 4 and not set(top) & set(sample)
    assert top == edge_attribution(EdgeRuns.of(model, pairs)).ranking()[:4]
    runs = EdgeRuns.of(model, pairs)
    for edge, effect in zip(sample, record["sample"]["effect"]):
        assert effect == pytest.approx(float(patch_each_edge(runs, [edge]).effect[edge]), abs=1e-5)
    assert exact_edge_record(model, pairs, 4)["sample"]["edges"] == sample  # seeded
    # the summary reports the sample from tau/2 on only
    edges = [{"step": 10, "graph": dataclasses.asdict(runs.graph)}]
    late, early = {"step": 60, **record}, {"step": 20, **record}
    summary = edges_summary(edges, [{"step": 10, "circuit": None}], [early, late], tau=100)
    assert summary["sample_agreement"]["steps"] == 1 and summary["sample_agreement"]["from_step"] == 50


@pytest.mark.parametrize("attn_only", [False, True])
def test_edges_and_attribution_from_one_backward_equal_the_two_apart(attn_only):
    """The cheap pass takes edge attribution and attribution patching of heads and the residual
    stream from one clean forward and one corrupted forward and backward: the numbers of each computed
    on its own (``attribute_all``: its own runs, without the per-head input copies)."""
    from plateauscope.analysis.attribution import attribute_all
    from plateauscope.analysis.edges import edge_and_attribution_records, edge_record

    model, pairs = random_model(torch.float64, attn_only=attn_only), random_pairs()
    edges, attribution = edge_and_attribution_records(model, pairs, ("heads", "resid"))
    alone = edge_record(model, pairs)
    assert edges["graph"] == alone["graph"] and edges["effect"] == pytest.approx(alone["effect"], abs=2e-6)
    assert edges["clean"] == pytest.approx(alone["clean"], abs=1e-12)
    for target, result in attribute_all(model, pairs, ("heads", "resid")).items():
        got, want = attribution[target], result.to_dict()
        assert got.keys() == want.keys()
        raw = torch.tensor(want["raw"])  # float32, as cached
        torch.testing.assert_close(torch.tensor(got["raw"]), raw, atol=1e-5, rtol=1e-6, msg=target)
        assert got["clean_metric"] == pytest.approx(want["clean_metric"], abs=1e-12)
        assert {k: v for k, v in got.items() if k not in ("raw", "normalised", "clean_metric", "corrupt_metric")} == \
            {k: v for k, v in want.items() if k not in ("raw", "normalised", "clean_metric", "corrupt_metric")}
        assert raw.abs().max() > 0.1  # not vacuous
