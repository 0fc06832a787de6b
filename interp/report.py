"""``python -m interp.report``: the run's report (``interp.views.report``, where the page is built)."""

from __future__ import annotations

import sys

from interp.views.report import main

if __name__ == "__main__":
    sys.exit(main())
