"""The training loop, as one function in step order, and ``plateauscope train``.

The loop's steps are built from pieces that the seed ensemble (``plateauscope.training.ensemble``)
builds its loop from too, so the two cannot drift apart: :class:`Schedule` (which steps evaluate,
checkpoint, write a resume state), :class:`RunState` (per run: its :class:`DataOrder`, its
:class:`EvaluationLog`, the machines and wall clock, and its checkpoints and resume states, written
through ``plateauscope.runs.files``) and :func:`take_step` (the update, with the hooks).

A run is fully determined by its RunConfig: same config and seed, same numbers, bit for bit,
on the same kind of CPU with the same thread count (float kernels differ between CPU types, and
between the two training forwards, ``train.forward``; such runs diverge within seed intervals).
A killed run resumes from its latest checkpoint with the exact optimiser state, data order
and RNG state, so the weights after N + M steps equal those of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from plateauscope.errors import ConfigError
from plateauscope.model.backend import (
    backend_optimizer_state,
    build_model,
    hooked_optimizer_state,
    hooked_parameter_names,
    hooked_parameters,
    hooked_state_dict,
    load_hooked_state_dict,
    resolve_backend,
)
from plateauscope.model.config import TrainConfig
from plateauscope.model.fused import unsupported_reason
from plateauscope.model.loss import fused_loss
from plateauscope.runs import run as rd
from plateauscope.runs.config import RunConfig
from plateauscope.runs.files import (
    TRAIN_LOCK_FILE,
    ResumePoint,
    disk_error,
    load_resume_point,
    resume_state_file,
    save_checkpoint_and_state,
    writer_lock,
)
from plateauscope.runs.interventions import (
    Interventions,
    in_part,
    load_donor,
    transplanted,
)
from plateauscope.runs.machine import describe, machine_record, same_machine
from plateauscope.runs.metrics import PLATEAU_STRETCH, compute_tau, summarize
from plateauscope.runs.references import ReferenceLadder, ladder_summary
from plateauscope.tasks.base import ProgressMeasure, Task, TaskError
from plateauscope.tasks.loading import (
    build_task,
    canonical_task_name,
    sha256_of,
    task_file_error,
    task_source_file,
)
from plateauscope.training.checkpoint_policy import CheckpointPolicy, transition_window
from plateauscope.training.schedule import resume_steps, scheduled_steps

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


def resolve_device(name: str) -> torch.device:
    """``auto`` (a GPU when present), ``cpu`` or ``cuda`` as a torch device; else a one-line ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def deterministic(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with torch's deterministic algorithms on (restored afterwards).

    Same seed, same numbers: with more than one thread, the embedding's backward otherwise adds
    its per-token gradients in a racy order, and the weights drift apart in the last bits.
    """
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        was_on, was_warn_only = torch.are_deterministic_algorithms_enabled(), \
            torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)

    return wrapper


@dataclass(frozen=True)
class TrainingHooks:
    """What the training loop calls besides its own steps (the benches time the loop with these).
    A hook observes; it must not change the model, the optimiser or the data order."""

    on_step: Callable[[int, Tensor], None] | None = None
    """After each update: the number of updates so far and the step's detached loss (one per member
    in a seed ensemble)."""
    on_evaluation: Callable[[dict, float], None] | None = None
    """After each evaluation: its ``metrics.jsonl`` record and the seconds the evaluation took (once
    per member in a seed ensemble)."""
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """A context entered around each step's forward and backward, e.g. ``torch.autocast``."""


NO_HOOKS = TrainingHooks()


def locks_runs(fn: Callable) -> Callable:
    """Train (``fn(cfg_or_cfgs, out_dir_or_dirs, ...)``) holding each run directory's training lock
    (``plateauscope.runs.files.writer_lock``): a second process that trains the same run waits
    for the first, saying so in one line, then resumes it or stops with one line."""
    @functools.wraps(fn)
    def locked(cfg: Any, out: Any, *args: Any, **kwargs: Any) -> Any:
        outs = [out] if isinstance(out, (str, os.PathLike)) else out
        with contextlib.ExitStack() as locks:
            for o in outs:
                locks.enter_context(writer_lock(Path(o) / TRAIN_LOCK_FILE, "the run"))
            return fn(cfg, out, *args, **kwargs)
    return locked


