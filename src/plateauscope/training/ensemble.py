"""Seed ensembles: S seeds of one configuration trained in one process, with one optimiser.

Method. The members' parameters are stacked along a new leading dimension, one leaf tensor
per parameter (what ``torch.func.stack_module_state`` does, here from state dicts so that fresh
and resumed members stack alike). The forward follows the run's ``train.forward``:

* ``fused`` (the default) or ``trimmed``: :func:`plateauscope.model.fused.fused_logits` member by member, on its
  slices of the stacked tensors: the very kernels of a solo run, so a member is its solo run to the
  last bit.
* ``hooked``: one pass for all members, ``torch.vmap`` over ``torch.func.functional_call`` of one
  template HookedTransformer (the very module a solo run trains; TransformerLens 3 only).

The loss is the sum of the members' mean target cross-entropies: members share no parameter, so
member i's gradient is exactly the gradient of its own loss. AdamW steps the stacked tensors;
AdamW is elementwise, so each member's slice receives the update a solo run would make from the
same gradient (gradient clipping, when asked, uses each member's own norm).

Everything else is per member and is the solo run's, down to the code: the initialisation
(``model.seed``), and a :class:`plateauscope.training.train.RunState` per member, the very object a solo
run keeps: the minibatch order (a ``DataOrder``, seeded with ``train.seed``), the fixed evaluation set,
the task's ``evaluate`` (on a model of the installed backend holding the member's weights: evaluation is not
the hot path), tau, ``stop_after_tau`` (an ``EvaluationLog``), and every file of the run directory. The
loop below takes the solo loop's steps, in its order, through the same ``Schedule`` and ``take_step``.
A member run therefore has the solo layout and can be resumed, analysed or reported like any other run.

Agreement with solo runs (same torch thread count). ``fused``: identical (``tests/sweeps/test_sweep.py``).
``hooked``: vmap turns the solo matmuls into batched ones, whose float32 rounding may differ in the
last bits, and such differences can grow through training. Measured on one thread: identical
metrics on the ``tiny`` preset, at most 3e-6 apart after 200 steps of ``ci``.

Members that finish (``max_steps``, or ``stop_after_tau`` once their own tau is known) write
their summary and leave the stack, so a slow seed does not keep finished ones training. A
killed ensemble resumes from its members' resume points; members saved at different steps
(a kill between two members' checkpoints) are resumed as separate ensembles.

Speed: on a CPU an ensemble step costs about as much as the members' solo steps one after the
other (``bench/sweep.py`` measures the ratio): a vmapped pass's batched kernels and larger
tensors eat what one dispatch per op saves, and a stacked fused pass measured slower than the
members' fused passes in turn (``scaled_dot_product_attention`` has no vmap rule on a CPU). The
expected gain of one vectorised pass is on a GPU, where one small model leaves the device idle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.func import functional_call
from tqdm.auto import tqdm

from plateauscope.errors import ConfigError
from plateauscope.model.backend import (
    build_model,
    hooked_parameter_shapes,
    hooked_state_dict,
    initial_hooked_state,
    load_hooked_state_dict,
    resolve_backend,
)
from plateauscope.model.loss import fused_loss
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.files import load_resume_point, resume_state_file
from plateauscope.runs.interventions import has_interventions
from plateauscope.runs.machine import machine_record
from plateauscope.tasks.base import Task
from plateauscope.tasks.loading import build_task, canonical_task_name
from plateauscope.training.train import (
    NO_HOOKS,
    RunState,
    Schedule,
    TrainingHooks,
    adamw,
    check_forward,
    deterministic,
    evaluation_sets,
    finish,
    locks_runs,
    prepare_run_dir,
    resolve_device,
    take_step,
    training_tokens,
    with_stored_policy,
)

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One seed of the ensemble: its place in the caller's list, its config, and everything a solo run
    keeps per run (:class:`plateauscope.training.train.RunState`: run directory, data order, evaluation
    log, machines, wall clock)."""

    index: int
    """Position in the caller's list (results come back in that order)."""
    cfg: RunConfig
    run: RunState


def same_but_seed(cfgs: list[RunConfig]) -> None:
    """Members may differ in their seeds only (``model.seed``, ``train.seed``); else one line."""
    def strip(c: RunConfig) -> RunConfig:
        return dataclasses.replace(c, model=dataclasses.replace(c.model, seed=0),
                                   train=dataclasses.replace(c.train, seed=0))

    ref = strip(cfgs[0])
    for c in cfgs[1:]:
        if strip(c) != ref:
            raise ConfigError("an ensemble's members must differ in their seed only")


def member_optimizer_state(stacked: dict, i: int) -> dict:
    """Member ``i``'s slice of the stacked AdamW state, in the solo run's ``state_dict`` format."""
    state = {j: {k: (v[i].clone() if k != "step" else v.clone()) for k, v in s.items()}
             for j, s in stacked["state"].items()}
    return {"state": state, "param_groups": stacked["param_groups"]}


