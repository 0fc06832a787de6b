"""The house, read from the source of every module of the package: the design's one executable statement.

Every ``import`` statement counts, at any depth: inside functions and under ``if TYPE_CHECKING:`` too
(only a script's ``if __name__ == "__main__":`` block is left out).

* The floors (:data:`FLOORS`), from the ground up: the ground floor (the model, its forwards and configs),
  the tasks, the run directories, then training, the readers of other series and the analyses side by side
  (none imports another), then sweeps, dynamics, views, and on top the public API and the command line.
  A module imports its own package and the floors below it, never a package beside it or above it.
* No import cycle anywhere.
* The training side (training, sweeps, sources) never imports the analyses, the fits, the views or the
  command line.
* Analyses compute and draw nothing: no figure or page module, no plotting library.
* Only the task registry (by name, at run time) reaches a built-in task's module from the analyses and views.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGES = ("plateauscope", "interp")


def _name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_name(p) for package in PACKAGES for p in (SRC / package).rglob("*.py"))
"""Every module of the package, ``__init__`` and ``__main__`` modules included."""


def module_file(name: str) -> Path | None:
    """The source file of one of this project's modules (a package's ``__init__.py``), or None."""
    path = SRC / name.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def direct_imports(module: str) -> frozenset[str]:
    """This project's modules named by ``module``'s import statements (``from a import b`` names ``a``,
    and ``a.b`` when that is a module)."""
    tree = ast.parse(module_file(module).read_text())
    skipped = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    skip = {id(n) for block in skipped for n in ast.walk(block)}
    package = module if module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return frozenset(m for m in found if m.split(".")[0] in PACKAGES and module_file(m) is not None
                     or m.split(".")[0] not in PACKAGES)


def closure(module: str) -> set[str]:
    """Everything ``module`` imports, following this project's modules."""
    seen, todo = set(), [module]
    while todo:
        for name in direct_imports(todo.pop()):
            if name not in seen:
                seen.add(name)
                if name.split(".")[0] in PACKAGES:
                    todo.append(name)
    return seen


def import_graph() -> dict[str, list[str]]:
    """Module -> the project's modules it imports."""
    return {m: sorted(d for d in direct_imports(m) if d in MODULES) for m in MODULES}


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The import cycles of a graph: strongly connected components (Tarjan) of more than one module, or
    a module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for m in graph:
        if m not in index:
            visit(m)
    return found


def test_the_checker_sees_every_module_and_its_imports():
    assert "plateauscope.__main__" in MODULES and "plateauscope.cli.train" in MODULES and "interp.patch" in MODULES
    assert "plateauscope.views.figures" in closure("plateauscope.views.report")
    assert "plotly.graph_objects" in closure("plateauscope.views.report")
    assert "plateauscope.runs.run" in closure("plateauscope.analysis.analyze")
    assert "plateauscope.cli.patch" in closure("interp.patch")


def test_the_cycle_finder_finds_cycles():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a", "d"], "e": []}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d"]]
    assert cycles({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


TRAINING_SIDE = ("plateauscope.training", "plateauscope.tasks", "plateauscope.model.backend", "plateauscope.sweeps")
ANALYSIS_SIDE = ("plateauscope.analysis", "plateauscope.dynamics", "plateauscope.views", "plateauscope.cli",
                 "plateauscope.api")
ANALYSES_AND_VIEWS = ("plateauscope.analysis", "plateauscope.dynamics", "plateauscope.views")
VIEWS = ("plotly", "circuitsvis", "plateauscope.views")
TASK_SPECIFIC = ("plateauscope.tasks.selector", "plateauscope.tasks.selector_layout",
                 "plateauscope.tasks.selector_metrics", "plateauscope.tasks.induction",
                 "plateauscope.tasks.markov")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, TRAINING_SIDE)])
def test_training_side_never_imports_the_analyses(module):
    found = sorted(m for m in closure(module) if _under(m, ANALYSIS_SIDE))
    assert not found, f"{module} imports {found}"


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, ("plateauscope.analysis", "plateauscope.dynamics"))])
def test_analyses_import_no_figure_or_page_module(module):
    found = sorted(m for m in closure(module) if _under(m, VIEWS))
    assert not found, f"{module} imports {found}"


def test_the_checker_sees_task_modules():
    assert "plateauscope.tasks.induction" in closure("plateauscope.runs.presets")
    assert "plateauscope.tasks.base" in closure("plateauscope.analysis.attention")


@pytest.mark.parametrize("module", [m for m in MODULES if _under(m, ANALYSES_AND_VIEWS)])
def test_analyses_import_no_task_specific_module(module):
    found = sorted(m for m in closure(module) if _under(m, TASK_SPECIFIC))
    assert not found, f"{module} imports {found}"


TESTS = Path(__file__).resolve().parent


def _test_imports() -> set[str]:
    """Every module that some test file names in an import statement (and the packages above it)."""
    found: set[str] = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found | {m.rsplit(".", i)[0] for m in set(found) for i in range(1, m.count(".") + 1)}


def test_the_tests_mirror_the_packages():
    """One test folder per package of ``plateauscope``, and every module imported by some test."""
    packages = {p.name for p in (SRC / "plateauscope").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in TESTS.iterdir() if (p / "__init__.py").is_file()}
    assert packages <= folders, sorted(packages - folders)
    untested = [m for m in MODULES if m not in _test_imports() and not m.endswith("__main__")]
    assert not untested, f"no test imports {untested}"
