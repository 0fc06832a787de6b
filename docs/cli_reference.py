"""mkdocs hook: the command-line reference, generated from the argparse parsers so that it cannot drift.

A line ``<!-- cli: training.train -->`` in a page becomes the ``--help`` of that command, from the
``build_parser()`` of the module that defines it (``COMMANDS``). The test suite renders every entry
(``tests/test_docs.py``), so a command whose parser is missing fails there too.
"""

from __future__ import annotations

import importlib
import os
import re

COMMANDS: dict[str, str] = {
    "training.train": "training.train",
    "training.sweep": "training.sweep",
    "interp.analyze": "interp.analyze",
    "interp.patch": "interp.patch",
    "interp.attention": "interp.attention",
    "interp.ablate": "interp.ablate",
    "interp.report": "interp.views.report",
    "interp.view": "interp.view",
    "interp.dynamics": "interp.views.sweep_report",
    "interp.hessian": "interp.hessian",
    "interp.llc": "interp.llc",
}
"""``python -m`` name -> the module whose ``build_parser()`` builds its parser."""

MARKER = re.compile(r"^<!-- cli: ([\w.]+) -->$", re.MULTILINE)
HELP_WIDTH = 100


def command_help(command: str) -> str:
    """``python -m COMMAND --help``, at a fixed width."""
    if command not in COMMANDS:
        raise KeyError(f"no command {command!r} in docs/cli_reference.py COMMANDS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)  # argparse wraps to $COLUMNS
    return importlib.import_module(COMMANDS[command]).build_parser().format_help()


def render(markdown: str) -> str:
    """Every ``<!-- cli: NAME -->`` marker replaced by that command's help as a code block."""
    return MARKER.sub(lambda m: f"```text\n{command_help(m.group(1)).rstrip()}\n```", markdown)


def on_page_markdown(markdown: str, **_) -> str:
    """mkdocs: expand the markers of each page."""
    return render(markdown)
