"""The import paths that moved in 0.3 (``plateauscope.deprecation``): each still imports, with one warning that
names the new import, and gives the very objects of the new home; a task file written against 0.2's manual
trains unchanged."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import plateauscope
from plateauscope.deprecation import MOVED, PlateauscopeDeprecationWarning, advice

ROOT = Path(__file__).resolve().parent.parent
LEGACY_TASK = Path(__file__).resolve().parent / "tasks" / "markov_chains_0_2.py"


def _fresh_import(old: str) -> tuple[object, list[warnings.WarningMessage]]:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(old)  # as an import statement does (importlib.import_module would be the importing frame)
    return sys.modules[old], [w for w in caught if issubclass(w.category, PlateauscopeDeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_with_one_warning_and_the_same_objects(old):
    module, caught = _fresh_import(old)
    assert len(caught) == 1 and str(caught[0].message) == advice(old)
    # (the line it points at is checked in a fresh interpreter below: under pytest, jaxtyping's import hook
    # stands between this file and the import)
    home = MOVED[old]
    names = vars(importlib.import_module(home)) if isinstance(home, str) else home
    for name in [n for n in names if not n.startswith("__")][:40]:
        new = importlib.import_module(home if isinstance(home, str) else names[name])
        assert getattr(module, name) is getattr(new, name), name
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_each_warning_names_where_every_name_went():
    text = advice("plateauscope.training.config")
    assert "import JsonConfig, ModelConfig, TrainConfig, RunConfig, ConfigError from plateauscope" in text
    assert "TaskConfig" in text and "plateauscope.tasks.selector_config" in text
    assert advice("plateauscope.training.run").endswith("import from plateauscope.runs.run")


def test_the_old_hooked_config_dict_gives_the_new_config():
    from plateauscope.tasks.selector import SelectorTask
    from plateauscope.tasks.selector_config import TaskConfig

    with pytest.warns(PlateauscopeDeprecationWarning):
        sys.modules.pop("plateauscope.training.model", None)
        from plateauscope.training.model import hooked_config_dict
    task = SelectorTask.generate(TaskConfig(n_b=20, K=4))
    model = plateauscope.ModelConfig(n_layers=1)
    assert hooked_config_dict(model, task) == task.hooked_config(model)


def test_a_task_file_written_for_0_2_trains_unchanged(tmp_path):
    """The 0.2 copy of notebooks/markov_chains.py (imports from plateauscope.training.config) trains through the
    command line: one warning for the one moved module it imports, on its import line, and a complete run."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "plateauscope", "train", "--task", f"{LEGACY_TASK}:MarkovChains", "--set",
         "n_sequences=256", "--max-steps", "4", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "PlateauscopeDeprecationWarning" in line]
    assert len(lines) == 1 and "plateauscope.training.config moved" in lines[0] and "markov_chains_0_2.py:15" in lines[0]
    assert plateauscope.Run(out).summary["complete"]


def test_the_notebook_task_file_imports_only_plateauscope():
    source = (ROOT / "notebooks" / "markov_chains.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("from plateauscope", "import plateauscope"))]
    assert imports and all(line.startswith("from plateauscope import ") for line in imports)
