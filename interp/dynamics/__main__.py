"""``python -m interp.dynamics``: the sweep's table and fits, and its page (``interp.views.sweep_report``,
which draws what this package computes)."""

from __future__ import annotations

import sys

from interp.views.sweep_report import main

sys.exit(main())
