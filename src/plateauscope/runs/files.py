"""The run directory's files: their names, atomic writes, and reading and writing checkpoints and
resume states. Every other module reads and writes a run's files through this one.

Layout of a run directory (names are the constants below)::

    config.json        RunConfig (with its task_name), the HookedTransformerConfig kwargs, vocabulary,
                       the task's positions
    dataset.jsonl      every example (the selector task: b, z, a, group, selector)
    metrics.jsonl      one JSON object per evaluation
    summary.json       tau, the plateau's stretch and counts, final metrics (written at the end)
    series.json        an imported run's manifest of external checkpoints (instead of config.json and
                       checkpoints/; model/config.json holds the series' Hugging Face config)
    checkpoints/step_0000120.safetensors   model weights, step in name and metadata
    resume.pt          latest optimiser / data-order / RNG state (tensors only: weights_only=True)
    resume.prev.pt     the resume state before it (a fallback when resume.pt is bad or missing)
    checksums.json     SHA-256 and size of every checkpoint and resume state (:func:`verify_file`)
    .train.lock        held by the process that trains the run (:func:`writer_lock`)

Every file is written atomically (temporary file in the same folder, then ``os.replace``),
so a crash never leaves half a file behind; a full disk leaves the file absent, or as it was.

Checkpoints and resume states are *verified*: each write records the file's SHA-256 and size in
``checksums.json`` before the file is moved into place (and the entry it replaces as ``previous``
until the move is done), and each load checks them, so a truncated, altered or missing file is a
one-line :class:`RunError` naming it. A run written before checksums were kept loads with a
one-line note; when such a run is resumed, its existing files are adopted as they are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, safe_open, save

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
DATASET_FILE = "dataset.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
TASK_SOURCE_FILE = "task_source.py"
"""A copy of the task's own file (a task of one's own), with its SHA-256 in ``config.json``'s ``task_source``:
the run loads its task from it when the original has moved."""
RESUME_FILE = "resume.pt"
PREVIOUS_RESUME_FILE = "resume.prev.pt"
"""The resume state before the latest: where a run resumes from when ``resume.pt`` is bad or missing."""
CHECKSUMS_FILE = "checksums.json"
"""SHA-256 and size of each checkpoint and resume state, by path relative to the run directory."""
CHECKSUMS_FORMAT = "plateauscope-checksums-v1"
LOCK_FILE = ".lock"
"""The lock file a writer holds (:func:`writer_lock`), in the folder it writes."""
TRAIN_LOCK_FILE = ".train.lock"
"""The training process's lock file, in the run directory."""
MANIFEST_FILE = "sweep.json"
"""A sweep directory's list of its runs (``plateauscope.sweeps.sweep``)."""
ANALYSIS_DIR = "analysis"
"""Folder of a run directory that holds every analysis cache."""
ROUTING_FILE = "routing.json"
"""The routing-head summary of the latest ``plateauscope.analysis.analyze`` call (with its settings), in
``ANALYSIS_DIR``; a sweep's ``clamp_head_of=routing`` reads its head."""
SERIES_FILE = "series.json"
"""An imported run's manifest (``plateauscope import``, :mod:`plateauscope.runs.series`): each external
checkpoint's step, file, SHA-256, format, architecture and tokenizer."""
SERIES_FORMAT = "plateauscope-series-v1"
"""The ``format`` tag of :data:`SERIES_FILE`."""
MODEL_CONFIG_DIR = "model"
"""Folder of an imported run holding the series' Hugging Face ``config.json`` (one model per series)."""
SUBMITIT_DIR = ".submitit"
"""submitit's folder of job files and logs, in a sweep's directory and in a sharded analysis's shards folder."""
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


