"""HTML pages: one self-contained page shell, its CSS, and the pieces pages are assembled from.

Pages (the run report, ``plateauscope.views.report``; the sweep report, ``plateauscope.views.sweep_report``) only assemble:
they take figures from the figure modules (``(figure, caption)`` pairs) and tables as
``(name, value)`` text rows, and pass the parts to :func:`page`. A page needs no network: the
first figure inlines plotly.js (``figure_section(..., include_plotlyjs=True)``).
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from plateauscope.runs.run import write_text_atomic

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: #222;
       background: #fafafa; }
main { max-width: 1250px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { margin-bottom: 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 0; }
p.caption { color: #444; font-style: italic; margin: 4px 0 24px; max-width: 1000px; }
table.summary { border-collapse: collapse; margin: 12px 0; }
table.summary td, table.summary th { border: 1px solid #ddd; padding: 5px 10px; text-align: left; vertical-align: top; }
table.summary th { background: #f3f3f3; width: 280px; }
.figure { margin: 8px 0; }
.moment { margin: 24px 0 8px; }
.cv-row { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.cv-cell { flex: 1 1 520px; min-width: 420px; border: 1px solid #eee; padding: 6px 10px 6px 28px; }
.cv-cell h4 { margin: 4px 0; font-weight: 600; }
code { background: #f3f3f3; padding: 1px 4px; }
.note { color: #666; font-size: 0.92em; }
"""


def table_html(rows: list[tuple[str, str]]) -> str:
    """A two-column (name, value) table."""
    body = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">\n{body}\n</table>'


def figure_section(key: str, heading: str, fig: Any, caption: str, include_plotlyjs: bool) -> list[str]:
    """One figure as HTML parts: heading, the plotly div, caption. Inline plotly.js (``include_plotlyjs``)
    with the first figure of a page only: the page then needs nothing from the network."""
    div = fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs, auto_play=False, div_id=f"fig-{key}",
                      config={"displaylogo": False, "responsive": True}, default_width="100%")
    return [f"<h2>{html.escape(heading)}</h2>", f'<div class="figure">{div}</div>',
            f'<p class="caption">{html.escape(caption)}</p>']


def page(title: str, parts: list[str]) -> str:
    """A whole HTML document: ``title`` in the head, the CSS, and ``parts`` in the main column."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n"
            "<body><main>\n" + "\n".join(parts) + "\n</main></body></html>\n")


LIVE_RELOAD_S = 30
"""How often a live page (:func:`with_live_status`) reloads itself in the browser, in seconds."""


def live_status(step: int, max_steps: int) -> str:
    """The banner of a live page: the last analysed step of the run's planned steps, and the time now."""
    return (f"live: last analysed step {step} of {max_steps}, refreshed {time.strftime('%H:%M:%S')}; until training "
            "ends, attribution patching stands in for exact patching and the landmarks are not yet analysed")


def with_live_status(text: str, live: str | None) -> str:
    """A page (from :func:`page`) with a banner of its live status (``live``, e.g. "live: last analysed
    step 120 of 400, refreshed 14:02:11") that reloads itself every :data:`LIVE_RELOAD_S` seconds;
    the page unchanged when ``live`` is None."""
    if live is None:
        return text
    text = text.replace('<meta charset="utf-8">',
                        f'<meta charset="utf-8"><meta http-equiv="refresh" content="{LIVE_RELOAD_S}">', 1)
    banner = (f'<p class="live" id="live-status" style="background:#fff3cd;padding:0.4em 0.8em;border-radius:4px">'
              f'{html.escape(live)}</p>')
    return text.replace("<body><main>\n", f"<body><main>\n{banner}\n", 1)


def write_page(path: str | Path, text: str, live: str | None = None) -> Path:
    """Write a page atomically (with its live status, if any: :func:`with_live_status`) and return its path."""
    path = Path(path)
    write_text_atomic(path, with_live_status(text, live))
    return path
