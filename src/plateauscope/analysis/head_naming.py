"""Which heads a probe names, by a rule that holds on any layout: a head's score against its null, with a margin
and an interval over the probe's sequences.

A head's score on a detection pattern is its mean attention to the pattern's targets
(:func:`plateauscope.tasks.probe.target_scores`), per sequence; its null is the same attention under no signal
(uniform causal attention, or the head's attention to the same positions in the probe's control sequences:
:class:`plateauscope.tasks.probe.ProbeSignals`). The rule (:func:`name_heads`):

* a head is **named** where the lower end of the 95% interval of ``score - null`` (the percentile bootstrap over the
  probe's sequences, :data:`N_BOOTSTRAP` resamples) lies above :data:`MARGIN`;
* for a pattern that reads an earlier layer (``induction``: the query must find the token *after* an earlier
  occurrence, which takes a previous-token head before it), a layer-0 head is never named: it is reported as an
  offset head, attention by position;
* where the probe gives each sequence's lag (the distance between its copies), a named head must pass at every lag:
  one that copies (its mean score above uniform attention by the margin) at some lags only is a **fixed-lag
  copier**, with those lags; one that passes at every lag is a content-based head.

The margin is in attention probability: a named head moves at least a fifth of its attention to the targets beyond
what it would give them anyway.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from plateauscope.model.heads import head_label

MARGIN = 0.2
"""A named head's ``score - null`` exceeds this (attention probability) at the lower end of its interval."""
N_BOOTSTRAP = 1000
"""Resamples of the probe's sequences for each interval."""
LEVEL = 0.95
"""The intervals' coverage."""
READS_EARLIER_LAYER = frozenset({"induction"})
"""Patterns a layer-0 head cannot follow by content (it sees only token and position embeddings)."""


@dataclass
class HeadCall:
    """One head's reading on one detection pattern."""

    head: str
    """``L1H0``."""
    layer: int
    index: int
    score: float
    """Mean attention to the targets over the probe's sequences."""
    null: float
    """The same under the null."""
    difference: float
    """``score - null``."""
    interval: list[float]
    """The 95% percentile-bootstrap interval of ``difference`` over the probe's sequences."""
    named: bool
    """Whether the rule names it (module docstring)."""
    kind: str | None
    """``named`` (by the rule; where lags are probed, at every lag: by content), ``fixed_lag`` (copies at some lags
    only), ``layer0_offset`` (would be named, but sits in layer 0 on a pattern that reads an earlier layer), or None."""
    lags: list[int] = field(default_factory=list)
    """The lags at which it copies (a fixed-lag copier's), ascending."""
    by_lag: dict[str, list[float]] = field(default_factory=dict)
    """Lag -> ``[score, null, chance]`` at that lag."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types."""
        return asdict(self)


def bootstrap_means(values: Float[np.ndarray, "N K"], n_boot: int = N_BOOTSTRAP, seed: int = 0
                    ) -> Float[np.ndarray, "B K"]:
    """Means over resampled rows (sequences), ``n_boot`` times; NaN rows are left out of each mean."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(values), size=(n_boot, len(values)))
    with np.errstate(invalid="ignore"):
        return np.nanmean(values[index], axis=1)


def percentile_interval(draws: Float[np.ndarray, "B ..."], level: float = LEVEL) -> Float[np.ndarray, "2 ..."]:
    """The percentile interval of bootstrap draws, per column."""
    tail = 100 * (1 - level) / 2
    return np.nanpercentile(draws, [tail, 100 - tail], axis=0)


def name_heads(name: str, scores: Float[Tensor, "N n_layers n_heads"], nulls: Float[Tensor, "N n_layers n_heads"],
               chance: Float[Tensor, " N"], lags: Int[Tensor, " N"] | None = None, margin: float = MARGIN,
               n_boot: int = N_BOOTSTRAP, seed: int = 0) -> list[HeadCall]:
    """Every head's :class:`HeadCall` on the pattern ``name`` (module docstring), strongest difference first."""
    n, n_layers, n_heads = scores.shape
    score = scores.reshape(n, -1).double().numpy()
    null = nulls.reshape(n, -1).double().numpy()
    difference = score - null
    low, high = percentile_interval(bootstrap_means(difference, n_boot, seed))
    with np.errstate(invalid="ignore"):
        mean_score, mean_null, mean_difference = (np.nanmean(a, 0) for a in (score, null, difference))
    groups = sorted(set(lags.tolist())) if lags is not None else []
    by_lag = {}
    for lag in groups:
        rows = (lags == lag).numpy()
        with np.errstate(invalid="ignore"):
            by_lag[lag] = (np.nanmean(score[rows], 0), np.nanmean(null[rows], 0), float(chance[rows].double().mean()))
    calls = []
    for i in range(n_layers * n_heads):
        layer, index = divmod(i, n_heads)
        passes = bool(low[i] > margin)
        content_lags = [lag for lag in groups if by_lag[lag][0][i] - by_lag[lag][1][i] > margin]
        copying_lags = [lag for lag in groups if by_lag[lag][0][i] - by_lag[lag][2] > margin]
        kind = "named" if passes else None
        if groups and copying_lags and len(content_lags) < len(groups):
            kind = "fixed_lag" if len(copying_lags) < len(groups) or not passes else kind
        if kind == "named" and layer == 0 and name in READS_EARLIER_LAYER:
            kind = "layer0_offset"
        calls.append(HeadCall(head_label(layer, index), layer, index, float(mean_score[i]), float(mean_null[i]),
                              float(mean_difference[i]), [float(low[i]), float(high[i])], kind == "named",
                              kind, copying_lags if kind == "fixed_lag" else [],
                              {str(lag): [float(s[i]), float(nl[i]), c] for lag, (s, nl, c) in by_lag.items()}))
    return sorted(calls, key=lambda c: -c.difference if np.isfinite(c.difference) else np.inf)


def named(calls: list[HeadCall], kind: str = "named") -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs of ``kind``, in the calls' order (strongest first)."""
    return [(c.layer, c.index) for c in calls if c.kind == kind]