def stacked_optimizer_state(members: list[dict]) -> dict:
    """The inverse of :func:`member_optimizer_state`: the members' solo AdamW states, stacked.

    Every member has taken the same number of steps, so the step counters agree.
    """
    state = {j: {k: (torch.stack([m["state"][j][k] for m in members]) if k != "step" else v)
                 for k, v in s.items()}
             for j, s in members[0]["state"].items()}
    return {"state": state, "param_groups": members[0]["param_groups"]}


def stack_members(names: list[str], weights: list[dict[str, Tensor]], opt_states: list[dict] | None,
                  cfg: RunConfig) -> tuple[dict[str, Tensor], torch.optim.AdamW]:
    """Stacked leaf parameters ``{name: [S, ...]}`` (HookedTransformer's names and order) and their
    AdamW (with the members' states, if any)."""
    params = {n: torch.stack([w[n] for w in weights]).detach().clone().requires_grad_() for n in names}
    tc = cfg.train
    optimizer = adamw(list(params.values()), tc)
    if opt_states is not None:
        optimizer.load_state_dict(stacked_optimizer_state(opt_states))
    return params, optimizer


def ensemble_loss(template: torch.nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor],
                  batches: Int[Tensor, "S B seq"], task: Task, forward: str = "hooked") -> Float[Tensor, " S"]:
    """Each member's training loss (the task's) on its own minibatch. ``hooked``: one vectorised pass,
    ``torch.vmap`` over the template's own forward. ``fused`` (or ``trimmed``): :func:`plateauscope.training.train.fused_loss`
    member by member on its slices of the stacked parameters, the very kernels of a solo run, so a member's
    numbers are a solo run's to the last bit (one pass over the stack was slower on a CPU:
    ``scaled_dot_product_attention`` has no vmap rule there, and batched matmuls round differently)."""
    if forward != "hooked":
        return torch.stack([fused_loss(template.cfg, {n: p[j] for n, p in params.items()}, batch, task,
                                       forward == "trimmed") for j, batch in enumerate(batches)])

    def member_loss(p: dict[str, Tensor], batch: Tensor) -> Tensor:
        logits = functional_call(template, (p, buffers), (batch[:, : task.input_len],))
        return task.loss(logits, batch)

    return torch.vmap(member_loss)(params, batches)


