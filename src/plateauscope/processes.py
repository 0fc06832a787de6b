"""Workers on this machine: its cores, a pool of spawned processes that stops with its caller, and
worker threads for small models.

Used by the local sweep executor (one training job per process), by the per-head LLC (checkpoints and
heads spread over processes) and by the analysis (checkpoints spread over threads); each caller writes its
files in the parent, so a killed pool loses work in flight, never a file. Jobs on a cluster go through
submitit (:func:`submitit_executor`: a sweep's runs, a series' analysis in shards).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import functools
import multiprocessing
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch

from plateauscope.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once (``find_library`` runs ``ldconfig``: not at every step of an analysis)."""
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release_freed_memory() -> None:
    """Give the memory of freed tensors back to the system (glibc's ``malloc_trim``; elsewhere nothing). glibc keeps
    freed blocks in its heaps, so a process that ran large batches keeps its high-water mark, and fragmentation adds
    to it at each step of a long analysis (``bench/imported_analysis.py`` measures the peak)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


MALLOC_ARENAS = 1
"""glibc heaps (``M_ARENA_MAX``) of a ``plateauscope`` command: the analysis's worker threads would otherwise each
allocate from a heap of their own, and memory freed in one is not reused by another (``bench/imported_analysis.py``
measures the peak)."""


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """At most ``arenas`` glibc heaps for this process (``mallopt``; elsewhere nothing). A ``MALLOC_ARENA_MAX`` in the
    environment wins."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt") and "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(-8, arenas)  # M_ARENA_MAX


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _leave_interrupts_to_the_parent() -> None:
    """A worker's initializer: Ctrl-C reaches the terminal's whole process group, and the parent, not each
    worker, answers it (by terminating the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: a kill (SIGTERM) raises KeyboardInterrupt, as Ctrl-C does, so that a pool stops its workers and
    the caller answers it in one line (call it in the main thread)."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def spawn_pool(workers: int) -> Iterator[cf.ProcessPoolExecutor]:
    """A pool of ``workers`` spawned processes, shut down on leaving; on an exception (Ctrl-C, or SIGTERM
    turned into one) its processes are terminated first, so none goes on computing, or writing, after its
    caller stopped."""
    # spawn, not fork: forking a process whose torch (OpenMP) thread pool is running can hang the child.
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_leave_interrupts_to_the_parent)
    try:
        yield pool
    except BaseException:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def thread_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` on ``workers`` threads, the results in the order of ``items``.

    Meanwhile torch runs each operation on ``torch.get_num_threads() // workers`` threads (at least one):
    a small model's operations are too short to split well over the cores, so whole tasks side by side
    keep them busier. ``fn`` must not share a model (or its hooks) between calls that may overlap. One
    worker: a plain loop in this thread. When the caller stops early (an exception, Ctrl-C), the tasks not
    yet started are cancelled and the running ones finish first."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // workers))  # threads started from here on take it too
    pool = cf.ThreadPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(fn, item) for item in items]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)


def submitit_executor(folder: Path, cluster: str) -> Any:
    """A submitit executor (``cluster``: ``local`` or ``slurm``), or a one-line ConfigError saying why not."""
    flag = "slurm" if cluster == "slurm" else "submitit-local"
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"--executor {flag} needs submitit: pip install 'plateauscope[cluster]'") from None
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    except RuntimeError as e:  # "Could not detect srun": not on a Slurm cluster
        raise ConfigError(f"--executor {flag}: {' '.join(str(e).split())}") from None
    if cluster == "slurm":  # a controller that does not answer: one line here, not sbatch's lines at submission
        try:
            answer = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60)
            why = None if answer.returncode == 0 else (answer.stderr.strip().splitlines() or ["no answer"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            why = " ".join(str(e).split())
        if why is not None:
            raise ConfigError(f"--executor slurm: no Slurm controller answers (sinfo: {why})")
    return executor
