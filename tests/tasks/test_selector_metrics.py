"""Metrics against hand-computed values: oracle models built by hand, brute-force loops."""

import math

import pytest
import torch
from torch import nn

from plateauscope.runs.metrics import compute_tau, plateau_stretch
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.tasks.selector_metrics import EvalSet, candidate_metrics, evaluate

NEG = -1e4


class LookupModel(nn.Module):
    """Predicts the targets of a task from a table; ``use_z`` decides whether the selector is read.

    Without z it is uniform over the K candidates' first characters (distinct by construction)
    and then certain of the rest of the candidate it has started: exactly the marginal.
    """

    def __init__(self, task: SelectorTask, use_z: bool):
        super().__init__()
        self.task, self.use_z = task, use_z
        self.dummy = nn.Parameter(torch.zeros(()))
        self.group_of = {tuple(b): g for g, b in enumerate(task.b_tokens.tolist())}
        self.selector_of = {tuple(z): j for j, z in enumerate(task.z_tokens.tolist())}

    def forward(self, tokens):
        lay, vocab = self.task.layout, len(self.task.vocab)
        logits = torch.full((*tokens.shape, vocab), NEG)
        a0, a1 = lay.a_span
        for n, row in enumerate(tokens.tolist()):
            g = self.group_of[tuple(row[slice(*lay.b_span)])]
            cands = self.task.a_tokens[g]
            if self.use_z:
                cands = cands[[self.selector_of[tuple(row[slice(*lay.z_span)])]]]
            for pos in range(a0 - 1, a1 - 1):
                typed = row[a0:pos + 1]
                for cand in cands.tolist():
                    if cand[: len(typed)] == typed:
                        logits[n, pos, cand[len(typed)]] = 0.0
        return logits


@pytest.fixture
def task():
    return SelectorTask.generate(TaskConfig(n_b=12, K=5, seed=1))


def test_marginal_model_sits_exactly_at_log_k(task):
    evalset = EvalSet.build(task, n_eval_groups=6, n_tracked_groups=4, seed=0)
    m = evaluate(LookupModel(task, use_z=False), task, evalset)
    assert m["candidate_loss"] == pytest.approx(math.log(5), abs=1e-6)
    assert m["set_loss"] == pytest.approx(0.0, abs=1e-6)
    assert m["delta_z"] == pytest.approx(0.0, abs=1e-6)
    assert m["seq_nll"] == pytest.approx(m["set_loss"] + m["candidate_loss"], abs=1e-6)
    assert m["first_token_loss"] == pytest.approx(math.log(5), abs=1e-6)


def test_model_that_reads_z_is_at_zero(task):
    evalset = EvalSet.build(task, n_eval_groups=6, n_tracked_groups=4, seed=0)
    m = evaluate(LookupModel(task, use_z=True), task, evalset)
    assert m["candidate_loss"] == pytest.approx(0.0, abs=1e-6)
    assert m["candidate_acc"] == 1.0 and m["accuracy"] == 1.0
    assert m["group_acc"] == [1.0] * 4
    assert m["delta_z"] > 100  # the shuffled selector points at a candidate given ~zero probability


def test_candidate_metrics_match_brute_force():
    G, K = 3, 4
    scores = torch.randn(G, K, K) * 3 - 5
    shift = torch.randint(1, K, (G, K))
    got = candidate_metrics(scores, shift)
    cand, setl, nll, shuffled, acc = [], [], [], [], []
    for g in range(G):
        for j in range(K):
            row = scores[g, j].tolist()
            norm = math.log(sum(math.exp(s) for s in row))
            cand.append(norm - row[j])
            setl.append(-norm)
            nll.append(-row[j])
            acc.append(max(range(K), key=lambda k: row[k]) == j)
            jp = (j + shift[g, j].item()) % K
            assert jp != j
            other = scores[g, jp].tolist()
            shuffled.append(math.log(sum(math.exp(s) for s in other)) - other[j])
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert got["candidate_loss"] == pytest.approx(mean(cand), abs=1e-5)
    assert got["set_loss"] == pytest.approx(mean(setl), abs=1e-5)
    assert got["seq_nll"] == pytest.approx(mean(nll), abs=1e-5)
    assert got["seq_nll"] == pytest.approx(got["set_loss"] + got["candidate_loss"], abs=1e-5)
    assert got["delta_z"] == pytest.approx(mean(shuffled) - mean(cand), abs=1e-5)
    assert got["candidate_acc"] == pytest.approx(mean(acc))


