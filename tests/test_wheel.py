"""The wheel, as a user installs it: built from the checkout, installed without ``-e`` into a fresh
virtual environment, and run from a folder outside the checkout.

The fresh environment has only the wheel in its own site-packages; the project's dependencies come
from the test environment's site-packages, appended after it (``--no-deps`` on top of them), whose
editable install of the checkout is not activated (a ``.pth`` line only appends a folder). So every
import of ``plateauscope`` resolves to the wheel, and a subpackage or data file missing from it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)], cwd=out)
    (path,) = out.glob("plateauscope-*.whl")
    return path


def test_the_wheel_holds_every_module_and_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    sources = {str(Path(f).relative_to("src")) for f in tracked}
    assert sources, "no sources found"
    missing = sorted(sources - names)
    assert not missing, f"missing from {wheel.name}: {missing}"
    assert not {n for n in names if n.split("/")[0] in ("tests", "training", "bench", "docs")}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "plateauscope = plateauscope.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_wheel_trains_analyses_and_reports_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip())
    # the test environment's packages (torch, transformer_lens, ...) after the fresh environment's own
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)], tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLATEAUSCOPE_OTHER_PYTHON")}
    command = env_dir / "bin" / "plateauscope"
    where = _run([str(python), "-c", "import plateauscope; print(plateauscope.__file__)"], work, env)
    assert where.startswith(str(site)), f"plateauscope imported from {where.strip()}, not from the wheel"
    assert "train" in _run([str(command), "--help"], work, env)
    assert _run([str(command), "--version"], work, env).split() == ["plateauscope", _version()]
    _run([str(command), "train", "--preset", "tiny", "--out", "run", "--no-progress"], work, env)
    _run([str(command), "analyze", "--run", "run", "--every", "2", "--n-exact", "2", "--no-progress"], work, env)
    _run([str(command), "report", "--run", "run"], work, env)
    _run([str(command), "view", "--run", "run"], work, env)
    assert (work / "run" / "report.html").stat().st_size > 0 and (work / "run" / "view.html").stat().st_size > 0
    opened = _run([str(python), "-c", "import plateauscope as ps; r = ps.Run('run'); "
                   "print(len(r.steps), r.summary['tau'] is None or r.summary['tau'] >= 0, ps.__version__)"],
                  work, env).split()
    assert int(opened[0]) > 1 and opened[1] == "True" and opened[2] == _version()
    # the project's first command, as an alias
    assert "step" in _run([str(python), "-m", "interp.patch", "--ckpt", "run", "--n-examples", "8", "--top", "2"], work, env)


def _version() -> str:
    text = (SRC / "plateauscope" / "__init__.py").read_text()
    return text.split('__version__ = "')[1].split('"')[0]
