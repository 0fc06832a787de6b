"""Write a run's time view: one offline HTML page that moves the circuit through training.

One slider (also play/pause and the arrow keys) over the analysed checkpoints moves together the
circuit graph (edges by attribution, the faithful circuit highlighted), the heads x layers
heatmaps, the attention pattern of a chosen head and a marker on the loss curves
(:mod:`plateauscope.views.time_view`). The page needs no network and no server.

    plateauscope view --run checkpoints/demo [--out FILE] [--analyze --every 2]

The run must have been analysed with edges (``plateauscope analyze``); ``--analyze`` does that
first when its cache has no edge records.
"""

from __future__ import annotations

from pathlib import Path

from plateauscope.analysis.results import VIEW_FILE
from plateauscope.views.pages import write_page
from plateauscope.views.time_data import time_view_data
from plateauscope.views.time_view import render_time_view


def write_view(run_dir: str | Path, out: str | Path | None = None, live: str | None = None) -> Path:
    """Write the view (default ``RUN/view.html``) from the run's cached analyses; return its path.
    ``live``: the status line of a run still being followed (``plateauscope.analysis.follow``)."""
    path = Path(out) if out is not None else Path(run_dir) / VIEW_FILE
    return write_page(path, render_time_view(time_view_data(run_dir)), live)
