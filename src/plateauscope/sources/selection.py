"""Which checkpoints of a series to import: ``--every N``, ``--steps a,b,c``, ``--log-spaced N``."""

from __future__ import annotations

import numpy as np

from plateauscope.sources.found import SourceError


def parse_steps(text: str | None) -> list[int] | None:
    """``--steps 0,100,200`` as a list of steps (None: not given); anything else is a SourceError."""
    if text is None:
        return None
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SourceError(f"--steps must be comma-separated step numbers, got {text!r}") from None
    if not steps or min(steps) < 0:
        raise SourceError(f"--steps must name at least one step, none negative, got {text!r}")
    return steps


def log_spaced(steps: list[int], n: int) -> list[int]:
    """About ``n`` of ``steps`` spaced evenly in log(step + 1), the first and last always kept."""
    if n >= len(steps):
        return list(steps)
    arr = np.asarray(steps, dtype=float)
    targets = np.geomspace(arr[0] + 1, arr[-1] + 1, n) - 1
    return sorted({steps[int(np.abs(arr - t).argmin())] for t in targets})


def select_steps(have: list[int], every: int = 1, steps: list[int] | None = None,
                 log_n: int | None = None, source: str = "") -> list[int]:
    """The chosen steps of ``have`` (ascending): ``steps`` (each must exist), else every ``every``-th
    (the last kept), then thinned to ``log_n`` log-spaced ones. One option at a time for ``steps``."""
    if every < 1:
        raise SourceError(f"--every must be at least 1, got {every}")
    if log_n is not None and log_n < 2:
        raise SourceError(f"--log-spaced must be at least 2, got {log_n}")
    if steps is not None:
        if every != 1 or log_n is not None:
            raise SourceError("--steps chooses the steps itself: give it without --every or --log-spaced")
        absent = sorted(set(steps) - set(have))
        if absent:
            raise SourceError(f"{source}: no checkpoint at step(s) {', '.join(map(str, absent))} "
                              f"(steps: {have[0]}..{have[-1]}, {len(have)} checkpoints)")
        return sorted(set(steps))
    chosen = have[::every]
    if have and chosen[-1] != have[-1]:
        chosen.append(have[-1])
    return log_spaced(chosen, log_n) if log_n is not None else chosen
