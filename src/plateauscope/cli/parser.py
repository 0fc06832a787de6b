"""The command line's argument parser: usage errors in one line."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit code 2), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print a usage error as one line and exit with code 2."""
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
