"""The command line's pieces (``plateauscope.cli.parser``, ``cli.common``, ``cli.text``): one-line errors,
the one table format, and the text package's names; and the project's first command, ``python -m interp.patch``."""

import argparse
import os

import pytest

import plateauscope as ps
from interp import patch as interp_patch
from plateauscope.cli import text
from plateauscope.cli.common import run_cli
from plateauscope.cli.parser import OneLineParser
from plateauscope.cli.text.tables import format_table
from plateauscope.runs.files import RunError


def test_a_table_is_right_aligned_with_signed_floats():
    table = format_table([["L0", 0.5, 12], ["L10", -1.25, 3]], ["layer", "effect", "n"])
    assert table.splitlines() == ["layer  effect   n", "   L0  +0.500  12", "  L10  -1.250   3"]


def test_a_usage_error_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="plateauscope thing")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--n", "x"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: argument --n") and "(see plateauscope thing --help)" in err


def test_a_user_error_in_a_verb_is_one_line(capsys):
    def body(args: argparse.Namespace) -> None:
        raise RunError("runs/x: no such run directory")

    assert run_cli(body, [], argparse.ArgumentParser()) == 2
    assert capsys.readouterr().err == "error: runs/x: no such run directory\n"


def test_the_text_package_is_the_public_text():
    assert ps.text is text and set(text.__all__) <= set(dir(text))
    assert text.na(None) == "n/a" and text.na(0.12345) == "0.123"


def test_the_first_command_is_an_alias_of_patch(capsys):
    with pytest.raises(SystemExit) as done:
        interp_patch.main(["--help"])
    assert done.value.code == 0 and "usage: plateauscope patch" in capsys.readouterr().out


def test_the_command_starts_torch_with_a_short_spin(monkeypatch):
    """The verb's torch loads OpenMP with threads that spin briefly, then sleep, while they wait (bench/threads.py);
    a wait policy or spin count the user set is kept."""
    from plateauscope.cli import SPIN_COUNT, main

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["no-such-verb"]) == 2
    assert os.environ["GOMP_SPINCOUNT"] == SPIN_COUNT
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert main(["no-such-verb"]) == 2
    assert "GOMP_SPINCOUNT" not in os.environ