@locks_runs
@deterministic
def train(cfg: RunConfig, out_dir: str | Path, resume: bool = False, device: str = "auto",
          progress: bool = True, stop_at_step: int | None = None, backend: str | None = None,
          hooks: TrainingHooks = NO_HOOKS) -> dict:
    """Train one run into ``out_dir`` and return its summary (:func:`run_training`).

    An error raised inside a task file of one's own becomes one line naming the file, the function and
    the line (``plateauscope.tasks.loading.task_file_error``); a fresh run directory that fails before
    its first checkpoint is removed (:func:`remove_unstarted_run`)."""
    out = Path(out_dir)
    fresh = not (out / rd.CONFIG_FILE).exists()
    try:
        return run_training(cfg, out, resume, device, progress, stop_at_step, backend, hooks)
    except Exception as e:
        error = task_file_error(e, canonical_task_name(cfg.task_name))
        if fresh and isinstance(error or e, (ConfigError, rd.RunError)):
            remove_unstarted_run(out)
        if error is not None:
            raise error from None
        raise


def remove_unstarted_run(out: Path) -> None:
    """Remove what a fresh run wrote into ``out`` when it has no checkpoint yet (a run that failed at its
    first evaluation leaves nothing behind, so the next try is not told to ``--resume``)."""
    ckpts = out / rd.CHECKPOINT_DIR
    if ckpts.is_dir() and any(ckpts.iterdir()):
        return
    for name in (rd.CONFIG_FILE, rd.DATASET_FILE, rd.METRICS_FILE, rd.TASK_SOURCE_FILE, rd.SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    if ckpts.is_dir():
        shutil.rmtree(ckpts, ignore_errors=True)


def run_training(cfg: RunConfig, out_dir: str | Path, resume: bool = False, device: str = "auto",
              progress: bool = True, stop_at_step: int | None = None, backend: str | None = None,
              hooks: TrainingHooks = NO_HOOKS) -> dict:
    """Train one run into ``out_dir`` and return its summary.

    ``backend``: ``hooked`` (TransformerLens 3.x HookedTransformer) or ``bridge`` (4.x
    TransformerBridge); None: the installed one. Either starts from the same weights and writes the
    same run directory, with checkpoints and the resume state in HookedTransformer's layout, so a run
    resumes on either.

    ``stop_at_step`` abandons the run right after that step's evaluation, as a kill would
    (no checkpoint, no summary, unless they were due anyway): it exists to test resuming.
    """
    out = Path(out_dir)
    cfg = with_stored_policy(dataclasses.replace(cfg, task_name=canonical_task_name(cfg.task_name)), out, resume)
    cfg.validate()
    tc = cfg.train
    dev = resolve_device(device)
    backend = resolve_backend(backend)
    if tc.threads:
        torch.set_num_threads(tc.threads)

    # --- The run directory: a fresh one, or the one we resume. -----------------------------
    task = build_task(cfg.task_name, cfg.task)
    check_forward(cfg, task)
    evalsets = evaluation_sets(task, tc, tc.seed)
    # Interventions (plateauscope.runs.interventions) and a transplant's donor are checked before anything is written.
    interventions = Interventions.build(tc, task, cfg.model.n_layers, cfg.model.n_heads)
    model = build_model(task.hooked_config(cfg.model), backend=backend, seed=cfg.model.seed, device=dev)
    fresh = not (resume and resume_state_file(out) is not None)
    donor = load_donor(tc, hooked_state_dict(model)) if tc.transplant and fresh else None
    if fresh:  # every key evaluate() returns, checked on the step-0 model before anything is written
        check_evaluation(model, task, evalsets[0], tc, interventions.applied(model, 0))
    prepare_run_dir(cfg, task, out, resume)

    # --- Model and optimiser (the fixed evaluation sets are built above). --------------------
    if donor is not None:  # the run's own step-0 weights, with one part from the donor
        load_hooked_state_dict(model, transplanted(hooked_state_dict(model), donor, tc.transplant))
    if tc.freeze_transplant:  # no gradient, so AdamW neither steps nor decays them
        for name, param in zip(hooked_parameter_names(model), model.parameters()):
            param.requires_grad_(not in_part(name, tc.transplant))
    optimizer = adamw(model.parameters(), tc)
    tokens = training_tokens(task).to(dev)
    step = 0
    # The training step's loss: fused kernels over the model's own parameters (trimmed or not), or its
    # hooked forward. Interventions enter the fused kernels as masks, the hooked forward (and evaluation)
    # as hooks; ``step`` is read when the loss is computed.
    loss_of = (lambda b: task.loss(model(b[:, : task.input_len]), b)) if tc.forward == "hooked" else (
        lambda b: fused_loss(model.cfg, hooked_parameters(model), b, task, tc.forward == "trimmed",
                             **interventions.fused_options(step)))

    # --- Resume: weights, optimiser and RNG here; data order, metrics, machines and clock in RunState. --
    point = load_resume_point(out, tc.max_steps) if resume else None
    if point is not None:
        if point.optimizer_layout not in ("hooked", backend):  # a bridge's state from before they were portable
            raise ConfigError(f"{out / rd.RESUME_FILE}: its optimiser state follows the {point.optimizer_layout} "
                              f"backend's parameters; resume it with --backend {point.optimizer_layout}")
        if point.complete:
            log.info("%s is already complete at step %d", out, point.step)
            return finish(out, point.records, task, point.step, evalsets[0], reuse=True)
        step = point.step
        load_hooked_state_dict(model, point.weights)
        optimizer.load_state_dict(backend_optimizer_state(model, point.optimizer)
                                  if point.optimizer_layout == "hooked" else point.optimizer)
        torch.set_rng_state(point.torch_rng)
    schedule = Schedule.of(tc)
    run = RunState.start(out, tc, evalsets, task.progress, len(tokens), machine_record(dev), point, backend)
    bar = tqdm(total=tc.max_steps, initial=step, disable=not progress, desc=out.name, dynamic_ncols=True)
    with contextlib.closing(run), bar:
        while True:
            # 1. Evaluate on the fixed evaluation set (no training RNG is touched), with the interventions
            # of this step; log it (metrics.jsonl, tau, whether stop_after_tau is reached).
            if step in schedule.evaluate:
                record = run.evaluate(model, task, step, hooks, interventions.applied(model, step))
                bar.set_postfix(_bar_fields(record, task.progress), refresh=False)
            # 2. Checkpoint (weights; at a resume point also the state needed to resume exactly from here).
            if schedule.checkpoints(step, run.evaluations.stop):
                run.checkpoint(step, hooked_state_dict(model), hooked_optimizer_state(model, optimizer.state_dict())
                               if schedule.resumes(step, run.evaluations.stop) else None)
            if step >= tc.max_steps or run.evaluations.stop:
                break
            if step == stop_at_step:  # a kill right after this step's evaluation (no summary)
                return {"stopped_at": step}

            # 3. Next minibatch: walk a fresh permutation of the training split each epoch, dropping the
            # ragged tail (full batch: the whole split, in its order).
            batch = run.next_batch(tokens)

            # 4-5. The task's loss (on its loss positions: logits at p predict the token at p + 1),
            # then the update (the step the seed ensemble takes too), under the interventions of this step.
            step = take_step(loss_of, batch, optimizer, tc, step, hooks, interventions.applied(model, step),
                             clip=lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            bar.update(1)
    return run.finish(task, step)


# ---- the pieces of the loop that the seed ensemble (plateauscope.training.ensemble) shares --------------


@dataclass(frozen=True)
class Schedule:
    """The steps that evaluate, checkpoint, and also write the resume state (``plateauscope.training.schedule``):
    pure functions of the TrainConfig, so a seed ensemble's members share them."""

    evaluate: frozenset[int]
    checkpoint: frozenset[int]
    resume: frozenset[int]
    """The checkpoints that also write ``resume.pt``."""

    @classmethod
    def of(cls, tc: TrainConfig) -> Schedule:
        """The run's schedule."""
        ckpt_steps = scheduled_steps(tc.ckpt_every, tc.max_steps, tc.early_log_points)
        return cls(frozenset(scheduled_steps(tc.eval_every, tc.max_steps, tc.early_log_points)), frozenset(ckpt_steps),
                   frozenset(resume_steps(ckpt_steps, tc.resume_every)))

    def checkpoints(self, step: int, stop: bool) -> bool:
        """Whether ``step`` writes a checkpoint: a scheduled one, or the last one of a run that stops here."""
        return step in self.checkpoint or stop

    def resumes(self, step: int, stop: bool) -> bool:
        """Whether the checkpoint at ``step`` also writes the resume state (a run that stops here can be
        resumed from its last step, e.g. with a larger ``stop_after_tau``)."""
        return step in self.resume or stop


class DataOrder:
    """One run's minibatch order: a generator seeded with ``train.seed`` (the minibatch order only, no
    other RNG), a permutation of the data set and a cursor into it. A fresh permutation each epoch; the
    ragged tail of one is dropped, so every minibatch has ``batch_size`` distinct examples."""

    def __init__(self, seed: int, n_examples: int, point: ResumePoint | None = None) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.n_examples = n_examples
        self.perm: Int[Tensor, " D"] = torch.randperm(n_examples, generator=self.generator)
        self.cursor = 0
        if point is not None:  # where the killed run was: its permutation, cursor and generator state
            self.generator.set_state(point.data_gen)
            self.perm, self.cursor = point.perm, point.cursor

    def next_rows(self, batch_size: int) -> Int[Tensor, " batch"]:
        """The next minibatch's rows of the data set (on the CPU), reshuffling first when the
        permutation has fewer than ``batch_size`` rows left."""
        if self.cursor + batch_size > self.n_examples:
            self.perm, self.cursor = torch.randperm(self.n_examples, generator=self.generator), 0
        rows = self.perm[self.cursor: self.cursor + batch_size]
        self.cursor += batch_size
        return rows


class EvaluationLog:
    """One run's evaluations: its ``metrics.jsonl`` records, the file open for appending, tau, and
    whether ``stop_after_tau`` is reached."""

    def __init__(self, out: Path, records: list[dict], measure: ProgressMeasure, tc: TrainConfig) -> None:
        # Metrics past the resume point (from the killed process) are dropped, never duplicated.
        rd.write_text_atomic(out / rd.METRICS_FILE, "".join(json.dumps(r) + "\n" for r in records))
        self.records, self.measure, self.tc = records, measure, tc
        self.tau = compute_tau(records, measure)
        self.stop = False
        self.file = open(out / rd.METRICS_FILE, "ab", buffering=0)  # unbuffered: a full disk fails here, not at close

    def log(self, record: dict) -> None:
        """Append ``record`` (written at once: a kill loses no evaluation), and update tau (the first
        step that reaches the progress measure's threshold, fixed once seen) and the stop flag."""
        self.records.append(record)
        try:
            self.file.write((json.dumps(record) + "\n").encode())
        except OSError as e:  # a torn last line is dropped on reading, and cut off on resume
            raise disk_error(Path(self.file.name), e) from None
        self.tau = self.tau if self.tau is not None else compute_tau([record], self.measure)
        self.stop = stop_due(self.tc, self.tau, record["step"])

    def window(self, complete: bool = False) -> tuple[int, int | None]:
        """The transition window so far (:func:`plateauscope.training.checkpoint_policy.transition_window`)."""
        return transition_window(self.records, self.measure, complete)

    def close(self) -> None:
        """Close ``metrics.jsonl`` (again: a no-op)."""
        self.file.close()


@dataclass
class RunState:
    """What the training loop keeps per run besides the weights and the optimiser: a solo run's, and
    each member's of a seed ensemble. Its directory, data order, evaluation log, the machines that
    trained it and its wall clock."""

    out: Path
    tc: TrainConfig
    evalsets: tuple[Any, Any]
    """The run's fixed evaluation sets (:func:`evaluation_sets`)."""
    order: DataOrder
    evaluations: EvaluationLog
    machines: list[dict]
    """Every machine that trains the run, in order (bit-identity holds on one): :func:`machines_on_resume`."""
    t0: float
    """``time.perf_counter()`` at the run's (resumed) step 0, for ``wall_s``."""
    backend: str = "hooked"
    """The backend that trains the run (recorded in ``resume.pt``)."""
    policy: CheckpointPolicy = CheckpointPolicy(adaptive=False, coarse=frozenset())
    """Which of the scheduled checkpoints the run keeps (``train.checkpoints``)."""
    resume_step: int | None = None
    """The step of the latest resume state, whose checkpoint is never pruned."""
    ladder: ReferenceLadder | None = field(default=None, init=False, repr=False)
    """The task's reference predictors on the evaluation set, built at the first evaluation (None: none)."""
    ladder_built: bool = field(default=False, init=False, repr=False)

    @classmethod
    def start(cls, out: Path, tc: TrainConfig, evalsets: tuple[Any, Any], measure: ProgressMeasure, n_examples: int,
              here: dict, point: ResumePoint | None, backend: str = "hooked") -> RunState:
        """A fresh run (``point`` None), or one resumed from ``point`` (not a complete one): its data order,
        metrics up to the saved step (``metrics.jsonl`` cut back to them and opened), machines and clock.
        ``measure``: what defines tau (the task's progress measure); ``here``: this machine
        (:func:`plateauscope.runs.machine.machine_record`)."""
        records = [] if point is None else point.records
        return cls(out=out, tc=tc, evalsets=evalsets, order=DataOrder(tc.seed, n_examples, point),
                   evaluations=EvaluationLog(out, records, measure, tc),
                   machines=[here] if point is None else machines_on_resume(out, point.machines, here),
                   t0=time.perf_counter() - (0.0 if point is None else point.wall_s), backend=backend,
                   policy=CheckpointPolicy.of(tc), resume_step=None if point is None else point.step)

    def close(self) -> None:
        """Close ``metrics.jsonl`` (again: a no-op)."""
        self.evaluations.close()

    def next_batch(self, tokens: Int[Tensor, "D_train seq"]) -> Int[Tensor, "batch seq"]:
        """The next step's batch of the training split ``tokens`` (:func:`training_tokens`): the whole split
        with ``full_batch``, else the next rows of the data order."""
        if self.tc.full_batch:
            return tokens
        return tokens[self.order.next_rows(self.tc.batch_size).to(tokens.device)]

    def evaluate(self, model: torch.nn.Module, task: Task, step: int, hooks: TrainingHooks,
                 context: contextlib.AbstractContextManager) -> dict:
        """Evaluate ``model`` (inside ``context``: the step's interventions, or loading a member's weights)
        on the fixed evaluation set of ``step``, call ``hooks.on_evaluation`` and log the record; return it."""
        started = time.perf_counter()
        if not self.ladder_built:
            self.ladder, self.ladder_built = ReferenceLadder.build(task, self.evalsets[0]), True
        with context:
            record = evaluation_record(model, task, evaluation_set(self.evalsets, step, self.tc), step, self.tc,
                                       started - self.t0, self.ladder)
        if hooks.on_evaluation:
            hooks.on_evaluation(record, time.perf_counter() - started)
        self.evaluations.log(record)
        return record

    def checkpoint(self, step: int, weights: dict[str, Tensor], optimizer_state: dict | None) -> None:
        """Checkpoint ``weights``; with an ``optimizer_state`` (in the solo run's format), also the resume
        state: this data order, the wall clock, the global RNG, the backend and the machines. Under the
        adaptive policy, a checkpoint past the window's end is not written, and those that the metrics
        so far put outside the window are deleted."""
        window = self.evaluations.window() if self.policy.adaptive else (0, None)
        if optimizer_state is None and not self.policy.keeps(step, window):
            return
        save_checkpoint_and_state(self.out, step, weights, optimizer_state, self.order.generator, self.order.perm,
                                  self.order.cursor, time.perf_counter() - self.t0, self.backend, self.machines)
        self.resume_step = step if optimizer_state is not None else self.resume_step
        self.policy.prune(self.out, window, protect=self.resume_step)

    def finish(self, task: Task, step: int) -> dict:
        """Close ``metrics.jsonl``, keep the checkpoints of the final window, then write and return
        ``summary.json`` (:func:`finish`)."""
        self.close()
        self.policy.prune(self.out, self.evaluations.window(complete=True), protect=step)
        return finish(self.out, self.evaluations.records, task, step, self.evalsets[0], machines=self.machines)


def take_step(loss_of: Callable[[Tensor], Tensor], batch: Int[Tensor, "*members batch seq"],
              optimizer: torch.optim.Optimizer, tc: TrainConfig, step: int, hooks: TrainingHooks,
              context: contextlib.AbstractContextManager, clip: Callable[[float], object]) -> int:
    """:func:`train_step` inside ``context`` (a solo run's interventions) and ``hooks.step_context``, then
    ``hooks.on_step``; returns the number of updates so far."""
    with context, hooks.step_context():
        loss = train_step(loss_of, batch, optimizer, tc, step, clip=clip)
    if hooks.on_step:
        hooks.on_step(step + 1, loss)
    return step + 1


def evaluation_sets(task: Task, tc: TrainConfig, seed: int) -> tuple[Any, Any]:
    """The run's fixed evaluation set, and the same set without its tracked examples for the steps
    between two ``tracked_every`` steps (the full set again when ``tracked_every`` is None); a
    one-line ConfigError when the task has nothing to leave out."""
    full = task.build_evalset(tc.eval_groups, tc.tracked_groups, seed)
    if tc.tracked_every is None:
        return full, full
    light = task.untracked(full)
    if light is None:
        raise ConfigError(f"tracked_every={tc.tracked_every}: task {task.describe()} logs nothing less often "
                          "(its untracked() returns None)")
    return full, light


def training_tokens(task: Task) -> Int[Tensor, "D_train seq"]:
    """The sequences training samples: the task's training split (``Task.train_indices``), else every one."""
    rows = task.train_indices()
    return task.tokens if rows is None else task.tokens[rows]


def batch_rows(tc: TrainConfig, task: Task) -> int:
    """Examples in one training step: the whole training split with ``full_batch``, else ``batch_size``."""
    return len(training_tokens(task)) if tc.full_batch else tc.batch_size


def check_evaluation(model: torch.nn.Module, task: Task, evalset: Any, tc: TrainConfig,
                     context: contextlib.AbstractContextManager | None = None) -> None:
    """The evaluation record of the step-0 model (:func:`evaluation_record`), computed and dropped before
    anything is written, so that a misspelt key of ``evaluate`` fails in one line before the progress bar;
    the global RNG is left as it was."""
    rng = torch.get_rng_state()
    try:
        with context or contextlib.nullcontext():
            record = evaluation_record(model, task, evalset, 0, tc, 0.0)
    finally:
        torch.set_rng_state(rng)
    progress = task.progress
    if progress.cue_effect_key is not None and progress.cue_effect_key not in record:
        raise TaskError(f"task {task.describe()}: evaluate() must return the cue effect "
                        f"{progress.cue_effect_key!r} its progress measure names, got {sorted(record)}")
    bad = [k for k, v in record.items() if not _plain(v)]
    if bad:
        raise TaskError(f"task {task.describe()}: evaluate() must return plain numbers and lists; "
                        f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not")


def _plain(value: Any) -> bool:
    """Whether ``value`` is what ``metrics.jsonl`` holds: None, a finite-or-not number, or lists of them."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def evaluation_set(evalsets: tuple[Any, Any], step: int, tc: TrainConfig) -> Any:
    """Which of :func:`evaluation_sets` the evaluation at ``step`` uses."""
    return evalsets[0] if tc.tracked_every is None or step % tc.tracked_every == 0 else evalsets[1]


def check_forward(cfg: RunConfig, task: Task) -> None:
    """A one-line ConfigError, before anything is written, when ``cfg.train.forward`` cannot train this
    model, or (``trimmed``) this task."""
    forward = cfg.train.forward
    why = unsupported_reason(cfg.model) if forward != "hooked" else None
    if why:
        raise ConfigError(f"--forward {forward} does not support {why}: pass --forward hooked")
    if forward == "trimmed" and type(task).loss is not Task.loss:
        raise ConfigError(f"--forward trimmed: task {task.describe()} defines its own loss over every position; "
                          "pass --forward fused")


def adamw(params: Iterable[Tensor], tc: TrainConfig) -> torch.optim.AdamW:
    """The run's AdamW. ``foreach=True``: on a CPU, torch's default is the single-tensor loop, and
    the multi-tensor one computes the same numbers bit for bit (``tests/training/test_train.py`` checks a run
    against a loop with the default) in about a third less time on the ``ci`` model
    (``bench/train_step.py --only-optimizer``; the numbers and their CPU are in the performance page
    of the docs). On CUDA it is already the default."""
    return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=tc.betas, foreach=True)


def train_step(loss_of: Callable[[Tensor], Tensor], batch: Int[Tensor, "*members batch seq"],
               optimizer: torch.optim.Optimizer, tc: TrainConfig, step: int,
               clip: Callable[[float], object]) -> Float[Tensor, "*members"]:
    """One training step: forward and loss, linear warmup, backward, gradient clipping, AdamW step.

    ``loss_of(batch)`` is the mean target cross-entropy: a scalar for a solo run, one per member
    for the seed ensemble, whose members share no parameter, so the gradient of the summed loss is
    each member's own. ``clip(max_norm)`` clips the gradients (per member in an ensemble) and is
    called only when ``tc.grad_clip`` is set. Returns the detached loss.
    """
    loss = loss_of(batch)
    if tc.warmup_steps:
        for group in optimizer.param_groups:
            group["lr"] = tc.lr * min(1.0, (step + 1) / tc.warmup_steps)
    optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()
    if tc.grad_clip is not None:
        clip(tc.grad_clip)
    optimizer.step()
    return loss.detach()


def prepare_run_dir(cfg: RunConfig, task: Task, out: Path, resume: bool) -> dict:
    """Write a fresh run directory (dataset + config), or check that the stored run has this
    config when resuming; return the HookedTransformerConfig kwargs of the run."""
    n_train = len(training_tokens(task))
    if not cfg.train.full_batch and n_train < cfg.train.batch_size:
        split = "the training split" if task.train_indices() is not None else "the data set"
        raise ConfigError(f"batch_size={cfg.train.batch_size} is larger than {split} (D={n_train})")
    hooked_cfg = task.hooked_config(cfg.model)
    existing = out / rd.CONFIG_FILE
    if existing.exists():
        if not resume:
            raise ConfigError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
        stored = rd.read_json(existing)
        try:  # a config.json from before a field existed reads as that field's default
            stored_cfg = json.loads(json.dumps(RunConfig.from_dict(stored.get("run") or {}).to_dict()))
        except (ConfigError, TypeError):
            stored_cfg = None
        asked = json.loads(json.dumps(cfg.to_dict()))
        differences = [] if stored_cfg is None else _differences(stored_cfg, asked)
        if extends_horizon(differences):  # one longer run: the new horizon is the run's from now on
            rd.write_json_atomic(existing, {**stored, "run": cfg.to_dict()})
            (out / rd.SUMMARY_FILE).unlink(missing_ok=True)
            log.info("%s: extended from %d to %d steps", out, differences[0][1], differences[0][2])
        elif stored_cfg != asked:
            differ = "" if stored_cfg is None else " (" + "; ".join(
                f"{key}: stored {a!r}, asked {b!r}" for key, a, b in differences) + ")"
            raise ConfigError(f"{existing}: --resume with a different configuration than the stored run{differ}; "
                              f"pass the stored options (only a larger --max-steps extends a run), "
                              f"or choose another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        rd.write_text_atomic(out / rd.DATASET_FILE, "".join(json.dumps(r) + "\n" for r in task.records()))
        source = task_source_file(cfg.task_name)
        copy = {}
        if source is not None and source.is_file():  # the task's own file, kept so the run outlives a move
            rd.atomic_write(out / rd.TASK_SOURCE_FILE, lambda tmp: shutil.copyfile(source, tmp))
            copy = {"task_source": {"file": rd.TASK_SOURCE_FILE, "original": str(source),
                                    "sha256": sha256_of(out / rd.TASK_SOURCE_FILE)}}
        rd.write_json_atomic(existing, {"run": cfg.to_dict(), "hooked_transformer_config": hooked_cfg,
                                        "vocab": task.vocab, "layout": task.layout_record(), **copy})
    return hooked_cfg


def extends_horizon(differences: list[tuple[str, object, object]]) -> bool:
    """Whether a resumed run's configuration differs from the stored one only by a larger ``max_steps``:
    the run then continues bit for bit as one longer run would (no part of a step depends on the horizon:
    the learning rate has a warmup and no decay, and evaluation and checkpoints touch no training RNG)."""
    return len(differences) == 1 and differences[0][0] == "train.max_steps" \
        and isinstance(differences[0][1], int) and isinstance(differences[0][2], int) \
        and differences[0][2] > differences[0][1]


POLICY_FIELDS: tuple[str, ...] = ("checkpoints", "coarse_every")
"""The TrainConfig fields of the checkpoint policy: they change which files a run keeps, not its numbers."""


def with_stored_policy(cfg: RunConfig, out: Path, resume: bool) -> RunConfig:
    """``cfg`` with the checkpoint policy of the run stored in ``out`` when resuming it: a run keeps the
    policy it started with (a dense run resumed as adaptive would delete checkpoints it has), so a
    run written before the policy existed, or under another one, resumes without an error."""
    if not resume or not (out / rd.CONFIG_FILE).exists():
        return cfg
    stored = (rd.read_json(out / rd.CONFIG_FILE).get("run") or {}).get("train") or {}
    defaults = TrainConfig()
    kept = {name: stored.get(name, getattr(defaults, name)) for name in POLICY_FIELDS}
    if any(getattr(cfg.train, name) != value for name, value in kept.items()):
        log.info("%s: resumed with its own checkpoint policy (%s)", out,
                 ", ".join(f"{k}={v}" for k, v in kept.items()))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **kept))


def _differences(a: dict, b: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """The dotted keys where two nested config dicts differ, with both values."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append((f"{prefix}{key}", x, y))
    return out


def machines_on_resume(out: Path, before: list[dict], here: dict) -> list[dict]:
    """The machines of a resumed run: ``before``, then ``here`` when it differs from the last of them,
    with a one-line warning, since the rest of the run is then not bit-identical to an uninterrupted one."""
    if before and not same_machine(before[-1], here):
        log.warning("%s: trained so far on %s, resumed on %s: from here on it is not bit-identical to an "
                    "uninterrupted run", out, describe(before[-1]), describe(here))
    return before if before and same_machine(before[-1], here) else [*before, here]


def evaluation_record(model: torch.nn.Module, task: Task, evalset: object, step: int, tc: TrainConfig,
                      wall_s: float, ladder: ReferenceLadder | None = None) -> dict:
    """One line of ``metrics.jsonl``: every metric of ``model`` on the fixed evaluation set, and its KL
    from each of the task's reference predictors (``ladder``)."""
    model.eval()
    metrics = task.evaluate(model, evalset, tc.eval_batch_size)
    if isinstance(metrics, dict):
        metrics.update(task.evaluate_heldout(model, tc.eval_batch_size))
        metrics.update(progress_measure_value(model, task, evalset, metrics))
    if not isinstance(metrics, dict) or task.progress.key not in metrics:
        got = sorted(metrics) if isinstance(metrics, dict) else type(metrics).__name__
        raise TaskError(f"task {task.describe()}: evaluate() must return a dict with its progress measure "
                        f"{task.progress.key!r} (or the task declare a measure of that name), got {got}")
    if ladder is not None:
        metrics.update(ladder.kl(model, task, tc.eval_batch_size))
    record = {"step": step, "tokens_seen": step * batch_rows(tc, task) * task.tokens_per_example(), **metrics,
              "wall_s": round(wall_s, 3)}
    model.train()
    return record


def progress_measure_value(model: torch.nn.Module, task: Task, evalset: Any, metrics: dict) -> dict:
    """``{key: value}`` when the progress measure's key names one of the task's own measures
    (``Task.measures``, one number per model) that ``metrics`` lacks, computed under ``torch.no_grad()``;
    else {}. A measure that fails, or gives no single number, is one TaskError naming it."""
    key = task.progress.key
    measure = next((m for m in task.measures() if m.name == key), None) if key not in metrics else None
    if measure is None:
        return {}
    if measure.per != "model":
        raise TaskError(f"task {task.describe()}: the progress measure {key!r} must be one number per model, "
                        f"not per {measure.per}")
    try:
        with torch.no_grad():
            value = measure.compute(model, task, evalset)
        value = float(value)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - a task's measure can fail in any way; name it and its line
        frames = traceback.extract_tb(e.__traceback__)
        at = f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""
        raise TaskError(f"task {task.describe()}: measure {key!r} failed{at} ({type(e).__name__}: {e})") from None
    if not math.isfinite(value):
        raise TaskError(f"task {task.describe()}: measure {key!r} gave {value}, not a finite number")
    return {key: value}


def stop_due(tc: TrainConfig, tau: int | None, step: int) -> bool:
    """``stop_after_tau``: stop once the step has reached that multiple of tau (when tau is known)."""
    return tc.stop_after_tau is not None and tau is not None and step >= tc.stop_after_tau * tau


def finish(out: Path, records: list[dict], task: Task, step: int, evalset: Any, reuse: bool = False,
           machines: list[dict] | None = None) -> dict:
    """Write and return ``summary.json`` (``reuse``: return the one already written, if any), with
    the machines that trained the run; the plateau verdict's references are over ``evalset``, the
    run's evaluation set."""
    summary_path = out / rd.SUMMARY_FILE
    if reuse and summary_path.exists():
        return rd.read_json(summary_path)
    summary = {**summarize(records, task.progress, task.plateau_reference(evalset)), "final_step": step,
               "complete": True, **task.summary_fields(), "machines": machines or []}
    if "references" in task.capabilities:
        rungs = task.reference_predictors()
        ladder = summary["ladder"] = ladder_summary(records, [r.name for r in rungs], [r.label for r in rungs],
                                                    summary[PLATEAU_STRETCH])
        if ladder and summary.get("plateau"):  # the thresholds' verdict, checked against the ladder's reading
            kind = next((r.verdict for r in rungs if r.name == ladder["plateau_stage"]), None)
            summary["plateau"].update(ladder_verdict=kind, agrees_with_ladder=kind == summary["plateau"]["verdict"])
    rd.write_json_atomic(summary_path, summary)
    return summary


def _bar_fields(record: dict, progress: ProgressMeasure) -> dict:
    if not progress.falls or record.get(progress.key) is None:
        return {name: f"{record[key]:.3f}" for name, key in (("loss", "loss"), ("acc", "accuracy"))
                if isinstance(record.get(key), (int, float))}
    fields = {f"{progress.key}/{progress.height_name}": f"{record[progress.key] / progress.height:.3f}"}
    if progress.cue_effect_key is not None and record.get(progress.cue_effect_key) is not None:
        fields[progress.cue_effect_key] = f"{record[progress.cue_effect_key]:.3f}"
    return fields


def default_run_name(cfg: RunConfig) -> str:
    """The run directory name made from the options: preset, the task's label (direction, K, n_b for
    the selector task; else the task's name), lr, batch and seed."""
    tr = cfg.train
    label = cfg.task.run_label() if hasattr(cfg.task, "run_label") else \
        Path(cfg.task_name.rpartition(":")[2] or cfg.task_name).stem.lower()
    return f"{cfg.preset or 'custom'}_{label}_lr{tr.lr:g}_bs{tr.batch_size}_seed{tr.seed}"
