"""Plateau geometry: the Hessian spectrum of the training loss, escape directions, gradient noise.

Method. The loss is THE training loss (``Task.loss``, ``training.tasks.base``: mean
cross-entropy over the target tokens) at one checkpoint, on a fixed, seeded batch of examples
(``hessian_batch``), as a function of the flat vector of the trainable parameters (buffers are
held fixed). Hessian-vector products (HVPs) come from ``torch.func``: ``vjp`` of ``grad`` of a
``functional_call`` (reverse-over-reverse; the linearised graph is built once per batch and
reused by every HVP, which measured faster on the CPU than forward-over-reverse ``jvp(grad)``,
also available as ``method="jvp"``). The Hessian is symmetric, so the vjp of the gradient is H v.

* Spectrum: Lanczos with full reorthogonalisation (two Gram-Schmidt passes per step) from a
  seeded random start; one Krylov space gives both ends, the top-k and the ``n_bottom`` most
  negative eigenvalues. Iteration stops when every wanted Ritz pair's Lanczos residual estimate
  is below tolerance or at ``max_iter``. Every reported pair is then checked with an explicit
  HVP: ``residual = ||H v - lambda v||`` (absolute) and ``rel_residual = residual / |lambda|``.
  By Weyl's theorem an eigenvalue of H lies within ``residual`` of each Ritz value, so
  ``rel_residual`` bounds the relative error of the value. Pairs with ``rel_residual > tol`` are
  FLAGGED (``converged = False`` and an ``UnconvergedEigenWarning``), never silently reported.
  A negative Ritz value is a Rayleigh quotient, so it PROVES that this batch's Hessian has
  negative curvature (lambda_min <= it) whether or not it converged; its magnitude needs the
  residual.
* Escape directions: (a) ``displacement``: the unit vector from a plateau checkpoint to a
  post-transition checkpoint of the same run; (b) ``min_eigvec``: the eigenvector of the most
  negative eigenvalue. For each: ``curvature = v^T H v`` (exact, one HVP), ``anisotropy =
  lambda_max / |curvature|`` (large = the direction is much flatter than the dominant
  curvature; the paper claims 500-1000), ``overlap_topk = sum_i (v . u_i)^2`` over the top-k
  eigenvectors u_i (0 = orthogonal to the steep subspace, 1 = inside it).
* Gradient noise: per-example gradients (``vmap`` of ``grad`` of the per-example loss) on the
  Hessian batch, centred on their mean (the batch gradient). The share of the noise variance
  along a set of orthonormal directions is ``sum_n ||U^T c_n||^2 / sum_n ||c_n||^2`` (computed
  chunk by chunk from projections; the P x P covariance is never formed). Reported for the
  top-k eigenvector subspace and for each escape direction, against the isotropic baselines
  ``k / P`` and ``1 / P`` (``enrichment = share / baseline``; > 1 means the noise prefers it).
* Stability: the spectrum is recomputed on ``n_batches`` batches (seeds ``seed``,
  ``seed + 1``, ...; top-1 / bottom-1 for the extra ones) and lambda_max, lambda_min, the
  fraction of batches with lambda_min < 0 (sign stability) and both anisotropy ratios are
  reported as mean, standard deviation, min and max.

Signs: eigenvalues and curvatures in nats per unit squared parameter distance; lambda_min < 0
means a descent direction of negative curvature (a saddle, not a minimum). Shares lie in [0, 1].

    python -m interp.hessian --ckpt RUN/checkpoints/step_0000200.safetensors [--json out.json]
    python -m interp.hessian --run RUN --steps 200 1300 [--k 20 --n-bottom 5 --batch 1024 --n-batches 3]

Series results are cached per step in ``RUN/analysis/hessian.jsonl`` (``interp.results``; a record
is reused only when its settings match). The figures are ``interp.figures.hessian_*``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch.func import functional_call, grad, jvp, vjp, vmap
from tqdm.auto import tqdm

from interp.cli import CliError, resolve_ckpt, run_cli, write_json
from interp.results import HESSIAN_FILE, analysis_dir, cached_series, load_records, settings_key
from training.run import Run, RunError
from training.tasks.base import Task

log = logging.getLogger(__name__)

METHODS = ("vjp", "jvp")
DEFAULT_K = 20
DEFAULT_N_BOTTOM = 5
DEFAULT_BATCH = 512
DEFAULT_N_BATCHES = 3
DEFAULT_TOL = 1e-2
DEFAULT_MAX_ITER = 300
DEFAULT_CHUNK = 64
PAPER_ANISOTROPY = (500.0, 1000.0)

LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss(theta [P], batch [N, ...]) -> scalar``: the mean loss of a batch at flat parameters theta."""
MatVec = Callable[[Tensor], Tensor]


