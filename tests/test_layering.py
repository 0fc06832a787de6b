"""The seams of the house: analyses compute and draw nothing; training never imports interp; interp
never imports a task-specific module (it asks the task protocol, ``training.tasks.base``).

Read from the source (every ``import`` statement, at any depth, except under
``if __name__ == "__main__":``), followed transitively through this project's own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ANALYSES = ("interp.inputs", "interp.results", "interp.attention", "interp.patch", "interp.attribution",
            "interp.ablate", "interp.circuit", "interp.selector", "interp.snap", "interp.analyze", "interp.hessian",
            "interp.dynamics", "interp.components", "interp.prefix", "interp.llc", "interp.summary", "interp.hessian_engine",
            "interp.edges")
"""Modules that compute: records in, data out."""
VIEWS = ("plotly", "circuitsvis", "interp.views.figures", "interp.views.sweep_figures", "interp.views.pages", "interp.views.report",
         "interp.views.sweep_report", "interp.views.time_view")
"""Figure and page modules, and the drawing libraries."""
TASK_SPECIFIC = ("training.tasks.selector", "training.tasks.selector_layout", "training.tasks.selector_metrics",
                 "training.tasks.induction")
"""The modules of the built-in tasks: only the task registry (by name, at run time) reaches them."""


def module_file(name: str) -> Path | None:
    """The source file of one of this project's modules (a package's ``__init__.py``), or None."""
    path = ROOT / name.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def direct_imports(module: str) -> set[str]:
    """Modules named by the import statements of ``module`` (outside its ``__main__`` block)."""
    tree = ast.parse(module_file(module).read_text())
    main_blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    skip = {id(n) for block in main_blocks for n in ast.walk(block)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from interp.views import figures`
    return found


def closure(module: str) -> set[str]:
    """Everything ``module`` imports, following this project's modules (training.*, interp.*)."""
    seen, todo = set(), [module]
    while todo:
        for name in direct_imports(todo.pop()):
            if name in seen:
                continue
            seen.add(name)
            if name.split(".")[0] in ("training", "interp") and module_file(name) is not None:
                todo.append(name)
    return seen


def test_the_checker_sees_imports():
    assert "interp.views.figures" in closure("interp.views.report") and "plotly.graph_objects" in closure("interp.views.report")
    assert "training.run" in closure("interp.analyze")


@pytest.mark.parametrize("module", ANALYSES)
def test_analyses_import_no_figure_or_page_module(module):
    views = {m for m in closure(module) if m in VIEWS or m.split(".")[0] in VIEWS}
    assert not views, f"{module} imports {sorted(views)}"


TRAINING = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "training").rglob("*.py"))
INTERP = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "interp").rglob("*.py")
                if p.name != "__init__.py")


@pytest.mark.parametrize("module", TRAINING)
def test_training_never_imports_interp(module):
    assert not {m for m in closure(module) if m.split(".")[0] == "interp"}


def test_the_checker_sees_task_modules():
    assert "training.tasks.induction" in closure("training.presets")
    assert "training.tasks.base" in closure("interp.attention")


@pytest.mark.parametrize("module", INTERP)
def test_interp_imports_no_task_specific_module(module):
    found = sorted(m for m in closure(module) if m in TASK_SPECIFIC or m.rpartition(".")[0] in TASK_SPECIFIC)
    assert not found, f"{module} imports {found}"


def test_no_import_cycle_between_patch_and_attribution():
    assert "interp.patch" not in closure("interp.attribution") or "interp.attribution" not in closure("interp.patch")
