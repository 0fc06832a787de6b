"""The LLC estimator: known answers on a regular model, a redundant copy, the cache, the missing extra."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from plateauscope.analysis import llc as L
from plateauscope.cli import llc as llc_cli
from plateauscope.runs.run import Run
from tests.conftest import copy_run

needs_devinterp = pytest.mark.skipif(importlib.util.find_spec("devinterp") is None,
                                     reason="devinterp (the optional extra 'llc': pip install '.[llc]') is not installed")

N, D_IN = 1000, 6
NBETA, GAMMA = 100.0, 1.0


class Linear(torch.nn.Module):
    """y = x . (w_1 + ... + w_copies): one regular model, or the same model with redundant copies."""

    def __init__(self, copies: int, w: torch.Tensor):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(w.clone() / copies) for _ in range(copies)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.stack(list(self.w)).sum(0)


def _regression() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D_IN, generator=gen) * torch.linspace(0.5, 1.5, D_IN)
    y = x @ torch.randn(D_IN, generator=gen) + torch.randn(N, generator=gen)
    return torch.cat([x, y[:, None]], 1), torch.linalg.lstsq(x, y).solution


def _mse(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Gaussian negative log-likelihood (sigma 1, up to a constant): the mean of half the squared error."""
    return 0.5 * ((model(batch[:, :D_IN]) - batch[:, D_IN]) ** 2).mean()


def _expected_llc(data: torch.Tensor, copies: int) -> float:
    """The exact localised answer for a quadratic loss with Hessian H around the minimum.

    The tempered, localised posterior exp(-nbeta L - gamma/2 |w - w*|^2) is Gaussian; along an
    eigenvector of the Hessian h of the loss, E[L - L*] = h / (2 (nbeta h + gamma)), so
    nbeta E[L - L*] = sum_i nbeta h_i / (2 (nbeta h_i + gamma)): d/2 as gamma -> 0. With c
    copies, the loss Hessian over all c*d weights has the eigenvalues c h_i (direction: all copies
    together) and 0 (the c - 1 redundant directions, which add nothing).
    """
    x = data[:, :D_IN].double()
    h = torch.linalg.eigvalsh(x.T @ x / len(x)) * copies
    return float((NBETA * h / (2 * (NBETA * h + GAMMA))).sum())


def _settings(**kw) -> L.LLCSettings:
    base = dict(num_chains=2, num_draws=1500, num_burnin_steps=200, batch_size=N, lr=1e-3,
                localization=GAMMA, nbeta=NBETA, init_examples=0)
    return L.LLCSettings(**{**base, **kw})


@needs_devinterp
def test_regular_model_has_llc_d_over_2():
    data, w = _regression()
    expected = _expected_llc(data, 1)
    assert expected == pytest.approx(D_IN / 2, rel=0.02)  # gamma small: the regular answer d/2
    res = L.estimate_llc(Linear(1, w), data, None, _settings(), loss_fn=_mse)
    assert res["llc"] == pytest.approx(expected, rel=0.12), res["llc_per_chain"]
    assert res["stationary"], res["drift"]


class DroppedLinear(Linear):
    """:class:`Linear` behind a dropout layer, as a Hugging Face model with dropout in its config."""

    def __init__(self, w: torch.Tensor):
        super().__init__(1, w)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.drop(x))


@needs_devinterp
def test_the_sampler_runs_without_dropout():
    data, w = _regression()
    settings = _settings(num_draws=50, num_burnin_steps=10)
    plain = L.estimate_llc(Linear(1, w), data, None, settings, loss_fn=_mse)
    dropped = L.estimate_llc(DroppedLinear(w).train(), data, None, settings, loss_fn=_mse)
    assert dropped["llc_per_chain"] == plain["llc_per_chain"]  # the loss is a function of the weights alone


@needs_devinterp
def test_redundant_copy_does_not_lower_the_llc():
    data, w = _regression()
    one = L.estimate_llc(Linear(1, w), data, None, _settings(), loss_fn=_mse)["llc"]
    two = L.estimate_llc(Linear(2, w), data, None, _settings(), loss_fn=_mse)["llc"]
    # twice the parameters, the same function: the LLC stays d/2, it is not a parameter count
    assert two == pytest.approx(_expected_llc(data, 2), rel=0.12)
    assert two >= 0.9 * one
    assert two < 0.75 * (2 * D_IN / 2)  # far below (2d)/2, what a count of all weights would give


@needs_devinterp
@pytest.mark.filterwarnings("ignore:noise_level in SGLD")
def test_a_sampler_without_noise_fails_the_check():
    """With the Langevin noise off, SGLD is gradient descent at the minimum: the LLC collapses to 0."""
    data, w = _regression()
    import devinterp.optim

    def no_noise(params, **kw):
        return devinterp.optim.SGMCMC.sgld(params, noise_level=0.0, **kw)

    orig = L.require_devinterp
    try:
        L.require_devinterp = lambda: no_noise
        broken = L.estimate_llc(Linear(1, w), data, None, _settings(num_draws=200), loss_fn=_mse)["llc"]
    finally:
        L.require_devinterp = orig
    assert abs(broken) < 0.1 * _expected_llc(data, 1)


