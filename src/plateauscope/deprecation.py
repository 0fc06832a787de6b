"""Modules that moved: their old import paths keep working for one release, with one warning each.

:data:`MOVED` maps each old module to its new home: one module, or a new home per name. ``import
plateauscope`` installs :class:`MovedModuleFinder` at the end of ``sys.meta_path``, so an old path that no
file answers any more is served by a stand-in module: importing it warns once
(:class:`PlateauscopeDeprecationWarning`, naming the new import), and each of its names resolves to the
object at the new home, so ``isinstance`` and identity hold across the two paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

REMOVED_IN = "0.4"
"""The release that drops the old paths."""

_MODEL_CONFIG, _SELECTOR_CONFIG = "plateauscope.model.config", "plateauscope.tasks.selector_config"
MOVED: dict[str, str | dict[str, str]] = {
    "plateauscope.backend": "plateauscope.model.backend",
    "plateauscope.training.fused": "plateauscope.model.fused",
    "plateauscope.training.hooked_forward": "plateauscope.model.hooked_forward",
    "plateauscope.training.scoring": "plateauscope.model.scoring",
    "plateauscope.training.files": "plateauscope.runs.files",
    "plateauscope.training.run": "plateauscope.runs.run",
    "plateauscope.training.presets": "plateauscope.runs.presets",
    "plateauscope.training.metrics": "plateauscope.runs.metrics",
    "plateauscope.training.references": "plateauscope.runs.references",
    "plateauscope.training.interventions": "plateauscope.runs.interventions",
    "plateauscope.training.machine": "plateauscope.runs.machine",
    "plateauscope.training.config": {
        **dict.fromkeys(("JsonConfig", "ModelConfig", "TrainConfig", "RunConfig", "ConfigError"), "plateauscope"),
        **dict.fromkeys(("FORWARDS", "CHECKPOINT_POLICIES", "TRANSPLANTS", "PART_FORMS", "transplant_part"),
                        _MODEL_CONFIG),
        **dict.fromkeys(("TaskConfig", "DIRECTIONS", "TARGET_UNIQUENESS", "TAILS", "ORDERS", "SELECTORS"),
                        _SELECTOR_CONFIG),
    },
    "plateauscope.training.model": {"build_hooked_transformer": "plateauscope.model.backend",
                                    "hooked_config_dict": "plateauscope.deprecation"},
}
"""Old module -> its new module, or -> {name: the module that now holds it} (``plateauscope``: the public API)."""


class PlateauscopeDeprecationWarning(FutureWarning):
    """An import path that moved. A ``FutureWarning``, so that Python shows it by default (a plain
    ``DeprecationWarning`` raised inside a task file that the command line imports would be hidden)."""


def advice(old: str) -> str:
    """The warning's text for the old module ``old``: where to import each of its names from now."""
    home = MOVED[old]
    if isinstance(home, str):
        new = f"import from {home}"
    else:
        by_home: dict[str, list[str]] = {}
        for name, module in home.items():
            by_home.setdefault(module, []).append(name)
        new = "; ".join(f"import {', '.join(names)} from {module}" if module != __name__
                        else f"for {', '.join(names)}(model, task) call task.hooked_config(model)"
                        for module, names in by_home.items())
    return f"{old} moved in plateauscope 0.3 and goes in {REMOVED_IN}: {new}"


def hooked_config_dict(model: Any, task: Any) -> dict[str, Any]:
    """The old ``plateauscope.training.model.hooked_config_dict(model, task)``: now ``task.hooked_config(model)``."""
    return task.hooked_config(model)


class _MovedModule(types.ModuleType):
    """An old module path: every name read from its new home."""

    def __getattr__(self, name: str) -> Any:
        home = MOVED[self.__name__]
        module = home if isinstance(home, str) else home.get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the old paths of :data:`MOVED` (after every other finder has found no file for them)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _MovedModule(spec.name, f"Moved: {advice(spec.name)}.")

    def exec_module(self, module: types.ModuleType) -> None:
        # stacklevel 2 names the frame that imports the old path: CPython skips the import machinery's frames
        warnings.warn(advice(module.__name__), PlateauscopeDeprecationWarning, stacklevel=2)


def install() -> None:
    """Serve the old paths (once per process)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
