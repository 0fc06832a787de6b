"""The local learning coefficient (LLC) over a run's checkpoint series: a second progress measure.

Method: at each chosen checkpoint w*, sample the tempered, localised posterior around it with
SGLD (``devinterp.optim.SGMCMC.sgld``, Lau et al. 2023)::

    w_{t+1} = w_t - eps/2 (nbeta grad L_m(w_t) + gamma (w_t - w*)) + N(0, eps)

where ``L_m`` is the training loss on a minibatch of ``m`` examples of the run's own data set (an
imported series, ``plateauscope import``, has none: its probe's sequences and the probe's task loss
stand in, and ``llc.json``'s ``data`` says which), and estimate ``LLC = nbeta (E_chain[L(w_t)] - L(w*))``. ``L`` is the training objective,
``Task.loss`` (``plateauscope.tasks.base``): the mean cross-entropy over the A (target) tokens
under teacher forcing. ``E_chain`` is the mean of the minibatch losses of the draws (the steps
after burn-in) over all chains; ``L(w*)`` is the loss at the checkpoint on a fixed, seeded
subset of the data set (``LLCSettings.init_examples``). The sampler comes from ``devinterp``
(the optional extra ``llc``: ``pip install '.[llc]'``); the loop around it is ours, so the loss
is exactly the training loss and nothing is written but our cache.

Metric and sign: the LLC is a positive number of effective parameters (a degeneracy-aware
count; ``d/2`` for a regular model with ``d`` parameters). Larger = a more complex, less
degenerate solution. Values at different checkpoints of one run are comparable only under the
same settings (they are stored with every record).

Calibration (reported with every result):

* stationarity: for each chain, ``drift = (mean of the last third of the draws - mean of the
  first third) / std of the draws``; the chains are called stationary when every ``|drift|`` is
  at most ``LLCSettings.max_drift``;
* stability: at one checkpoint the estimate is repeated with twice the draws; it is stable when
  ``|LLC(2 draws) - LLC(draws)| / |LLC(2 draws)|`` is at most ``LLCSettings.max_rel_change``.

Results are cached in ``RUN/analysis/llc.jsonl`` (one record per (step, settings), the whole
file rewritten atomically); a record is reused only when its settings match. The series summary
goes to ``RUN/analysis/llc.json``.

    plateauscope llc --run checkpoints/demo --every 4
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from plateauscope.analysis.results import (
    LLC_FILE,
    LLC_SUMMARY_FILE,
    analysis_dir,
    cached_series,
    load_records,
    pick_steps,
    read_routing_summary,
    with_task,
    write_json_result,
)
from plateauscope.runs.metrics import compute_tau
from plateauscope.runs.run import Run, RunError, read_jsonl
from plateauscope.runs.series import is_imported
from plateauscope.tasks.base import Task

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install '.[llc]' (or pip install devinterp)"


class MissingExtraError(RunError):
    """The optional dependency ``devinterp`` is not installed."""


def require_devinterp() -> Any:
    """The SGLD factory ``devinterp.optim.SGMCMC.sgld``; a one-line MissingExtraError without devinterp."""
    try:
        from devinterp.optim import SGMCMC
    except ImportError:
        raise MissingExtraError(f"the LLC needs the optional extra 'llc': {INSTALL_HINT}") from None
    return SGMCMC.sgld


@dataclass(frozen=True)
class LLCSettings:
    """SGLD settings of one LLC estimate; stored with every cached record."""

    num_chains: int = 2
    """Independent SGLD chains (different noise and minibatch order), all started at the checkpoint."""
    num_draws: int = 100
    """Steps after burn-in whose minibatch losses enter the estimate, per chain."""
    num_burnin_steps: int = 20
    """SGLD steps per chain before the draws (their losses are not used)."""
    batch_size: int = 16
    """Examples per SGLD minibatch (m), drawn with replacement from the run's data set."""
    lr: float = 3e-4
    """SGLD step size epsilon (eps * nbeta * lambda_max / 2 < 1 keeps the steepest direction stable)."""
    localization: float = 1000.0
    """Localisation strength gamma: the pull back towards the checkpoint's weights (relaxation ~ 2 / (eps gamma) steps)."""
    nbeta: float = 100.0
    """Inverse temperature n*beta multiplying the loss gradient, and the LLC's scale."""
    init_examples: int = 2048
    """Examples (a fixed seeded subset of the data set) on which L(w*) is computed; 0 = all."""
    seed: int = 0
    """Seed of the noise, the minibatch order (chain c uses seed + c) and the init subset."""
    max_drift: float = 0.5
    """Stationarity: the largest |drift| (last-third mean minus first-third mean, over the draws' std) allowed."""
    max_rel_change: float = 0.1
    """Stability: the largest relative change of the LLC allowed when the draws are doubled."""

    def validate(self) -> None:
        """Raise ValueError (one line) on settings SGLD cannot use."""
        for name in ("num_chains", "num_draws", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LLC setting {name} must be at least 1, got {getattr(self, name)}")
        if self.num_draws < 3:
            raise ValueError(f"LLC setting num_draws must be at least 3 (the stationarity check uses thirds), got {self.num_draws}")
        for name in ("num_burnin_steps", "init_examples"):
            if getattr(self, name) < 0:
                raise ValueError(f"LLC setting {name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "nbeta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LLC setting {name} must be positive, got {getattr(self, name)}")
        if self.localization < 0:
            raise ValueError(f"LLC setting localization must be >= 0, got {self.localization}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: the key the cached records are stored under."""
        return dataclasses.asdict(self)

    def with_draws(self, num_draws: int) -> LLCSettings:
        """The same settings with another number of draws."""
        return dataclasses.replace(self, num_draws=num_draws)


# ---- the estimator ------------------------------------------------------------------------


def target_loss(model: torch.nn.Module, tokens: Int[Tensor, "N seq"], task: Task) -> Float[Tensor, ""]:
    """The training loss (``Task.loss``) of ``model`` on ``tokens``."""
    return task.loss(model(tokens[:, : task.input_len]), tokens)


@torch.no_grad()
def dataset_loss(model: torch.nn.Module, tokens: Int[Tensor, "N seq"], task: Task, chunk: int = 2048) -> float:
    """The training loss over all of ``tokens`` (chunked; every example weighted equally)."""
    total = 0.0
    for part in tokens.split(chunk):
        total += target_loss(model, part, task).item() * len(part)
    return total / len(tokens)


def drift(trace: Float[np.ndarray, "... draws"]) -> Float[np.ndarray, "..."]:
    """(mean of the last third - mean of the first third) / std of the draws, along the last axis."""
    n = trace.shape[-1] // 3
    spread = trace.std(axis=-1)
    diff = trace[..., -n:].mean(axis=-1) - trace[..., :n].mean(axis=-1)
    return diff / np.where(spread > 0, spread, 1.0)


RESTRICTIONS: tuple[str, ...] = ("devinterp", "restore")
"""How :func:`estimate_llc` keeps the weights outside its ``masks`` at the checkpoint: ``devinterp``, the
sampler's own ``mask`` (each step's drift and noise multiplied by the mask); ``restore``, ours (the sampler
moves whole tensors, then the entries outside the mask are copied back from the checkpoint after every step).
The two give the same chain: the masked entries' updates depend only on their own gradient, prior pull and
noise, and the noise is drawn for the whole tensor either way."""


def release_graphs(model: torch.nn.Module) -> None:
    """Detach every tensor attached to an autograd graph that ``model``'s modules hold as plain attributes.

    A deep copy of a TransformerLens 4.x bridge keeps the forward hooks (closures) of the original, and
    one of them stores the attention's input residual on the original module: after a chain on a copy
    the original holds a tensor of the chain's graph, which the next ``copy.deepcopy`` refuses. Its own
    next forward overwrites that attribute before reading it, so detaching changes no number.
    """
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, Tensor) and value.grad_fn is not None:
                module.__dict__[name] = value.detach()


def estimate_llc(model: torch.nn.Module, tokens: Shaped[Tensor, "N ..."], task: Task | None,
                 settings: LLCSettings = LLCSettings(), loss_fn: Any = None,
                 masks: list[Bool[Tensor, "..."]] | None = None, restriction: str = "devinterp",
                 paired: bool = False, reference: Float[np.ndarray, "chains draws"] | None = None) -> dict[str, Any]:
    """Estimate the LLC of ``model`` at its current weights by SGLD on the examples ``tokens``.

    ``loss_fn(model, batch) -> scalar`` defaults to the task's training loss
    (:func:`target_loss` with ``task``); it must be the mean over the examples of ``batch``
    (any model and data: the tests use a linear regression).
    ``model`` itself is not changed (each chain samples a copy). Returns plain floats/lists:
    ``llc`` (mean over chains), ``llc_std`` (std over chains), ``llc_per_chain``, ``init_loss``,
    ``trace`` (minibatch losses, chains x draws), ``drift`` per chain and ``stationary``.

    ``masks`` (one boolean tensor per ``model.parameters()``, in that order, each of its parameter's
    shape; True = sampled) restricts the sampler to a subset of the weights, every other weight held
    at the checkpoint (a weight-restricted LLC, Wang et al. 2024); ``restriction`` is how
    (:data:`RESTRICTIONS`). Parameters without a True entry get no gradient and are not handed to the
    sampler. The result then also has ``n_sampled`` (weights sampled) and ``frozen_max_change``: the
    largest change of a weight outside the masks at the end of any chain (0.0: held exactly).

    ``paired``: each draw's minibatch loss is taken minus the checkpoint's own loss on the same
    minibatch, ``LLC = nbeta mean_t (L_Bt(w_t) - L_Bt(w*))``: the same expectation (each minibatch is
    drawn independently of the weights it is evaluated at), without the minibatch-to-minibatch spread
    of the loss, which the two terms share (the smaller the move, the more). ``init_loss`` is then the
    mean of the checkpoint's minibatch losses (``init_examples`` is not used), ``drift`` is read on the
    differences, and ``reference`` (chains x draws) holds those losses: they depend only on the
    checkpoint, ``seed``, ``batch_size`` and the step counts, so a caller may pass them back in for
    another restriction at the same checkpoint instead of recomputing them.
    """
    settings.validate()
    sgld = require_devinterp()
    if restriction not in RESTRICTIONS:
        raise ValueError(f"restriction must be one of {', '.join(RESTRICTIONS)}, got {restriction!r}")
    if masks is not None:
        params = list(model.parameters())
        if len(masks) != len(params) or any(m.shape != p.shape for m, p in zip(masks, params)):
            raise ValueError("estimate_llc needs one mask per model parameter, each of its parameter's shape")
        if not any(bool(m.any()) for m in masks):
            raise ValueError("estimate_llc: the masks select no weight to sample")
    if loss_fn is None:
        if task is None:
            raise ValueError("estimate_llc needs a task for the default (training) loss")

        def loss_fn(m: torch.nn.Module, batch: Tensor) -> Tensor:
            return target_loss(m, batch, task)
    n = len(tokens)
    gen = torch.Generator().manual_seed(settings.seed)
    if 0 < settings.init_examples < n:
        subset = tokens[torch.randperm(n, generator=gen)[: settings.init_examples]]
    else:
        subset = tokens
    was_training = model.training
    model.eval()
    n_steps = settings.num_burnin_steps + settings.num_draws
    traces = np.zeros((settings.num_chains, settings.num_draws))
    if reference is not None and (not paired or np.shape(reference) != traces.shape):
        raise ValueError("estimate_llc: reference losses need paired=True and one per chain and draw")
    refs = np.array(reference, dtype=float) if reference is not None else np.full(traces.shape, np.nan)
    init_loss = float("nan")  # paired: the mean of the checkpoint's minibatch losses, known at the end
    if not paired:
        with torch.no_grad():
            init_loss = float(sum(loss_fn(model, part).item() * len(part) for part in subset.split(2048)) / len(subset))
    start = time.perf_counter()
    frozen_change = 0.0
    for chain in range(settings.num_chains):
        release_graphs(model)
        sampler_model = copy.deepcopy(model)  # in eval mode: no dropout, the loss a function of the weights
        for p in sampler_model.parameters():
            p.requires_grad_(True)
        if masks is None:
            sampled, kwargs, held = sampler_model.parameters(), {}, []
        else:  # only the parameters holding a sampled weight get a gradient and go to the sampler
            pairs = [(p, m.to(p.device)) for p, m in zip(sampler_model.parameters(), masks)]
            for p, m in pairs:
                p.requires_grad_(bool(m.any()))
            moving = [(p, m) for p, m in pairs if m.any()]
            sampled = [p for p, _ in moving]
            kwargs = {"mask": [m for _, m in moving]} if restriction == "devinterp" else {}
            held = ([(p, ~m, p.detach()[~m].clone()) for p, m in moving if not m.all()]
                    if restriction == "restore" else [])
        batch_gen = torch.Generator().manual_seed(settings.seed + chain)
        batches = torch.randint(0, n, (n_steps, settings.batch_size), generator=batch_gen)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed + chain)
            optimizer = sgld(sampled, lr=settings.lr, localization=settings.localization,
                             nbeta=settings.nbeta, **kwargs)
            for t in range(n_steps):
                loss = loss_fn(sampler_model, tokens[batches[t]])
                if not torch.isfinite(loss):
                    raise RunError(f"SGLD chain {chain} diverged at step {t} (loss {loss.item()}); "
                                   f"lower the step size (lr {settings.lr}) or raise the localisation")
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if held:
                    with torch.no_grad():
                        for p, frozen, value in held:
                            p[frozen] = value
                if t >= settings.num_burnin_steps:
                    traces[chain, t - settings.num_burnin_steps] = loss.item()
                    if paired and np.isnan(refs[chain, t - settings.num_burnin_steps]):
                        with torch.no_grad():
                            refs[chain, t - settings.num_burnin_steps] = loss_fn(model, tokens[batches[t]]).item()
        if masks is not None:
            with torch.no_grad():
                for p, p0, m in zip(sampler_model.parameters(), model.parameters(), masks):
                    if not m.all():
                        frozen_change = max(frozen_change, float((p - p0)[~m.to(p.device)].abs().max()))
        del sampler_model, optimizer
    release_graphs(model)
    model.train(was_training)
    return {
        **summarise_draws(traces, refs if paired else None, init_loss, settings),
        "seconds": time.perf_counter() - start,
        **({} if masks is None else {"n_sampled": int(sum(int(m.sum()) for m in masks)),
                                     "frozen_max_change": frozen_change}),
    }


def summarise_draws(traces: Float[np.ndarray, "chains draws"], refs: Float[np.ndarray, "chains draws"] | None,
                    init_loss: float, settings: LLCSettings) -> dict[str, Any]:
    """:func:`estimate_llc`'s estimate from its chains' minibatch losses (``refs``: the checkpoint's losses on
    the same minibatches, for a paired estimate; ``init_loss`` is then their mean)."""
    if refs is not None:
        init_loss = float(refs.mean())
        per_chain = settings.nbeta * (traces - refs).mean(axis=1)
        drifts = drift(traces - refs)
    else:
        per_chain = settings.nbeta * (traces.mean(axis=1) - init_loss)
        drifts = drift(traces)
    return {
        "llc": float(per_chain.mean()),
        "llc_std": float(per_chain.std()),
        "llc_per_chain": per_chain.tolist(),
        "init_loss": init_loss,
        "mean_loss": float(traces.mean()),
        "drift": drifts.tolist(),
        "stationary": bool(np.all(np.abs(drifts) <= settings.max_drift)),
        "trace": traces.tolist(),
        **({"reference": refs.tolist()} if refs is not None else {}),
    }


def first_draws(record: dict[str, Any], settings: LLCSettings, num_draws: int) -> dict[str, Any]:
    """The estimate with ``num_draws`` draws, read from the first draws of ``record`` (an :func:`estimate_llc`
    record with ``settings`` and its ``trace``): each chain's seed fixes its minibatches and its noise step by
    step, so a chain of fewer draws is the start of a longer one, and its estimate is the one this
    returns. ``seconds`` is 0.0 (no sampling of its own) and ``first_draws_of`` the chain's length."""
    if not 0 < num_draws <= settings.num_draws:
        raise ValueError(f"first_draws: {num_draws} draws of a chain of {settings.num_draws}")
    traces = np.asarray(record["trace"], dtype=float)[:, :num_draws]
    refs = np.asarray(record["reference"], dtype=float)[:, :num_draws] if "reference" in record else None
    kept = {k: record[k] for k in ("n_sampled", "frozen_max_change") if k in record}
    return {**summarise_draws(traces, refs, record["init_loss"], settings.with_draws(num_draws)),
            "seconds": 0.0, "first_draws_of": settings.num_draws, **kept}


# ---- the cache and the series -------------------------------------------------------------


def llc_path(run_dir: str | Path) -> Path:
    """The run's LLC cache file."""
    return analysis_dir(run_dir) / LLC_FILE


def load_llc(run_dir: str | Path, settings: LLCSettings | None = None) -> list[dict[str, Any]]:
    """Cached LLC records of a run made with ``settings`` and the run's task (all records when None), sorted by step."""
    if settings is not None:
        return load_records(llc_path(run_dir), with_task(run_dir, settings.to_dict()))
    path = llc_path(run_dir)
    return sorted(read_jsonl(path), key=lambda r: (r["step"], r["settings"]["num_draws"])) if path.exists() else []


def llc_at(run: Run, steps: list[int], settings: LLCSettings, device: str = "cpu",
           progress: bool = True) -> list[dict[str, Any]]:
    """The LLC record of each step (from the cache when its settings match, else computed and cached)."""
    settings.validate()
    require_devinterp()
    task = run.task()
    return cached_series(run, llc_path(run.path), settings.to_dict(), steps,
                         lambda step, model: estimate_llc(model, task.tokens.to(device), task, settings), "LLC",
                         device, progress)


def calibrate(run: Run, step: int, settings: LLCSettings, device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """The stability check at ``step``: the LLC with ``num_draws`` and with twice as many draws."""
    base, doubled = (llc_at(run, [step], s, device, progress)[0]
                     for s in (settings, settings.with_draws(2 * settings.num_draws)))
    rel = abs(doubled["llc"] - base["llc"]) / max(abs(doubled["llc"]), 1e-12)
    return {"step": step, "num_draws": settings.num_draws, "llc": base["llc"], "llc_doubled": doubled["llc"],
            "rel_change": rel, "stable": rel <= settings.max_rel_change,
            "stationary_doubled": doubled["stationary"], "drift_doubled": doubled["drift"]}


def half_change_step(steps: list[int], values: list[float], start_step: int = 0) -> int | None:
    """First step >= start_step where ``values`` has covered half its change from there to the end (either sign)."""
    pairs = [(s, v) for s, v in zip(steps, values) if s >= start_step]
    if len(pairs) < 2 or pairs[-1][1] == pairs[0][1]:
        return None
    v0, v1 = pairs[0][1], pairs[-1][1]
    for s, v in pairs:
        if (v - v0) / (v1 - v0) >= 0.5:
            return s
    return None


def nearest(steps: list[int], values: list[float], target: float | int | None) -> dict[str, Any] | None:
    """The (step, value) of the analysed step nearest ``target``."""
    if target is None or not steps:
        return None
    i = int(np.abs(np.asarray(steps) - target).argmin())
    return {"step": steps[i], "llc": values[i]}


def data_of(run: Run) -> str:
    """What the LLC's loss is taken on: the training set, or an imported run's probe sequences."""
    task = run.task()
    where = "probe sequences (an imported series has no training data)" if is_imported(run.path) else "training sequences"
    return f"{len(task.tokens)} {where}: {task.describe()}"


def llc_series(run_dir: str | Path, steps: list[int] | None = None, every: int = 1,
               settings: LLCSettings = LLCSettings(), calib_step: int | None = None, calibrate_check: bool = True,
               device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """The LLC over the chosen checkpoints, with the calibration and the landmarks; written to ``llc.json``.

    ``calib_step`` (default: the last chosen step) is where the draws are doubled. t_form comes
    from ``routing.json`` (``plateauscope analyze``) when it exists; tau from ``metrics.jsonl``.
    """
    settings.validate()
    require_devinterp()
    run = Run(run_dir)  # an imported run samples on its probe's sequences (data_of)
    chosen = pick_steps(run.steps, every, steps)
    if not chosen:
        raise RunError(f"{run.path}: the run has no checkpoints")
    start = time.perf_counter()
    records = llc_at(run, chosen, settings, device, progress)
    calibration = None
    if calibrate_check:
        c_step = chosen[-1] if calib_step is None else calib_step
        run.checkpoint_path(c_step)
        calibration = calibrate(run, c_step, settings, device, progress)
    tau = compute_tau(run.metrics(), run.progress)
    routing = read_routing_summary(run.path) or {}
    t_form = routing.get("t_form")
    plateau_start = (run.plateau_stretch() or [chosen[0]])[0]
    llc = [r["llc"] for r in records]
    drifts = [d for r in records for d in r["drift"]]
    result = {
        "settings": settings.to_dict(),
        "data": data_of(run),
        "steps": chosen,
        "llc": llc,
        "llc_std": [r["llc_std"] for r in records],
        "init_loss": [r["init_loss"] for r in records],
        "stationary": [r["stationary"] for r in records],
        "all_stationary": all(r["stationary"] for r in records),
        "max_abs_drift": float(np.max(np.abs(drifts))),
        "calibration": calibration,
        "tau": tau,
        "t_form": t_form,
        "routing_head": routing.get("label"),
        "plateau_start": plateau_start,
        "llc_half_change_step": half_change_step(chosen, llc, plateau_start),
        "at": {name: nearest(chosen, llc, x) for name, x in
               (("plateau_start", plateau_start), ("t_form", t_form), ("tau_half", tau / 2 if tau else None),
                ("tau", tau), ("end", chosen[-1]))},
        "seconds": time.perf_counter() - start,
    }
    write_json_result(analysis_dir(run.path) / LLC_SUMMARY_FILE, result)
    return result
