"""A generic Hessian engine: flat parameters, Hessian-vector products, Lanczos, per-example gradients.

For any module and loss (``model_loss``: the task's training loss, ``Task.loss``, as a function of
the flat trainable parameters). Hessian-vector products come from ``torch.func``: ``vjp`` of
``grad`` of a ``functional_call`` (reverse-over-reverse, the linearised graph built once per batch;
``jvp(grad)`` as ``method="jvp"``). ``lanczos`` gives both ends of the spectrum from one Krylov
space, with full reorthogonalisation and an explicit residual check of every reported pair (pairs
above tolerance are flagged with an ``UnconvergedEigenWarning``, never silently reported).
``per_example_grads``, ``noise_sums`` / ``noise_shares`` and ``direction_stats`` project gradient
noise and curvature onto directions. The plateau-geometry study built on it is ``plateauscope.analysis.hessian``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from torch.func import functional_call, grad, jvp, vjp, vmap
from tqdm.auto import tqdm

from plateauscope.tasks.base import Task

METHODS = ("vjp", "jvp")
DEFAULT_K = 20
DEFAULT_N_BOTTOM = 5
DEFAULT_TOL = 1e-2
DEFAULT_MAX_ITER = 300
DEFAULT_CHUNK = 64


class UnconvergedEigenWarning(UserWarning):
    """An eigenpair whose explicit residual is above tolerance (reported, but flagged)."""


LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss(theta [P], batch [N, ...]) -> scalar``: the mean loss of a batch at flat parameters theta."""
MatVec = Callable[[Tensor], Tensor]


# ---- flat parameters and the loss --------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """The trainable parameters of a module, in ``named_parameters`` order, as one flat vector."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    numels: tuple[int, ...]

    @classmethod
    def of(cls, model: torch.nn.Module) -> ParamSpec:
        """The layout of ``model``'s trainable parameters."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return cls(tuple(n for n, _ in named), tuple(p.shape for _, p in named), tuple(p.numel() for _, p in named))

    @property
    def n_params(self) -> int:
        """Number of trainable parameters P."""
        return sum(self.numels)

    def flatten(self, model: torch.nn.Module) -> Float[Tensor, " P"]:
        """The trainable parameters of ``model`` as one flat vector."""
        params = dict(model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names])

    def unflatten(self, theta: Float[Tensor, " P"]) -> dict[str, Tensor]:
        """A flat vector back as ``{name: tensor}`` in the parameters' shapes."""
        return {n: t.view(s) for n, t, s in zip(self.names, theta.split(self.numels), self.shapes)}


def model_loss(model: torch.nn.Module, task: Task) -> tuple[LossFn, Float[Tensor, " P"], ParamSpec]:
    """The training loss as ``loss(theta, tokens)``, the model's flat parameters, and their layout."""
    spec = ParamSpec.of(model)
    fixed = {n: b.detach() for n, b in model.named_buffers()}
    fixed.update({n: p.detach() for n, p in model.named_parameters() if not p.requires_grad})

    def loss(theta: Tensor, tokens: Tensor) -> Tensor:
        logits = functional_call(model, (spec.unflatten(theta), fixed), (tokens[:, : task.input_len],))
        return task.loss(logits, tokens)

    return loss, spec.flatten(model), spec


class HessianOperator:
    """``v -> H v`` for the Hessian of ``loss(., batch)`` at ``theta``; counts its HVPs.

    ``method="vjp"`` builds the linearised gradient graph once (memory: about three times the
    activations of one forward pass on the batch) and reuses it; ``"jvp"`` recomputes
    forward-over-reverse each call (no retained graph).
    """

    def __init__(self, loss: LossFn, theta: Float[Tensor, " P"], batch: Tensor, method: str = "vjp"):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method, self.n_params, self.n_hvp = method, theta.numel(), 0
        self._theta = theta.detach()
        self._grad_fn = grad(lambda t: loss(t, batch))
        if method == "vjp":
            self.gradient, self._vjp = vjp(self._grad_fn, self._theta)
        else:
            self.gradient = self._grad_fn(self._theta)
        self.gradient = self.gradient.detach()

    def __call__(self, v: Float[Tensor, " P"]) -> Float[Tensor, " P"]:
        self.n_hvp += 1
        if self.method == "vjp":
            return self._vjp(v)[0].detach()
        return jvp(self._grad_fn, (self._theta,), (v,))[1].detach()


def per_example_grads(loss: LossFn, theta: Float[Tensor, " P"], batch: Tensor) -> Float[Tensor, "N P"]:
    """The gradient of each example's own loss (``loss(theta, batch[i:i+1])``), by ``vmap``."""
    return vmap(grad(lambda t, x: loss(t, x[None])), in_dims=(None, 0))(theta.detach(), batch).detach()


# ---- Lanczos -----------------------------------------------------------------------------------