def test_tau_and_plateau_from_records():
    lk = math.log(10)
    recs = [{"step": s, "candidate_loss": c * lk, "delta_z": dz * lk, "accuracy": a}
            for s, c, dz, a in [(0, 1.4, 0, 0), (10, 1.05, 0.01, 0), (20, 0.98, 0.02, 0), (30, 0.95, 0.05, 0.1),
                                (40, 0.6, 0.3, 0.3), (50, 0.45, 0.6, 0.6), (60, 0.05, 0.9, 0.99)]]
    backward = ProgressMeasure("candidate_loss", lk, cue_effect_key="delta_z")
    forward = ProgressMeasure("accuracy", lk, falls=False)
    assert compute_tau(recs, backward) == 50
    assert compute_tau(recs, backward, threshold=0.7) == 40
    assert compute_tau(recs, forward) == 50
    counts = plateau_stretch(recs, backward, 50)
    assert counts["stretch"] == [10, 30] and (counts["n_inside"], counts["n_before"], counts["n_stretch"]) == (3, 5, 3)
    assert plateau_stretch(recs, forward, 50)["stretch"] is None
    assert compute_tau(recs[:3], backward) is None


def _brute_force_evaluate(model, task, evalset):
    """The evaluation scored the plain way: every sequence run in full, every metric from its logits."""
    lay, K = task.layout, task.cfg.K
    pos = torch.tensor(lay.target_pred_positions)

    def score(seqs):
        with torch.no_grad():
            logits = model(seqs[:, : lay.input_len])[:, pos]
        target = seqs[:, pos + 1]
        return logits.log_softmax(-1).gather(-1, target[..., None])[..., 0], (logits.argmax(-1) == target).all(-1)

    G = evalset.shift.shape[0]
    logp, exact = score(evalset.candidate_seqs)
    logp, exact = logp.view(G, K, K, -1), exact.view(G, K, K)
    s = logp.sum(-1)
    diag = torch.arange(K)
    cand = torch.stack([s[g, j].logsumexp(0) - s[g, j, j] for g in range(G) for j in range(K)])
    shuffled = torch.stack([s[g, (j + int(evalset.shift[g, j])) % K].logsumexp(0) - s[g, (j + int(evalset.shift[g, j])) % K, j]
                            for g in range(G) for j in range(K)])
    true = logp[:, diag, diag]
    _, tracked = score(evalset.tracked_seqs)
    return {"candidate_loss": cand.mean().item(), "delta_z": (shuffled - cand).mean().item(),
            "set_loss": -s.logsumexp(-1).mean().item(), "seq_nll": -s[:, diag, diag].mean().item(),
            "candidate_acc": (s.argmax(-1) == diag).float().mean().item(),
            "accuracy": exact[:, diag, diag].float().mean().item(), "loss": -true.mean().item(),
            "first_token_loss": -true[..., 0].mean().item(),
            "group_acc": tracked.view(-1, K).float().mean(-1).tolist()}


