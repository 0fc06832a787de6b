"""The run directory's files: their names, atomic writes, and reading and writing checkpoints and
resume states. Every other module reads and writes a run's files through this one.

Layout of a run directory (names are the constants below)::

    config.json        RunConfig (with its task_name), the HookedTransformerConfig kwargs, vocabulary,
                       the task's positions
    dataset.jsonl      every example (the selector task: b, z, a, group, selector)
    metrics.jsonl      one JSON object per evaluation
    summary.json       tau, plateau span, final metrics (written at the end)
    checkpoints/step_0000120.safetensors   model weights, step in name and metadata
    resume.pt          latest optimiser / data-order / RNG state (tensors only: weights_only=True)

Every file is written atomically (temporary file in the same folder, then ``os.replace``),
so a crash never leaves half a file behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save

CONFIG_FILE = "config.json"
DATASET_FILE = "dataset.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
RESUME_FILE = "resume.pt"
MANIFEST_FILE = "sweep.json"
"""A sweep directory's list of its runs (``plateauscope.sweeps.sweep``)."""
CHECKPOINT_FORMAT = "plateauscope-checkpoint-v1"
"""The ``format`` tag in every checkpoint's safetensors metadata."""
READABLE_CHECKPOINT_FORMATS: tuple[str, ...] = (CHECKPOINT_FORMAT, "synass-lens-checkpoint-v1")
"""Tags this toolkit reads: its own, and the one it wrote under its former name."""
_CKPT_RE = re.compile(r"^step_(\d+)\.safetensors$")


class RunError(Exception):
    """A run directory or file that cannot be used; the message is one line naming the file."""


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint at ``step`` (``step_NNNNNNN.safetensors``)."""
    return f"step_{step:07d}.safetensors"


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` and move the result onto ``path`` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file, then one rename)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def save_checkpoint(path: Path, state_dict: dict[str, torch.Tensor], step: int) -> None:
    """Write weights as safetensors with the format tag and the step in the metadata, atomically.
    The same weights give the same bytes (:func:`_sorted_metadata`)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    blob = _sorted_metadata(save(tensors, metadata={"format": CHECKPOINT_FORMAT, "step": str(step)}))
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(blob))


def _sorted_metadata(blob: bytes) -> bytes:
    """A safetensors file's bytes with its metadata keys in sorted order. safetensors writes the
    metadata from a hash map, in an order that changes from one process to the next, so two
    checkpoints of the same weights would differ in their header; the tensors' entries and data are
    already in a fixed order. The header stays padded to 8 bytes, as safetensors pads it."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8: 8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + n:]


def read_checkpoint_metadata(path: Path) -> dict[str, str]:
    """The safetensors metadata of one of our checkpoints (format tag, step); else a one-line RunError."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: no such checkpoint file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise RunError(f"{path}: not a readable safetensors checkpoint ({_one_line(e)})") from None
    if meta.get("format") not in READABLE_CHECKPOINT_FORMATS:
        raise RunError(f"{path}: a safetensors file, but not a checkpoint of this toolkit")
    return meta


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], int]:
    """Weights and step of one checkpoint; any problem is a one-line RunError naming the file."""
    meta = read_checkpoint_metadata(path)
    try:
        return load_file(str(path)), int(meta["step"])
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise RunError(f"{path}: not a readable safetensors checkpoint ({_one_line(e)})") from None


def save_resume_state(path: Path, state: dict[str, Any]) -> None:
    """Write the resume state (tensors and plain types only) atomically."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_resume_state(path: Path) -> dict[str, Any]:
    """The resume state, loaded with ``weights_only=True``; a one-line RunError if unreadable."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means the same thing to the user
        raise RunError(f"{path}: cannot read the resume state ({_one_line(e)})") from None


@dataclass
class ResumePoint:
    """What ``resume.pt`` and the latest checkpoint hold: enough to continue bit for bit."""

    step: int
    weights: dict[str, torch.Tensor]
    optimizer: dict
    """``torch.optim.AdamW.state_dict()`` of the run's parameters (in ``model.parameters()`` order)."""
    data_gen: torch.Tensor
    perm: torch.Tensor
    cursor: int
    wall_s: float
    torch_rng: torch.Tensor
    records: list[dict]
    """Metrics before ``step`` (the loop evaluates ``step`` again; anything later came from the
    killed process), or up to and including it when the run is complete."""
    complete: bool
    """The run had finished: nothing is left to train."""
    backend: str = "hooked"
    """The backend that trained the run (resume states written before backends existed: hooked)."""
    machines: list[dict] = field(default_factory=list)
    """The machines that trained the run so far (``plateauscope.training.machine.machine_record``), in order;
    empty for resume states written before they were recorded."""


def load_resume_point(out: Path, max_steps: int) -> ResumePoint | None:
    """The state to resume the run in ``out`` from, or None when it has none (a fresh start)."""
    resume_path = out / RESUME_FILE
    if not resume_path.exists():
        return None
    state = load_resume_state(resume_path)
    step = int(state["step"])
    weights, _ = load_checkpoint(out / CHECKPOINT_DIR / checkpoint_name(step))
    summary_path = out / SUMMARY_FILE
    complete = step >= max_steps or (summary_path.exists() and bool(read_json(summary_path).get("complete")))
    return ResumePoint(step=step, weights=weights, optimizer=state["optimizer"], data_gen=state["data_gen"],
                       perm=state["perm"], cursor=int(state["cursor"]), wall_s=float(state["wall_s"]),
                       torch_rng=state["torch_rng"], complete=complete, backend=str(state.get("backend", "hooked")),
                       machines=list(state.get("machines", [])),
                       records=[r for r in read_jsonl(out / METRICS_FILE)
                                if r["step"] < step or (complete and r["step"] == step)])


def save_checkpoint_and_state(out: Path, step: int, weights: dict[str, torch.Tensor], optimizer: dict | None,
                              data_gen: torch.Generator, perm: torch.Tensor, cursor: int, wall_s: float,
                              backend: str = "hooked", machines: list[dict] | None = None) -> None:
    """Checkpoint the weights (HookedTransformer layout); at a resume point (an ``optimizer`` state
    given, not None), also write the state needed to resume exactly from here, with the backend
    whose parameter order the optimiser state follows and the machines that trained the run so far."""
    save_checkpoint(out / CHECKPOINT_DIR / checkpoint_name(step), weights, step)
    if optimizer is not None:
        save_resume_state(out / RESUME_FILE, {
            "step": step, "optimizer": optimizer, "data_gen": data_gen.get_state(), "perm": perm, "cursor": cursor,
            "wall_s": wall_s, "torch_rng": torch.get_rng_state(), "backend": backend, "machines": machines or []})


def read_json(path: Path) -> Any:
    """A JSON file, or a one-line RunError naming it."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({_one_line(e)})") from None


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a run killed mid-write) is dropped."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise RunError(f"{path}: line {i + 1} is not valid JSON") from None
    return out


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