def atomic_write(path: Path, write: Any, before_move: Any = None) -> None:
    """Call ``write(tmp_path)`` and move the result onto ``path`` in one rename (after calling
    ``before_move(tmp_path)``, if given). A full disk is a one-line RunError, and ``path`` is left
    as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise disk_error(path, e) from None
    os.close(fd)
    try:
        write(tmp)
        if before_move is not None:
            before_move(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise disk_error(path, e) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def disk_error(path: Path, e: OSError) -> Exception:
    """A full disk (or quota) while writing ``path`` as a one-line RunError; any other OSError as it is."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return RunError(f"{path}: the disk is full, so it was not written (every file is complete or absent); "
                        "free some space and run the same command again")
    return e


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file, then one rename)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def append_lines_atomic(path: Path, lines: list[str]) -> None:
    """Append whole lines (each without its newline) to a text file atomically: the file rewritten in one
    rename, a torn last line (a file cut short) dropped."""
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old = old.rsplit("\n", 1)[0] + "\n" if "\n" in old else ""
    write_text_atomic(path, old + "".join(line + "\n" for line in lines))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def save_checkpoint(path: Path, state_dict: dict[str, torch.Tensor], step: int) -> None:
    """Write weights as safetensors with the format tag and the step in the metadata, atomically.
    The same weights give the same bytes (:func:`_sorted_metadata`)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    blob = _sorted_metadata(save(tensors, metadata={"format": CHECKPOINT_FORMAT, "step": str(step)}))
    write_verified(path, lambda tmp: Path(tmp).write_bytes(blob))


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
    """Weights and step of one checkpoint, verified against the run's ``checksums.json``; any
    problem is a one-line RunError naming the file."""
    blob = read_verified(path)
    meta = read_checkpoint_metadata(path)
    try:
        return load(blob), int(meta["step"])
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise RunError(f"{path}: not a readable safetensors checkpoint ({_one_line(e)})") from None


def save_resume_state(path: Path, state: dict[str, Any]) -> None:
    """Write the resume state (tensors and plain types only) atomically, with its checksum."""
    write_verified(path, lambda tmp: torch.save(state, tmp))


def load_resume_state(path: Path) -> dict[str, Any]:
    """The resume state, verified and loaded with ``weights_only=True``; a one-line RunError if
    it is bad or unreadable."""
    blob = read_verified(path)
    try:
        return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means the same thing to the user
        raise RunError(f"{path}: cannot read the resume state ({_one_line(e)})") from None


# --- Checksums: every checkpoint and resume state, verified when it is read. ----------------------

def _run_dir_of(path: Path) -> tuple[Path, str]:
    """The run directory a checkpoint or resume state belongs to, and the file's key in ``checksums.json``."""
    path = Path(path)
    run_dir = path.parent.parent if path.parent.name == CHECKPOINT_DIR else path.parent
    return run_dir, path.relative_to(run_dir).as_posix()


