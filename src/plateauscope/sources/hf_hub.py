"""Step revisions of a model on the Hugging Face hub: ``hf:ORG/NAME``, imported from the hub's listing and
fetched just in time.

``plateauscope import hf:ORG/NAME`` reads the hub and downloads no weights: the repository's branches and tags
(step revisions named as :data:`plateauscope.sources.hf_cache.STEP_REVISION` says), each chosen revision's
files with their sizes and the SHA-256 the hub lists for LFS files, its ``config.json``, each weights file's
safetensors header (a Range request: its tensors checked against the model) and, from the last revision, the
tokenizer's files, copied into ``RUN/model/``. The manifest names each checkpoint's repository, revision and
commit, and the file where ``huggingface_hub``'s cache puts it.

``plateauscope analyze`` reads such a run through a :class:`HubFetcher`: each checkpoint is fetched by its
commit with ``huggingface_hub.hf_hub_download`` when its weights are read (a step whose analysis is cached is
never read), its bytes checked against the listed SHA-256, and with ``keep`` the cache holds at most that
many of the series' revisions (the least recently read evicted before a fetch, their snapshots and the
blobs no other snapshot links to). Offline (``HF_HUB_OFFLINE=1``) only the cache is read, and a revision it
lacks is one line naming every revision of the series that it lacks.

The hub is ``$HF_ENDPOINT`` (else ``huggingface_hub``'s), the cache ``$HF_HUB_CACHE`` (else ``$HF_HOME/hub``),
both read when the source is read. Every failure (no such model or revision, the network, a file whose bytes
differ from the listing, a full disk) is a one-line SourceError; nothing partial is kept, so a rerun resumes.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from plateauscope.model.backend import BackendError, boot_causal_lm, check_causal_lm_shapes
from plateauscope.runs.files import MODEL_CONFIG_DIR, RunError
from plateauscope.runs.series import ImportedSeries, SeriesCheckpoint, file_sha256, is_imported, write_series
from plateauscope.sources.found import FoundCheckpoint, SourceError, read_source_json
from plateauscope.sources.hf_cache import _REPO_ID, choose_revisions, hub_cache_dir, listing, revision_step
from plateauscope.sources.hf_folder import TOKENIZER_FILES, WEIGHT_FILES
from plateauscope.sources.importer import ImportResult, check_one_model
from plateauscope.sources.selection import select_steps

PREFIX = "hf:"
"""How a source names a model on the Hugging Face hub: ``hf:EleutherAI/pythia-70m``."""
TOKENIZER_COPIED = (*TOKENIZER_FILES, "merges.txt", "special_tokens_map.json", "added_tokens.json")
"""The tokenizer's files copied from the last revision into ``RUN/model/`` (those it has)."""


def is_hub_source(source: str | os.PathLike) -> bool:
    """Whether a source names a model on the Hugging Face hub (``hf:ORG/NAME``)."""
    return str(source).startswith(PREFIX)


def hub_endpoint() -> str:
    """The hub's address: ``$HF_ENDPOINT`` read now, else ``huggingface_hub``'s."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Whether the hub must not be asked: ``$HF_HUB_OFFLINE`` read now, or ``huggingface_hub``'s own switch."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"} or constants.is_offline_mode()


@contextmanager
def hub_errors(name: str, what: str) -> Iterator[None]:
    """Turn what the hub client raises while doing ``what`` into a one-line SourceError naming the model."""
    import httpx2
    from huggingface_hub.errors import (
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        SafetensorsParsingError,
    )

    try:
        yield
    except RepositoryNotFoundError:
        raise SourceError(f"hf:{name}: no such model on the hub ({hub_endpoint()}), or it is private or gated "
                          "(log in with hf auth login)") from None
    except RevisionNotFoundError:
        raise SourceError(f"hf:{name}: {what}: the revision is not on the hub ({hub_endpoint()})") from None
    except RemoteEntryNotFoundError:
        raise SourceError(f"hf:{name}: {what}: the file is not on the hub ({hub_endpoint()})") from None
    except SafetensorsParsingError:
        raise SourceError(f"hf:{name}: {what}: not a safetensors file (its header cannot be read)") from None
    except OfflineModeIsEnabled:
        raise SourceError(f"hf:{name}: {what}: HF_HUB_OFFLINE is set and the local Hugging Face cache "
                          f"({hub_cache_dir()}) lacks it") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SourceError(f"hf:{name}: {what}: no space left on the disk of the Hugging Face cache "
                              f"({hub_cache_dir()}); free some (or analyse with a smaller --keep) and run again; "
                              "what was analysed is kept") from None
        raise SourceError(f"hf:{name}: {what}: {' '.join(str(e).split())[:300]}") from None
    except httpx2.HTTPError as e:  # the network: refused, timed out, closed too often mid-file
        raise SourceError(f"hf:{name}: {what}: cannot reach the hub at {hub_endpoint()} ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}); run again to resume") from None


def _api() -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_endpoint())


def _download(name: str, filename: str, commit: str, progress: bool = False) -> Path:
    """One file of a commit into the Hugging Face cache (``huggingface_hub.hf_hub_download``; offline: the cache
    only), its path there."""
    from huggingface_hub import hf_hub_download

    kwargs: dict[str, Any] = {} if progress else {"tqdm_class": _NoBar}
    return Path(hf_hub_download(name, filename, revision=commit, cache_dir=hub_cache_dir(), endpoint=hub_endpoint(),
                                local_files_only=hub_offline(), **kwargs))


class _NoBar(tqdm):  # type: ignore[misc]
    """A download's progress bar, switched off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "disable": True})


