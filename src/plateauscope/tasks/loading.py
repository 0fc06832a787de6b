"""Finding a task by name: the built-in ones, or a task of your own in one file.

``task_class(spec)`` accepts:

* a built-in name: ``selector`` (the (B, z) -> A wind tunnel), ``induction``, ``markov`` (in-context
  Markov chains) or ``grokking`` (modular addition with a held-out split);
* ``path/to/file.py:Class``: a class in a Python file (a run records the file's absolute path and keeps a
  copy of the file, which it loads from when the original has moved: :func:`use_task_copy`);
* ``package.module:Class``: a class in an importable module.

The class must subclass :class:`plateauscope.tasks.base.Task`, implement its abstract members and
carry a ``Config`` dataclass with ``to_dict`` / ``from_dict``. :func:`build_task` generates the
data set and checks what the protocol promises (shapes, dtypes, positions), so a broken task file
fails with one line naming the file, the part and what was expected, before any training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from plateauscope.tasks.base import ProgressMeasure, Task, TaskError

BUILTIN_TASKS: dict[str, str] = {
    "selector": "plateauscope.tasks.selector:SelectorTask",
    "induction": "plateauscope.tasks.induction:InductionTask",
    "markov": "plateauscope.tasks.markov:MarkovTask",
    "grokking": "plateauscope.tasks.grokking:GrokkingTask",
}
"""Built-in task names and where their classes live (imported only when asked for)."""

_LOADED: dict[str, type[Task]] = {}
_COPIES: dict[str, Path] = {}
"""Task file specs -> the copy of the file a run directory keeps (:func:`use_task_copy`)."""
log = logging.getLogger(__name__)


def task_class(spec: str) -> type[Task]:
    """The task class a spec names, checked against the protocol; else a one-line TaskError."""
    if spec in _LOADED:
        return _LOADED[spec]
    where = BUILTIN_TASKS.get(spec, spec)
    if ":" not in where:
        raise TaskError(f"--task {spec}: not a built-in task ({', '.join(BUILTIN_TASKS)}) "
                        "and not of the form file.py:Class or module:Class")
    source, _, name = where.rpartition(":")
    if source.endswith(".py") and not Path(source).is_file() and spec in _COPIES:
        source = str(_COPIES[spec])
    module = _import_file(spec, source) if source.endswith(".py") else _import_module(spec, source)
    cls = getattr(module, name, None)
    if cls is None:
        raise TaskError(f"{source}: no class {name!r} in it (--task {spec})")
    _check_class(spec, source, cls)
    _LOADED[spec] = cls
    return cls


def canonical_task_name(spec: str) -> str:
    """The spec a run records: a task file's path made absolute (so the run loads from any folder)."""
    source, sep, name = spec.rpartition(":")
    if spec in BUILTIN_TASKS or not sep or not source.endswith(".py"):
        return spec
    return f"{Path(source).resolve()}:{name}"


def task_source_file(spec: str) -> Path | None:
    """The Python file of a task file spec (``path/to/file.py:Class``), None for a built-in or module task."""
    source, sep, _ = spec.rpartition(":")
    return Path(source) if sep and spec not in BUILTIN_TASKS and source.endswith(".py") else None


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def use_task_copy(spec: str, copy: Path, sha256: str | None = None) -> None:
    """Load the task ``spec`` from ``copy`` (the file a run directory keeps) when its own file has moved
    or is gone; a copy whose SHA-256 is not ``sha256`` is refused in one line."""
    original = task_source_file(spec)
    if original is None or original.is_file() or not Path(copy).is_file():
        return
    if sha256 is not None and sha256_of(copy) != sha256:
        raise TaskError(f"{copy}: its SHA-256 differs from the one the run recorded, and {original} is gone")
    if _COPIES.get(spec) != Path(copy):
        log.info("%s is gone: loading the task from the run's copy %s", original, copy)
    _COPIES[spec] = Path(copy)


def task_file_error(e: BaseException, spec: str) -> TaskError | None:
    """A one-line TaskError for an error raised inside a task file of one's own (``spec``): the file,
    the function and the line in it that failed; None when the error did not come from such a file."""
    if isinstance(e, (TaskError, KeyboardInterrupt)) or spec in BUILTIN_TASKS:
        return None
    cls = _LOADED.get(spec)
    try:
        source = inspect.getsourcefile(cls) if cls is not None else None
    except TypeError:
        source = None
    if source is None or Path(source).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
        return None
    inside = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == Path(source).resolve()]
    if not inside:
        return None
    frame = inside[-1]
    return TaskError(f"{source}: {frame.name}() failed at line {frame.lineno} ({type(e).__name__}: {e})")


def build_task(task_name: str, cfg: Any) -> Task:
    """The task ``task_name`` generated from its config, its data checked against the protocol."""
    cls = task_class(task_name)
    if not isinstance(cfg, cls.Config):
        raise TaskError(f"--task {task_name}: its config must be a {cls.Config.__name__}, got {type(cfg).__name__}")
    try:
        task = cls.generate(cfg)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's generate() can fail in any way; say where
        raise task_file_error(e, task_name) or TaskError(
            f"{_where(task_name)}: generate() failed ({type(e).__name__}: {e})") from None
    check_task(task, task_name)
    return task


