"""mkdocs hook: the command-line reference, generated from the argparse parsers so that it cannot drift.

A line ``<!-- cli: VERB -->`` in a page becomes the ``--help`` of ``plateauscope VERB``, from the
``build_parser()`` of ``plateauscope.cli.VERB``; ``<!-- cli: plateauscope -->`` becomes the list of
verbs. The test suite renders every entry (``tests/test_docs.py``), so a verb whose parser is missing
fails there too.
"""

from __future__ import annotations

import os
import re

from plateauscope.cli import VERBS, usage, verb_module

MARKER = re.compile(r"^<!-- cli: ([\w.]+) -->$", re.MULTILINE)
HELP_WIDTH = 100


def command_help(verb: str) -> str:
    """``plateauscope VERB --help`` (or ``plateauscope --help``), at a fixed width."""
    if verb == "plateauscope":
        return usage()
    if verb not in VERBS:
        raise KeyError(f"no verb {verb!r} in plateauscope.cli.VERBS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)  # argparse wraps to $COLUMNS
    return verb_module(verb).build_parser().format_help()


def render(markdown: str) -> str:
    """Every ``<!-- cli: VERB -->`` marker replaced by that verb's help as a code block."""
    return MARKER.sub(lambda m: f"```text\n{command_help(m.group(1)).rstrip()}\n```", markdown)


def on_page_markdown(markdown: str, **_) -> str:
    """mkdocs: expand the markers of each page."""
    return render(markdown)
