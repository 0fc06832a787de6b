"""Fixed-width tables: the one table format of the command line."""

from __future__ import annotations

from typing import Any


def format_table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain fixed-width table."""
    cells = [header] + [[f"{c:+.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)
