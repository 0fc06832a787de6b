"""The sweep report and ``plateauscope dynamics``: a sweep's table, fits and figures.

    plateauscope dynamics --sweep DIR [--analyze [--every 10] [--n-exact 8]] [--llc EVERY] [--compare SWEEP]
                              [--csv FILE] [--json FILE] [--report]

With ``--analyze``, first runs ``plateauscope.analysis.analyze`` on every backward run of the sweep (the cache
makes a second call cheap); with ``--llc N``, ``plateauscope.analysis.llc`` at every N-th checkpoint of every run
(default settings; cached), and the LLC's departure over seeds (:mod:`plateauscope.dynamics.llc`).
Prints the per-run table, the fits and the seed summary of :mod:`plateauscope.dynamics` (definitions
there); where the sweep varies batch size or learning rate, the noise table and the paper's two
noise claims (:mod:`plateauscope.dynamics.noise`), and with ``--compare`` how a second sweep reads them.
Writes the table as ``DIR/dynamics.csv`` and, with ``--report``, one self-contained HTML page
``DIR/sweep_report.html`` with every figure of :mod:`plateauscope.views.sweep_figures`.
"""

from __future__ import annotations

import html
from typing import Any

from plateauscope.dynamics.sweep import Sweep
from plateauscope.views.pages import figure_section, page, table_html
from plateauscope.views.phrases import TABLE_COLUMNS, summary_lines
from plateauscope.views.sweep_figures import sweep_figures


def build_sweep_report(sweep: Sweep, result: dict[str, Any]) -> str:
    """The sweep report: the fits, every figure, the per-run table; one self-contained HTML page."""
    parts = [f"<h1>Sweep report: {html.escape(sweep.name)}</h1>",
             f'<p class="sub">{html.escape(str(sweep.path.resolve()))} - {len(sweep.rows)} runs</p>',
             "<h2>Fits (ours - the paper's)</h2>", table_html(summary_lines(result))]
    for i, (key, heading, fig, caption) in enumerate(sweep_figures(sweep, result)):
        parts += figure_section(key, heading, fig, caption, include_plotlyjs=(i == 0))
    header = "".join(f"<th>{html.escape(h)}</th>" for _, h in TABLE_COLUMNS)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(_cell(r[k]))}</td>" for k, _ in TABLE_COLUMNS) + "</tr>"
                     for r in sweep.rows)
    parts += ["<h2>Runs</h2>", f'<table class="summary"><tr>{header}</tr>\n{body}\n</table>',
              '<p class="note">Written by <code>plateauscope dynamics</code>; definitions in its module '
              "docstring; tau: <code>plateauscope.runs.metrics.compute_tau</code>.</p>"]
    return page(f"Sweep: {sweep.name}", parts)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if isinstance(v, float) else str(v)
