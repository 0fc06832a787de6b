"""A folder of Hugging Face checkpoints: Trainer's ``checkpoint-N/`` or any subfolders (or the folder itself)
holding ``config.json`` with ``model.safetensors`` or ``pytorch_model.bin``.

The step of a checkpoint is ``global_step`` in its ``trainer_state.json``, or else the last number in its
folder's name (``checkpoint-1200``, ``step_300``); a folder with neither is a one-line SourceError.
"""

from __future__ import annotations

import re
from pathlib import Path

from plateauscope.sources.found import FoundCheckpoint, SourceError, read_source_json

WEIGHT_FILES = (("model.safetensors", "safetensors"), ("pytorch_model.bin", "torch"))
"""The weights file of a checkpoint folder, by preference, and its format."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def is_checkpoint_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a Hugging Face checkpoint (``config.json`` and a weights file, or a sharded
    index, which is refused later with its name)."""
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name, _ in WEIGHT_FILES)


def folder_step(folder: Path) -> int:
    """The checkpoint's step: ``trainer_state.json``'s ``global_step``, else the last number in the folder's name."""
    state = folder / "trainer_state.json"
    if state.is_file():
        step = read_source_json(state).get("global_step")
        if isinstance(step, int) and step >= 0:
            return step
        raise SourceError(f"{state}: no global_step (an integer) to read the step from")
    match = _NUMBER.search(folder.name)
    if match is None:
        raise SourceError(f"{folder}: cannot read its step (no trainer_state.json, no number in the folder's name)")
    return int(match.group(1))


def read_checkpoint_folder(folder: Path) -> FoundCheckpoint:
    """One checkpoint folder."""
    file, fmt = next((folder / name, fmt) for name, fmt in WEIGHT_FILES if (folder / name).is_file())
    tokenizer = folder if any((folder / name).is_file() for name in TOKENIZER_FILES) else None
    return FoundCheckpoint(folder_step(folder), file, fmt, read_source_json(folder / "config.json"),
                           folder / "config.json", tokenizer)


def read_hf_folder(source: Path) -> list[FoundCheckpoint]:
    """Every checkpoint under ``source`` (its subfolders, or ``source`` itself), in step order; two folders
    with one step are a SourceError."""
    folders = sorted(p for p in source.rglob("*") if p.is_dir() and is_checkpoint_folder(p))
    if is_checkpoint_folder(source):
        folders.insert(0, source)
    found = [read_checkpoint_folder(f) for f in folders]
    by_step: dict[int, FoundCheckpoint] = {}
    for c in found:
        if c.step in by_step:
            raise SourceError(f"{c.file.parent}: step {c.step} again (also {by_step[c.step].file.parent}); "
                              "the steps cannot be read")
        by_step[c.step] = c
    return [by_step[s] for s in sorted(by_step)]