def cache_path(name: str, commit: str, filename: str) -> Path:
    """Where ``huggingface_hub``'s cache puts ``filename`` of a commit: ``models--ORG--NAME/snapshots/<commit>/``."""
    return hub_cache_dir() / f"models--{name.replace('/', '--')}" / "snapshots" / commit / filename


def hub_revisions(name: str) -> dict[str, str]:
    """Revision name -> commit of the repository's branches and tags on the hub."""
    with hub_errors(name, "listing its revisions"):
        refs = _api().list_repo_refs(name)
    return {r.name: r.target_commit for r in [*refs.branches, *refs.tags]}


@dataclass(frozen=True)
class HubRevision:
    """One revision's weights file as the hub lists it, before anything of it is downloaded."""

    revision: str
    step: int
    commit: str
    filename: str
    format: str
    sha256: str
    size: int
    files: tuple[str, ...]
    """Every file of the revision."""


def read_revision(name: str, revision: str, commit: str) -> HubRevision:
    """The hub's listing of one revision (``model_info`` with its files' metadata): its weights file, by
    :data:`WEIGHT_FILES` preference, with the size and SHA-256 of its LFS pointer. A revision without a single
    weights file, or whose weights file the hub lists without a SHA-256, is a one-line SourceError."""
    with hub_errors(name, f"revision {revision}"):
        info = _api().model_info(name, revision=commit, files_metadata=True)
    siblings = {s.rfilename: s for s in info.siblings or []}
    weights = [(file, fmt) for file, fmt in WEIGHT_FILES if file in siblings]
    if not weights:
        sharded = any(f.endswith(".index.json") for f in siblings)
        raise SourceError(f"hf:{name}: revision {revision} has no " + ("single weights file (its weights are sharded, "
                          "which import does not read)" if sharded else "model.safetensors or pytorch_model.bin"))
    if "config.json" not in siblings:
        raise SourceError(f"hf:{name}: revision {revision} has no config.json")
    file, fmt = weights[0]
    lfs = siblings[file].lfs
    if lfs is None:
        raise SourceError(f"hf:{name}: revision {revision}: the hub lists {file} without a SHA-256 (not an LFS file), "
                          "so it cannot be checked when fetched")
    step = revision_step(revision)
    assert step is not None
    return HubRevision(revision, step, info.sha or commit, file, fmt, lfs.sha256, int(lfs.size), tuple(siblings))


