"""Which steps get an evaluation, a checkpoint or a resume point: a fixed interval plus log-spaced early steps."""

from __future__ import annotations

import numpy as np


def scheduled_steps(every: int, max_steps: int, early_points: int) -> set[int]:
    """Step 0, every multiple of ``every`` up to ``max_steps``, the last step, and
    ``early_points`` log-spaced steps in [1, every) so the first few hundred steps are dense too."""
    steps = set(range(0, max_steps + 1, every)) | {max_steps}
    if early_points > 0 and every > 1:
        steps |= {int(s) for s in np.unique(np.geomspace(1, every, early_points, endpoint=False).round())}
    return {s for s in steps if s <= max_steps}


def resume_steps(ckpt_steps: set[int], every: int) -> set[int]:
    """The checkpoints that also write the resume state: the first checkpoint at or after each multiple
    of ``every`` (step 0 included), and the last one. A pure function of the schedule, so the members
    of a seed ensemble share their resume points."""
    ordered = sorted(ckpt_steps)
    firsts = {s for prev, s in zip([-1, *ordered], ordered) if s // every > prev // every}
    return firsts | {ordered[-1]} if ordered else firsts
