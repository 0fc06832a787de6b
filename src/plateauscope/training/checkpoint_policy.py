"""Which checkpoints a run keeps: every one of its schedule (``dense``), or a coarse series
everywhere and the dense one only in the transition window (``adaptive``).

The adaptive policy is exact by construction: the run trains and writes the dense schedule as a
dense run does (same steps, same bytes), and deletes a checkpoint once the logged metrics prove
that it lies outside the window. The window is the plateau's middle (the middle of
``summary.json``'s ``plateau_stretch``, the longest stretch of in-band evaluations before tau) to
``WINDOW_END_TAU`` x tau; a run whose progress measure has no plateau (an accuracy) starts it at
tau / 2. While tau is unknown, the window's start is only bounded from below (the longest stretch so
far is replaced only by a longer one that ends later, so its middle never moves back), so nothing that
might still be in the window is deleted, and what is kept on disk stays near the final window's size. No training
step is taken twice, so the wall time is that of a dense run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from plateauscope.model.config import TrainConfig
from plateauscope.runs.files import _CKPT_RE, CHECKPOINT_DIR, checkpoint_name, forget_verified
from plateauscope.runs.metrics import compute_tau, plateau_stretch
from plateauscope.tasks.base import ProgressMeasure
from plateauscope.training.schedule import resume_steps, scheduled_steps

WINDOW_END_TAU = 1.3
"""The dense window ends at this multiple of tau."""


def transition_window(records: list[dict], measure: ProgressMeasure, complete: bool = False) -> tuple[int, int | None]:
    """The transition window ``(start, end)`` from a run's ``metrics.jsonl`` records so far.

    ``start`` is the plateau's middle, else tau // 2, else (no tau yet) half the last evaluated
    step; before tau is seen it is a lower bound of the final start. ``end`` is ``WINDOW_END_TAU``
    x tau (rounded up), or None while tau is unknown (then the window is open to the right).
    ``complete``: the run has ended, so a missing tau will not come.
    """
    tau = compute_tau(records, measure)
    stretch = plateau_stretch(records, measure, tau)["stretch"]
    last = records[-1]["step"] if records else 0
    if stretch is not None:
        start = (stretch[0] + stretch[1]) // 2
    else:
        start = (tau if tau is not None else last) // 2
    end = math.ceil(WINDOW_END_TAU * tau) if tau is not None else None
    if complete and end is None:
        end = last
    return start, end


@dataclass(frozen=True)
class CheckpointPolicy:
    """A run's checkpoint policy (:func:`of`): which scheduled checkpoints it writes and keeps."""

    adaptive: bool
    coarse: frozenset[int]
    """Adaptive: the checkpoints kept outside the window (every ``coarse_every`` steps, the early
    log-spaced ones, every resume point and the last step)."""

    @classmethod
    def of(cls, tc: TrainConfig) -> CheckpointPolicy:
        """The policy of ``tc`` over its schedule (``plateauscope.training.schedule``)."""
        scheduled = scheduled_steps(tc.ckpt_every, tc.max_steps, tc.early_log_points)
        coarse = {s for s in scheduled if s < tc.ckpt_every or s % tc.coarse_every == 0}
        return cls(tc.checkpoints == "adaptive",
                   frozenset(coarse | resume_steps(scheduled, tc.resume_every) | {tc.max_steps}))

    def keeps(self, step: int, window: tuple[int, int | None]) -> bool:
        """Whether a scheduled checkpoint at ``step`` belongs to the run, given the window so far."""
        start, end = window
        return not self.adaptive or step in self.coarse or (step >= start and (end is None or step <= end))

    def prune(self, out: Path, window: tuple[int, int | None], protect: int | None = None) -> list[int]:
        """Delete the checkpoints in ``out`` that :meth:`keeps` rejects (never ``protect``, the
        checkpoint of the latest resume state); return their steps."""
        if not self.adaptive:
            return []
        folder = Path(out) / CHECKPOINT_DIR
        steps = [int(m.group(1)) for p in folder.iterdir() if (m := _CKPT_RE.match(p.name))] if folder.is_dir() else []
        gone = sorted(s for s in steps if s != protect and not self.keeps(s, window))
        forget_verified(Path(out), [f"{CHECKPOINT_DIR}/{checkpoint_name(s)}" for s in gone])
        for step in gone:
            (folder / checkpoint_name(step)).unlink(missing_ok=True)
        return gone
