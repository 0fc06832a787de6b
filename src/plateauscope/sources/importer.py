"""``plateauscope import``: a checkpoint series written elsewhere, checked and written as an imported run.

Every chosen checkpoint is read once and hashed (SHA-256), and its tensors' names and shapes are checked
against the series' one model (a safetensors file's from its header, its length against the header; any
other file decoded without unpickling code), so that a truncated file, a ``.pt`` that needs code, weights
that do not fit the config and a folder that mixes architectures are one-line SourceErrors before anything
is written. Two steps with identical weights get a warning naming both (a step revision that serves another
step's files). The run directory (:mod:`plateauscope.runs.series`) is written at the end in one rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from plateauscope.model.backend import BackendError, boot_causal_lm, check_causal_lm_shapes, supported_causal_lms
from plateauscope.runs.files import RunError
from plateauscope.runs.series import SeriesCheckpoint, weight_shapes, write_series
from plateauscope.sources.found import FoundCheckpoint, SourceError
from plateauscope.sources.hf_cache import is_hf_cache_source, read_hf_cache
from plateauscope.sources.hf_folder import read_hf_folder
from plateauscope.sources.nanogpt import nanogpt_files, read_nanogpt
from plateauscope.sources.selection import select_steps
from plateauscope.sources.tl_checkpoint import is_transformer_lens_source, read_transformer_lens

log = logging.getLogger(__name__)

_NOT_THE_MODEL = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "_commit_hash"}
"""Config fields that do not change the model (they differ between checkpoints of one series)."""


@dataclass
class ImportResult:
    """What ``plateauscope import`` wrote."""

    path: Path
    steps: list[int]
    architecture: str
    tokenizer: str | None
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    """Pairs of steps whose weights are identical (same SHA-256)."""


def find_checkpoints(source: str | Path, revisions: list[str] | None = None) -> list[FoundCheckpoint]:
    """The checkpoints of a source: a folder of Hugging Face checkpoints, nanoGPT ``.pt`` files, TransformerLens
    state dicts (:mod:`plateauscope.sources.tl_checkpoint`), or ``hf-cache:ORG/NAME``, the step revisions of a
    model in the local Hugging Face cache (``revisions``: these only; :mod:`plateauscope.sources.hf_cache`)."""
    if is_hf_cache_source(source):
        return read_hf_cache(str(source), revisions)
    if revisions is not None:
        raise SourceError(f"--revisions names revisions of a model in the Hugging Face cache (hf-cache:ORG/NAME), "
                          f"not of {source}")
    source = Path(source)
    if not source.exists():
        raise SourceError(f"{source}: no such file or folder")
    if is_transformer_lens_source(source):
        return read_transformer_lens(source)
    if source.is_file() or (nanogpt_files(source) and not (source / "config.json").is_file()
                            and not any(source.rglob("config.json"))):
        if source.suffix != ".pt" and source.is_file():
            raise SourceError(f"{source}: not a checkpoint folder or a nanoGPT .pt file")
        return read_nanogpt(source)
    found = read_hf_folder(source)
    if not found:
        raise SourceError(f"{source}: no checkpoints found (a folder of Hugging Face checkpoints with config.json and "
                          "model.safetensors or pytorch_model.bin, or nanoGPT .pt files)")
    return found


def model_fields(config: dict) -> dict:
    """The fields of a Hugging Face config that make the model."""
    return {k: v for k, v in config.items() if k not in _NOT_THE_MODEL}


def check_one_model(found: list[FoundCheckpoint]) -> None:
    """Every checkpoint of one architecture and shape, and that architecture supported."""
    first = found[0]
    for c in found[1:]:
        if model_fields(c.hf_config) != model_fields(first.hf_config):
            what = (f"{first.architecture} and {c.architecture}" if c.architecture != first.architecture
                    else "models of different configs")
            raise SourceError(f"{c.config_file}: the series mixes architectures ({what}; first {first.config_file})")
    supported = supported_causal_lms()
    if first.architecture not in supported:
        families = "GPT-2, GPT-NeoX (Pythia), GPT-J, Llama, Mistral, Qwen, OLMo, Gemma, Phi, OPT and their kin"
        raise SourceError(f"{first.config_file}: architecture {first.architecture} is not supported: the analyses "
                          f"need a decoder-only causal attention language model that TransformerLens 4's bridge "
                          f"loads ({families}; {len(supported)} architectures), not an encoder or a state-space model")


def import_series(source: str | Path, out: str | Path, every: int = 1, steps: list[int] | None = None,
                  log_spaced: int | None = None, device: str = "cpu",
                  progress: Callable[[int, int], None] | None = None,
                  revisions: list[str] | None = None) -> ImportResult:
    """Import the chosen checkpoints of ``source`` as a run directory at ``out`` (files not copied).

    ``progress(i, n)``: called after each checkpoint is checked (a progress bar); ``revisions``: with
    ``hf-cache:ORG/NAME``, the revisions to import. Raises SourceError or RunError (one line) and writes
    nothing on bad input."""
    source = str(source) if is_hf_cache_source(source) else Path(source).resolve()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SourceError(f"{out}: already exists; --out must be a new (or empty) folder")
    found = find_checkpoints(source, revisions)
    chosen = set(select_steps([c.step for c in found], every, steps, log_spaced, str(source)))
    found = [c for c in found if c.step in chosen]
    check_one_model(found)  # of the chosen ones: a foreign or broken checkpoint left out does not block the rest
    first = found[0]
    shapes: dict[int, dict[str, tuple[int, ...]]] = {}
    for c in found:  # the quick checks, before the long pass (a safetensors file's header only)
        try:
            shapes[c.step] = weight_shapes(c.file, c.format, hf_config=c.hf_config)
        except RunError as e:
            raise SourceError(str(e)) from None
    with tempfile.TemporaryDirectory() as config_dir:
        (Path(config_dir) / "config.json").write_text(json.dumps(first.hf_config))
        try:
            model = boot_causal_lm(config_dir, device, str(first.tokenizer) if first.tokenizer else None)
        except (OSError, ValueError, KeyError) as e:
            if isinstance(e, BackendError):
                raise
            raise SourceError(f"{first.config_file}: the model cannot be built ({' '.join(str(e).split())[:200]})") from None
    written: list[SeriesCheckpoint] = []
    by_hash: dict[str, int] = {}
    duplicates: list[tuple[int, int]] = []
    notes: list[str] = []
    for i, c in enumerate(found):
        try:
            data = c.file.read_bytes()
        except OSError as e:
            raise SourceError(f"{c.file}: cannot be read ({e.strerror})") from None
        digest = hashlib.sha256(data).hexdigest()
        try:  # the names and shapes fit the model
            check_causal_lm_shapes(model, shapes[c.step])
        except BackendError as e:
            raise SourceError(f"{c.file}: {e}") from None
        if digest in by_hash:
            duplicates.append((by_hash[digest], c.step))
            notes.append(f"steps {by_hash[digest]} and {c.step} have identical weights (SHA-256 {digest[:12]}...): "
                         "one of them serves the other's files")
        by_hash.setdefault(digest, c.step)
        written.append(SeriesCheckpoint(c.step, str(c.file.resolve()), digest, len(data), c.format, c.architecture,
                                        str(c.tokenizer.resolve()) if c.tokenizer else None))
        if progress is not None:
            progress(i + 1, len(found))
    for note in notes:
        log.warning("%s: %s", source, note)
    try:
        path = write_series(out, written, first.hf_config, str(source), notes)
    except RunError as e:
        raise SourceError(str(e)) from None
    return ImportResult(path, [w.step for w in written], first.architecture, written[0].tokenizer, duplicates)