def remote_shapes(name: str, rev: HubRevision) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of a revision's safetensors file, from its header alone (Range requests);
    a header that is not one, or names more data than the listed size, is a one-line SourceError."""
    with hub_errors(name, f"revision {rev.revision} ({rev.filename}'s header)"):
        meta = _api().parse_safetensors_file_metadata(name, rev.filename, revision=rev.commit)
    end = max((t.data_offsets[1] for t in meta.tensors.values()), default=0)
    if 8 + end > rev.size:  # the header's own length is not returned: its data at least must fit the size
        raise SourceError(f"hf:{name}: revision {rev.revision}: {rev.filename}'s header names {end} bytes of data, "
                          f"the hub lists {rev.size} bytes")
    return {k: tuple(t.shape) for k, t in meta.tensors.items()}


def import_hub(source: str, out: str | Path, every: int = 1, steps: list[int] | None = None,
               log_spaced: int | None = None, device: str = "cpu",
               progress: Callable[[int, int], None] | None = None,
               revisions: list[str] | None = None) -> ImportResult:
    """Import the chosen step revisions of ``hf:ORG/NAME`` as a run directory at ``out`` from the hub's listing
    (module docstring): ``revisions`` (these only), then ``every`` / ``steps`` / ``log_spaced`` as for any series
    (:func:`plateauscope.sources.selection.select_steps`). ``progress(i, n)``: after each revision is read. No
    weights are downloaded; raises a one-line SourceError and writes nothing on bad input."""
    name = source[len(PREFIX):] if is_hub_source(source) else source
    if not _REPO_ID.match(name):
        raise SourceError(f"{source}: name a model as hf:ORG/NAME (e.g. hf:EleutherAI/pythia-70m)")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SourceError(f"{out}: already exists; --out must be a new (or empty) folder")
    if hub_offline():
        raise SourceError(f"hf:{name}: HF_HUB_OFFLINE is set, and import hf: reads the hub's listing; import the "
                          f"revisions already in the cache with hf-cache:{name}")
    have = hub_revisions(name)
    wanted = {revision_step(r): r for r in choose_revisions(f"hf:{name}", have, revisions, f"on the hub ({hub_endpoint()})")}
    chosen = select_steps(sorted(wanted), every, steps, log_spaced, f"hf:{name}")
    listed: list[HubRevision] = []
    found: list[FoundCheckpoint] = []
    for i, step in enumerate(chosen):
        rev = read_revision(name, wanted[step], have[wanted[step]])
        with hub_errors(name, f"revision {rev.revision} (config.json)"):
            config = _download(name, "config.json", rev.commit)
        listed.append(rev)
        found.append(FoundCheckpoint(step, cache_path(name, rev.commit, rev.filename), rev.format,
                                     read_source_json(config), config))
        if progress is not None:
            progress(i + 1, len(chosen))
    check_one_model(found)
    last = listed[-1]
    tokenizer: dict[str, bytes] = {}
    for file in (f for f in TOKENIZER_COPIED if f in last.files):
        with hub_errors(name, f"revision {last.revision} ({file})"):
            tokenizer[file] = _download(name, file, last.commit).read_bytes()
    out_model = out.resolve() / MODEL_CONFIG_DIR
    with tempfile.TemporaryDirectory() as folder:  # the weights' names and shapes fit the model
        (Path(folder) / "config.json").write_text(json.dumps(found[0].hf_config))
        for file, data in tokenizer.items():
            (Path(folder) / file).write_bytes(data)
        try:
            model = boot_causal_lm(folder, device, folder if tokenizer else None)
        except (OSError, ValueError, KeyError) as e:
            if isinstance(e, BackendError):
                raise
            raise SourceError(f"{found[0].config_file}: the model cannot be built "
                              f"({' '.join(str(e).split())[:200]})") from None
    for rev in listed:
        if rev.format == "safetensors":
            try:
                check_causal_lm_shapes(model, remote_shapes(name, rev))
            except BackendError as e:
                raise SourceError(f"hf:{name}: revision {rev.revision} ({rev.filename}): {e}") from None
    by_hash: dict[str, int] = {}
    duplicates: list[tuple[int, int]] = []
    notes: list[str] = []
    written = []
    for rev, c in zip(listed, found):
        if rev.sha256 in by_hash:
            duplicates.append((by_hash[rev.sha256], rev.step))
            notes.append(f"steps {by_hash[rev.sha256]} and {rev.step} have identical weights (SHA-256 "
                         f"{rev.sha256[:12]}...): one of them serves the other's files")
        by_hash.setdefault(rev.sha256, rev.step)
        written.append(SeriesCheckpoint(rev.step, str(c.file), rev.sha256, rev.size, rev.format, c.architecture,
                                        str(out_model) if tokenizer else None, name, rev.revision, rev.commit))
    try:
        path = write_series(out, written, found[0].hf_config, f"{PREFIX}{name}", notes, tokenizer)
    except RunError as e:
        raise SourceError(str(e)) from None
    return ImportResult(path, [w.step for w in written], found[0].architecture, written[0].tokenizer, duplicates)


def is_hub_series(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is an imported run whose checkpoints come from the hub (``import hf:``)."""
    return is_imported(run_dir) and any(c.remote for c in ImportedSeries(run_dir).checkpoints.values())


def analysis_fetch(run_dir: str | Path, keep: int | None = None, progress: bool = False
                   ) -> tuple[HubFetcher | None, Callable[..., HubFetcher] | None]:
    """How an analysis reads an imported series' weights: for a series imported from the hub, its fetcher (``keep``:
    the revisions left in the cache) and the factory a shard builds its own from (``steps=``: it evicts only its
    share's, :mod:`plateauscope.analysis.shards`); ``(None, None)`` for a series on the disk, where ``keep`` is a
    one-line SourceError."""
    if not is_hub_series(run_dir):
        if keep is not None:
            raise SourceError(f"--keep: {run_dir} is not a series imported from the hub (plateauscope import hf:ORG/NAME)")
        return None, None
    return HubFetcher.for_run(run_dir, keep, progress), functools.partial(HubFetcher.for_run, keep=keep)


