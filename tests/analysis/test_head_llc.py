"""The per-head (weight-restricted) LLC: the masks, an exact restriction that agrees with devinterp's own,
known answers (zero for weights the loss ignores, closed forms for quadratic losses), the cache, the
clusters, the command line and the figures."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json

import numpy as np
import pytest
import torch

from plateauscope.analysis import head_llc as HL
from plateauscope.analysis import llc as L
from plateauscope.analysis.results import ATTENTION_FILE, HEAD_LLC_SUMMARY_FILE, ROUTING_FILE, analysis_dir
from plateauscope.cli import llc as llc_cli
from plateauscope.model.backend import hooked_parameters
from plateauscope.runs.run import Run
from tests.conftest import copy_run
from tests.handbuilt import D_HEAD, D_MODEL, handbuilt_task, selector_copy_model

needs_devinterp = pytest.mark.skipif(importlib.util.find_spec("devinterp") is None,
                                     reason="devinterp (the optional extra 'llc': pip install '.[llc]') is not installed")

IDLE_HEAD = (1, 0)
"""In :func:`_model`, a head whose values are zero: its queries and keys cannot change any output."""
READOUT_HEAD = (1, 1)
"""The hand-built group head: in the last layer, no LayerNorm, so the logits are linear in its W_O."""


def _model() -> torch.nn.Module:
    """The hand-built selector model with the idle head's W_V zeroed (its b_V is zero already)."""
    model = selector_copy_model(handbuilt_task())
    with torch.no_grad():
        hooked_parameters(model)[f"blocks.{IDLE_HEAD[0]}.attn.W_V"][IDLE_HEAD[1]].zero_()
    assert not hooked_parameters(model)[f"blocks.{IDLE_HEAD[0]}.attn.b_V"][IDLE_HEAD[1]].any()
    return model


def _full_batch(n: int, **kw) -> L.LLCSettings:
    """Full-batch SGLD on all ``n`` examples, L(w*) on all of them: no minibatch noise."""
    base = dict(num_chains=1, num_draws=40, num_burnin_steps=5, batch_size=n, lr=1e-4, localization=1000.0,
                nbeta=100.0, init_examples=0)
    return L.LLCSettings(**{**base, **kw})


# ---- the masks ------------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["head", "qk", "ov", ("W_O",)])
def test_masks_hold_exactly_the_heads_slices(part):
    model = _model()
    layer, head = 0, 1
    masks = HL.head_masks(model, layer, head, part)
    weights = HL.PARTS[part] if isinstance(part, str) else part
    per_head = {"W_Q": D_MODEL * D_HEAD, "W_K": D_MODEL * D_HEAD, "W_V": D_MODEL * D_HEAD, "W_O": D_HEAD * D_MODEL,
                "b_Q": D_HEAD, "b_K": D_HEAD, "b_V": D_HEAD}
    assert sum(int(m.sum()) for m in masks) == sum(per_head[w] for w in weights)
    # read back in HookedTransformer's layout: ones exactly on [head] of the part's weights
    marked = copy.deepcopy(model)
    with torch.no_grad():
        for p, m in zip(marked.parameters(), masks):
            p.copy_(m.float())
    for name, value in hooked_parameters(marked).items():
        leaf = name.rsplit(".", 1)[1]
        expected = torch.zeros_like(value)
        if name.startswith(f"blocks.{layer}.attn.") and leaf in weights:
            expected[head] = 1.0
        assert torch.equal(value, expected), name  # b_O (shared by the heads) is never in a mask
    with pytest.raises(ValueError, match="head's weights"):
        HL.head_masks(model, 0, 0, ("b_O",))


def test_head_labels_are_checked():
    assert HL.parse_head_label("L2H3", 4, 4) == (2, 3) == HL.parse_head_label("2.3", 4, 4)
    with pytest.raises(ValueError, match="does not exist"):
        HL.parse_head_label("L4H0", 4, 4)
    with pytest.raises(ValueError, match="L0H1"):
        HL.parse_head_label("head 3", 4, 4)


# ---- the restriction ------------------------------------------------------------------------