@dataclass
class Eigenpairs:
    """Ritz pairs with explicit residuals. Vectors are rows, unit norm."""

    values: Float[Tensor, " m"]
    vectors: Float[Tensor, "m P"]
    residuals: Float[Tensor, " m"]
    """``||H v - lambda v||``, from an explicit HVP (or the Lanczos estimate if not verified)."""
    rel_residuals: Float[Tensor, " m"]
    """``residual / |lambda|``: a bound on the relative error of the value."""
    converged: Bool[Tensor, " m"]
    """``rel_residual <= tol``; False = FLAGGED."""

    def to_dict(self) -> list[dict[str, Any]]:
        """Values, residuals and convergence flags (not the vectors)."""
        return [{"value": v, "residual": r, "rel_residual": rr, "converged": c} for v, r, rr, c in zip(
            self.values.tolist(), self.residuals.tolist(), self.rel_residuals.tolist(), self.converged.tolist())]


@dataclass
class Spectrum:
    """Both ends of a Hessian spectrum from one Lanczos run."""

    top: Eigenpairs
    """The largest eigenvalues, descending."""
    bottom: Eigenpairs
    """The smallest (most negative) eigenvalues, ascending."""
    n_iter: int
    n_hvp: int
    tol: float
    verified: bool
    wall_s: float

    @property
    def lambda_max(self) -> float:
        """The largest Ritz value."""
        return float(self.top.values[0])

    @property
    def lambda_min(self) -> float:
        """The most negative (smallest) Ritz value."""
        return float(self.bottom.values[0])

    @property
    def all_converged(self) -> bool:
        """Whether every reported pair is within tolerance."""
        return bool(self.top.converged.all() and self.bottom.converged.all())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (no vectors)."""
        return {"top": self.top.to_dict(), "bottom": self.bottom.to_dict(), "lambda_max": self.lambda_max,
                "lambda_min": self.lambda_min, "lambda_min_negative_certified": self.lambda_min < 0,
                "all_converged": self.all_converged, "n_iter": self.n_iter, "n_hvp": self.n_hvp,
                "tol": self.tol, "verified": self.verified, "wall_s": round(self.wall_s, 3)}


class _Basis:
    """Lanczos vectors as rows of a growing buffer."""

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device, capacity: int):
        self.rows = torch.empty(capacity, n, dtype=dtype, device=device)
        self.size = 0

    def append(self, v: Tensor) -> None:
        if self.size == len(self.rows):
            grown = torch.empty(2 * len(self.rows), self.rows.shape[1], dtype=self.rows.dtype, device=self.rows.device)
            grown[: self.size] = self.rows
            self.rows = grown
        self.rows[self.size] = v
        self.size += 1

    def view(self) -> Tensor:
        return self.rows[: self.size]


def _wanted(n_ritz: int, k_top: int, k_bottom: int) -> tuple[list[int], list[int]]:
    """Indices (into ascending Ritz values) of the top (descending) and bottom (ascending) ones, disjoint."""
    k_top = min(k_top, n_ritz)
    top = list(range(n_ritz - 1, n_ritz - 1 - k_top, -1))
    bottom = [i for i in range(min(k_bottom, n_ritz)) if i not in top]
    return top, bottom


def lanczos(matvec: MatVec, n: int, k_top: int = DEFAULT_K, k_bottom: int = DEFAULT_N_BOTTOM,
            max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, seed: int = 0,
            dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", check_every: int = 10,
            verify: bool = True, progress: bool = False) -> Spectrum:
    """The ``k_top`` largest and ``k_bottom`` smallest eigenpairs of the symmetric operator ``matvec``.

    Full reorthogonalisation; stops when every wanted pair's Lanczos residual estimate
    ``|beta_m s_mi|`` is below ``tol / 2 * |theta_i|``, when the Krylov space is exhausted, or after
    ``max_iter`` HVPs. With ``verify`` each returned pair costs one more HVP for its explicit
    residual. Unconverged pairs are flagged and warned about (``UnconvergedEigenWarning``).
    """
    t0 = time.perf_counter()
    if k_top < 1 or k_bottom < 0:
        raise ValueError(f"need k_top >= 1 and k_bottom >= 0, got {k_top}, {k_bottom}")
    device = torch.device(device)
    m_max = max(1, min(max_iter, n))
    q = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(device, dtype)
    basis = _Basis(n, dtype, device, capacity=min(m_max + 1, 64))
    basis.append(q / q.norm())
    alpha: list[float] = []
    beta: list[float] = []
    breakdown = False
    bar = tqdm(total=m_max, desc="lanczos", disable=not progress, leave=False, dynamic_ncols=True)
    for j in range(m_max):
        w = matvec(basis.view()[j])
        Q = basis.view()
        h = Q @ w
        w = w - Q.T @ h
        h2 = Q @ w  # the second pass: "twice is enough"
        w = w - Q.T @ h2
        alpha.append(float(h[j] + h2[j]))
        b = float(w.norm())
        bar.update(1)
        scale = max(abs(a) for a in alpha) + (max(beta) if beta else 0.0)
        if b <= 1e3 * torch.finfo(dtype).eps * max(scale, 1e-30) or j + 1 == n:
            breakdown = True  # an invariant subspace: the Ritz values are exact
            break
        beta.append(b)
        if j + 1 == m_max:
            break
        basis.append(w / b)
        if (j + 1) % check_every == 0 and j + 1 >= k_top + k_bottom:
            theta, S = _tridiag_eig(alpha, beta[:-1])
            est = abs(b) * np.abs(S[-1])
            top, bottom = _wanted(len(theta), k_top, k_bottom)
            idx = top + bottom
            if np.all(est[idx] <= 0.5 * tol * np.abs(theta[idx])):
                break
    bar.close()
    m = len(alpha)
    theta, S = _tridiag_eig(alpha, beta[: m - 1])
    b_last = 0.0 if breakdown else beta[m - 1]
    top, bottom = _wanted(m, k_top, k_bottom)
    Q = basis.view()[:m]

    def pairs(idx: list[int]) -> Eigenpairs:
        values = torch.tensor(theta[idx], dtype=torch.float64)
        coeffs = torch.as_tensor(S[:, idx].T.copy(), dtype=dtype, device=device)  # [w, m]
        vectors = coeffs @ Q if idx else torch.empty(0, n, dtype=dtype, device=device)
        vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(1e-30)
        if verify and idx:
            res = torch.stack([(matvec(v).double() - float(lam) * v.double()).norm() for v, lam in zip(vectors, values)])
            res = res.cpu()
        else:
            res = torch.tensor(abs(b_last) * np.abs(S[-1, idx]), dtype=torch.float64)
        rel = res / values.abs().clamp_min(1e-300)
        return Eigenpairs(values, vectors, res, rel, rel <= tol)

    spec = Spectrum(pairs(top), pairs(bottom), m, m + (len(top) + len(bottom)) * verify, tol, verify,
                    time.perf_counter() - t0)
    bad = [(name, i, float(p.values[i]), float(p.rel_residuals[i]))
           for name, p in (("top", spec.top), ("bottom", spec.bottom)) for i in range(len(p.values))
           if not p.converged[i]]
    if bad:
        detail = ", ".join(f"{name}[{i}]={v:.4g} (rel residual {r:.2g})" for name, i, v, r in bad[:6])
        warnings.warn(f"{len(bad)} of {len(top) + len(bottom)} eigenvalues above tolerance {tol:g} after {m} "
                      f"Lanczos steps: {detail}{' ...' if len(bad) > 6 else ''}", UnconvergedEigenWarning,
                      stacklevel=2)
    return spec


def _tridiag_eig(alpha: list[float], beta: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of the symmetric tridiagonal matrix (alpha, beta)."""
    from scipy.linalg import eigh_tridiagonal

    if len(alpha) == 1:
        return np.array(alpha, dtype=float), np.ones((1, 1))
    return eigh_tridiagonal(np.asarray(alpha, dtype=float), np.asarray(beta, dtype=float))