def check_task(task: Task, task_name: str) -> None:
    """What the protocol promises of a generated task; a one-line TaskError naming the part."""
    where = _where(task_name)
    tokens = getattr(task, "tokens", None)
    if not isinstance(tokens, torch.Tensor):
        raise TaskError(f"{where}: tokens must be a torch tensor of token ids, got {type(tokens).__name__}")
    if tokens.dim() != 2:
        raise TaskError(f"{where}: tokens must have 2 dimensions [D, seq], got shape {list(tokens.shape)}")
    if tokens.dtype != torch.long:
        raise TaskError(f"{where}: tokens must hold 64-bit integer ids (torch.long), got {tokens.dtype}")
    if tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise TaskError(f"{where}: tokens must hold at least one sequence of 2 or more tokens, got {list(tokens.shape)}")
    vocab = getattr(task, "vocab", None)
    if not isinstance(vocab, list) or not vocab:
        raise TaskError(f"{where}: vocab must be a non-empty list of token strings, got {type(vocab).__name__}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= len(vocab):
        raise TaskError(f"{where}: token ids must lie in [0, {len(vocab)}) (the vocabulary), "
                        f"got {int(tokens.min())}..{int(tokens.max())}")
    positions = task.loss_positions
    if not positions or any(not isinstance(p, int) or not 0 <= p < task.input_len for p in positions):
        raise TaskError(f"{where}: loss_positions must be a non-empty list of ints in [0, {task.input_len}), "
                        f"got {positions!r}")
    if not 0 <= task.pred_pos < task.input_len:
        raise TaskError(f"{where}: pred_pos must lie in [0, {task.input_len}), got {task.pred_pos}")
    check_attention_rules(task, where)
    if not isinstance(task.progress, ProgressMeasure):
        raise TaskError(f"{where}: progress must be a plateauscope.tasks.base.ProgressMeasure, "
                        f"got {type(task.progress).__name__}")


def check_attention_rules(task: Task, where: str, sample: int = 64) -> None:
    """Every attention rule (the cue among them) on a sample of the data: query positions in
    ``[0, input_len)``, and for each query a ``[N, C]`` integer tensor of key positions at or before it
    (causal attention sees nothing later), ``-1`` padding a row with fewer keys."""
    tokens = task.tokens[:sample]
    for name, rule in task.attention_rules().items():
        part = "cue_positions" if name == "cue" else f"attention rule {name!r}"
        bad = [q for q in rule.queries if not isinstance(q, int) or not 0 <= q < task.input_len]
        if bad:
            raise TaskError(f"{where}: {part}: query positions must lie in [0, {task.input_len}), got {bad}")
        for q in rule.queries:
            keys = rule.keys(tokens, q)
            if not isinstance(keys, torch.Tensor) or keys.dim() != 2 or keys.shape[0] != tokens.shape[0] \
                    or keys.dtype != torch.long:
                got = f"{keys.dtype} {list(keys.shape)}" if isinstance(keys, torch.Tensor) else type(keys).__name__
                raise TaskError(f"{where}: {part} at query {q} must be a [N, C] torch.long tensor of key positions "
                                f"(N = {tokens.shape[0]} sequences), got {got}")
            if keys.numel() and (int(keys.min()) < -1 or int(keys.max()) > q):
                raise TaskError(f"{where}: {part} at query {q} must lie in [0, {q}] (the positions it can attend "
                                f"to; -1 pads), got {int(keys.min())}..{int(keys.max())}")


def _where(task_name: str) -> str:
    return f"task {task_name}" if task_name in BUILTIN_TASKS else task_name


def _import_file(spec: str, source: str) -> Any:
    path = Path(source)
    if not path.is_file():
        raise TaskError(f"{source}: no such task file (--task {spec})")
    module_name = f"plateauscope_task_{path.stem}_{abs(hash(str(path.resolve())))}"
    if module_name in sys.modules:  # the same file named another way (relative, absolute): one class
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise TaskError(f"{source}: cannot be imported as a Python file (--task {spec})")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses resolve their annotations through sys.modules
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any error in the user's file means the same to them
        del sys.modules[module_name]
        raise TaskError(f"{source}: importing it failed ({type(e).__name__}: {e})") from None
    return module


def _import_module(spec: str, source: str) -> Any:
    try:
        return importlib.import_module(source)
    except ImportError as e:
        raise TaskError(f"--task {spec}: cannot import module {source!r} ({e})") from None


def _check_class(spec: str, source: str, cls: Any) -> None:
    where = f"{source}:{getattr(cls, '__name__', cls)}"
    if not (inspect.isclass(cls) and issubclass(cls, Task)):
        raise TaskError(f"{where}: a task must subclass plateauscope.tasks.base.Task")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TaskError(f"{where}: missing {', '.join(missing)} (required by plateauscope.tasks.base.Task)")
    config = getattr(cls, "Config", None)
    if not (inspect.isclass(config) and dataclasses.is_dataclass(config)
            and callable(getattr(config, "from_dict", None)) and callable(getattr(config, "to_dict", None))):
        raise TaskError(f"{where}: missing Config, a dataclass with to_dict and from_dict "
                        "(build it on plateauscope.JsonConfig)")
    if not getattr(cls, "name", None):
        cls.name = spec
