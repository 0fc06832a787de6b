"""Edge attribution (``plateauscope.analysis.edges.edge_attribution(runs, on="clean")``) against auto-circuit's
mask-gradient edge scores, an independent implementation of edge attribution patching.

OPTIONAL: skipped unless ``auto_circuit`` is importable (``pip install -e '.[autocircuit]'``; CI
does not install it). auto-circuit 1.0.1 imports ``transformer_lens.past_key_value_caching``, a
module TransformerLens 3.x removed (only for type hints and its optional key/value caching, which
is not used here), so :func:`autocircuit_scores` registers a stand-in module first.

The two conventions, and why they are the same numbers:

* ours (``on="clean"``): per edge, ``sum over positions and features of (clean - corrupted sender
  output) . d metric / d receiver input``, the gradient taken on the clean run, where metric = the
  clean-answer minus corrupted-answer logit at the prediction position, averaged over the pairs;
* auto-circuit (``mask_gradient_prune_scores(grad_function="logit", answer_function="avg_diff",
  mask_val=0.0, ablation_type=RESAMPLE, clean_corrupt="corrupt")``): each receiver reads
  ``input + sum_s mask_s * (corrupted_s - current_s)`` with every mask 0 (so the run is the clean
  one), the loss is ``-(batch mean of the same logit difference)`` and the score is
  ``d loss / d mask_s = (corrupted_s - clean_s) . d(-metric)/d input``.

So **auto-circuit's score equals ours, same sign** (the two minus signs cancel: it minimises minus
the metric and patches towards the corrupted output); the test asserts exactly that. auto-circuit
sums per-batch means over batches, so all the pairs go in one batch and its batch mean is our mean
over pairs. It patches every position at once (``seq_len=None``), as ours sums over positions.

Cases (every edge; the edge sets, mapped by name, must be equal and the max |difference| under
1e-5 logits; both sides in float64, see ``DTYPE``): a random 3-layer model with LayerNorm and MLPs
(largest score 0.8), the session's trained ``ci`` run at its last checkpoint on 64 pairs (largest
score about 1.2) and the ``induction`` preset's attention-only model at its seed-0 initialisation
on 64 of its task's pairs (scores about 0.01: an untrained model). Our side skips the pairs' shared
prefix (the random pairs share 3 tokens; induction pairs differ only at the cue position), while
auto-circuit runs every position. auto-circuit gets its own deep copy of each model,
since it rewires the model it wraps.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
import types

import pytest
import torch

from plateauscope.analysis.edges import EdgeGraph, EdgeRuns, edge_attribution
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.model.backend import build_hooked_transformer
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run
from plateauscope.tasks.base import PromptPairs
from plateauscope.tasks.induction import InductionTask

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("auto_circuit") is None,
    reason="optional: auto-circuit is not installed (it imports HookedTransformer, so TransformerLens 3 only: "
           "make test-tl3 installs and runs it)")

TOL = 1e-5
"""Largest allowed |ours - auto-circuit| per edge, in logits."""
DTYPE = torch.float64
"""Both sides run in float64 (auto-circuit's masks take the model's dtype). In float32 the two
implementations' summation orders alone differ by ~1e-7 relative: 4e-5 on a score of 18.5 (the
random model with weights x2), 1e-6 at 0.8. ``edge_attribution`` returns float32 scores whatever the
model's dtype, so even in float64 the differences are float32 roundings (~1e-8 here)."""

EdgeKey = tuple[str, str, str]
"""(sender, receiver, input) in our names (``EdgeGraph.edge_names``)."""