@needs_devinterp
def test_restriction_is_exact_and_devinterp_mask_agrees_with_ours(one_thread, monkeypatch):
    model, task = _model(), handbuilt_task()
    masks = HL.head_masks(model, 0, 1)
    before = [p.detach().clone() for p in model.parameters()]
    settings = L.LLCSettings(num_chains=2, num_draws=12, num_burnin_steps=3, batch_size=8, init_examples=0)
    seen = []
    real = L.require_devinterp()

    def spy(params, **kw):  # the sampler's own parameters, as devinterp gets them
        params = list(params)
        seen.append((params, kw.get("mask")))
        return real(params, **kw)

    monkeypatch.setattr(L, "require_devinterp", lambda: spy)
    ours = L.estimate_llc(model, task.tokens, task, settings, masks=masks, restriction="restore")
    theirs = L.estimate_llc(model, task.tokens, task, settings, masks=masks, restriction="devinterp")
    # the same chains, number for number: the head's updates never read the weights held fixed
    assert ours["trace"] == theirs["trace"] and ours["llc"] == theirs["llc"]
    assert ours["frozen_max_change"] == 0.0 == theirs["frozen_max_change"]
    assert ours["n_sampled"] == 4 * D_MODEL * D_HEAD + 3 * D_HEAD
    # what the sampler held: only the head's slices moved; every other entry is the checkpoint's, bit for bit
    moving = [(p0, m) for p0, m in zip(before, masks) if m.any()]
    assert len(seen) == 4 and all(len(params) == len(moving) for params, _ in seen)
    for params, mask_arg in seen:
        assert mask_arg is None or all(torch.equal(a, b) for a, b in zip(mask_arg, [m for _, m in moving]))
        for p, (p0, m) in zip(params, moving):
            assert torch.equal(p.detach()[~m], p0[~m])
        assert any(not torch.equal(p.detach()[m], p0[m]) for p, (p0, m) in zip(params, moving))
    assert all(torch.equal(p, p0) for p, p0 in zip(model.parameters(), before))  # the model itself untouched


@needs_devinterp
def test_a_second_chain_on_a_bridge_copy_works(one_thread):
    """A deep-copied TransformerLens 4 bridge stores a tensor of the chain's graph on the original
    (:func:`plateauscope.analysis.llc.release_graphs`): two chains in a row must not fail."""
    model, task = _model(), handbuilt_task()
    res = L.estimate_llc(model, task.tokens, task, _full_batch(16, num_chains=2, num_draws=3, num_burnin_steps=0))
    assert len(res["llc_per_chain"]) == 2
    copy.deepcopy(model)


@needs_devinterp
def test_fused_and_hooked_forwards_give_the_same_estimate(one_thread):
    """The per-head loss runs the training step's fused forward; the model's own hooked forward is the same
    function (the kernels round differently), and the paired estimate shares the checkpoint's losses."""
    model, task = _model(), handbuilt_task()
    settings = L.LLCSettings(num_chains=1, num_draws=20, num_burnin_steps=2, batch_size=8)
    fused = HL.estimate_head_llc(model, task, 0, 1, settings)
    hooked = HL.estimate_head_llc(model, task, 0, 1, settings, forward="hooked")
    assert fused["forward"] == "fused" and hooked["forward"] == "hooked"
    assert fused["llc"] == pytest.approx(hooked["llc"], rel=1e-3, abs=1e-4)
    shared = HL.estimate_head_llc(model, task, 1, 1, settings, reference=np.array(fused["reference"]))
    alone = HL.estimate_head_llc(model, task, 1, 1, settings)
    assert shared["llc"] == alone["llc"] and shared["init_loss"] == alone["init_loss"] == fused["init_loss"]
    # a layer-1 head's chain started at its block, from the checkpoint's stream into it
    started = HL.estimate_head_llc(model, task, 1, 1, settings, prefix=HL.FrozenPrefix(model, task))
    assert started["llc"] == pytest.approx(alone["llc"], rel=1e-5, abs=1e-6)


# ---- known answers --------------------------------------------------------------------------


