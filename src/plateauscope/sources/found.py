"""What a reader of a series finds: one checkpoint's file, step and model, before any weights are read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plateauscope.errors import ConfigError


class SourceError(ConfigError):
    """A series that cannot be imported (one line naming the file or flag)."""


def read_source_json(path: Path) -> Any:
    """A JSON file of a source (a config, a trainer state), or a one-line SourceError naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: not readable JSON ({' '.join(str(e).split())})") from None


@dataclass(frozen=True)
class FoundCheckpoint:
    """A checkpoint a reader found: its step, weights file and format, and its model's Hugging Face config."""

    step: int
    file: Path
    format: str
    """One of :data:`plateauscope.runs.series.WEIGHT_FORMATS`."""
    hf_config: dict[str, Any]
    """The model's Hugging Face ``config.json`` (what it is built from)."""
    config_file: Path
    """Where the config came from (named in messages)."""
    tokenizer: Path | None = None
    """A folder with tokenizer files, or None."""

    @property
    def architecture(self) -> str:
        """The config's architecture class (``architectures[0]``), or ``?``."""
        return (self.hf_config.get("architectures") or ["?"])[0]