def _shim_transformer_lens() -> None:
    """Register ``transformer_lens.past_key_value_caching`` (removed in TransformerLens 3.x) and the
    top-level ``HookedTransformerKeyValueCache`` that auto-circuit 1.0.1 imports, as aliases of the
    3.x key/value cache class; nothing when they exist."""
    import transformer_lens

    if "transformer_lens.past_key_value_caching" not in sys.modules:
        try:
            import transformer_lens.past_key_value_caching  # noqa: F401  (TransformerLens < 3)
        except ImportError:
            from transformer_lens.cache.key_value_cache import (
                TransformerLensKeyValueCache,
            )

            shim = types.ModuleType("transformer_lens.past_key_value_caching")
            shim.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
            sys.modules["transformer_lens.past_key_value_caching"] = shim
    if not hasattr(transformer_lens, "HookedTransformerKeyValueCache"):
        kv = sys.modules["transformer_lens.past_key_value_caching"].HookedTransformerKeyValueCache
        transformer_lens.HookedTransformerKeyValueCache = kv


def _our_sender(name: str) -> str:
    """auto-circuit's source node name -> ours: ``Resid Start`` -> ``embed``, ``A1.2`` -> ``L1H2``,
    ``MLP 1`` -> ``MLP1``."""
    if name == "Resid Start":
        return "embed"
    if m := re.fullmatch(r"A(\d+)\.(\d+)", name):
        return f"L{m[1]}H{m[2]}"
    if m := re.fullmatch(r"MLP (\d+)", name):
        return f"MLP{m[1]}"
    raise AssertionError(f"unknown auto-circuit source node {name!r}")


def _our_receiver(name: str) -> tuple[str, str]:
    """auto-circuit's destination node name -> our (receiver, input): ``A1.2.Q`` -> (``L1H2``,
    ``q``), ``MLP 1`` -> (``MLP1``, ``mlp``), ``Resid End`` -> (``logits``, ``logits``)."""
    if name == "Resid End":
        return "logits", "logits"
    if m := re.fullmatch(r"A(\d+)\.(\d+)\.([QKV])", name):
        return f"L{m[1]}H{m[2]}", m[3].lower()
    if m := re.fullmatch(r"MLP (\d+)", name):
        return f"MLP{m[1]}", "mlp"
    raise AssertionError(f"unknown auto-circuit destination node {name!r}")


def autocircuit_scores(model: torch.nn.Module, pairs: PromptPairs) -> dict[EdgeKey, float]:
    """auto-circuit's mask-gradient score of every edge of ``model`` (left untouched: auto-circuit
    wraps a deep copy) on ``pairs``, in one batch, keyed by our edge names."""
    _shim_transformer_lens()
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.types import AblationType
    from auto_circuit.utils.graph_utils import patchable_model

    ac_model = copy.deepcopy(model).eval()
    ac_model.set_use_attn_result(True)  # each head's output: blocks.l.attn.hook_result
    ac_model.set_use_split_qkv_input(True)  # each head's q / k / v input: blocks.l.hook_{q,k,v}_input
    if not ac_model.cfg.attn_only:
        ac_model.set_use_hook_mlp_in(True)  # the MLP's input before its LayerNorm: blocks.l.hook_mlp_in
    for p in ac_model.parameters():
        p.requires_grad_(False)  # only the masks' gradients are wanted

    end = pairs.pred_pos + 1  # auto-circuit reads the last position ("last_seq"); causal, so cut there
    clean, corrupt = pairs.clean[:, :end].cpu(), pairs.corrupt[:, :end].cpu()
    n = clean.shape[0]
    dataset = PromptDataset(list(clean), list(corrupt), [a.view(1) for a in pairs.clean_answer.cpu()],
                            [a.view(1) for a in pairs.corrupt_answer.cpu()])
    loader = PromptDataLoader(dataset, seq_len=end, diverge_idx=0, batch_size=n, shuffle=False)
    patchable = patchable_model(ac_model, factorized=True, slice_output="last_seq", seq_len=None,
                                separate_qkv=True, device=torch.device(model.cfg.device))
    scores = mask_gradient_prune_scores(
        patchable, loader, official_edges=None, grad_function="logit", answer_function="avg_diff",
        mask_val=0.0, integrated_grad_samples=None, ablation_type=AblationType.RESAMPLE, clean_corrupt="corrupt")
    return {(_our_sender(e.src.name), *_our_receiver(e.dest.name)): scores[e.dest.module_name][e.patch_idx].item()
            for e in patchable.edges}