# ---- projections: escape directions and gradient noise -----------------------------------------


def noise_sums(grads: Float[Tensor, "N P"], directions: Float[Tensor, "d P"],
               mean: Float[Tensor, " P"]) -> tuple[Float[Tensor, ""], Float[Tensor, " d"]]:
    """``sum_n ||c_n||^2`` and ``sum_n (u_d . c_n)^2`` for the centred gradients ``c_n = g_n - mean``."""
    centred = grads - mean
    return centred.double().pow(2).sum(), (centred @ directions.T).double().pow(2).sum(0)


def noise_shares(grads: Float[Tensor, "N P"], directions: Float[Tensor, "d P"],
                 mean: Float[Tensor, " P"] | None = None) -> Float[Tensor, " d"]:
    """Share of the gradient-noise variance along each unit direction (rows of ``directions``).

    The noise is the covariance of the per-example gradients around ``mean`` (their own mean by
    default): ``share_d = u_d^T C u_d / tr C``. For orthonormal directions the shares add up to the
    share of the subspace they span.
    """
    total, along = noise_sums(grads, directions, grads.mean(0) if mean is None else mean)
    return along / total


def unit(v: Float[Tensor, " P"]) -> Float[Tensor, " P"]:
    """``v`` scaled to unit length."""
    norm = v.norm()
    if not norm > 0:
        raise ValueError("cannot normalise a zero vector (are the two checkpoints identical?)")
    return v / norm


def direction_stats(v: Float[Tensor, " P"], hvp: MatVec, lambda_max: float,
                    top_vectors: Float[Tensor, "k P"]) -> dict[str, float]:
    """Curvature ``v^T H v``, anisotropy ``lambda_max / |curvature|`` and top-k overlap of a unit direction."""
    v = unit(v)
    curvature = float(v @ hvp(v))
    overlap = float((top_vectors @ v).pow(2).sum())
    return {"curvature": curvature, "anisotropy": lambda_max / abs(curvature) if curvature else math.inf,
            "overlap_topk": overlap}
