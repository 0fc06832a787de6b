"""Follow a run while it trains: analyse each new checkpoint as it appears.

``plateauscope analyze --follow`` polls the run directory. Whenever checkpoints have appeared, it
runs the cheap pass of the analysis (``plateauscope.analysis.analyze``) on them, summarised with
attribution patching standing in for exact patching, and calls ``on_refresh`` (the command line
rewrites the report and the time view there, with a live banner). When the run's ``summary.json``
says it is complete, it runs the whole analysis once (the cheap pass on what is left, then the
expensive pass at the landmarks, which need the finished run's tau and plateau), calls
``on_complete`` (the final pages) and returns. So the cache it leaves is the one an analysis after the fact
gives: the same records, the same values (on a run with dense checkpoints; under the adaptive
policy it also keeps the records of checkpoints deleted after they were analysed).

A checkpoint that the adaptive checkpoint policy deletes while it is being read is skipped until
the next poll. Ctrl-C stops following between two writes: every cache file is whole, and a later
``analyze`` (or ``--follow``) continues from it. While following, the process holds the run's
analysis lock (``plateauscope.analysis.results.writes_cache``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plateauscope.analysis.analyze import AnalysisSettings, analyze_run
from plateauscope.analysis.landmarks import DEFAULT_BUDGET
from plateauscope.analysis.results import writes_cache
from plateauscope.runs.run import CONFIG_FILE, Run, RunError

log = logging.getLogger(__name__)

POLL_S = 2.0
"""Seconds between two looks at the run directory."""


def is_complete(run: Run) -> bool:
    """Whether the run's ``summary.json`` says training is over."""
    return bool((run.summary or {}).get("complete"))


def follow(run_dir: str | Path, settings: AnalysisSettings | None = None, n_exact: int = DEFAULT_BUDGET, poll_s: float = POLL_S,
           progress: bool = False, device: str = "cpu", backend: str | None = None, edges: bool = True,
           on_refresh: Callable[[int, int], Any] | None = None, on_complete: Callable[[], Any] | None = None,
           timeout_s: float | None = None, wait: bool = True) -> dict[str, Any]:
    """Analyse the run in ``run_dir`` as training writes it (waiting for training to create it),
    until its ``summary.json`` says complete; return the final summary (``analyze_run``'s).
    ``on_refresh(step, max_steps)``: called after each cheap pass, with the last analysed step and the
    run's planned steps; ``on_complete()``: called once the whole analysis of the finished run is cached. ``timeout_s``: give up (a
    one-line RunError) when the run has not completed by then; None waits for ever. ``wait``: for
    another writer of the run's analysis cache to finish (False: a one-line RunError)."""
    run_dir = Path(run_dir)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not (run_dir / CONFIG_FILE).exists():  # training has not written its run directory yet
        _sleep(poll_s, deadline, run_dir)
    return _follow(run_dir, settings, n_exact, poll_s, progress, device, backend, edges, on_refresh, on_complete,
                   deadline, wait=wait)


def _sleep(poll_s: float, deadline: float | None, run_dir: Path) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise RunError(f"{run_dir}: not complete by the end of the time given to following it")
    time.sleep(poll_s)


@writes_cache
def _follow(run_dir: Path, settings: AnalysisSettings | None, n_exact: int, poll_s: float, progress: bool, device: str,
            backend: str | None, edges: bool, on_refresh: Callable[[int, int], Any] | None,
            on_complete: Callable[[], Any] | None, deadline: float | None) -> dict[str, Any]:
    """:func:`follow`'s loop, holding the run's analysis lock."""
    options = dict(settings=settings, device=device, progress=progress, backend=backend, edges=edges)
    analysed = None
    while True:
        run = Run(run_dir)
        complete = is_complete(run)  # read before the steps: a complete run's last checkpoint is listed
        steps = run.steps
        if complete:
            result = analyze_run(run_dir, n_exact=n_exact, **options)
            if on_complete is not None:
                on_complete()
            log.info("%s is complete and analysed", run_dir)
            return result
        if steps and steps[-1] != analysed:
            try:
                analyze_run(run_dir, steps=steps, expensive=False, measures=False, **options)
            except RunError as e:  # a checkpoint pruned under us: it is gone, the next poll lists the others
                log.info("%s; trying again at the next poll", e)
            else:
                analysed = steps[-1]
                log.info("%s: analysed to step %d of %d", run_dir, analysed, run.config.train.max_steps)
                if on_refresh is not None:
                    on_refresh(analysed, run.config.train.max_steps)
        _sleep(poll_s, deadline, run_dir)
