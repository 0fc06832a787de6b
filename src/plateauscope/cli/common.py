"""Shared pieces of the analysis CLIs: resolving ``--ckpt``, ``--backend``, and failing with one line."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from plateauscope.analysis.results import write_json_result
from plateauscope.errors import AnalysisFailure
from plateauscope.model.backend import BACKENDS, BackendError
from plateauscope.runs.files import write_text_atomic
from plateauscope.runs.run import Run, RunError


class CliError(Exception):
    """A user error; printed as one line, exit code 2."""


def add_ckpt_args(p: argparse.ArgumentParser) -> None:
    """The options every single-checkpoint command takes: --ckpt, --step, --n-examples, --seed, --json, --device."""
    p.add_argument("--ckpt", required=True, type=Path,
                   help="a checkpoint file (.../checkpoints/step_NNNNNNN.safetensors) or a run directory")
    p.add_argument("--step", type=int, help="with a run directory: the step to load (default: the last)")
    p.add_argument("--n-examples", type=int, default=256, help="prompt pairs / examples to use (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example sample (default 0)")
    p.add_argument("--json", type=Path, help="also write the result as JSON to this file")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    add_backend_arg(p)


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    """``--backend hooked|bridge``: which TransformerLens opens the checkpoints."""
    p.add_argument("--backend", choices=BACKENDS,
                   help="hooked: TransformerLens 3.x HookedTransformer; bridge: TransformerLens 4.x "
                        "TransformerBridge (default: the installed one)")


def resolve_ckpt(path: Path, step: int | None) -> tuple[Run, int]:
    """A run and a step from ``--ckpt`` (file or run directory) and ``--step``."""
    if not path.exists():
        raise RunError(f"{path}: no such checkpoint file or run directory")
    if path.is_file():
        run, file_step = Run.of_checkpoint(path)
        if step is not None and step != file_step:
            raise RunError(f"{path}: holds step {file_step}, not --step {step}")
        return run, file_step
    run = Run(path)
    steps = run.steps
    if not steps:
        raise RunError(f"{path}: the run has no checkpoints")
    if step is None:
        return run, steps[-1]
    run.checkpoint_path(step)  # raises a one-line error naming the steps that exist
    return run, step


def write_json(path: Path | None, obj: Any) -> None:
    """``--json FILE``: write ``obj`` there as strict JSON (NaN as null), atomically; nothing without a path."""
    if path is not None:
        write_json_result(path, obj)


ERROR_LOG = "plateauscope-error.log"
"""In the run directory (else the working directory): the traceback of the last unexpected error of a command."""


def error_log_path(args: argparse.Namespace) -> Path:
    """Where an unexpected error's traceback goes: the run directory of ``--run`` / ``--ckpt`` (a checkpoint's run),
    else the working directory."""
    for name in ("run", "ckpt", "out"):
        path = getattr(args, name, None)
        if isinstance(path, Path):
            folder = path if path.is_dir() else path.parent.parent if path.is_file() else None
            if folder is not None and folder.is_dir():
                return folder / ERROR_LOG
    return Path.cwd() / ERROR_LOG


def run_cli(body, argv: list[str] | None, parser: argparse.ArgumentParser) -> int:
    """Parse, run ``body(args)``, and turn user errors into one line on stderr with exit code 2. Any other
    exception is a bug: one line naming where it happened (the analysis, checkpoint and family of an
    :class:`~plateauscope.errors.AnalysisFailure`) and the log file that holds its traceback, exit code 1."""
    args = parser.parse_args(argv)
    try:
        body(args)
    except (RunError, CliError, BackendError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 -- an error that escapes is a bug: one line, the traceback in a file
        log = error_log_path(args)
        try:
            write_text_atomic(log, f"plateauscope {parser.prog.split()[-1]} {' '.join(argv or sys.argv[1:])}\n"
                                   + "".join(traceback.format_exception(e)))
            where = f"the traceback is in {log}"
        except OSError:
            where = "the traceback could not be written"
        what = str(e) if isinstance(e, AnalysisFailure) else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"error: {what} (an error in plateauscope, not in your input; {where})", file=sys.stderr)
        return 1
    return 0