class UnconvergedEigenWarning(UserWarning):
    """An eigenpair whose explicit residual is above tolerance (reported, but flagged)."""


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


def hessian_batch(task: Task, n: int, seed: int) -> Int[Tensor, "N seq"]:
    """``n`` seeded examples of the task (all of them, in order, when it has no more than ``n``)."""
    if n < 1:
        raise ValueError(f"the Hessian batch must hold at least 1 example, got {n}")
    if n >= task.cfg.D:
        return task.tokens
    idx = torch.randperm(task.cfg.D, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return task.tokens[idx]


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


# ---- one checkpoint ----------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, Any]:
    a = np.asarray(values, dtype=float)
    finite = a[np.isfinite(a)]
    return {"mean": float(finite.mean()) if len(finite) else None,
            "std": float(finite.std(ddof=1)) if len(finite) > 1 else 0.0 if len(finite) else None,
            "min": float(finite.min()) if len(finite) else None, "max": float(finite.max()) if len(finite) else None,
            "values": [float(x) if np.isfinite(x) else None for x in a]}


def geometry(model: torch.nn.Module, task: Task, *, k: int = DEFAULT_K, n_bottom: int = DEFAULT_N_BOTTOM,
             batch: int = DEFAULT_BATCH, n_batches: int = DEFAULT_N_BATCHES, seed: int = 0,
             tol: float = DEFAULT_TOL, max_iter: int = DEFAULT_MAX_ITER,
             displacement: Float[Tensor, " P"] | None = None, chunk: int = DEFAULT_CHUNK,
             method: str = "vjp", progress: bool = False) -> dict[str, Any]:
    """Spectrum, escape directions, gradient noise and batch stability of one checkpoint (a JSON-ready dict).

    ``displacement`` is the (unnormalised) parameter displacement of the escape direction (a),
    in ``ParamSpec`` order; without it only the min-eigenvector direction is analysed.
    """
    t0 = time.perf_counter()
    if k < 1 or n_bottom < 1 or n_batches < 1 or chunk < 1:
        raise ValueError(f"--k, --n-bottom, --n-batches and the chunk must be at least 1 (got {k}, {n_bottom}, "
                         f"{n_batches}, {chunk})")
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    loss, theta, spec = model_loss(model, task)
    device = theta.device
    P = theta.numel()
    if displacement is not None and displacement.numel() != P:
        raise ValueError(f"the displacement has {displacement.numel()} entries, the model {P} parameters")
    d_unit = unit(displacement.to(device, theta.dtype)) if displacement is not None else None
    distinct = batch < task.cfg.D
    if n_batches > 1 and not distinct:
        log.warning("the Hessian batch (%d) covers all %d examples: every batch is the same, so the stability "
                    "statistics only vary the Lanczos start", batch, task.cfg.D)
    per_batch: list[dict[str, Any]] = []
    record: dict[str, Any] = {}
    for b in range(n_batches):
        tokens = hessian_batch(task, batch, seed + b).to(device)
        op = HessianOperator(loss, theta, tokens, method)
        kb, nb = (k, n_bottom) if b == 0 else (1, 1)
        sp = lanczos(op, P, kb, nb, max_iter, tol, seed=seed + b, dtype=theta.dtype, device=device,
                     progress=progress)
        lam_max = sp.lambda_max
        row = {"seed": seed + b, "lambda_max": lam_max, "lambda_min": sp.lambda_min,
               "converged": sp.all_converged, "anisotropy_min_eigvec": lam_max / abs(sp.lambda_min)}
        if d_unit is not None:
            row["curvature_displacement"] = float(d_unit @ op(d_unit))
            row["anisotropy_displacement"] = lam_max / abs(row["curvature_displacement"])
        per_batch.append(row)
        if b == 0:
            with torch.no_grad():
                batch_loss = float(loss(theta, tokens))
            g = op.gradient
            top_vecs = sp.top.vectors
            escape = {"min_eigvec": direction_stats(sp.bottom.vectors[0], op, lam_max, top_vecs)}
            dirs = {"min_eigvec": sp.bottom.vectors[0]}
            if d_unit is not None:
                escape["displacement"] = direction_stats(d_unit, op, lam_max, top_vecs)
                dirs["displacement"] = d_unit
            noise = _noise(loss, theta, tokens, g, top_vecs, dirs, chunk)
            grad_topk = float((top_vecs @ g).pow(2).sum() / g.pow(2).sum()) if g.norm() > 0 else None
            record = {"n_params": P, "batch": len(tokens), "batch_loss": batch_loss, "grad_norm": float(g.norm()),
                      "grad_share_topk": grad_topk, "spectrum": sp.to_dict(), "escape": escape, "noise": noise,
                      "n_hvp": op.n_hvp}
            del op, sp
        else:
            record["n_hvp"] += op.n_hvp
    stab = {"n_batches": n_batches, "seeds": [r["seed"] for r in per_batch], "batches_distinct": distinct,
            "lambda_max": _stats([r["lambda_max"] for r in per_batch]),
            "lambda_min": _stats([r["lambda_min"] for r in per_batch]),
            "frac_lambda_min_negative": float(np.mean([r["lambda_min"] < 0 for r in per_batch])),
            "all_converged": all(r["converged"] for r in per_batch),
            "anisotropy_min_eigvec": _stats([r["anisotropy_min_eigvec"] for r in per_batch])}
    if d_unit is not None:
        stab["curvature_displacement"] = _stats([r["curvature_displacement"] for r in per_batch])
        stab["anisotropy_displacement"] = _stats([r["anisotropy_displacement"] for r in per_batch])
    record["stability"] = stab
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    return record


def _noise(loss: LossFn, theta: Float[Tensor, " P"], tokens: Int[Tensor, "N seq"], mean: Float[Tensor, " P"],
           top_vecs: Float[Tensor, "k P"], dirs: dict[str, Tensor], chunk: int) -> dict[str, Any]:
    """Noise-variance shares of the top-k subspace and each escape direction, chunk by chunk."""
    directions = torch.cat([top_vecs, torch.stack(list(dirs.values()))])
    total = torch.zeros((), dtype=torch.float64)
    along = torch.zeros(len(directions), dtype=torch.float64)
    for part in tokens.split(chunk):
        t, a = noise_sums(per_example_grads(loss, theta, part), directions, mean)
        total += t.cpu()
        along += a.cpu()
    shares = (along / total).tolist()
    k, P = len(top_vecs), theta.numel()
    out: dict[str, Any] = {"n_examples": len(tokens), "trace": float(total) / len(tokens),
                           "share_topk": sum(shares[:k]), "share_top1": shares[0],
                           "isotropic_topk": k / P, "isotropic_one": 1 / P}
    out["enrichment_topk"] = out["share_topk"] / out["isotropic_topk"]
    for name, s in zip(dirs, shares[k:]):
        out[f"share_{name}"] = s
        out[f"enrichment_{name}"] = s / out["isotropic_one"]
    return out


# ---- a run's series, with the cache -------------------------------------------------------------


def hessian_path(run_dir: str | Path) -> Path:
    """The run's Hessian cache file."""
    return analysis_dir(run_dir) / HESSIAN_FILE


def load_hessian(run_dir: str | Path, settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Cached records of a run (only those made with ``settings``, when given), sorted by step."""
    return load_records(hessian_path(run_dir), settings)


def default_escape(run: Run) -> tuple[int | None, int | None]:
    """The checkpoint nearest the middle of the plateau span (from the summary), and the last one."""
    steps = run.steps()
    span = (run.summary() or {}).get("plateau_span")
    if not steps or not span:
        return None, steps[-1] if steps else None
    mid = (span[0] + span[1]) / 2
    return min(steps, key=lambda s: abs(s - mid)), steps[-1]


def displacement(run: Run, step_from: int, step_to: int, device: str = "cpu") -> Float[Tensor, " P"]:
    """Flat trainable-parameter displacement ``theta(step_to) - theta(step_from)``."""
    if step_from == step_to:
        raise ValueError(f"the escape direction needs two different checkpoints, got {step_from} twice")
    a, b = run.load_model(step_from, device), run.load_model(step_to, device)
    spec = ParamSpec.of(a)
    return spec.flatten(b) - spec.flatten(a)


def analyze_series(run_dir: str | Path, steps: Sequence[int] | None = None, *, k: int = DEFAULT_K,
                   n_bottom: int = DEFAULT_N_BOTTOM, batch: int = DEFAULT_BATCH,
                   n_batches: int = DEFAULT_N_BATCHES, seed: int = 0, tol: float = DEFAULT_TOL,
                   max_iter: int = DEFAULT_MAX_ITER, escape_from: int | None = None, escape_to: int | None = None,
                   method: str = "vjp", device: str = "cpu", progress: bool = True) -> list[dict[str, Any]]:
    """Geometry records of the chosen steps (default: the escape endpoints), computing only what the cache lacks."""
    run = Run(run_dir)
    available = run.steps()
    if not available:
        raise RunError(f"{run.path}: the run has no checkpoints")
    d_from, d_to = default_escape(run)
    escape_from = d_from if escape_from is None else escape_from
    escape_to = d_to if escape_to is None else escape_to
    steps = sorted(set(steps)) if steps else sorted({s for s in (escape_from, escape_to) if s is not None})
    for s in [*steps, *(x for x in (escape_from, escape_to) if x is not None)]:
        run.checkpoint_path(s)  # a one-line error naming the steps that exist
    if escape_from is None:
        log.warning("%s: no plateau span in the summary and no --escape-from: displacement direction skipped",
                    run.path)
    settings = settings_key(dict(k=k, n_bottom=n_bottom, batch=batch, n_batches=n_batches, seed=seed, tol=tol,
                                 max_iter=max_iter, escape_from=escape_from, escape_to=escape_to, method=method))
    cached = {r["step"] for r in load_hessian(run.path, settings)}
    disp = (displacement(run, escape_from, escape_to, device)
            if escape_from is not None and any(s not in cached for s in steps) else None)
    task = run.task()
    return cached_series(run, hessian_path(run.path), settings, steps,
                         lambda step, model: geometry(model, task, k=k, n_bottom=n_bottom, batch=batch,
                                                      n_batches=n_batches, seed=seed, tol=tol, max_iter=max_iter,
                                                      displacement=disp, method=method), "hessian", device, progress)


# ---- text and the CLI --------------------------------------------------------------------------


def _pm(s: dict[str, Any], fmt: str = "{:.4g}") -> str:
    if s["mean"] is None:
        return "n/a"
    return f"{fmt.format(s['mean'])} +- {fmt.format(s['std'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def format_record(r: dict[str, Any]) -> str:
    """A readable summary of one checkpoint's geometry."""
    sp, st, nz = r["spectrum"], r["stability"], r["noise"]
    flag = lambda p: "" if p["converged"] else "  FLAGGED"  # noqa: E731
    top = ", ".join(f"{p['value']:.4g}" + ("*" if not p["converged"] else "") for p in sp["top"])
    lines = [f"step {r['step']}: {r['n_params']} parameters, batch {r['batch']}, loss {r['batch_loss']:.4f}, "
             f"|grad| {r['grad_norm']:.4g}, {sp['n_iter']} Lanczos steps, {r['n_hvp']} HVPs, {r['wall_s']:.1f} s",
             f"  top-{len(sp['top'])} eigenvalues: {top}   (* = residual above tol {sp['tol']:g})",
             f"  lambda_max {sp['top'][0]['value']:.5g} (rel residual {sp['top'][0]['rel_residual']:.1e}){flag(sp['top'][0])}"]
    for i, p in enumerate(sp["bottom"]):
        lines.append(f"  bottom[{i}]  {p['value']:+.5g} (residual {p['residual']:.2e}, rel {p['rel_residual']:.1e})"
                     f"{flag(p)}")
    lines += [f"  over {st['n_batches']} Hessian batches (seeds {st['seeds']}): lambda_max {_pm(st['lambda_max'])}; "
              f"lambda_min {_pm(st['lambda_min'])}; lambda_min < 0 in {st['frac_lambda_min_negative']:.0%}"
              f"{'' if st['all_converged'] else '  (some batches FLAGGED)'}"]
    for name, e in r["escape"].items():
        key = f"anisotropy_{name}"
        lines.append(f"  escape {name:<12}: curvature {e['curvature']:+.4g}, anisotropy lambda_max/|curv| "
                     f"{e['anisotropy']:.4g} (batches: {_pm(st[key])}), overlap with top-k {e['overlap_topk']:.3g}")
    lines.append(f"  gradient noise ({nz['n_examples']} examples): share in top-{len(sp['top'])} "
                 f"{nz['share_topk']:.3g} (isotropic {nz['isotropic_topk']:.2g}, x{nz['enrichment_topk']:.3g})"
                 + "".join(f"; along {n} {nz[f'share_{n}']:.3g} (isotropic {nz['isotropic_one']:.2g}, "
                           f"x{nz[f'enrichment_{n}']:.3g})" for n in r["escape"]))
    if r.get("grad_share_topk") is not None:
        lines.append(f"  batch gradient: share in top-{len(sp['top'])} {r['grad_share_topk']:.3g}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m interp.hessian``."""
    p = argparse.ArgumentParser(prog="python -m interp.hessian", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--ckpt", type=Path, help="a checkpoint file, or a run directory (with --step)")
    where.add_argument("--run", type=Path, help="a run directory: analyse --steps, cached in RUN/analysis/")
    p.add_argument("--step", type=int, help="with --ckpt DIR: the step (default: the last)")
    p.add_argument("--steps", type=int, nargs="+", help="with --run: the steps (default: the escape endpoints)")
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"top eigenvalues (default {DEFAULT_K})")
    p.add_argument("--n-bottom", type=int, default=DEFAULT_N_BOTTOM,
                   help=f"most negative eigenvalues (default {DEFAULT_N_BOTTOM})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"Hessian batch size (default {DEFAULT_BATCH})")
    p.add_argument("--n-batches", type=int, default=DEFAULT_N_BATCHES,
                   help=f"Hessian batches for the stability statistics (default {DEFAULT_N_BATCHES})")
    p.add_argument("--seed", type=int, default=0, help="seed of the first batch and of the Lanczos start")
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help=f"relative residual tolerance (default {DEFAULT_TOL})")
    p.add_argument("--max-iter", type=int, default=DEFAULT_MAX_ITER,
                   help=f"Lanczos steps at most (default {DEFAULT_MAX_ITER})")
    p.add_argument("--escape-from", type=int, help="plateau step of the displacement (default: mid plateau)")
    p.add_argument("--escape-to", type=int, help="post-transition step of the displacement (default: the last)")
    p.add_argument("--method", choices=METHODS, default="vjp", help="HVP: vjp of grad (default) or jvp of grad")
    p.add_argument("--json", type=Path, help="also write the result(s) as JSON to this file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads (default: torch's; 1 is much faster on a loaded machine)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be at least 1, got {args.threads}")
    for name in ("k", "n_bottom", "batch", "n_batches", "max_iter"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.tol < 1:
        raise CliError(f"--tol must lie in (0, 1), got {args.tol}")
    if args.ckpt is not None and args.steps:
        raise CliError("--steps goes with --run; use --step with --ckpt")
    if args.run is not None and args.step is not None:
        raise CliError("--step goes with --ckpt; use --steps with --run")


def main(argv: list[str] | None = None) -> int:
    """``python -m interp.hessian``: geometry of one checkpoint or a cached series."""
    def body(args: argparse.Namespace) -> None:
        _check_args(args)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        if args.threads:
            torch.set_num_threads(args.threads)
        opts = dict(k=args.k, n_bottom=args.n_bottom, batch=args.batch, n_batches=args.n_batches, seed=args.seed,
                    tol=args.tol, max_iter=args.max_iter, escape_from=args.escape_from, escape_to=args.escape_to,
                    method=args.method, device=args.device, progress=not args.no_progress)
        if args.run is not None:
            records = analyze_series(args.run, args.steps, **opts)
            print("\n".join(format_record(r) for r in records))
            print(f"results in {hessian_path(args.run)}")
            write_json(args.json, records)
            return
        run, step = resolve_ckpt(args.ckpt, args.step)
        d_from, d_to = default_escape(run)
        e_from = d_from if args.escape_from is None else args.escape_from
        e_to = d_to if args.escape_to is None else args.escape_to
        for s in (e_from, e_to):
            if s is not None:
                run.checkpoint_path(s)
        if e_from is None:
            log.warning("%s: no plateau span in the summary and no --escape-from: displacement direction skipped",
                        run.path)
        disp = displacement(run, e_from, e_to, args.device) if e_from is not None else None
        settings = {k: v for k, v in opts.items() if k not in ("device", "progress")}
        rec = {"step": step, "settings": settings_key({**settings, "escape_from": e_from, "escape_to": e_to}),
               **geometry(run.load_model(step, args.device), run.task(), k=args.k, n_bottom=args.n_bottom,
                          batch=args.batch, n_batches=args.n_batches, seed=args.seed, tol=args.tol,
                          max_iter=args.max_iter, displacement=disp, method=args.method,
                          progress=not args.no_progress)}
        print(format_record(rec))
        write_json(args.json, rec)

    return run_cli(body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
