"""Per-head LLC: the local learning coefficient restricted to one attention head's weights (Wang et al. 2024).

Method: the refined, weight-restricted LLC of "Differentiation and specialization of attention heads
via the refined local learning coefficient" (Wang et al. 2024). At a checkpoint w*, SGLD
(:func:`plateauscope.analysis.llc.estimate_llc`: the same sampler, settings and estimator as the
whole-model LLC) moves only the weights of one head, every other weight held at w*::

    LLC(head) = nbeta (E_chain[L(w)] - L(w*)),   w = w* outside the head's weights

A head's weights (:data:`PARTS`) are its slices, along the head dimension, of ``W_Q``, ``b_Q``, ``W_K``,
``b_K`` (where it looks: ``plateauscope.runs.interventions.HEAD_WEIGHTS['qk']``) and ``W_V``,
``b_V``, ``W_O`` (what it carries: ``HEAD_WEIGHTS['ov']``), found through the backend's views of the
parameters in HookedTransformer's layout (``plateauscope.model.backend.hooked_parameters``), so the same
slices are restricted on both backends; on an imported series, the head's rows and columns of the projection
modules its forward runs (``plateauscope.model.families.head_weights``; under grouped keys, the key/value head
the head shares with its group), with the model's own forward and no frozen prefix. ``b_O`` is shared by the layer's heads and stays fixed. The
restriction is a boolean mask per parameter, applied by devinterp's own ``mask`` (the default), or by
ours (``restriction="restore"``: every weight outside the mask copied back after each step); the two
give the same chains, number for number, and each record stores ``frozen_max_change``, the largest
change of a weight outside the head at the end of a chain (0.0: held exactly).

``L`` is the training objective (``Task.loss``) computed by the training step's own forward
(``fused``: ``plateauscope.training.train.fused_loss``, with a run's interventions; the model's hooked
forward where the fused one does not apply: :func:`training_loss`). The estimate is *paired*: each
draw's minibatch loss minus the checkpoint's loss on the same minibatch, ``nbeta mean_t (L_Bt(w_t) -
L_Bt(w*))``. Its expectation is the LLC above (each minibatch is drawn independently of the weights it
is evaluated at); what it drops is the spread of the loss from one minibatch to the next, which the
two terms share, and which otherwise swamps a single head's small LLC. The checkpoint's minibatch
losses depend on the checkpoint and the settings only, so they are computed once per checkpoint and
shared by its heads.

Metric and sign: as for the whole-model LLC, a positive effective number of parameters of the head
(``d/2`` for a head whose loss is locally quadratic and regular in its ``d`` weights; 0 for a head
whose weights do not change the loss); larger = the loss depends on the head in more, less
degenerate directions. Values are comparable across heads and checkpoints of one run only under the
same settings (stored with every record). The per-head LLCs do not add up to the whole model's.

Calibration (in the summary): stationarity per (step, head) as in :mod:`plateauscope.analysis.llc`
(|drift| of each chain's paired differences at most ``max_drift``); stability: at the calibration
steps every head's estimate is repeated with twice the draws, and its change, relative to the
doubled estimate or to :data:`STABILITY_FLOOR` where that is smaller, is compared with
``max_rel_change``.

Clustering (:func:`cluster_heads`): the heads' LLC curves over the analysed steps, each divided by its
own mean (so a head is placed by how its LLC changes relative to its level, not by its level),
grouped by hierarchical clustering (scipy, average linkage, Euclidean distance); the number of
clusters is where the merge heights jump most. The summary says whether the heads that the other
analyses single out (the routing head of ``routing.json``; the top heads of the attention cache's
``cue`` and named rules, e.g. induction's ``previous token``) fall in clusters of their own.

Results are cached in ``RUN/analysis/head_llc.jsonl`` (one record per (step, head, settings)); the
summary goes to ``RUN/analysis/head_llc.json``.

    plateauscope llc --run checkpoints/demo --per-head --every 16
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from plateauscope.analysis.llc import (
    LLCSettings,
    estimate_llc,
    first_draws,
    require_devinterp,
    target_loss,
)
from plateauscope.analysis.results import (
    ATTENTION_FILE,
    HEAD_LLC_FILE,
    HEAD_LLC_SUMMARY_FILE,
    analysis_dir,
    append_records,
    load_records,
    pick_steps,
    read_routing_summary,
    strict_json,
    task_changed,
    with_task,
    write_json_result,
    writes_cache,
)
from plateauscope.analysis.summary import stated_routing
from plateauscope.model.backend import Model, hooked_parameters, is_causal_lm
from plateauscope.model.families import head_weights
from plateauscope.model.fused import fused_logits, unsupported_reason
from plateauscope.model.heads import head_label, parse_head_label
from plateauscope.model.loss import fused_loss
from plateauscope.processes import available_cores, spawn_pool
from plateauscope.runs.interventions import HEAD_WEIGHTS, Interventions, has_interventions
from plateauscope.runs.metrics import compute_tau
from plateauscope.runs.run import Run, RunError
from plateauscope.tasks.base import Task

HEAD_LLC_SETTINGS = LLCSettings(num_chains=1, num_draws=300, num_burnin_steps=10, batch_size=16, lr=1e-3,
                                localization=300.0, nbeta=100.0)
"""The per-head defaults, chosen on the demo run (``plateauscope train --preset demo``) for estimates stable
under doubled draws (:func:`calibrate_heads`) at every checkpoint, the plateau's middle included, where
every head's LLC is below 1 and fewer draws (150, 250) move a head by more than the 10% bound: the same
nbeta and the same ``lr x localization`` (the relaxation of the localised directions, and the step
size's bias on them) as the whole-model defaults, with a third of the localisation, so that a head's
LLC is less the trace of its Hessian over gamma and its minibatch noise smaller against it; one chain,
each draw's loss paired with the checkpoint's (the numbers are in the bench JSON, ``bench/llc.py``)."""

PARTS: dict[str, tuple[str, ...]] = {"head": HEAD_WEIGHTS["qk"] + HEAD_WEIGHTS["ov"], **HEAD_WEIGHTS}
"""Which of a head's weights are sampled: ``head`` (all: Q, K, V, O and the head's b_Q, b_K, b_V), ``qk``
(where it looks) or ``ov`` (what it carries). Each is indexed by the head in its first dimension."""

STABILITY_FLOOR = 1.0
"""In the stability check, a head's change is taken relative to at least this LLC (one effective parameter,
two regular weights' worth), so a head whose LLC is near 0 is held to an absolute bound instead
(``max_rel_change`` x this), where a relative change says nothing."""

FORWARDS: tuple[str, ...] = ("fused", "hooked")
"""The forward passes the per-head loss can run (:func:`training_loss`)."""


# ---- heads and their weights --------------------------------------------------------------




def head_weight_names(layer: int, part: str | tuple[str, ...] = "head") -> tuple[str, ...]:
    """The HookedTransformer names of the weights ``part`` samples in ``layer``: a name of :data:`PARTS`, or
    a tuple of the per-head weights themselves (e.g. ``("W_O",)``)."""
    if isinstance(part, tuple):
        unknown = sorted(set(part) - set(PARTS["head"]))
        if unknown or not part:
            raise ValueError(f"a head's weights are {', '.join(PARTS['head'])}; got {', '.join(unknown) or 'none'}")
        return tuple(f"blocks.{layer}.attn.{w}" for w in part)
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    return tuple(f"blocks.{layer}.attn.{w}" for w in PARTS[part])


@torch.no_grad()
def head_masks(model: Model, layer: int, head: int, part: str | tuple[str, ...] = "head") -> list[Bool[Tensor, "..."]]:
    """One boolean mask per ``model.parameters()`` (in that order): True on head ``head`` of ``layer``'s
    weights of ``part`` (:func:`head_weight_names`), found through the backend's HookedTransformer-layout views of the parameters
    (``plateauscope.model.backend.hooked_parameters``; on the bridge they are views of fused tensors)."""
    names = head_weight_names(layer, part)
    if is_causal_lm(model):  # another trainer's layout: the head's rows and columns of the modules the forward runs
        masks = {id(p): torch.zeros_like(p, dtype=torch.bool) for p in model.parameters()}
        for tensor, index in head_weights(model, layer, head, tuple(n.rsplit(".", 1)[1] for n in names)):
            masks[id(tensor)][index] = True
        return [masks[id(p)] for p in model.parameters()]
    probe = copy.deepcopy(model)
    for p in probe.parameters():
        p.zero_()
    views = hooked_parameters(probe)
    missing = [n for n in names if n not in views]
    if missing:
        raise RunError(f"the model has no {', '.join(missing)}")
    expected = 0
    for name in names:
        views[name][head].fill_(1.0)
        expected += views[name][head].numel()
    masks = [p != 0 for p in probe.parameters()]
    if sum(int(m.sum()) for m in masks) != expected:  # a view that was a copy would leave weights out
        raise RunError(f"head {head_label(layer, head)}: the backend's weights are not views of its parameters")
    return masks


class FrozenPrefix:
    """The residual stream into each block at the checkpoint, per example of the task's data set, computed on
    first use and kept: while SGLD moves one head's weights, every block below the head's holds its
    weights, so the stream into the head's block depends on the example alone, and the chain's forward
    can start there (``fused_logits``'s ``start``). Its floats differ from the whole forward's by the
    rounding of a different batch (about 1e-7)."""

    def __init__(self, model: Model, task: Task):
        self.params = hooked_parameters(model)
        self.cfg = model.cfg
        self.inputs = task.tokens[:, : task.input_len].to(self.params["embed.W_E"].device)
        self.streams: dict[int, Tensor] = {}
        self.known: dict[int, Tensor] = {}

    @torch.no_grad()
    def into(self, layer: int, examples: Int[Tensor, " batch"]) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream into block ``layer`` of ``examples`` (indices into the data set)."""
        if layer not in self.streams:
            n, pos = self.inputs.shape
            w_e = self.params["embed.W_E"]
            self.streams[layer] = torch.empty(n, pos, self.cfg.d_model, dtype=w_e.dtype, device=w_e.device)
            self.known[layer] = torch.zeros(n, dtype=torch.bool, device=w_e.device)
        missing = examples[~self.known[layer][examples]].unique()
        if len(missing):
            # from the deepest block below whose stream is known for them all (the heads go layer by layer)
            below = [j for j in self.streams if j < layer and bool(self.known[j][missing].all())]
            start = (max(below), self.streams[max(below)][missing]) if below else None
            self.streams[layer][missing] = fused_logits(self.cfg, self.params, self.inputs[missing], start=start,
                                                        stop_at=layer)
            self.known[layer][missing] = True
        return self.streams[layer][examples]


def training_loss(model: Model, task: Task, forward: str = "fused", interventions: dict[str, Any] | None = None,
                  prefix: tuple[int, FrozenPrefix] | None = None) -> tuple[Any, str]:
    """The training loss as ``loss_fn(model, examples)`` (indices into the task's data set) for
    :func:`plateauscope.analysis.llc.estimate_llc`, and the forward it runs: ``fused``, the training step's own
    (``plateauscope.training.train.fused_loss`` over the backend's views of the parameters, trimmed to the loss
    positions where the task's loss is the default one; ``interventions``: its keyword arguments for a run
    trained with interventions), where the model allows it; else ``hooked``, the model's own forward
    (``target_loss``, with its permanent hooks). The same function; the fused kernels round differently
    (about 1e-6 in the logits). ``prefix`` = (layer, :class:`FrozenPrefix`): the fused forward starts at
    that block, from the checkpoint's stream into it (only where every weight below it is held and no
    intervention acts)."""
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    tokens = task.tokens.to(next(model.parameters()).device)
    if forward == "hooked" or unsupported_reason(model.cfg) is not None or is_causal_lm(model):
        return (lambda m, examples: target_loss(m, tokens[examples], task)), "hooked"
    trimmed = type(task).loss is Task.loss
    options = interventions or {}
    if prefix is not None and (options or prefix[0] == 0):
        prefix = None

    def loss(m: Model, examples: Int[Tensor, " batch"]) -> Tensor:
        start = None if prefix is None else (prefix[0], prefix[1].into(prefix[0], examples))
        return fused_loss(m.cfg, hooked_parameters(m), tokens[examples], task, trimmed, start=start, **options)

    return loss, "fused"


def estimate_head_llc(model: Model, task: Task, layer: int, head: int, settings: LLCSettings = HEAD_LLC_SETTINGS,
                      part: str | tuple[str, ...] = "head", restriction: str = "devinterp", paired: bool = True,
                      reference: Float[np.ndarray, "chains draws"] | None = None, forward: str = "fused",
                      interventions: dict[str, Any] | None = None, device: str = "cpu",
                      keep_trace: bool = False, prefix: FrozenPrefix | None = None) -> dict[str, Any]:
    """The LLC of ``model`` restricted to one head's weights (:func:`head_masks`), on the task's data set
    and training loss (:func:`training_loss`): :func:`plateauscope.analysis.llc.estimate_llc`'s record
    without its trace (``keep_trace``: with it), with the ``forward`` it ran (``paired``: each draw's loss minus
    the checkpoint's on the same minibatch; ``reference``: those checkpoint losses from another head's
    estimate at the same checkpoint and settings; ``prefix``: the checkpoint's streams, shared by its heads,
    from which the chain's forward starts at the head's block)."""
    loss_fn, ran = training_loss(model, task, forward, interventions, None if prefix is None else (layer, prefix))
    rec = estimate_llc(model, torch.arange(len(task.tokens), device=device), task, settings, loss_fn=loss_fn,
                       masks=head_masks(model, layer, head, part), restriction=restriction, paired=paired,
                       reference=reference)
    if not keep_trace:
        rec.pop("trace")
    return {**rec, "forward": ran}


# ---- the cache and the series -------------------------------------------------------------


def head_llc_path(run_dir: str | Path) -> Path:
    """The run's per-head LLC cache file."""
    return analysis_dir(run_dir) / HEAD_LLC_FILE


def _key(settings: LLCSettings, label: str, part: str, paired: bool, forward: str) -> dict[str, Any]:
    """The settings one head's records are stored under (without the task)."""
    return {**settings.to_dict(), "head": label, "part": part, "paired": paired, "forward": forward}


def all_heads(run: Run) -> list[tuple[int, int]]:
    """Every (layer, head) of the run's model, layer by layer."""
    mc = run.config.model
    return [(layer, h) for layer in range(mc.n_layers) for h in range(mc.n_heads)]


def resolve_heads(run: Run, heads: list[str] | list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """``heads`` (labels such as ``L0H1`` or (layer, head) pairs; None: all) checked against the model."""
    if heads is None:
        return all_heads(run)
    mc = run.config.model
    out = [parse_head_label(h, mc.n_layers, mc.n_heads) if isinstance(h, str) else
           parse_head_label(f"{h[0]}.{h[1]}", mc.n_layers, mc.n_heads) for h in heads]
    if len(set(out)) != len(out):
        raise ValueError("a head is named twice")
    return sorted(out)


def load_head_llc(run_dir: str | Path, settings: LLCSettings, heads: list[tuple[int, int]],
                  part: str = "head", paired: bool = True, forward: str = "fused") -> dict[str, list[dict[str, Any]]]:
    """Cached records of ``settings``, per head label, each sorted by step."""
    return {head_label(*h): load_records(head_llc_path(run_dir),
                                         with_task(run_dir, _key(settings, head_label(*h), part, paired, forward)))
            for h in heads}


def _head_records(run: Run, step: int, heads: list[tuple[int, int]], settings: LLCSettings, part: str,
                  paired: bool, forward: str, device: str,
                  shorter: dict[tuple[int, int], list[int]] | None = None) -> Iterator[tuple[LLCSettings, dict[str, Any]]]:
    """The per-head LLC records of ``heads`` at ``step`` with their settings, one at a time, without their cache
    key: the checkpoint is loaded once, and the checkpoint's minibatch losses of a paired estimate are
    computed with the first head and shared by the others. ``shorter``: for a head, the fewer draws whose
    records are read from the first draws of its chain (:func:`plateauscope.analysis.llc.first_draws`)."""
    task, tc, mc = run.task(), run.config.train, run.config.model
    plan = Interventions.build(tc, task, mc.n_layers, mc.n_heads) if has_interventions(tc) else None
    model, reference = run.model(step, device), None
    prefix = None if is_causal_lm(model) else FrozenPrefix(model, task)  # the fused forward's; a bridge runs its own
    for h in heads:
        rec = estimate_head_llc(model, task, *h, settings=settings, part=part, paired=paired, reference=reference,
                                forward=forward, interventions=plan.fused_options(step) if plan else None,
                                device=device, keep_trace=True, prefix=prefix)
        head = {"step": step, "layer": h[0], "head": h[1], "label": head_label(*h)}
        for draws in (shorter or {}).get(h, []):
            short = first_draws(rec, settings, draws)
            short.pop("trace"), short.pop("reference", None)
            yield settings.with_draws(draws), {**head, **short, "forward": rec["forward"]}
        rec.pop("trace")
        reference = np.asarray(rec.pop("reference")) if paired else None
        yield settings, {**head, **rec}


def _head_records_in_worker(run_dir: str, step: int, heads: list[tuple[int, int]], settings: LLCSettings,
                            part: str, paired: bool, forward: str, device: str, threads: int,
                            shorter: dict[tuple[int, int], list[int]]) -> list[tuple[LLCSettings, dict[str, Any]]]:
    """:func:`_head_records` in a worker process with ``threads`` torch threads; the parent caches them."""
    torch.set_num_threads(threads)
    return list(_head_records(Run(run_dir), step, heads, settings, part, paired, forward, device, shorter))


def chain_prefixes(todo: list[tuple[LLCSettings, int, tuple[int, int]]]) -> tuple[
        list[tuple[LLCSettings, int, tuple[int, int]]], dict[tuple[LLCSettings, int, tuple[int, int]], list[int]]]:
    """The estimates of ``todo`` that need a chain of their own, and for each of them, the fewer draws read
    from its first draws: an estimate whose settings differ from another's at the same (step, head) in
    fewer draws alone (the doubled-draws check's base) is the start of the longest such chain."""
    longest: dict[tuple[LLCSettings, int, tuple[int, int]], LLCSettings] = {}
    for settings, step, h in todo:
        base = (settings.with_draws(1), step, h)
        if base not in longest or settings.num_draws > longest[base].num_draws:
            longest[base] = settings
    run, shorter = [], {}
    for settings, step, h in todo:
        top = longest[(settings.with_draws(1), step, h)]
        if top == settings:
            run.append((settings, step, h))
        else:
            shorter.setdefault((top, step, h), []).append(settings.num_draws)
    return run, shorter


Unit = tuple[LLCSettings, int, list[tuple[int, int]]]
"""A unit of per-head work: the settings, the step, the heads estimated there one after another."""


def work_units(todo: list[tuple[LLCSettings, int, tuple[int, int]]], workers: int) -> list[Unit]:
    """The (settings, step, head) estimates to run, as units of work for ``workers`` processes, largest first.

    A unit is one checkpoint under one settings (loaded, and its minibatch losses computed, once); where
    a settings has fewer than twice as many steps as there are workers (the doubled-draws check at one
    step), its steps' heads are split into equal runs, so that the workers finish together. Largest
    first (draws x heads), so the small ones fill in at the end."""
    groups: dict[LLCSettings, dict[int, list[tuple[int, int]]]] = {}
    for settings, step, h in todo:
        groups.setdefault(settings, {}).setdefault(step, []).append(h)
    units: list[Unit] = []
    for settings, by_step in groups.items():
        split = 1 if workers <= 1 else -(-2 * workers // len(by_step))
        for step, hs in by_step.items():
            parts = min(split, len(hs))
            units += [(settings, step, hs[i * len(hs) // parts:(i + 1) * len(hs) // parts]) for i in range(parts)]
    return sorted(units, key=lambda u: -(u[0].num_draws + u[0].num_burnin_steps) * u[0].num_chains * len(u[2]))


@writes_cache
def head_llc_records(run: Run, requests: list[tuple[LLCSettings, list[int]]], heads: list[tuple[int, int]],
                     part: str = "head", paired: bool = True, forward: str = "fused", device: str = "cpu",
                     progress: bool = True, workers: int = 1) -> list[list[list[dict[str, Any]]]]:
    """For each request (settings, steps), the per-head LLC record of each (step, head), ``[request][step][head]``:
    from the cache when one with these settings (and the run's task) exists, else computed
    (:func:`_head_records`) and cached.

    ``workers`` > 1 spreads the work of all the requests together (:func:`work_units`) over as many
    spawned processes, each with an equal share of the cores' torch threads; the records are the same
    (each chain's seed is the settings' own; the floats as far as the thread count leaves them). A request
    that differs from another at the same (step, head) in fewer draws alone (the doubled-draws check's
    base) is read from the start of the longer chain (:func:`chain_prefixes`), not sampled again. The
    parent alone writes the cache, a unit's records as it finishes: a killed series keeps every
    finished unit. A script that asks for workers needs ``if __name__ == "__main__":`` around it: each
    spawned process imports the script's main module (``plateauscope llc`` and notebooks need nothing)."""
    require_devinterp()
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    path = head_llc_path(run.path)
    keys: dict[tuple[LLCSettings, tuple[int, int]], dict[str, Any]] = {}
    have: dict[tuple[LLCSettings, tuple[int, int]], dict[int, dict[str, Any]]] = {}
    for settings, _ in requests:
        settings.validate()
        for h in heads:
            key = keys[(settings, h)] = with_task(run.path, _key(settings, head_label(*h), part, paired, forward))
            if task_changed(path, key):
                raise RunError(f"{run.path}: the task changed since {path.name} was written; move it away to recompute")
            have[(settings, h)] = {r["step"]: r for r in load_records(path, key)}
    todo = list(dict.fromkeys((settings, step, h) for settings, steps in requests for step in steps for h in heads
                              if step not in have[(settings, h)]))
    chains, shorter = chain_prefixes(todo)
    units = work_units(chains, workers)
    workers = min(workers, len(units))

    def keep(records: list[tuple[LLCSettings, dict[str, Any]]]) -> None:
        records = [(settings, {**r, "settings": keys[(settings, (r["layer"], r["head"]))]}) for settings, r in records]
        append_records(path, [r for _, r in records])
        for settings, r in records:
            have[(settings, (r["layer"], r["head"]))][r["step"]] = strict_json(r)
        bar.update(len(records))

    def prefixes(settings: LLCSettings, step: int, hs: list[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
        return {h: shorter[(settings, step, h)] for h in hs if (settings, step, h) in shorter}

    with tqdm(total=len(todo), desc=f"per-head LLC {run.path.name}", disable=not progress or not todo,
              dynamic_ncols=True) as bar:
        if workers <= 1:
            for settings, step, hs in units:
                for record in _head_records(run, step, hs, settings, part, paired, forward, device,
                                            prefixes(settings, step, hs)):
                    keep([record])
        else:
            threads = max(1, available_cores() // workers)
            with spawn_pool(workers) as pool:
                futures = [pool.submit(_head_records_in_worker, str(run.path), step, hs, settings, part, paired,
                                       forward, device, threads, prefixes(settings, step, hs))
                           for settings, step, hs in units]
                for future in cf.as_completed(futures):
                    keep(future.result())
    return [[[have[(settings, h)][s] for h in heads] for s in steps] for settings, steps in requests]


def stability(step: int, settings: LLCSettings, base: list[dict[str, Any]],
              doubled: list[dict[str, Any]]) -> dict[str, Any]:
    """The doubled-draws check at ``step`` from every head's record with ``settings`` (``base``) and with twice
    the draws (``doubled``).

    A head's change is ``|LLC(2 draws) - LLC(draws)| / max(|LLC(2 draws)|, STABILITY_FLOOR)``: relative for
    a head that counts at least one effective parameter, absolute (in units of one) below that, where a
    relative change of a value near 0 says nothing. ``rel_change`` is the plain relative change."""
    diff = [abs(d["llc"] - b["llc"]) for b, d in zip(base, doubled)]
    change = [x / max(abs(d["llc"]), STABILITY_FLOOR) for x, d in zip(diff, doubled)]
    return {"step": step, "num_draws": settings.num_draws, "llc": [b["llc"] for b in base],
            "llc_doubled": [d["llc"] for d in doubled], "abs_change": diff,
            "rel_change": [x / max(abs(d["llc"]), 1e-12) for x, d in zip(diff, doubled)],
            "change": change, "max_change": max(change), "stable": max(change) <= settings.max_rel_change,
            "stationary_doubled": [d["stationary"] for d in doubled]}


def calibrate_heads(run: Run, step: int, settings: LLCSettings, heads: list[tuple[int, int]], part: str = "head",
                    paired: bool = True, forward: str = "fused", device: str = "cpu",
                    progress: bool = True, workers: int = 1) -> dict[str, Any]:
    """The stability check (:func:`stability`) at ``step``: every head's LLC with ``num_draws`` and with twice
    as many."""
    doubled_settings = settings.with_draws(2 * settings.num_draws)
    (base,), (doubled,) = head_llc_records(run, [(settings, [step]), (doubled_settings, [step])], heads, part, paired,
                                           forward, device, progress, workers)
    return stability(step, settings, base, doubled)


def marked_heads(run_dir: str | Path) -> dict[str, str]:
    """The heads other analyses single out (``plateauscope analyze``): ``routing`` (``routing.json``'s named
    head; where it names no single head, each head of the routing group as ``routing group LxHy``) and the top
    head at the last analysed step of the attention cache by the cue (``to_z_all_targets``) and by each of
    the task's named rules (e.g. ``previous token``). Empty without an analysis."""
    out: dict[str, str] = {}
    stated = stated_routing(read_routing_summary(run_dir) or {})
    if stated is not None and not stated.is_group:
        out["routing"] = stated.labels[0]
    for label in stated.labels if stated is not None and stated.is_group else ():
        out[f"routing group {label}"] = label
    attention = load_records(analysis_dir(run_dir) / ATTENTION_FILE)
    if attention:
        last = attention[-1]
        fields = {"cue": last.get("to_z_all_targets"), **(last.get("rules") or {})}
        for name, grid in fields.items():
            if grid is not None:
                a = np.asarray(grid, dtype=float)
                layer, head = np.unravel_index(int(np.nanargmax(a)), a.shape)
                out[name] = head_label(int(layer), int(head))
    return out


# ---- clustering ---------------------------------------------------------------------------


def normalise_curves(llc_curves: Float[np.ndarray, "head step"], how: str = "mean") -> Float[np.ndarray, "head step"]:
    """Each head's curve divided by its mean over the steps (``mean``: its change relative to its own level),
    or centred and divided by its standard deviation (``zscore``: the shape alone; a flat curve becomes 0)."""
    c = np.asarray(llc_curves, dtype=float)
    if how == "mean":
        level = np.abs(c.mean(axis=1, keepdims=True))
        return c / np.where(level > 1e-12, level, 1.0)
    if how == "zscore":
        sd = c.std(axis=1, keepdims=True)
        return (c - c.mean(axis=1, keepdims=True)) / np.where(sd > 1e-12, sd, 1.0)
    raise ValueError(f"normalise must be mean or zscore, got {how!r}")


def cluster_heads(steps: list[int], llc_curves: Float[np.ndarray, "head step"], labels: list[str] | None = None,
                  marked: dict[str, str] | None = None, normalise: str = "mean", n_clusters: int | None = None,
                  max_clusters: int | None = None) -> dict[str, Any]:
    """Group heads by the shape of their per-head LLC curves.

    Each curve (one row of ``llc_curves``, over ``steps``) is normalised (:func:`normalise_curves`), the
    heads are clustered hierarchically (scipy ``linkage``, average linkage, Euclidean distance), and
    the tree is cut into ``n_clusters``, or, by default, where the merge heights jump most (the largest
    gap between consecutive heights, for 2 to ``max_clusters`` clusters; default half the heads).
    ``marked`` ({name: head label}, :func:`marked_heads`) are the heads to check: each one's cluster,
    and ``apart``: its cluster holds no head that is not marked. Clusters are numbered 0, 1, ... in
    the order of their first head.
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    c = np.asarray(llc_curves, dtype=float)
    n = c.shape[0]
    labels = labels or [f"head {i}" for i in range(n)]
    if len(labels) != n or c.ndim != 2 or c.shape[1] != len(steps):
        raise ValueError("cluster_heads needs one curve per head label, one value per step")
    marked = {k: v for k, v in (marked or {}).items() if v in labels}
    if n < 3 or len(steps) < 2:
        assign, k, heights = [0] * n, 1, []
    else:
        z = linkage(normalise_curves(c, normalise), method="average", metric="euclidean")
        heights = z[:, 2].tolist()
        hi = max(2, min(n - 1, max_clusters if max_clusters else n // 2))
        if n_clusters is None:
            # cutting between heights[i - 1] and heights[i] leaves n - i clusters
            gaps = {n - i: heights[i] - heights[i - 1] for i in range(1, n - 1) if 2 <= n - i <= hi}
            k = max(gaps, key=lambda kk: (gaps[kk], -kk))
        else:
            k = n_clusters
        raw = fcluster(z, t=k, criterion="maxclust").tolist()
        order = list(dict.fromkeys(raw))
        assign = [order.index(r) for r in raw]
        k = len(order)
    members = {i: [lab for lab, a in zip(labels, assign) if a == i] for i in range(k)}
    marked_set = set(marked.values())
    checks = {}
    for name, lab in marked.items():
        cl = assign[labels.index(lab)]
        checks[name] = {"head": lab, "cluster": cl, "cluster_members": members[cl],
                        "apart": all(m in marked_set for m in members[cl])}
    return {"method": f"hierarchical, average linkage, Euclidean, curves normalised by {normalise}",
            "normalise": normalise, "labels": labels, "cluster": assign, "n_clusters": k, "members": members,
            "merge_heights": heights, "marked": checks,
            "marked_apart": all(v["apart"] for v in checks.values()) if checks else None}


# ---- the series ---------------------------------------------------------------------------


def head_llc_series(run_dir: str | Path, steps: list[int] | None = None, every: int = 1,
                    settings: LLCSettings = HEAD_LLC_SETTINGS, heads: list[str] | list[tuple[int, int]] | None = None,
                    part: str = "head", calib_steps: list[int] | None = None, calibrate_check: bool = True,
                    paired: bool = True, forward: str = "fused", device: str = "cpu",
                    progress: bool = True, workers: int = 1) -> dict[str, Any]:
    """The per-head LLC at the chosen checkpoints, with the stability check at ``calib_steps`` (default: the
    last chosen step), stationarity and the clusters of the heads' curves; written to ``head_llc.json``.

    Everything the caller can get wrong (the run, the steps, the heads, the settings) is checked before
    the first estimate. ``workers``: processes (:func:`head_llc_records`).
    """
    settings.validate()
    require_devinterp()
    head_weight_names(0, part)
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    run = Run(run_dir)
    chosen = pick_steps(run.steps, every, steps)
    if not chosen:
        raise RunError(f"{run.path}: the run has no checkpoints")
    chosen_heads = resolve_heads(run, heads)
    calib = ([] if not calibrate_check else [chosen[-1]] if calib_steps is None else sorted(set(calib_steps)))
    for s in calib:
        run.checkpoint_path(s)
    start = time.perf_counter()
    # the series and the doubled draws at the calibration steps, in one pool of workers
    doubled = settings.with_draws(2 * settings.num_draws)
    records, base, twice = head_llc_records(run, [(settings, chosen), (settings, calib), (doubled, calib)],
                                            chosen_heads, part, paired, forward, device, progress, workers)
    calibration = [stability(s, settings, b, d) for s, b, d in zip(calib, base, twice)]
    labels = [head_label(*h) for h in chosen_heads]
    llc = [[r["llc"] for r in row] for row in records]
    drifts = [d for row in records for r in row for d in r["drift"]]
    marked = marked_heads(run.path)
    routing = read_routing_summary(run.path) or {}
    mc = run.config.model
    result = {
        "settings": settings.to_dict(),
        "part": part,
        "paired": paired,
        "forward": sorted({r["forward"] for row in records for r in row}),
        "weights": list(PARTS[part]),
        "n_layers": mc.n_layers,
        "n_heads": mc.n_heads,
        "steps": chosen,
        "heads": labels,
        "n_sampled": [r["n_sampled"] for r in records[0]],
        "llc": llc,
        "llc_std": [[r["llc_std"] for r in row] for row in records],
        "stationary": [[r["stationary"] for r in row] for row in records],
        "all_stationary": all(r["stationary"] for row in records for r in row),
        "max_abs_drift": float(np.max(np.abs(drifts))),
        "frozen_max_change": max(r["frozen_max_change"] for row in records for r in row),
        "calibration": calibration,
        "stable": all(c["stable"] for c in calibration) if calibration else None,
        "clusters": cluster_heads(chosen, np.asarray(llc, dtype=float).T, labels, marked),
        "marked": marked,
        "tau": compute_tau(run.metrics(), run.progress),
        "t_form": stated.t_form if (stated := stated_routing(routing)) is not None else None,
        "seconds": time.perf_counter() - start,
    }
    write_json_result(analysis_dir(run.path) / HEAD_LLC_SUMMARY_FILE, result)
    return result
