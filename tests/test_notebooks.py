"""The notebooks run top to bottom, without an error, on the session's analysed `ci` run.

Each notebook is executed with nbclient in a ``python3`` kernel of *this* interpreter (a kernel spec
written to a temporary JUPYTER_PATH, so a user-level ``python3`` spec cannot swap in another Python),
with ``PLATEAUSCOPE_RUN_DIR`` pointing at the run. The committed notebooks carry no outputs.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import copy_run

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
SWEEP_NOTEBOOKS = ("04_sweeps_and_scaling.ipynb",)
"""Notebooks that look at a sweep (``PLATEAUSCOPE_SWEEP_DIR``, the session's tiny sweep), not at a run."""
OWN_RUN_NOTEBOOKS = ("07_a_task_of_your_own.ipynb", "08_what_the_plateau_waits_for.ipynb", "09_clamps_and_grafts.ipynb",
                     "10_your_own_checkpoints.ipynb", "11_grokking.ipynb")
"""Notebooks that train their own run (or sweep) into ``PLATEAUSCOPE_OUT_DIR`` (a temporary folder here)."""
NOTEBOOKS = tuple(sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")
                         if p.name not in SWEEP_NOTEBOOKS + OWN_RUN_NOTEBOOKS))
CELL_TIMEOUT_S = 900  # notebook 07 analyses its own run in one cell: over 300 s on a slow, loaded 2-core host


def _kernel_env(tmp_path_factory, variable: str, value: Path) -> pytest.MonkeyPatch:
    """JUPYTER_PATH with a ``python3`` kernel of this interpreter, and ``variable`` set to ``value``."""
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (test venv)", "language": "python"}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(spec_dir.parent.parent))
    mp.setenv(variable, str(value))
    return mp


@pytest.fixture(scope="module")
def kernel_env(ci_analysed, tmp_path_factory):
    """The notebooks look at a copy of the analysed ci run (notebook 05 adds its Hessian cache to it)."""
    run = copy_run(ci_analysed, tmp_path_factory.mktemp("notebooks") / "ci", with_analysis=True)
    mp = _kernel_env(tmp_path_factory, "PLATEAUSCOPE_RUN_DIR", run)
    yield run
    mp.undo()


@pytest.fixture(scope="module")
def sweep_kernel_env(tiny_sweep, tmp_path_factory):
    """Notebook 04 looks at a sweep, not a run: PLATEAUSCOPE_SWEEP_DIR points it at the session's tiny sweep."""
    sweep = shutil.copytree(tiny_sweep, tmp_path_factory.mktemp("notebooks") / "sweep")
    mp = _kernel_env(tmp_path_factory, "PLATEAUSCOPE_SWEEP_DIR", sweep)
    yield sweep
    mp.undo()


@pytest.mark.parametrize("name, var", [(n, "RUN_DIR") for n in NOTEBOOKS] + [(n, "SWEEP_DIR") for n in SWEEP_NOTEBOOKS]
                         + [(n, "OUT_DIR") for n in OWN_RUN_NOTEBOOKS])
def test_notebook_is_committed_without_outputs(name, var):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and code[0].source.splitlines()[-1].startswith(f"{var} = ")
    assert f'os.environ.get("PLATEAUSCOPE_{var}"' in code[0].source
    assert all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, kernel_env):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()  # raises on any cell error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert str(kernel_env) in text  # it looked at the run it was pointed at, not a default


@pytest.mark.parametrize("name", SWEEP_NOTEBOOKS)
def test_sweep_notebook_runs(name, sweep_kernel_env):
    test_notebook_runs(name, sweep_kernel_env)


@pytest.fixture(scope="module")
def out_kernel_env(interventions_sweep, tmp_path_factory):
    """Notebooks 07 and 08 train their own run or sweep into PLATEAUSCOPE_OUT_DIR: a folder with nothing
    but a copy of the session's plateau-interventions-tiny sweep, which notebook 08's run_sweep finds
    complete (tests/training/test_interventions.py tests its training), so it goes on to analyse it."""
    out = tmp_path_factory.mktemp("notebooks") / "own"
    out.mkdir()
    shutil.copytree(interventions_sweep[0], out / "plateau-interventions-tiny")
    mp = _kernel_env(tmp_path_factory, "PLATEAUSCOPE_OUT_DIR", out)
    mp.setenv("PLATEAUSCOPE_MAX_STEPS", "100")  # notebook 11's grokking run, cut short
    yield out
    mp.undo()


@pytest.mark.parametrize("name", OWN_RUN_NOTEBOOKS)
def test_own_task_notebook_runs(name, out_kernel_env):
    test_notebook_runs(name, out_kernel_env)