@pytest.mark.parametrize("kind", ["trained", "random_2layer"])
@pytest.mark.parametrize("batch_size", [7, 3])
def test_shared_prefix_evaluation_equals_scoring_every_sequence(tiny_run, kind, batch_size):
    """evaluate scores each shared prefix once; it must give the numbers of the plain computation.
    Batches of 7 rows hold whole families of K = 4 children (their parent's keys read once, shared);
    batches of 3 split a family (its keys copied out per child)."""
    from plateauscope.model.backend import build_model
    from plateauscope.runs.run import Run

    run = Run(tiny_run)
    task = run.task()
    model = run.model(run.steps[-1]) if kind == "trained" else \
        build_model({**run.hooked_config, "n_layers": 2}, seed=3).eval()
    evalset = EvalSet.build(task, n_eval_groups=6, n_tracked_groups=5, seed=1)
    ref = _brute_force_evaluate(model, task, evalset)
    got = evaluate(model, task, evalset, batch_size=batch_size)  # small batches: several chunks per level
    assert got.keys() >= ref.keys()
    for key, value in ref.items():
        if key == "group_acc":
            assert got[key] == pytest.approx(value, abs=1e-4)  # rounded to 4 places when logged
        else:
            assert got[key] == pytest.approx(value, abs=1e-5), key


@pytest.mark.parametrize("kind", ["oracle", "random_2layer", "mixed"])
def test_pruned_prefixes_give_the_same_exact_match(tiny_run, kind):
    """prune=True stops prefixes whose sequences have all missed a target token: exact match unchanged,
    log-probabilities unchanged wherever they are still computed."""
    from plateauscope.model.backend import build_model
    from plateauscope.model.scoring import shared_prefix_logprobs
    from plateauscope.runs.run import Run
    from tests.handbuilt import handbuilt_task, selector_copy_model

    if kind == "random_2layer":
        run = Run(tiny_run)
        task = run.task()
        model = build_model({**run.hooked_config, "n_layers": 2}, seed=3).eval()
    else:
        task = handbuilt_task()
        model = selector_copy_model(task)
    lay, K = task.layout, task.cfg.K
    seqs = task.tokens[task.example_ids(torch.arange(min(6, task.cfg.n_b))).flatten()]
    if kind == "mixed":  # every other sequence gets a wrong target token: some prefixes stop, some go on
        seqs = seqs.clone()
        seqs[::2, lay.target_span[0] + 1] = (seqs[::2, lay.target_span[0] + 1] + 1) % len(task.vocab)
    tree = seqs.view(-1, K, 1, seqs.shape[-1])
    splits = (lay.z_span[0], lay.target_span[0])
    full_logp, full_exact = shared_prefix_logprobs(model, tree, splits, task, batch_size=5)
    logp, exact = shared_prefix_logprobs(model, tree, splits, task, batch_size=5, prune=True)
    assert torch.equal(exact, full_exact)
    n_exact = int(full_exact.sum())
    assert (n_exact == full_exact.numel()) if kind == "oracle" else (n_exact == 0) if kind == "random_2layer" \
        else (0 < n_exact < full_exact.numel())
    ran = ~logp.isnan()
    assert ran[..., 0].all() and (ran.all(-1) | ~full_exact).all()  # the first target token always runs
    assert ran.all() if kind != "random_2layer" else not ran.all()  # a random model misses a1: pruned
    torch.testing.assert_close(logp[ran], full_logp[ran], atol=1e-5, rtol=0)


def test_hooks_added_fire_inside_and_are_gone_after(tiny_run):
    """The prefix-sharing paths add hooks with hooks_added instead of run_with_hooks: they must fire
    inside, replace activations like run_with_hooks's, and be removed, even after an error."""
    from plateauscope.model.backend import hooks_added
    from plateauscope.runs.run import Run

    run = Run(tiny_run)
    model, task = run.model(run.steps[-1]), run.task()
    tokens = task.tokens[:4, : task.layout.input_len]
    seen = []
    zero = [("blocks.0.hook_resid_pre", lambda act, hook: seen.append("resid_pre") or act * 0)]
    with hooks_added(model, zero):
        inside = model(tokens)
    torch.testing.assert_close(inside, model.run_with_hooks(tokens, fwd_hooks=zero))
    assert seen == ["resid_pre"] * 2
    with pytest.raises(RuntimeError), hooks_added(model, zero):
        raise RuntimeError("inside")
    assert not model.mod_dict["blocks.0.hook_resid_pre"].fwd_hooks
    assert not torch.allclose(model(tokens), inside) and len(seen) == 2
