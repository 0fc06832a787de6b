"""Step revisions of a model in the local Hugging Face hub cache: ``hf-cache:ORG/NAME``.

Pythia names its training checkpoints' branches ``stepN`` (``step1000``), OLMo ``stepN-tokensM``
(``step1000-tokens4B``, or ``stage1-step1000-tokens4B``); the step is N. Nothing is fetched: the cache
is read as it lies on disk, the layout ``huggingface_hub`` writes::

    $HF_HUB_CACHE/models--ORG--NAME/refs/<revision>        (a file holding a commit hash)
    $HF_HUB_CACHE/models--ORG--NAME/snapshots/<hash>/      (config.json, model.safetensors or
                                                            pytorch_model.bin, tokenizer files; links into blobs/)

The cache folder is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``huggingface_hub``'s default
(``~/.cache/huggingface/hub``), read when the source is read. Revisions whose names hold no step
(``main``) are left out unless named; a named revision the cache lacks is a one-line SourceError that
lists the ones it has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
import re
from pathlib import Path

from plateauscope.sources.found import FoundCheckpoint, SourceError, read_source_json
from plateauscope.sources.hf_folder import TOKENIZER_FILES, WEIGHT_FILES

PREFIX = "hf-cache:"
"""How a source names a model in the Hugging Face cache: ``hf-cache:EleutherAI/pythia-70m``."""
STEP_REVISION = re.compile(r"^(?:[A-Za-z0-9_]+-)*step(\d+)(?:-tokens\d+[A-Za-z]*)?$")
"""A step revision's name: ``step1000`` (Pythia), ``step1000-tokens4B`` (OLMo), ``stage1-step1000-tokens4B``
(OLMo 2); group 1 is the step."""
LISTED = 10
"""Revision names a message lists in full; a longer listing shows its ends and its length."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_hf_cache_source(source: str | Path) -> bool:
    """Whether a source names a model in the Hugging Face cache (``hf-cache:ORG/NAME``)."""
    return str(source).startswith(PREFIX)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` finds it, read from the environment now
    (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``huggingface_hub.constants.HF_HUB_CACHE``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def revision_step(revision: str) -> int | None:
    """The step a revision's name holds (``step1000`` and ``step1000-tokens4B`` -> 1000), or None."""
    match = STEP_REVISION.match(revision)
    return int(match.group(1)) if match else None


def cached_revisions(repo_folder: Path) -> dict[str, str]:
    """Revision name -> commit hash, from ``refs/`` of a cached model's folder (nested names like
    ``refs/pr/1`` kept whole)."""
    refs = repo_folder / "refs"
    if not refs.is_dir():
        return {}
    return {p.relative_to(refs).as_posix(): p.read_text().strip() for p in sorted(refs.rglob("*")) if p.is_file()}


def _by_step_order(revisions: list[str]) -> list[str]:
    """Revision names, step revisions first in step order, the others after by name."""
    return sorted(revisions, key=lambda r: (revision_step(r) is None, revision_step(r) or 0, r))


def read_snapshot(name: str, revision: str, snapshot: Path, step: int) -> FoundCheckpoint:
    """One revision's snapshot folder as a checkpoint; a snapshot with no config or weights (not
    downloaded, or sharded) is a one-line SourceError."""
    if not (snapshot / "config.json").is_file():
        raise SourceError(f"{name}: revision {revision} has no config.json in the local Hugging Face cache "
                          f"({snapshot})")
    weights = [(snapshot / file, fmt) for file, fmt in WEIGHT_FILES if (snapshot / file).is_file()]
    if not weights:
        sharded = any(snapshot.glob("*.index.json"))
        raise SourceError(f"{name}: revision {revision} has no " + ("single weights file (its weights are sharded, "
                          "which import does not read)" if sharded else "model.safetensors or pytorch_model.bin")
                          + f" in the local Hugging Face cache ({snapshot})")
    file, fmt = weights[0]
    tokenizer = snapshot if any((snapshot / t).is_file() for t in TOKENIZER_FILES) else None
    return FoundCheckpoint(step, file, fmt, read_source_json(snapshot / "config.json"), snapshot / "config.json", tokenizer)


def read_hf_cache(source: str, revisions: list[str] | None = None) -> list[FoundCheckpoint]:
    """The step revisions of ``hf-cache:ORG/NAME`` in the local cache (``revisions``: these only, each
    of which must be there), in step order. Nothing is downloaded. Two revisions of one step are a
    SourceError (name the ones to import with ``revisions``)."""
    name = source[len(PREFIX):] if is_hf_cache_source(source) else source
    if not _REPO_ID.match(name):
        raise SourceError(f"{source}: name a model as hf-cache:ORG/NAME (e.g. hf-cache:EleutherAI/pythia-70m)")
    cache = hub_cache_dir()
    repo_folder = cache / f"models--{name.replace('/', '--')}"
    have = cached_revisions(repo_folder)
    if not have:
        raise SourceError(f"{name}: not in the local Hugging Face cache ({cache}); download its step revisions "
                          "first (e.g. huggingface-cli download --revision step1000), or set HF_HUB_CACHE")
    where = f"in the local Hugging Face cache ({repo_folder})"
    return [read_snapshot(name, revision, repo_folder / "snapshots" / have[revision], revision_step(revision) or 0)
            for revision in choose_revisions(name, have, revisions, where)]


def listing(names: list[str]) -> str:
    """Revision names for a one-line message: all of them, or the ends of a long list and its length."""
    if len(names) <= LISTED:
        return ", ".join(names) or "none"
    return f"{', '.join(names[:5])}, ..., {', '.join(names[-3:])} ({len(names)} in all)"


def choose_revisions(label: str, have: Iterable[str], revisions: list[str] | None, where: str) -> list[str]:
    """The step revisions to import, in step order: ``revisions`` (each among ``have`` and holding a step), else
    every step revision of ``have``; two of one step are a SourceError. ``label`` names the model and ``where``
    the place the revisions are looked for in the one-line errors (``on the hub (URL)``)."""
    steps_have = [r for r in _by_step_order(list(have)) if revision_step(r) is not None]
    if revisions is None:
        wanted = steps_have
        if not wanted:
            raise SourceError(f"{label}: no step revisions (stepN or stepN-tokensM) {where}; it has: "
                              f"{listing(sorted(have))}")
    else:
        wanted = list(dict.fromkeys(revisions))
        absent = [r for r in wanted if r not in have]
        if absent:
            one = len(absent) == 1
            raise SourceError(f"{label}: revision{'' if one else 's'} {', '.join(absent)} {'is' if one else 'are'} "
                              f"not {where}; it has: {listing(steps_have)}")
        stepless = [r for r in wanted if revision_step(r) is None]
        if stepless:
            raise SourceError(f"{label}: revision {stepless[0]} has no step in its name (stepN or stepN-tokensM)")
    by_step: dict[int, str] = {}
    for revision in wanted:
        step = revision_step(revision)
        assert step is not None
        if step in by_step:
            raise SourceError(f"{label}: revisions {by_step[step]} and {revision} are both step {step}; "
                              "name the ones to import with --revisions")
        by_step[step] = revision
    return [by_step[s] for s in sorted(by_step)]


def parse_revisions(text: str | None) -> list[str] | None:
    """``--revisions step0,step1000`` as a list (None: not given); an empty list is a SourceError."""
    if text is None:
        return None
    revisions = [r.strip() for r in text.split(",") if r.strip()]
    if not revisions:
        raise SourceError(f"--revisions must name at least one revision (e.g. step0,step1000), got {text!r}")
    return revisions