def test_drift_and_half_change_by_hand():
    flat = np.tile([1.0, -1.0], 30)[None]
    ramp = np.linspace(0, 1, 60)[None]
    assert abs(L.drift(flat)[0]) < 0.1
    # a linear ramp: thirds' means differ by 2/3 of the range, its std is range / sqrt(12)
    assert L.drift(ramp)[0] == pytest.approx((2 / 3) * np.sqrt(12), rel=0.05)
    steps = [0, 10, 20, 30, 40]
    assert L.half_change_step(steps, [5.0, 5.0, 4.0, 2.0, 1.0]) == 30  # falls: half of -4 first at 30
    assert L.half_change_step(steps, [1.0, 2.0, 4.0, 4.0, 5.0]) == 20
    assert L.half_change_step(steps, [1.0] * 5) is None


def test_settings_are_validated():
    with pytest.raises(ValueError, match="num_draws"):
        L.LLCSettings(num_draws=2).validate()
    with pytest.raises(ValueError, match="lr"):
        L.LLCSettings(lr=0.0).validate()


TINY = L.LLCSettings(num_chains=1, num_draws=6, num_burnin_steps=2, batch_size=8, init_examples=64)


@needs_devinterp
def test_cache_reused_only_when_settings_match(tiny_run, monkeypatch, tmp_path):
    tiny_run = copy_run(tiny_run, tmp_path / "tiny")
    run = Run(tiny_run)
    steps = run.steps[-2:]
    calls = []
    real = L.estimate_llc
    monkeypatch.setattr(L, "estimate_llc", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = L.llc_at(run, steps, TINY, progress=False)
    assert len(calls) == 2
    again = L.llc_at(run, steps, TINY, progress=False)
    assert len(calls) == 2 and again == first  # reused: nothing recomputed
    other = TINY.with_draws(9)
    changed = L.llc_at(run, steps, other, progress=False)
    assert len(calls) == 4 and all(r["settings"]["num_draws"] == 9 for r in changed)
    lines = L.llc_path(tiny_run).read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["step"] in steps for x in lines)  # both settings kept
    assert [r["llc"] for r in L.load_llc(tiny_run, TINY)] == [r["llc"] for r in first]
    # deterministic: the same settings on a fresh cache give the same numbers
    L.llc_path(tiny_run).unlink()
    assert [r["llc"] for r in L.llc_at(run, steps, TINY, progress=False)] == [r["llc"] for r in first]


@needs_devinterp
def test_series_and_cli(tiny_run, capsys, tmp_path):
    tiny_run = copy_run(tiny_run, tmp_path / "tiny")
    s = L.llc_series(tiny_run, every=4, settings=TINY, progress=False)
    assert s["steps"][-1] == Run(tiny_run).steps[-1] and len(s["llc"]) == len(s["steps"])
    c = s["calibration"]
    assert c["step"] == s["steps"][-1] and c["rel_change"] == pytest.approx(
        abs(c["llc_doubled"] - c["llc"]) / abs(c["llc_doubled"]))
    assert json.loads((tiny_run / "analysis" / L.LLC_SUMMARY_FILE).read_text())["steps"] == s["steps"]
    argv = ["--run", str(tiny_run), "--every", "4", "--chains", "1", "--draws", "6", "--burnin", "2",
            "--batch-size", "8", "--no-progress"]
    assert llc_cli.main(argv) == 0
    assert "doubled draws" in capsys.readouterr().out
    assert llc_cli.main(["--run", str(tiny_run / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "nope" in err and "\n" not in err
    assert llc_cli.main(["--run", str(tiny_run), "--every", "0"]) == 2
    assert "--every" in capsys.readouterr().err


def test_missing_extra_is_one_clear_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "devinterp", None)
    monkeypatch.setitem(sys.modules, "devinterp.optim", None)
    with pytest.raises(L.MissingExtraError, match=r"pip install '\.\[llc\]'"):
        L.require_devinterp()
    with pytest.raises(L.MissingExtraError):
        L.llc_series(tmp_path)
    assert llc_cli.main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skipped:") and err.count("\n") == 1


def test_llc_figure_marks_t_form_and_tau():
    from plateauscope.views.figures import llc_figure

    summary = {"steps": [0, 100, 200, 300], "llc": [5.0, 6.0, 20.0, 40.0], "llc_std": [0.1, 0.2, 0.3, 0.4],
               "stationary": [True, False, True, True], "tau": 250, "t_form": 150,
               "settings": L.LLCSettings().to_dict(),
               "calibration": {"step": 300, "rel_change": 0.04}}
    fig, caption = llc_figure(summary)
    assert list(fig.data[0].x) == summary["steps"] and list(fig.data[0].y) == summary["llc"]
    assert list(fig.data[1].x) == [100]  # the non-stationary checkpoint is flagged
    assert sorted(s.x0 for s in fig.layout.shapes) == [125, 150, 250]  # tau/2, t_form, tau
    assert "4.0%" in caption and "t_form" in caption
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
