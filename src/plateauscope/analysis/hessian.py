"""Plateau geometry: the Hessian spectrum of the training loss, escape directions, gradient noise.

The study, built on the generic engine ``plateauscope.analysis.hessian_engine`` (flat parameters, HVPs, Lanczos,
per-example gradients). Method. The loss is THE training loss (``Task.loss``, ``plateauscope.tasks.base``: mean
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

    plateauscope hessian --ckpt RUN/checkpoints/step_0000200.safetensors [--json out.json]
    plateauscope hessian --run RUN --steps 200 1300 [--k 20 --n-bottom 5 --batch 1024 --n-batches 3]

Series results are cached per step in ``RUN/analysis/hessian.jsonl`` (``plateauscope.analysis.results``; a record
is reused only when its settings match). The figures are ``plateauscope.views.figures.hessian_*``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.analysis.hessian_engine import (
    DEFAULT_CHUNK,
    DEFAULT_K,
    DEFAULT_MAX_ITER,
    DEFAULT_N_BOTTOM,
    DEFAULT_TOL,
    HessianOperator,
    LossFn,
    ParamSpec,
    direction_stats,
    lanczos,
    model_loss,
    noise_sums,
    per_example_grads,
    unit,
)
from plateauscope.analysis.results import (
    HESSIAN_FILE,
    analysis_dir,
    cached_series,
    load_records,
    settings_key,
    with_task,
)
from plateauscope.runs.run import Run, RunError, trained_run
from plateauscope.tasks.base import Task

log = logging.getLogger(__name__)

DEFAULT_BATCH = 512
DEFAULT_N_BATCHES = 3
PAPER_ANISOTROPY = (500.0, 1000.0)

# ---- the data of the study ----------------------------------------------------------------------


def hessian_batch(task: Task, n: int, seed: int) -> Int[Tensor, "N seq"]:
    """``n`` seeded examples of the task (all of them, in order, when it has no more than ``n``)."""
    if n < 1:
        raise ValueError(f"the Hessian batch must hold at least 1 example, got {n}")
    if n >= task.cfg.D:
        return task.tokens
    idx = torch.randperm(task.cfg.D, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return task.tokens[idx]


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
    """Cached records of a run (only those made with ``settings`` and the run's task, when given), sorted by step."""
    return load_records(hessian_path(run_dir), None if settings is None else with_task(run_dir, settings))


def default_escape(run: Run) -> tuple[int | None, int | None]:
    """The checkpoint nearest the middle of the plateau (``Run.plateau_stretch``: the longest in-band stretch),
    and the last one."""
    steps = run.steps
    stretch = run.plateau_stretch()
    if not steps or not stretch:
        return None, steps[-1] if steps else None
    mid = (stretch[0] + stretch[1]) / 2
    return min(steps, key=lambda s: abs(s - mid)), steps[-1]


def displacement(run: Run, step_from: int, step_to: int, device: str = "cpu") -> Float[Tensor, " P"]:
    """Flat trainable-parameter displacement ``theta(step_to) - theta(step_from)``."""
    if step_from == step_to:
        raise ValueError(f"the escape direction needs two different checkpoints, got {step_from} twice")
    a, b = run.model(step_from, device), run.model(step_to, device)
    spec = ParamSpec.of(a)
    return spec.flatten(b) - spec.flatten(a)


def analyze_series(run_dir: str | Path, steps: Sequence[int] | None = None, *, k: int = DEFAULT_K,
                   n_bottom: int = DEFAULT_N_BOTTOM, batch: int = DEFAULT_BATCH,
                   n_batches: int = DEFAULT_N_BATCHES, seed: int = 0, tol: float = DEFAULT_TOL,
                   max_iter: int = DEFAULT_MAX_ITER, escape_from: int | None = None, escape_to: int | None = None,
                   method: str = "vjp", device: str = "cpu", progress: bool = True) -> list[dict[str, Any]]:
    """Geometry records of the chosen steps (default: the escape endpoints), computing only what the cache lacks."""
    run = trained_run(run_dir, "the Hessian (of the training loss)")
    available = run.steps
    if not available:
        raise RunError(f"{run.path}: the run has no checkpoints")
    d_from, d_to = default_escape(run)
    escape_from = d_from if escape_from is None else escape_from
    escape_to = d_to if escape_to is None else escape_to
    steps = sorted(set(steps)) if steps else sorted({s for s in (escape_from, escape_to) if s is not None})
    for s in [*steps, *(x for x in (escape_from, escape_to) if x is not None)]:
        run.checkpoint_path(s)  # a one-line error naming the steps that exist
    if escape_from is None:
        log.warning("%s: no plateau stretch in the summary and no --escape-from: displacement direction skipped",
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
