"""The report CLI: writes one file, and fails with one line (exit 2) on a missing run or analysis."""

from __future__ import annotations

import shutil

from plateauscope.analysis.landmarks import nearest
from plateauscope.cli import report as report_cli
from plateauscope.views import report
from plateauscope.views.report import moment_steps


def test_moments_are_nearest_checkpoints():
    steps = [0, 5, 10, 20, 40]
    assert nearest(steps, 7) == 5 and nearest(steps, 7.5) == 5 and nearest(steps, 8) == 10
    assert moment_steps(steps, 3, 30) == {"plateau start": 5, "tau/2": 10, "tau": 20, "end": 40}
    assert moment_steps(steps, 3, None) == {"plateau start": 5, "end": 40}
    moments = moment_steps(steps, 3, 30, t_form=18)
    assert moments == {"plateau start": 5, "t_form": 20, "tau/2": 10, "tau": 20, "end": 40}
    assert list(moments) == ["plateau start", "tau/2", "t_form", "tau", "end"]  # in the order of their steps


def test_report_cli_writes_one_file(ci_analysed, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert report_cli.main(["--run", str(ci_analysed), "--out", str(out), "--examples", "1"]) == 0
    assert str(out) in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "Summary" in text and "cv-view" in text
    summary = report.Run(ci_analysed).summary
    verdict = summary["plateau"]["verdict"]
    # a verdict of the longest in-band stretch only, where the counts find no plateau at the height
    only = ("" if summary["plateau_counts"]["holds"]
            else "of the longest in-band stretch only (by the counts, no plateau at the height): ")
    row = "plateau verdict (marginal | global marginal | shelf | mixed, on the set loss)</th><td>"
    assert f"{row}{only}{verdict}:" in text
    assert f"plateau: {verdict}" in text  # in the loss figure's title


def test_report_cli_errors_are_one_line(ci_analysed, tmp_path, capsys):
    assert report_cli.main(["--run", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "dataset.jsonl", "metrics.jsonl"):
        shutil.copy(ci_analysed / name, bare / name)
    assert report_cli.main(["--run", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plateauscope analyze --run" in err and "--analyze" in err
    assert not (bare / report.REPORT_FILE).exists()
