"""The views: figures (pure: results in, ``(figure, caption)`` out), the page shell, and the pages
that assemble them (the run report, the sweep report). Nothing under ``interp`` outside this
folder draws; the layering test checks it."""