@needs_devinterp
def test_weights_the_loss_ignores_have_llc_zero(one_thread):
    """The idle head's values are zero, so its queries and keys (and its W_O) change no output: the
    restricted LLC is 0 exactly (full batch, L(w*) on the same examples), on the training loss."""
    model, task = _model(), handbuilt_task()
    for part in ("qk", ("W_O",)):
        res = L.estimate_llc(model, task.tokens, task, _full_batch(len(task.tokens)),
                             masks=HL.head_masks(model, *IDLE_HEAD, part))
        assert abs(res["llc"]) < 1e-4, (part, res["llc"])
        assert res["frozen_max_change"] == 0.0


def _discretised_gaussian_llc(h: torch.Tensor, nbeta: float, gamma: float, lr: float,
                              g: torch.Tensor | None = None) -> float:
    """nbeta E[L - L*] under SGLD's own stationary law for L = g.d + d'Hd/2: the chain
    d' = d - lr/2 (A d + nbeta g) + sqrt(lr) xi, A = nbeta H + gamma, has mean -A^-1 nbeta g and covariance
    (A (1 - lr A / 4))^-1 (exact for the discretised chain, not only as lr -> 0)."""
    d = h.shape[0]
    eye = torch.eye(d, dtype=torch.float64)
    a = nbeta * h + gamma * eye
    sigma = torch.linalg.inv(a @ (eye - lr * a / 4))
    g = torch.zeros(d, dtype=torch.float64) if g is None else g
    mu = -torch.linalg.solve(a, nbeta * g)
    return float(nbeta * (g @ mu + 0.5 * mu @ h @ mu + 0.5 * torch.trace(h @ sigma)))


