"""Hessian geometry: HVPs against the exact Hessian and finite differences, Lanczos against eigvalsh,
the residual flag, the noise projection on a quadratic with a known answer, and the CLI."""

import json

import pytest
import torch
from torch.func import grad, hessian

from plateauscope.analysis import hessian as H
from plateauscope.analysis import hessian_engine as E
from plateauscope.analysis.results import strict_json
from plateauscope.cli import hessian as hessian_cli
from plateauscope.model.backend import build_model
from plateauscope.model.config import ModelConfig
from plateauscope.runs.run import Run
from plateauscope.tasks.selector import SelectorTask
from plateauscope.tasks.selector_config import TaskConfig
from plateauscope.views import figures as F
from tests.conftest import copy_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


@pytest.fixture(scope="module")
def small():
    """A 1-layer, d_model 8 transformer in float64 on a 4 x 2 task (a few hundred parameters)."""
    task = SelectorTask.generate(TaskConfig(n_b=4, K=2, b_len=2, z_len=1, a_len=2, alphabet="abcdef"))
    cfg = task.hooked_config(ModelConfig(n_layers=1, d_model=8, n_heads=1, d_head=4, d_mlp=8))
    model = build_model({**cfg, "dtype": torch.float64}, seed=0)
    loss, theta, spec = E.model_loss(model, task)
    theta = theta + 0.3 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(1), dtype=theta.dtype)
    tokens = task.tokens
    exact = hessian(lambda t: loss(t, tokens))(theta)
    return task, model, loss, theta, tokens, exact


def test_param_spec_round_trip(small):
    _, model, _, _, _, _ = small
    spec = E.ParamSpec.of(model)
    flat = spec.flatten(model)
    assert flat.numel() == spec.n_params == sum(p.numel() for p in model.parameters())
    back = spec.unflatten(flat)
    assert all(torch.equal(back[n], p) for n, p in model.named_parameters())
    assert 200 < spec.n_params < 1000


@pytest.mark.parametrize("method", E.METHODS)
def test_hvp_equals_exact_hessian_and_finite_differences(small, method):
    _, _, loss, theta, tokens, exact = small
    op = E.HessianOperator(loss, theta, tokens, method)
    g = grad(lambda t: loss(t, tokens))
    for seed in range(3):
        v = torch.randn(theta.shape, generator=torch.Generator().manual_seed(seed), dtype=theta.dtype)
        v = v / v.norm()
        hv = op(v)
        # target_cross_entropy computes in float32 even for a float64 model: agreement to ~1e-7
        assert (hv - exact @ v).norm() / hv.norm() < 1e-5
        eps = 3e-3  # central differences: O(eps^2) truncation vs float32 round-off / eps (~2e-5 here)
        fd = (g(theta + eps * v) - g(theta - eps * v)) / (2 * eps)
        assert (hv - fd).norm() / hv.norm() < 1e-4
    torch.testing.assert_close(op.gradient, g(theta))
    assert op.n_hvp == 3
    torch.testing.assert_close(exact, exact.T)  # the operator's symmetry is what vjp-of-grad relies on


def test_lanczos_matches_eigvalsh(small):
    _, _, loss, theta, tokens, exact = small
    evals = torch.linalg.eigvalsh(exact)
    assert evals[0] < 0 < evals[-1]  # a saddle: both ends are non-trivial
    op = E.HessianOperator(loss, theta, tokens)
    sp = E.lanczos(op, theta.numel(), k_top=5, k_bottom=3, max_iter=1000, tol=1e-4, dtype=theta.dtype, seed=3)
    want_top, want_bottom = evals.flip(0)[:5], evals[:3]
    torch.testing.assert_close(sp.top.values, want_top, rtol=1e-4, atol=0)
    torch.testing.assert_close(sp.bottom.values, want_bottom, rtol=1e-4, atol=0)
    assert sp.all_converged and bool((sp.top.rel_residuals < 1e-4).all())
    for pairs in (sp.top, sp.bottom):  # the reported residuals are the explicit ones
        r = (pairs.vectors @ exact - pairs.values[:, None] * pairs.vectors).norm(dim=1)
        torch.testing.assert_close(pairs.residuals, r, rtol=0.1, atol=1e-6)
    gram = sp.top.vectors @ sp.top.vectors.T
    torch.testing.assert_close(gram, torch.eye(5, dtype=gram.dtype), atol=1e-6, rtol=0)
    assert sp.to_dict()["lambda_min_negative_certified"]