def our_scores(model: torch.nn.Module, pairs: PromptPairs) -> dict[EdgeKey, float]:
    """``edge_attribution(on="clean")`` of every edge, keyed by our edge names."""
    effect = edge_attribution(EdgeRuns.of(model, pairs), on="clean").effect
    names = EdgeGraph.of(model).edge_names()
    assert len(names) == len(effect)
    return {(n["sender"], n["receiver"], n["input"]): x for n, x in zip(names, effect.tolist())}


def assert_same_scores(model: torch.nn.Module, pairs: PromptPairs) -> float:
    """Ours and auto-circuit's scores agree on every edge to within TOL; returns the max |difference|."""
    theirs = autocircuit_scores(model, pairs)
    ours = our_scores(model, pairs)
    assert set(ours) == set(theirs), (f"edge sets differ: only ours {sorted(set(ours) - set(theirs))}, "
                                      f"only auto-circuit {sorted(set(theirs) - set(ours))}")
    diff = {k: abs(ours[k] - theirs[k]) for k in ours}
    worst = max(diff, key=diff.get)
    scale = max(abs(x) for x in theirs.values())
    message = (f"max |ours - auto-circuit| = {diff[worst]:.3e} over {len(diff)} edges (worst {worst}: ours "
               f"{ours[worst]:+.6f}, auto-circuit {theirs[worst]:+.6f}; max |score| {scale:.3f})")
    print(message)
    assert diff[worst] < TOL, message
    assert scale > 1e-3, f"scores too small for the comparison to mean anything: {message}"
    return diff[worst]


def random_pairs(n: int, pos: int, diverge: int, vocab: int) -> PromptPairs:
    """Random pairs that share their first ``diverge`` tokens (our shared-prefix path starts there)."""
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, vocab, (n, pos), generator=gen)
    corrupt = clean.clone()
    corrupt[:, diverge:] = torch.randint(0, vocab, (n, pos - diverge), generator=gen)
    answer = torch.randint(0, vocab, (n,), generator=gen)
    wrong = (answer + torch.randint(1, vocab, (n,), generator=gen)) % vocab  # never the answer
    return PromptPairs(clean, corrupt, answer, wrong, torch.arange(n), pos - 1)


def test_random_model_with_layernorm_and_mlps(one_thread):
    cfg = {"n_layers": 3, "d_model": 32, "n_heads": 3, "d_head": 8, "d_mlp": 64, "act_fn": "gelu",
           "normalization_type": "LN", "n_ctx": 10, "d_vocab": 20, "d_vocab_out": 20, "attn_only": False,
           "default_prepend_bos": False, "seed": None}
    model = build_hooked_transformer(cfg, seed=0).eval().to(DTYPE, print_details=False)
    with torch.no_grad():  # larger weights than the default init: scores up to 0.8, further from linear
        for p in model.parameters():
            p.mul_(1.5)
    assert_same_scores(model, random_pairs(n=16, pos=10, diverge=3, vocab=20))


def test_trained_ci_checkpoint(ci_run, one_thread):
    run = Run(ci_run)
    model = run.model(run.steps[-1]).to(DTYPE, print_details=False)
    assert_same_scores(model, prompt_pairs(run.task(), 64, 0))


def test_induction_preset_model(one_thread):
    cfg = get_preset("induction")
    task = InductionTask.generate(cfg.task)
    model = build_hooked_transformer(task.hooked_config(cfg.model), seed=0).eval().to(DTYPE, print_details=False)
    assert model.cfg.attn_only
    assert_same_scores(model, prompt_pairs(task, 64, 0))
