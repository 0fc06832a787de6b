"""The import paths that moved in 0.3 (``plateauscope.deprecation``): each still imports, with one warning that
names the new import, and gives the very objects of the new home; a task file written against 0.2's manual
trains unchanged, and one whose prompt pairs index its own held-out examples analyses end to end."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import plateauscope
from plateauscope.deprecation import MOVED, PlateauscopeDeprecationWarning, advice

ROOT = Path(__file__).resolve().parent.parent
LEGACY_TASK = Path(__file__).resolve().parent / "tasks" / "markov_chains_0_2.py"
LEGACY_GROKKING = Path(__file__).resolve().parent / "tasks" / "grokking_0_2.py"


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


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plateauscope", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def test_a_grokking_task_file_written_for_0_2_trains_and_analyses_unchanged(tmp_path):
    """The 0.2 grokking file keeps its held-out pairs beside ``tokens`` (the training split) and draws its prompt
    pairs from them: it trains, analyses with no traceback (the routing margin reads the pairs' own sequences),
    and the train command's last line, ``summary.json`` and the analysis state the plateau by the counts."""
    from plateauscope.analysis.results import read_routing_summary
    from plateauscope.tasks.loading import task_class
    from plateauscope.views.phrases import plateau_sentence

    spec = f"{LEGACY_GROKKING}:ModularAddition"
    task = task_class(spec).generate(task_class(spec).Config(p=23))
    assert int(task.prompt_pairs().examples.max()) >= len(task.tokens)  # the case that died: pairs beyond tokens
    out = tmp_path / "run"
    trained = _command("train", "--task", spec, "--set", "p=23", "--full-batch", "--max-steps", "40", "--no-progress",
                       "--out", str(out), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    warned = [line for line in trained.stderr.splitlines() if "PlateauscopeDeprecationWarning" in line]
    assert len(warned) == 1 and "grokking_0_2.py:21" in warned[0]
    analysed = _command("analyze", "--run", str(out), "--no-progress", cwd=tmp_path)
    assert analysed.returncode == 0 and "Traceback" not in analysed.stderr, analysed.stderr
    assert not (out / "plateauscope-error.log").exists()
    # the plateau, recounted from metrics.jsonl: |held-out loss - log p| <= 0.1 log p before tau
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    log_p, tau = math.log(23), summary["tau"]
    before = [r for r in records if tau is None or r["step"] < tau]
    inside = [abs(r["heldout_loss"] - log_p) <= 0.1 * log_p for r in before]
    counts = summary["plateau_counts"]
    assert "plateau_span" not in summary and "plateau_fraction_of_tau" not in summary
    assert (counts["n_before"], counts["n_inside"], counts["holds"]) == (
        len(before), sum(inside), 2 * sum(inside) >= len(before))
    sentence = plateau_sentence(counts, "held-out loss", "log p").rstrip(".")
    assert f"; {sentence[0].lower() + sentence[1:]}; run in" in trained.stdout.strip().splitlines()[-1]
    routing = read_routing_summary(out)
    assert routing["plateau_counts"] == counts and routing["margin"] is not None  # the margin ran on the pairs
    assert f"plateau         {plateau_sentence(counts, 'held-out loss', 'log p')}" in analysed.stdout