class HubFetcher:
    """The checkpoints of a hub series, fetched when their weights are read (a
    :data:`plateauscope.runs.series.Fetch`): by commit, into the Hugging Face cache, checked against the manifest's
    SHA-256; with ``keep``, at most that many of the series' revisions left in the cache (module docstring). Where
    several threads read checkpoints, ``keep`` must be at least their number: the ``keep - 1`` revisions read most
    recently are the ones that may still be being read."""

    def __init__(self, checkpoints: list[SeriesCheckpoint], keep: int | None = None, progress: bool = False):
        if keep is not None and keep < 1:
            raise SourceError(f"--keep must be at least 1 (the revision being analysed), got {keep}")
        self.checkpoints = [c for c in checkpoints if c.remote]
        self.keep, self.progress = keep, progress
        self.lock = threading.Lock()
        """One fetch at a time (the cheap pass reads checkpoints on several threads)."""
        self.read: list[str] = []
        """Commits read by this fetcher, the most recent last."""
        self.fetched: list[str] = []
        """Commits it downloaded (not found in the cache)."""
        self.evicted: list[str] = []
        """Commits it deleted from the cache."""

    @classmethod
    def for_run(cls, run_dir: str | Path, keep: int | None = None, progress: bool = False,
                steps: list[int] | None = None) -> HubFetcher:
        """The fetcher of an imported run's hub checkpoints; ``steps``: only these steps' revisions are ever evicted
        (a shard's own, :mod:`plateauscope.analysis.shards`: the other shards read theirs from the same cache)."""
        found = ImportedSeries(run_dir).checkpoints
        return cls([c for step, c in found.items() if steps is None or step in steps], keep, progress)

    def cached(self, entry: SeriesCheckpoint) -> Path | None:
        """Where the cache holds ``entry``'s file, or None."""
        path = cache_path(entry.repo or "", entry.commit or "", Path(entry.file).name)
        return path if path.is_file() else None

    def missing(self) -> list[str]:
        """The series' revisions whose weights the cache lacks, in step order."""
        return [c.revision or "" for c in sorted(self.checkpoints, key=lambda c: c.step) if self.cached(c) is None]

    def __call__(self, entry: SeriesCheckpoint) -> Path:
        """``entry``'s file on the disk: from the cache, else fetched (after evicting down to ``keep - 1``) and its
        bytes checked; a one-line SourceError naming the revision and file where it cannot be."""
        with self.lock:
            return self._fetch(entry)

    def _fetch(self, entry: SeriesCheckpoint) -> Path:
        name, filename = entry.repo or "", Path(entry.file).name
        path = self.cached(entry)
        if path is None:
            if hub_offline():
                missing = self.missing()
                raise SourceError(f"hf:{name}: HF_HUB_OFFLINE is set and the local Hugging Face cache "
                                  f"({hub_cache_dir()}) lacks {len(missing)} of the series' {len(self.checkpoints)} "
                                  f"revisions: {', '.join(missing)} (step {entry.step}, revision {entry.revision}, "
                                  "is needed now); fetch them online, or analyse the others with --steps")
            self.evict(entry)
            with hub_errors(name, f"revision {entry.revision} ({filename})"):
                path = _download(name, filename, entry.commit or "", self.progress)
            self.fetched.append(entry.commit or "")
            digest = file_sha256(path)
            if digest != entry.sha256:
                self.forget(entry.commit or "")  # nothing of it kept, so a rerun fetches it again
                raise SourceError(f"hf:{name}: revision {entry.revision} ({filename}): the fetched bytes' SHA-256 "
                                  f"{digest[:12]}... differs from the hub's listing ({entry.sha256[:12]}..., in "
                                  "series.json); deleted from the cache, nothing analysed from it")
        if entry.commit in self.read:
            self.read.remove(entry.commit or "")
        self.read.append(entry.commit or "")
        return path

    def evict(self, coming: SeriesCheckpoint) -> None:
        """Make room for ``coming``: with ``keep``, delete the series' revisions in the cache beyond the ``keep - 1``
        read most recently (those read before this fetcher first)."""
        if self.keep is None:
            return
        commits = {c.commit for c in self.checkpoints if c.commit != coming.commit and self.cached(c) is not None}
        order = sorted(commits, key=lambda c: self.read.index(c) if c in self.read else -1)
        self.forget(*order[:max(0, len(order) - (self.keep - 1))])

    def forget(self, *commits: str) -> None:
        """Delete these commits' snapshots from the cache, with the blobs no other snapshot links to and their refs
        (``huggingface_hub``'s own ``delete_revisions``)."""
        if not commits:
            return
        from huggingface_hub import scan_cache_dir

        scan_cache_dir(hub_cache_dir()).delete_revisions(*commits).execute()
        self.evicted.extend(commits)