def test_lanczos_known_spectrum_and_early_stop():
    d = torch.cat([torch.tensor([50.0, 20.0, 10.0, 9.0]), torch.linspace(-0.5, 1.0, 996), torch.tensor([-2.0])])
    d = d.double()[torch.randperm(1001, generator=torch.Generator().manual_seed(0))]
    sp = E.lanczos(lambda v: d * v, 1001, k_top=3, k_bottom=1, max_iter=500, tol=1e-6, dtype=torch.float64)
    torch.testing.assert_close(sp.top.values, torch.tensor([50.0, 20.0, 10.0], dtype=torch.float64), rtol=1e-6, atol=0)
    torch.testing.assert_close(sp.bottom.values, torch.tensor([-2.0], dtype=torch.float64), rtol=1e-6, atol=0)
    assert sp.n_iter < 500  # stopped on the residual estimate, not on the cap


def test_residual_flag_triggers_when_starved(small):
    _, _, loss, theta, tokens, _ = small
    op = E.HessianOperator(loss, theta, tokens)
    with pytest.warns(E.UnconvergedEigenWarning, match="above tolerance"):
        sp = E.lanczos(op, theta.numel(), k_top=3, k_bottom=2, max_iter=6, tol=1e-4, dtype=theta.dtype)
    assert not sp.all_converged
    assert not bool(sp.bottom.converged.all())
    assert bool((sp.bottom.rel_residuals[~sp.bottom.converged] > 1e-4).all())
    d = sp.to_dict()
    assert d["all_converged"] is False and any(not p["converged"] for p in d["bottom"])
    assert "FLAGGED" not in json.dumps(d)  # a boolean per eigenvalue, not a string


