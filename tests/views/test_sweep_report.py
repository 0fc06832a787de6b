"""The sweep report page (``plateauscope.views.sweep_report``) of the session's tiny sweep: one row per run,
the fits' lines, every figure, self-contained."""

import html

from plateauscope.dynamics.fits import analyze_sweep
from plateauscope.dynamics.sweep import load_sweep
from plateauscope.views.phrases import TABLE_COLUMNS, summary_lines
from plateauscope.views.sweep_figures import sweep_figures
from plateauscope.views.sweep_report import build_sweep_report


def test_the_page_holds_every_run_every_fit_and_every_figure(tiny_sweep):
    sweep = load_sweep(tiny_sweep)
    result = analyze_sweep(sweep.rows)
    page = build_sweep_report(sweep, result)
    assert page.count("<tr><td>") == len(sweep.rows) and all(f"<td>{r['name']}</td>" in page for r in sweep.rows)
    assert all(f"<th>{html.escape(h)}</th>" in page for _, h in TABLE_COLUMNS)
    assert all(html.escape(what) in page for what, _ in summary_lines(result))
    assert page.count('<div id="fig-') == len(sweep_figures(sweep, result)) and "<script src=" not in page