def clip_member_grads(params: dict[str, Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` member by member: each member's global gradient norm, not the stack's."""
    grads = [p.grad for p in params.values() if p.grad is not None]
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()  # [S]
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


def resume_step(out: Path) -> int:
    """The step a member would resume from (0: a fresh start)."""
    path = resume_state_file(out)
    return int(rd.load_resume_state(path)["step"]) if path is not None else 0


@locks_runs
@deterministic
def train_ensemble(cfgs: list[RunConfig], out_dirs: list[str | Path], resume: bool = False, device: str = "auto",
                   progress: bool = True, stop_at_step: int | None = None,
                   hooks: TrainingHooks = NO_HOOKS) -> list[dict]:
    """Train S runs that differ only in their seed as one vectorised model; one summary per run.

    Each ``out_dirs[i]`` receives the run directory a solo ``train(cfgs[i], out_dirs[i])`` would
    write. ``resume`` continues killed members and skips complete ones; ``stop_at_step``
    abandons every member after that step, as a kill would (for tests); ``hooks`` are the solo
    loop's (:class:`plateauscope.training.train.TrainingHooks`).
    """
    if not cfgs or len(cfgs) != len(out_dirs):
        raise ConfigError(f"an ensemble needs one run directory per config, got {len(cfgs)} and {len(out_dirs)}")
    cfgs = [dataclasses.replace(c, task_name=canonical_task_name(c.task_name)).validate() for c in cfgs]
    cfgs = [with_stored_policy(c, Path(o), resume) for c, o in zip(cfgs, out_dirs)]
    same_but_seed(cfgs)
    if any(has_interventions(c.train) for c in cfgs):
        raise ConfigError("interventions (hide_cue_until, masked_heads, transplant, clamps, ablations) train solo runs, "
                          "not seed ensembles")
    outs = [Path(o) for o in out_dirs]
    if len(set(outs)) != len(outs):
        raise ConfigError("an ensemble's members need distinct run directories")
    if resume:  # members saved at different steps continue as separate ensembles, one per step
        steps = [resume_step(o) for o in outs]
        if len(set(steps)) > 1:
            log.warning("ensemble members resume from different steps %s: one ensemble per step", sorted(set(steps)))
            results: list[dict] = [{}] * len(cfgs)
            for s in sorted(set(steps)):
                idx = [i for i, si in enumerate(steps) if si == s]
                for i, r in zip(idx, train_ensemble([cfgs[i] for i in idx], [outs[i] for i in idx], True, device,
                                                    progress, stop_at_step, hooks)):
                    results[i] = r
            return results

    cfg, tc = cfgs[0], cfgs[0].train
    dev = resolve_device(device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    here = machine_record(dev)

    # --- The run directories, and each member's model, data order and evaluation set. -------
    task = build_task(cfg.task_name, cfg.task)  # the data set does not depend on the (model, train) seeds
    check_forward(cfg, task)
    if tc.forward == "hooked" and resolve_backend(None) != "hooked":
        raise ConfigError("forward=hooked trains a seed ensemble as one vmap over HookedTransformer, which "
                          "TransformerLens 4 removed: use the fused forward (the default) or solo runs")
    tokens = training_tokens(task).to(dev)
    results = [{}] * len(cfgs)
    members: list[Member] = []
    weights: list[dict[str, Tensor]] = []
    opt_states: list[dict] = []
    step = 0
    with contextlib.ExitStack() as open_runs:  # every member's metrics.jsonl is closed on the way out
        for i, (c, out) in enumerate(zip(cfgs, outs)):
            evalsets = evaluation_sets(task, tc, c.train.seed)
            hooked_cfg = prepare_run_dir(c, task, out, resume)
            point = load_resume_point(out, tc.max_steps) if resume else None
            if point is not None and point.complete:
                log.info("%s is already complete at step %d", out, point.step)
                results[i] = finish(out, point.records, task, point.step, evalsets[0], reuse=True)
                continue
            if point is None:
                weights.append({k: v.to(dev) for k, v in initial_hooked_state(hooked_cfg, c.model.seed).items()})
            else:
                step = point.step
                weights.append({k: v.to(dev) for k, v in point.weights.items()})
                opt_states.append(point.optimizer)
            members.append(Member(index=i, cfg=c, run=RunState.start(out, c.train, evalsets, task.progress,
                                                                     len(tokens), here, point,
                                                                     resolve_backend(None))))
            open_runs.callback(members[-1].run.close)
        if not members:
            return results

        # --- One template module; the members' parameters stacked on it; one AdamW. -------------
        # The parameters are kept in HookedTransformer's layout whatever the backend, so that the fused
        # forward reads them and a member's checkpoints are a solo run's.
        template = build_model(hooked_cfg, device=dev)  # its own weights are never used
        evaluator = build_model(hooked_cfg, device=dev)  # holds one member's weights at a time
        names = list(hooked_parameter_shapes(hooked_cfg))
        buffers = {n: b for n, b in hooked_state_dict(template).items() if n not in names}  # the same in every member
        # A member killed before its first checkpoint restarts at step 0 with no optimiser state; the
        # others are then at step 0 too (same resume step), where AdamW's state is still empty.
        params, optimizer = stack_members(names, weights, opt_states if len(opt_states) == len(weights) else None,
                                          cfg)
        del weights, opt_states

        def member_weights(j: int) -> dict[str, Tensor]:
            return {**{n: p[j].detach().clone() for n, p in params.items()}, **buffers}

        @contextlib.contextmanager
        def holding(j: int) -> Iterator[None]:  # the evaluator, with member j's weights
            load_hooked_state_dict(evaluator, member_weights(j))
            yield

        schedule = Schedule.of(tc)
        bar = open_runs.enter_context(tqdm(total=tc.max_steps, initial=step, disable=not progress,
                                           desc=f"ensemble of {len(members)}", dynamic_ncols=True))
        while True:
            # 1. Evaluate each member on its fixed evaluation set and log it, as a solo run would.
            if step in schedule.evaluate:
                for j, m in enumerate(members):
                    m.run.evaluate(evaluator, task, step, hooks, holding(j))
            # 2. Checkpoint each member (weights; at a resume point also its solo-format resume state).
            stacked_state = optimizer.state_dict()
            for j, m in enumerate(members):
                if schedule.checkpoints(step, m.run.evaluations.stop):
                    # the member's optimiser slice is copied only at a resume point
                    m.run.checkpoint(step, member_weights(j), member_optimizer_state(stacked_state, j)
                                     if schedule.resumes(step, m.run.evaluations.stop) else None)
            # 3. Finished members write their summary and leave the stack.
            done = [j for j, m in enumerate(members) if step >= tc.max_steps or m.run.evaluations.stop]
            for j in done:
                results[members[j].index] = members[j].run.finish(task, step)
            if done:
                keep = [j for j in range(len(members)) if j not in done]
                if not keep:
                    break
                params, optimizer = stack_members(names, [member_weights(j) for j in keep],
                                                  [member_optimizer_state(stacked_state, j) for j in keep], cfg)
                members = [members[j] for j in keep]
                bar.set_description(f"ensemble of {len(members)}")
            if step == stop_at_step:  # a kill right after this step's evaluation (no summary)
                return [{"stopped_at": step}] * len(cfgs)

            # 4. Each member's next minibatch: its own permutation, walked as a solo run walks it.
            batches = torch.stack([m.run.next_batch(tokens) for m in members])

            # 5-6. All members' losses (one vectorised pass, or the solo kernels member by member),
            # then the solo run's update step (their summed loss has each member's own gradient;
            # clipping is per member).
            step = take_step(lambda b: ensemble_loss(template, params, buffers, b, task, tc.forward), batches,
                             optimizer, tc, step, hooks, contextlib.nullcontext(),
                             clip=lambda max_norm: clip_member_grads(params, max_norm))
            bar.update(1)
    return results