def _whitened(n: int, r: int, seed: int) -> torch.Tensor:
    """``n x r`` with zero column means and ``Z^T Z = n I`` exactly."""
    z = torch.randn(n, r, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = z - z.mean(0)
    q, _ = torch.linalg.qr(z)
    return q * n**0.5


def test_noise_shares_known_covariance():
    P, N = 40, 300
    U, _ = torch.linalg.qr(torch.randn(P, P, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    var = torch.tensor([9.0, 4.0, 1.0, 0.5, 0.25], dtype=torch.float64)
    mean = torch.randn(P, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = mean + _whitened(N, 5, 1) * var.sqrt() @ U[:, :5].T  # covariance U diag(var) U^T
    shares = E.noise_shares(grads, U[:, :6].T)
    torch.testing.assert_close(shares, torch.cat([var / var.sum(), torch.zeros(1, dtype=var.dtype)]), atol=1e-12,
                               rtol=1e-10)
    torch.testing.assert_close(E.noise_shares(grads, U[:, :6].T, mean=mean), shares)
    mixed = (U[:, 0] + U[:, 1]) / 2**0.5  # a non-eigen direction: (9 + 4) / 2 of 14.75
    torch.testing.assert_close(E.noise_shares(grads, mixed[None]), torch.tensor([6.5 / 14.75], dtype=var.dtype))


def test_quadratic_saddle_end_to_end():
    """L = mean_n 1/2 (theta - x_n)^T A (theta - x_n), A = U diag(h) U^T: H = A, per-example
    gradients A (theta - x_n), noise covariance U diag(h^2 c) U^T for Cov(x) = U diag(c) U^T."""
    P, N, k = 30, 200, 3
    U, _ = torch.linalg.qr(torch.randn(P, P, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    f64 = {"dtype": torch.float64}
    h = torch.cat([torch.tensor([100.0, 60.0, 40.0], **f64), torch.linspace(0.1, 2.0, P - 4, **f64),
                   torch.tensor([-0.2], **f64)])
    c = torch.linspace(0.5, 2.0, P, dtype=torch.float64)
    A = U @ torch.diag(h) @ U.T
    X = _whitened(N, P, 1) * c.sqrt() @ U.T + 0.7
    theta = torch.full((P,), 0.3, dtype=torch.float64)

    def loss(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        d = t - x
        return 0.5 * ((d @ A) * d).sum(-1).mean()

    op = E.HessianOperator(loss, theta, X)
    sp = E.lanczos(op, P, k_top=k, k_bottom=1, max_iter=P, tol=1e-8, dtype=torch.float64)
    torch.testing.assert_close(sp.top.values, h[:k], rtol=1e-8, atol=0)
    torch.testing.assert_close(sp.lambda_min, -0.2, rtol=1e-8, atol=0)
    grads = E.per_example_grads(loss, theta, X)
    torch.testing.assert_close(grads, (theta - X) @ A)
    torch.testing.assert_close(grads.mean(0), op.gradient)
    noise = h**2 * c
    share_topk = E.noise_shares(grads, sp.top.vectors, op.gradient).sum()
    torch.testing.assert_close(share_topk, noise[:k].sum() / noise.sum())
    share_min = E.noise_shares(grads, sp.bottom.vectors[:1])[0]
    torch.testing.assert_close(share_min, noise[-1] / noise.sum())
    assert share_topk > 0.99 and share_min < 1e-5  # noise in the steep directions, not the escape one
    esc = E.direction_stats(U[:, -1], op, sp.lambda_max, sp.top.vectors)
    assert esc["curvature"] == pytest.approx(-0.2) and esc["anisotropy"] == pytest.approx(500.0)
    assert esc["overlap_topk"] == pytest.approx(0.0, abs=1e-12)
    steep = E.direction_stats(U[:, 1] + U[:, 5], op, sp.lambda_max, sp.top.vectors)
    assert steep["overlap_topk"] == pytest.approx(0.5) and steep["curvature"] == pytest.approx((60 + h[5].item()) / 2)


def test_geometry_record(small):
    task, model, _, _, _, _ = small
    disp = torch.randn(E.ParamSpec.of(model).n_params, dtype=torch.float64)
    rec = H.geometry(model, task, k=3, n_bottom=2, batch=6, n_batches=2, seed=0, tol=1e-3, max_iter=200,
                     displacement=disp, chunk=4)
    assert rec["batch"] == 6 and len(rec["spectrum"]["top"]) == 3 and len(rec["spectrum"]["bottom"]) == 2
    st = rec["stability"]
    assert st["n_batches"] == 2 and st["seeds"] == [0, 1] and len(st["lambda_max"]["values"]) == 2
    assert st["lambda_max"]["values"][0] == pytest.approx(rec["spectrum"]["lambda_max"])
    # Against the exact Hessian of each batch (torch.func.hessian of the same loss).
    loss, theta, _ = E.model_loss(model, task)
    batches = [H.hessian_batch(task, 6, seed) for seed in (0, 1)]
    exact = [torch.linalg.eigh(hessian(lambda t, b=b: loss(t, b))(theta)) for b in batches]
    lam_min = [float(e.eigenvalues[0]) for e in exact]
    assert st["lambda_min"]["values"] == pytest.approx(lam_min, rel=1e-3)
    assert st["frac_lambda_min_negative"] == sum(v < 0 for v in lam_min) / 2
    # Noise share in the top-3 subspace: per-example gradients, one at a time, projected on the
    # exact top-3 eigenvectors of batch 0.
    per_example = torch.stack([grad(lambda t, x=x: loss(t, x[None]))(theta) for x in batches[0]])
    centred = per_example - per_example.mean(0)
    top3 = exact[0].eigenvectors[:, -3:]
    nz = rec["noise"]
    assert nz["share_topk"] == pytest.approx(float((centred @ top3).pow(2).sum() / centred.pow(2).sum()), rel=1e-3)
    along = torch.nn.functional.normalize(disp, dim=0)
    assert nz["share_displacement"] == pytest.approx(float((centred @ along).pow(2).sum() / centred.pow(2).sum()),
                                                     rel=1e-4)
    assert nz["isotropic_topk"] == pytest.approx(3 / rec["n_params"])
    esc = rec["escape"]
    assert esc["min_eigvec"]["curvature"] == pytest.approx(rec["spectrum"]["lambda_min"], rel=1e-6)
    assert esc["min_eigvec"]["overlap_topk"] == pytest.approx(0.0, abs=1e-8)
    assert esc["displacement"]["anisotropy"] == pytest.approx(
        rec["spectrum"]["lambda_max"] / abs(esc["displacement"]["curvature"]))
    json.dumps(strict_json(rec), allow_nan=False)
    with pytest.raises(ValueError, match="displacement has"):
        H.geometry(model, task, k=1, n_bottom=1, batch=4, n_batches=1, displacement=disp[:5])


def test_hessian_batch_is_seeded(small):
    task = small[0]
    a, b = H.hessian_batch(task, 5, 0), H.hessian_batch(task, 5, 0)
    assert torch.equal(a, b) and not torch.equal(a, H.hessian_batch(task, 5, 1))
    assert torch.equal(H.hessian_batch(task, 10**6, 0), task.tokens)


# ---- the CLI, on the session's `tiny` run --------------------------------------------------------

FAST = ["--k", "2", "--n-bottom", "1", "--batch", "24", "--n-batches", "2", "--max-iter", "60", "--no-progress"]


def test_cli_series_cache_and_figures(tiny_run, tmp_path, capsys):
    tiny_run = copy_run(tiny_run, tmp_path / "tiny")
    steps = Run(tiny_run).steps
    s0, s1 = steps[1], steps[-1]
    argv = ["--run", str(tiny_run), "--steps", str(s0), str(s1), "--escape-from", str(s0), "--escape-to", str(s1),
            "--json", str(tmp_path / "h.json"), *FAST]
    assert hessian_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"step {s0}:" in out and "lambda_max" in out and "escape displacement" in out
    recs = H.load_hessian(tiny_run)
    assert [r["step"] for r in recs] == [s0, s1]
    assert json.loads((tmp_path / "h.json").read_text())[0]["step"] == s0
    n_lines = len(H.hessian_path(tiny_run).read_text().splitlines())
    assert hessian_cli.main(argv) == 0  # cached: nothing appended
    assert len(H.hessian_path(tiny_run).read_text().splitlines()) == n_lines
    assert hessian_cli.main([*argv[:2], *argv[5:], "--steps", str(steps[2])]) == 0  # appends one step
    assert len(H.hessian_path(tiny_run).read_text().splitlines()) == n_lines + 1
    recs = H.load_hessian(tiny_run)
    fig, caption = F.hessian_spectrum(recs, tau=s1)
    lam_min = next(t for t in fig.data if t.name == "lambda_min")
    assert list(lam_min.x) == [r["step"] for r in recs]
    assert list(lam_min.y) == [r["spectrum"]["lambda_min"] for r in recs]
    negative = sum(r["spectrum"]["lambda_min"] < 0 for r in recs)
    assert f"negative at {negative} of {len(recs)} analysed steps" in caption
    fig, _ = F.hessian_anisotropy(recs, tau=s1)
    assert list(fig.data[0].y) == [r["escape"]["displacement"]["anisotropy"] for r in recs]
    fig, _ = F.hessian_noise(recs, tau=s1)
    assert list(fig.data[0].y) == [r["noise"]["enrichment_topk"] for r in recs]


def test_cli_single_checkpoint(tiny_run, tmp_path, capsys):
    run = Run(tiny_run)
    ckpt = run.checkpoint_path(run.steps[-1])
    assert hessian_cli.main(["--ckpt", str(ckpt), "--escape-from", str(run.steps[0]), "--json", str(tmp_path / "o.json"),
                   *FAST]) == 0
    rec = json.loads((tmp_path / "o.json").read_text())
    assert rec["step"] == run.steps[-1] and rec["settings"]["escape_from"] == run.steps[0]
    assert "escape displacement" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--ckpt", "/nonexistent/run"], "no such"),
    (["--run", "/nonexistent/run"], "no such run directory"),
    (["--ckpt", "{run}", "--step", "99999"], "no checkpoint at step 99999"),
    (["--run", "{run}", "--steps", "99999"], "no checkpoint at step 99999"),
    (["--ckpt", "{run}", "--escape-from", "99999"], "no checkpoint at step 99999"),
    (["--run", "{run}", "--k", "0"], "--k must be at least 1"),
    (["--run", "{run}", "--batch", "0"], "--batch must be at least 1"),
    (["--run", "{run}", "--tol", "2"], "--tol must lie in"),
    (["--ckpt", "{run}", "--steps", "5"], "--steps goes with --run"),
    (["--ckpt", "{run}", "--escape-from", "5", "--escape-to", "5"], "two different checkpoints"),
])
def test_cli_errors(tiny_run, capsys, extra, message):
    argv = [a.replace("{run}", str(tiny_run)) for a in extra]
    assert hessian_cli.main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_requires_a_target(capsys):
    with pytest.raises(SystemExit) as e:
        hessian_cli.main(["--k", "3"])
    assert e.value.code == 2


def test_default_escape(tiny_run):
    run = Run(tiny_run)
    d_from, d_to = H.default_escape(run)
    assert d_to == run.steps[-1]
    span = run.plateau_stretch()
    assert (d_from is None) == (not span)