def read_checksums(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    """``checksums.json``'s entries by file (None for a run written before checksums were kept)."""
    path = Path(run_dir) / CHECKSUMS_FILE
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != CHECKSUMS_FORMAT:
        raise RunError(f"{path}: not a checksum file of this toolkit")
    return data["files"]


def _write_checksums(run_dir: Path, files: dict[str, dict[str, Any]]) -> None:
    write_json_atomic(Path(run_dir) / CHECKSUMS_FILE, {"format": CHECKSUMS_FORMAT, "files": dict(sorted(files.items()))})


def file_digest(path: Path) -> dict[str, Any]:
    """A file's checksum entry: its SHA-256 (hex) and its size in bytes."""
    data = Path(path).read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _checksums_for_writing(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The entries to extend: those on disk, or, for a run written before checksums were kept, its
    existing checkpoints and resume states adopted as they are now (said in one line)."""
    files = read_checksums(run_dir)
    if files is not None:
        return files
    existing = verified_files(run_dir)
    if existing:
        log.info("%s: written before checksums were kept; adopting its %d checkpoint and resume files as they are "
                 "(%s)", run_dir, len(existing), CHECKSUMS_FILE)
    return {key: file_digest(run_dir / key) for key in existing}


def verified_files(run_dir: Path) -> list[str]:
    """The files of a run that ``checksums.json`` covers, as they are on disk (relative paths)."""
    run_dir = Path(run_dir)
    folder = run_dir / CHECKPOINT_DIR
    ckpts = sorted(f"{CHECKPOINT_DIR}/{p.name}" for p in folder.iterdir() if _CKPT_RE.match(p.name)) \
        if folder.is_dir() else []
    return ckpts + [name for name in (RESUME_FILE, PREVIOUS_RESUME_FILE) if (run_dir / name).is_file()]


def write_verified(path: Path, write: Any) -> None:
    """:func:`atomic_write` with the file's checksum: the new entry goes into ``checksums.json``
    (keeping the entry it replaces as ``previous``) before the file is moved into place, and
    ``previous`` is dropped after. A kill in between leaves the old file, which still verifies, or
    the new one."""
    run_dir, key = _run_dir_of(path)
    files = _checksums_for_writing(run_dir)
    old = files.get(key)

    def record(tmp: str) -> None:
        new = file_digest(Path(tmp))
        files[key] = {**new, "previous": {k: old[k] for k in ("sha256", "bytes")}} if old and old != new else new
        _write_checksums(run_dir, files)

    atomic_write(path, write, before_move=record)
    if "previous" in files[key]:
        files[key].pop("previous")
        _write_checksums(run_dir, files)


def forget_verified(run_dir: Path, keys: list[str]) -> None:
    """Drop the entries of files about to be deleted (before the deletion: a kill in between leaves
    an unlisted file, which the checkpoint policy deletes on the next run)."""
    files = read_checksums(run_dir)
    if files is not None and any(k in files for k in keys):
        _write_checksums(run_dir, {k: v for k, v in files.items() if k not in keys})


def check_file(path: Path, entry: dict[str, Any] | None, data: bytes | None = None) -> str | None:
    """What is wrong with ``path`` against its checksum entry (None: nothing): missing, truncated,
    altered or unlisted. ``data``: the file's bytes, when already read."""
    path = Path(path)
    if data is None:
        if not path.is_file():
            return "missing" if entry is not None else "no such file"
        data = path.read_bytes()
    if entry is None:
        return f"not in {CHECKSUMS_FILE} (not written by this run)"
    digest = hashlib.sha256(data).hexdigest()
    for version in (entry, entry.get("previous")):  # previous: the file a killed write left as it was
        if version and digest == version["sha256"] and len(data) == version["bytes"]:
            return None
    if len(data) < entry["bytes"]:
        return f"truncated ({len(data)} of {entry['bytes']} bytes)"
    return f"altered (its SHA-256 differs from the one in {CHECKSUMS_FILE})"


_unverified_noted: set[Path] = set()


def read_verified(path: Path) -> bytes:
    """A checkpoint's or resume state's bytes, checked against the run's ``checksums.json``; a
    missing, truncated or altered file is a one-line RunError naming it. A run without checksums
    is read as it is, with a one-line note (once per run)."""
    path = Path(path)
    run_dir, key = _run_dir_of(path)
    files = read_checksums(run_dir)
    if not path.is_file():
        raise RunError(f"{path}: missing (listed in {CHECKSUMS_FILE})" if files and key in files else
                       f"{path}: no such {'checkpoint' if path.suffix == '.safetensors' else 'resume state'} file")
    data = path.read_bytes()
    if files is None:
        if run_dir not in _unverified_noted:
            _unverified_noted.add(run_dir)
            log.info("%s: no %s (written before checksums were kept): its files are read unverified",
                     run_dir, CHECKSUMS_FILE)
        return data
    problem = check_file(path, files.get(key), data)
    if problem:
        raise RunError(f"{path}: {problem}")
    return data


def verify_run(run_dir: Path) -> list[tuple[str, str]]:
    """Every problem of a run's checkpoints and resume states, as (file, what is wrong), in one pass:
    listed files that are missing, truncated or altered, and files that are not listed. A run
    without ``checksums.json`` is one problem."""
    run_dir = Path(run_dir)
    files = read_checksums(run_dir)
    if files is None:
        return [(CHECKSUMS_FILE, "missing: the run was written before checksums were kept, so it cannot be verified")]
    keys = sorted(set(files) | set(verified_files(run_dir)))
    return [(key, problem) for key in keys if (problem := check_file(run_dir / key, files.get(key)))]


# --- One writer per folder. ------------------------------------------------------------------

_held_locks: dict[Path, int] = {}


@contextlib.contextmanager
def writer_lock(path: Path, what: str, wait: bool = True) -> Iterator[None]:
    """Hold the lock file ``path`` (``fcntl.flock``) while writing ``what``: one writer at a time.
    A second writer waits, saying so in one line, or with ``wait=False`` raises a one-line
    RunError. The kernel releases the lock when its process exits, even on a crash or kill -9.
    Re-entrant within a process. Readers take no lock: every write is one atomic rename. A folder
    that the lock created and nothing else was written to is removed again (bad input leaves none)."""
    path = Path(path).resolve()
    if path in _held_locks:
        _held_locks[path] += 1
        try:
            yield
        finally:
            _held_locks[path] -= 1
        return
    created = not path.parent.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise disk_error(path, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            if not wait:
                raise RunError(f"{path.parent}: {what} is being written by {holder}; not waiting (--no-wait)") from None
            log.warning("%s: %s is being written by %s; waiting for it to finish", path.parent, what, holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        _held_locks[path] = 1
        try:
            yield
        finally:
            del _held_locks[path]
    finally:
        os.close(fd)  # releases the lock
        if created and [p.name for p in path.parent.iterdir()] == [path.name]:  # nothing written: leave no folder
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()


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
    optimizer_layout: str = "hooked"
    """Whose parameter order and layout ``optimizer`` follows: HookedTransformer's (``hooked``, every
    state written now: it resumes on either backend), or ``bridge`` (states the bridge wrote before)."""
    machines: list[dict] = field(default_factory=list)
    """The machines that trained the run so far (``plateauscope.runs.machine.machine_record``), in order;
    empty for resume states written before they were recorded."""


def resume_state_file(out: Path) -> Path | None:
    """The resume state a run continues from: ``resume.pt``, or ``resume.prev.pt`` when a kill left
    no ``resume.pt`` (said in one line); None for a fresh start."""
    for name in (RESUME_FILE, PREVIOUS_RESUME_FILE):
        if (Path(out) / name).is_file():
            if name == PREVIOUS_RESUME_FILE:
                log.info("%s: no %s; resuming from %s", out, RESUME_FILE, name)
            return Path(out) / name
    return None


def load_resume_point(out: Path, max_steps: int) -> ResumePoint | None:
    """The state to resume the run in ``out`` from, or None when it has none (a fresh start). A bad
    resume state, or a bad checkpoint of its step, refuses in one line that says which good state
    the run could resume from instead."""
    resume_path = resume_state_file(out)
    if resume_path is None:
        return None
    try:
        state = load_resume_state(resume_path)
        step = int(state["step"])
        weights, _ = load_checkpoint(out / CHECKPOINT_DIR / checkpoint_name(step))
    except RunError as e:
        raise RunError(f"{e}; refusing to resume from it: {_fallback(out, resume_path)}") from None
    summary_path = out / SUMMARY_FILE
    # a finished run's summary describes its last resume state, not the one before it
    complete = step >= max_steps or (resume_path.name == RESUME_FILE and summary_path.exists()
                                     and bool(read_json(summary_path).get("complete")))
    return ResumePoint(step=step, weights=weights, optimizer=state["optimizer"], data_gen=state["data_gen"],
                       perm=state["perm"], cursor=int(state["cursor"]), wall_s=float(state["wall_s"]),
                       torch_rng=state["torch_rng"], complete=complete, backend=str(state.get("backend", "hooked")),
                       optimizer_layout=str(state.get("optimizer_layout", state.get("backend", "hooked"))),
                       machines=list(state.get("machines", [])),
                       records=[r for r in read_jsonl(out / METRICS_FILE)
                                if r["step"] < step or (complete and r["step"] == step)])


def _fallback(out: Path, bad: Path) -> str:
    """Where a run whose resume state ``bad`` is unusable can resume from, in words."""
    previous = Path(out) / PREVIOUS_RESUME_FILE
    if bad.name == RESUME_FILE and previous.is_file():
        try:
            step = int(load_resume_state(previous)["step"])
            load_checkpoint(Path(out) / CHECKPOINT_DIR / checkpoint_name(step))
            return f"{previous} (step {step}) is good; delete {bad} to resume from there"
        except (RunError, KeyError, ValueError):
            pass
    return "no good resume state is left; train again into a new --out"


def save_checkpoint_and_state(out: Path, step: int, weights: dict[str, torch.Tensor], optimizer: dict | None,
                              data_gen: torch.Generator, perm: torch.Tensor, cursor: int, wall_s: float,
                              backend: str = "hooked", machines: list[dict] | None = None) -> None:
    """Checkpoint the weights (HookedTransformer layout); at a resume point (an ``optimizer`` state
    given, not None, in HookedTransformer's parameter order and layout), also write the state needed to
    resume exactly from here, with the backend that trained and the machines that trained the run so far."""
    save_checkpoint(out / CHECKPOINT_DIR / checkpoint_name(step), weights, step)
    if optimizer is not None:
        _keep_previous_resume_state(out)
        save_resume_state(out / RESUME_FILE, {
            "step": step, "optimizer": optimizer, "data_gen": data_gen.get_state(), "perm": perm, "cursor": cursor,
            "wall_s": wall_s, "torch_rng": torch.get_rng_state(), "backend": backend, "optimizer_layout": "hooked",
            "machines": machines or []})


def _keep_previous_resume_state(out: Path) -> None:
    """Move ``resume.pt`` onto ``resume.prev.pt``, checksum first (the entry it replaces kept as
    ``previous`` until the move is done), so that every kill leaves files that verify."""
    current, previous = out / RESUME_FILE, out / PREVIOUS_RESUME_FILE
    if not current.is_file():
        return
    files = _checksums_for_writing(out)
    entry, old = files.get(RESUME_FILE), files.get(PREVIOUS_RESUME_FILE)
    if entry is not None:
        files[PREVIOUS_RESUME_FILE] = {**entry, "previous": {k: old[k] for k in ("sha256", "bytes")}} if old else entry
        _write_checksums(out, files)
    try:
        os.replace(current, previous)
    except OSError as e:
        raise disk_error(previous, e) from None
    files[PREVIOUS_RESUME_FILE] = entry if entry is not None else file_digest(previous)
    _write_checksums(out, {k: v for k, v in files.items() if k != RESUME_FILE})


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