class Linear(torch.nn.Module):
    """y = x . w, with w split into two parameters (the restriction takes part of each)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.a = torch.nn.Parameter(w[:3].clone())
        self.b = torch.nn.Parameter(w[3:].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.cat([self.a, self.b])


@needs_devinterp
def test_restricted_llc_of_a_quadratic_loss_is_its_closed_form(one_thread):
    """Least squares at its minimum, sampling 3 of the 6 weights (2 in one parameter, 1 in the other): the
    LLC is the closed form of the Hessian's block on those 3 (about 3/2 at small gamma), not 6/2."""
    gen = torch.Generator().manual_seed(0)
    n = 1000
    x = torch.randn(n, 6, generator=gen) * torch.linspace(0.5, 1.5, 6)
    y = x @ torch.randn(6, generator=gen) + torch.randn(n, generator=gen)
    data, w = torch.cat([x, y[:, None]], 1), torch.linalg.lstsq(x, y).solution
    model = Linear(w)
    masks = [torch.tensor([True, False, True]), torch.tensor([False, True, False])]
    chosen = [0, 2, 4]

    def mse(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((m(batch[:, :6]) - batch[:, 6]) ** 2).mean()

    nbeta, gamma, lr = 100.0, 1.0, 1e-3
    h = (x.T @ x / n).double()[chosen][:, chosen]
    expected = _discretised_gaussian_llc(h, nbeta, gamma, lr)
    assert expected == pytest.approx(1.5, rel=0.03)
    settings = L.LLCSettings(num_chains=2, num_draws=1500, num_burnin_steps=200, batch_size=n, lr=lr,
                             localization=gamma, nbeta=nbeta, init_examples=0)
    res = L.estimate_llc(model, data, None, settings, loss_fn=mse, masks=masks)
    assert res["llc"] == pytest.approx(expected, rel=0.12), res["llc_per_chain"]
    assert res["frozen_max_change"] == 0.0 and res["n_sampled"] == 3
    # paired with the checkpoint's loss on each draw's minibatch (half the batch): the same answer
    half = dataclasses.replace(settings, batch_size=n // 2)
    paired = L.estimate_llc(model, data, None, half, loss_fn=mse, masks=masks, paired=True)
    assert paired["llc"] == pytest.approx(expected, rel=0.12), paired["llc_per_chain"]
    again = L.estimate_llc(model, data, None, half, loss_fn=mse, masks=masks, paired=True,
                           reference=np.array(paired["reference"]))
    assert again["llc"] == paired["llc"]  # the checkpoint's minibatch losses, passed back in
    with pytest.raises(ValueError, match="reference"):
        L.estimate_llc(model, data, None, half, loss_fn=mse, masks=masks, reference=np.zeros((2, 1500)))


@needs_devinterp
def test_a_head_that_matters_has_the_closed_form_llc(one_thread):
    """Distillation loss L(w) = mean |logits_w - logits_w*|^2 / 2 at the loss positions: w* is its exact
    minimum, and the logits are linear in the readout head's W_O (last layer, no LayerNorm, MLPs zero), so
    L is exactly quadratic in it with Hessian J'J: the restricted LLC is the closed form, clearly positive
    and at most rank(J) / 2, far below (its 384 weights) / 2. The idle head's W_O changes nothing: 0."""
    model, task = _model(), handbuilt_task()
    tokens, pos = task.tokens, task.loss_positions
    reference = copy.deepcopy(model)

    def distill(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = reference(batch[:, : task.input_len])[:, pos]
        return 0.5 * ((m(batch[:, : task.input_len])[:, pos] - target) ** 2).sum((1, 2)).mean()

    masks = HL.head_masks(model, *READOUT_HEAD, ("W_O",))
    params = list(model.parameters())
    logits = model(tokens[:, : task.input_len])[:, pos].reshape(-1)
    rows = []
    for i in range(logits.numel()):
        grads = torch.autograd.grad(logits[i], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([g[m] for g, m in zip(grads, masks) if m.any()]))
    jac = torch.stack(rows).double()
    h = jac.T @ jac / len(tokens)
    rank = int(torch.linalg.matrix_rank(h, rtol=1e-8))
    nbeta, gamma, lr = 10.0, 1000.0, 1e-5
    expected = _discretised_gaussian_llc(h, nbeta, gamma, lr)
    settings = _full_batch(len(tokens), num_chains=2, num_draws=400, num_burnin_steps=100, lr=lr,
                           localization=gamma, nbeta=nbeta)
    res = L.estimate_llc(model, tokens, None, settings, loss_fn=distill, masks=masks)
    assert expected > 2.0 and rank < D_HEAD * D_MODEL / 2
    assert res["llc"] == pytest.approx(expected, rel=0.1), (res["llc_per_chain"], expected)
    assert res["llc"] < rank / 2
    idle = L.estimate_llc(model, tokens, None, settings.with_draws(20), loss_fn=distill,
                          masks=HL.head_masks(model, *IDLE_HEAD, ("W_O",)))
    assert abs(idle["llc"]) < 1e-4


# ---- the clusters ---------------------------------------------------------------------------


def test_clusters_group_heads_by_the_shape_of_their_curves():
    steps = list(range(0, 200, 10))
    t = np.asarray(steps, dtype=float)
    flat = [5.0 + 0.05 * np.sin(t + k) for k in range(4)]
    rising = [3.0 + k + (4.0 + k) / (1 + np.exp(-(t - 100) / 10)) for k in range(3)]
    bump = [8.0 + 10.0 * np.exp(-((t - 60) / 15) ** 2)]
    curves = np.stack(flat + rising + bump)
    labels = [f"L0H{i}" for i in range(4)] + [f"L1H{i}" for i in range(3)] + ["L2H0"]
    out = HL.cluster_heads(steps, curves, labels, {"routing": "L2H0", "cue": "L1H0"})
    groups = sorted(sorted(m) for m in out["members"].values())
    assert groups == [["L0H0", "L0H1", "L0H2", "L0H3"], ["L1H0", "L1H1", "L1H2"], ["L2H0"]]
    assert out["marked"]["routing"]["apart"] and out["marked"]["routing"]["cluster_members"] == ["L2H0"]
    assert not out["marked"]["cue"]["apart"]  # its cluster holds two unmarked heads
    assert out["marked_apart"] is False
    # the level does not matter, the shape does: a flat curve at 50 joins the flat ones
    more = HL.cluster_heads(steps, np.vstack([curves, 50 + 0.5 * np.sin(t)]), labels + ["L2H1"])
    assert more["cluster"][-1] == more["cluster"][0]
    with pytest.raises(ValueError, match="one curve per head"):
        HL.cluster_heads(steps[:-1], curves, labels)


def test_marked_heads_come_from_routing_and_the_attention_cache(tmp_path):
    folder = analysis_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / ROUTING_FILE).write_text(json.dumps({"label": "L1H1", "head": [1, 1]}))
    rec = {"step": 10, "to_z_all_targets": [[0.1, 0.2], [0.3, 0.9]], "rules": {"previous token": [[0.95, 0.1], [0.0, 0.2]]}}
    (folder / ATTENTION_FILE).write_text(json.dumps({**rec, "step": 5}) + "\n" + json.dumps(rec) + "\n")
    assert HL.marked_heads(tmp_path) == {"routing": "L1H1", "cue": "L1H1", "previous token": "L0H0"}
    assert HL.marked_heads(tmp_path / "none") == {}


# ---- the series, the cache and the command line ---------------------------------------------


TINY = L.LLCSettings(num_chains=1, num_draws=6, num_burnin_steps=2, batch_size=8, init_examples=64)


@needs_devinterp
def test_series_cache_and_cli(tiny_run, tmp_path, monkeypatch, capsys, one_thread):
    run_dir = copy_run(tiny_run, tmp_path / "tiny")
    run = Run(run_dir)
    steps = run.steps[-2:]
    calls = []
    real = HL.estimate_head_llc
    monkeypatch.setattr(HL, "estimate_head_llc", lambda *a, **k: calls.append(a[2:4]) or real(*a, **k))
    s = HL.head_llc_series(run_dir, steps=steps, settings=TINY, progress=False)
    n_heads = run.config.model.n_layers * run.config.model.n_heads
    assert s["steps"] == steps and s["heads"] == [f"L0H{h}" for h in range(n_heads)]
    assert np.asarray(s["llc"]).shape == (2, n_heads)
    # every head at the first step, then the doubled draws at the last: its series estimates are their first draws
    assert len(calls) == 2 * n_heads
    assert s["frozen_max_change"] == 0.0
    c = s["calibration"][0]
    assert c["step"] == steps[-1] and c["rel_change"][0] == pytest.approx(
        abs(c["llc_doubled"][0] - c["llc"][0]) / abs(c["llc_doubled"][0]))
    assert c["change"][0] == pytest.approx(abs(c["llc_doubled"][0] - c["llc"][0])
                                           / max(abs(c["llc_doubled"][0]), HL.STABILITY_FLOOR))
    assert c["stable"] == (max(c["change"]) <= TINY.max_rel_change)
    saved = json.loads((analysis_dir(run_dir) / HEAD_LLC_SUMMARY_FILE).read_text())
    assert saved["llc"] == s["llc"] and saved["heads"] == s["heads"]
    again = HL.head_llc_series(run_dir, steps=steps, settings=TINY, progress=False)
    assert len(calls) == 2 * n_heads and again["llc"] == s["llc"]  # all from the cache
    HL.head_llc_series(run_dir, steps=steps, settings=TINY, heads=["L0H1"], calibrate_check=False, part="qk",
                       progress=False)
    assert len(calls) == 2 * n_heads + 2  # another part is another key
    lines = HL.head_llc_path(run_dir).read_text().splitlines()
    assert len(lines) == 3 * n_heads + 2 and {json.loads(x)["label"] for x in lines} == set(s["heads"])

    argv = ["--run", str(run_dir), "--per-head", "--steps", *map(str, steps), "--chains", "1", "--draws", "6",
            "--burnin", "2", "--batch-size", "8", "--no-progress"]
    assert llc_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "L0H1" in out and "doubled draws" in out and "clusters" in out
    for bad, word in ((["--heads", "L3H0"], "does not exist"), (["--steps", "99999"], "99999"),
                      (["--every", "0"], "--every"), (["--calib-step", "99999"], "99999"),
                      (["--workers", "0"], "--workers")):
        assert llc_cli.main(["--run", str(run_dir), "--per-head", *bad]) == 2  # progress bar on: none drawn
        err = capsys.readouterr().err
        assert err.startswith("error:") and word in err and err.count("\n") == 1, err
    for flags in (["--heads", "L0H0"], ["--workers", "2"]):
        assert llc_cli.main(["--run", str(run_dir), *flags]) == 2
        assert "--per-head" in capsys.readouterr().err


def test_work_units_keep_a_checkpoint_together_and_split_one_step_between_workers():
    h = [(0, 0), (0, 1), (1, 0), (1, 1)]
    a, b = TINY, TINY.with_draws(2 * TINY.num_draws)
    series = [(a, s, x) for s in (10, 20, 30, 40) for x in h]
    assert HL.work_units(series, 2) == [(a, s, h) for s in (10, 20, 30, 40)]  # one unit per checkpoint
    # the doubled draws at one step: its heads in runs, so that 2 workers finish together; largest units first
    assert HL.work_units(series + [(b, 40, x) for x in h], 2) == (
        [(a, s, h) for s in (10, 20, 30, 40)] + [(b, 40, [x]) for x in h])
    assert HL.work_units([(a, 30, x) for x in h[:3]], 8) == [(a, 30, [x]) for x in h[:3]]  # never an empty unit
    assert HL.work_units([(a, 10, h[0]), (a, 20, h[1])], 1) == [(a, 10, [h[0]]), (a, 20, [h[1]])]
    assert HL.work_units([], 2) == []


def test_chain_prefixes_read_fewer_draws_from_the_longest_chain():
    a, b, c = TINY, TINY.with_draws(2 * TINY.num_draws), dataclasses.replace(TINY, lr=TINY.lr / 2)
    todo = [(a, 10, (0, 0)), (a, 20, (0, 0)), (b, 20, (0, 0)), (c, 20, (0, 0)), (a, 20, (0, 1))]
    chains, shorter = HL.chain_prefixes(todo)
    # step 20, head L0H0: a is the start of b's chain; c differs in more than the draws; L0H1 has no b
    assert chains == [(a, 10, (0, 0)), (b, 20, (0, 0)), (c, 20, (0, 0)), (a, 20, (0, 1))]
    assert shorter == {(b, 20, (0, 0)): [a.num_draws]}


@needs_devinterp
def test_fewer_draws_read_from_a_longer_chain_equal_their_own_chain(tiny_run, tmp_path, one_thread):
    """The doubled-draws check's base estimate, read from the first draws of the doubled chain, against the
    same estimate sampled on a chain of its own."""
    step = Run(tiny_run).steps[-1]
    heads = [(0, 0), (0, 1)]
    doubled = TINY.with_draws(2 * TINY.num_draws)
    (own,), = HL.head_llc_records(Run(copy_run(tiny_run, tmp_path / "own")), [(TINY, [step])], heads, progress=False)
    (read,), (long,) = HL.head_llc_records(Run(copy_run(tiny_run, tmp_path / "read")),
                                           [(TINY, [step]), (doubled, [step])], heads, progress=False)
    for o, r, d in zip(own, read, long):
        assert r["first_draws_of"] == doubled.num_draws and "first_draws_of" not in o and r["seconds"] == 0.0
        for field in ("llc", "init_loss", "mean_loss", "drift", "stationary", "llc_per_chain"):
            assert r[field] == pytest.approx(o[field], rel=1e-9, abs=1e-12), field
        assert d["llc"] != pytest.approx(o["llc"], rel=1e-9)  # the doubled estimate is not the base one


@needs_devinterp
def test_workers_give_the_records_of_one_process(tiny_run, tmp_path, one_thread):
    steps = Run(tiny_run).steps[-3:]
    serial = HL.head_llc_series(copy_run(tiny_run, tmp_path / "serial"), steps=steps, settings=TINY, progress=False)
    run_dir = copy_run(tiny_run, tmp_path / "pool")
    pooled = HL.head_llc_series(run_dir, steps=steps, settings=TINY, progress=False, workers=2)
    # each chain's seed is the settings' own, and each worker runs one torch thread, as here
    assert np.asarray(pooled["llc"]) == pytest.approx(np.asarray(serial["llc"]), rel=1e-6, abs=1e-9)
    assert pooled["calibration"][0]["llc_doubled"] == pytest.approx(serial["calibration"][0]["llc_doubled"],
                                                                    rel=1e-6, abs=1e-9)
    records = [json.loads(x) for x in HL.head_llc_path(run_dir).read_text().splitlines()]
    n_heads = len(pooled["heads"])
    assert len(records) == (len(steps) + 1) * n_heads  # the parent wrote each (step, head, settings) once
    assert {(r["step"], r["label"]) for r in records if r["settings"]["num_draws"] == TINY.num_draws} == {
        (s, lab) for s in steps for lab in pooled["heads"]}
    with pytest.raises(ValueError, match="workers"):
        HL.head_llc_series(run_dir, steps=steps, settings=TINY, progress=False, workers=0)


@needs_devinterp
@pytest.mark.slow
def test_a_killed_per_head_series_stops_its_workers_in_one_line(tiny_run, tmp_path):
    """SIGTERM to `plateauscope llc --per-head` on 2 workers: one line, the workers gone, every finished record
    whole in the cache (the parent alone writes it)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    run_dir = copy_run(tiny_run, tmp_path / "tiny")
    steps = [str(s) for s in Run(run_dir).steps[-4:]]
    proc = subprocess.Popen([sys.executable, "-m", "plateauscope", "llc", "--run", str(run_dir), "--per-head",
                             "--steps", *steps, "--draws", "1000", "--workers", "2", "--no-progress"],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    cache = HL.head_llc_path(run_dir)
    deadline = time.monotonic() + 120
    while not (cache.exists() and cache.stat().st_size > 0):  # a unit finished: the workers are at work
        assert time.monotonic() < deadline and proc.poll() is None, "no estimate was ever cached"
        time.sleep(0.2)
    children = [c for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]  # the workers, not the resource tracker
    assert len(children) == 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 2 and lines[-1].startswith("error: interrupted") and "Traceback" not in err, err
    time.sleep(1)
    assert not [c for c in children if Path(f"/proc/{c}").exists()]  # every worker terminated
    records = [json.loads(x) for x in cache.read_text().splitlines()]
    assert records and len({(r["step"], r["label"], r["settings"]["num_draws"]) for r in records}) == len(records)


# ---- the figures ----------------------------------------------------------------------------


def _summary() -> dict:
    steps = [0, 100, 200, 300]
    llc = [[1.0, 2.0, 3.0, 4.0], [1.0, 2.5, 3.0, 6.0], [1.1, 3.0, 3.0, 12.0], [1.2, 3.5, 3.0, 20.0]]
    heads = ["L0H0", "L0H1", "L1H0", "L1H1"]
    return {"steps": steps, "heads": heads, "llc": llc, "n_layers": 2, "n_heads": 2, "tau": 250, "t_form": 150,
            "settings": {**HL.HEAD_LLC_SETTINGS.to_dict(), "num_chains": 1}, "marked": {"routing": "L1H1"},
            "calibration": [{"step": 300, "max_change": 0.04, "change": [0.01, 0.02, 0.04, 0.03]}],
            "clusters": HL.cluster_heads(steps, np.asarray(llc).T, heads, {"routing": "L1H1"})}


def test_figures_show_the_data_and_say_it():
    from plateauscope.views import llc_figures as LF

    s = _summary()
    fig, caption = LF.head_llc_heatmap(s)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (2, 2) and z[1, 1] == 20.0 and z[0, 1] == 3.0  # rows heads, columns layers
    assert "L1H1 has the largest per-head LLC (20.0)" in caption and "L0H0 the smallest (1.2)" in caption
    assert "4.0%" in caption and "L1H1 (routing) 20.0" in caption and "1 chain x" in caption
    fig, caption = LF.head_llc_heatmap(s, step=100)
    assert "(6.0)" in caption
    with pytest.raises(ValueError, match="not analysed"):
        LF.head_llc_heatmap(s, step=50)
    fig, caption = LF.head_llc_time_heatmap(s)
    assert list(fig.data[0].x) == s["steps"] and len(fig.data[0].y) == 4 and "L1H1 rises most (4.0 to 20.0)" in caption
    fig, caption = LF.head_llc_curves(s)
    assert len(fig.data) == 4 and list(fig.data[3].y) == [4.0, 6.0, 12.0, 20.0]
    assert fig.data[3].line.width > fig.data[0].line.width  # the marked head is thick
    assert "routing head L1H1" in caption and f"{s['clusters']['n_clusters']} cluster" in caption
    for f, _ in (LF.head_llc_heatmap(s), LF.head_llc_time_heatmap(s), LF.head_llc_curves(s)):
        assert f.layout.title.text and f.layout.xaxis.title.text and f.layout.yaxis.title.text
