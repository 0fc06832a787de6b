"""One writer per run (``plateauscope.runs.files.writer_lock``), and an analysis cache keyed on the task.

The lock is tested across real processes (``fcntl`` locks are per process): two analyses that
start together while a third process holds the lock, a holder killed with SIGKILL, and a writer
that is asked not to wait. The work done once is checked against an analysis of a copy of the same
run by a single process: the same records, none twice.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import plateauscope as ps
from plateauscope.analysis.analyze import AnalysisSettings, analyze_run, load_analysis
from plateauscope.analysis.results import ANALYSIS_DIR, LOCK_FILE, cached_series
from plateauscope.cli.analyze import main as analyze_main
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.training.train import train
from tests.conftest import copy_run

ANALYSE = ["--n-examples", "16", "--n-exact", "2", "--no-progress"]
HOLD = """
import sys, time
from pathlib import Path
from plateauscope.runs.files import writer_lock
with writer_lock(Path(sys.argv[1]), "its analysis cache"):
    print("held", flush=True)
    if sys.argv[2] == "die":
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""


def hold_lock(run: Path, until: str) -> subprocess.Popen:
    """A process that holds the run's analysis lock until the file ``until`` exists (``die``: is killed holding it)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run / ANALYSIS_DIR / LOCK_FILE), until],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def cache_lines(run: Path) -> dict[str, list[tuple]]:
    """Each cache file's records as (step, settings) keys, in file order."""
    return {p.name: [(r["step"], repr(r["settings"])) for r in rd.read_jsonl(p)]
            for p in sorted((run / ANALYSIS_DIR).glob("*.jsonl"))}


def test_two_analyses_at_once_do_the_work_once(tiny_run, tmp_path):
    single = copy_run(tiny_run, tmp_path / "single")
    assert analyze_main(["--run", str(single), *ANALYSE]) == 0
    shared = copy_run(tiny_run, tmp_path / "shared")
    release = tmp_path / "release"
    holder = hold_lock(shared, str(release))
    logs = [tmp_path / f"analysis{i}.err" for i in range(2)]
    analyses = [subprocess.Popen([sys.executable, "-m", "plateauscope", "analyze", "--run", str(shared), *ANALYSE],
                                 stdout=subprocess.DEVNULL, stderr=log.open("w")) for log in logs]
    deadline = time.monotonic() + 120
    while not all("waiting for it to finish" in log.read_text() for log in logs):  # both are blocked on the lock
        assert time.monotonic() < deadline and all(a.poll() is None for a in analyses), [log.read_text() for log in logs]
        time.sleep(0.1)
    release.touch()
    assert holder.wait(30) == 0 and [a.wait(300) for a in analyses] == [0, 0]
    waited = [log.read_text().splitlines() for log in logs]
    assert all(sum("is being written by pid" in line for line in lines) == 1 for lines in waited), waited
    once, twice = cache_lines(single), cache_lines(shared)
    assert twice == once  # the same records, in the same order: none computed twice
    assert all(not [k for k, n in Counter(keys).items() if n > 1] for keys in twice.values())


def test_a_lock_held_by_a_killed_process_is_free(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    holder = hold_lock(run, "die")
    assert holder.wait(30) == -signal.SIGKILL
    analyze_run(run, steps=[20, 40], n_exact=1, settings=AnalysisSettings(n_examples=16), progress=False, wait=False)
    assert len(load_analysis(run)["attention"]) == 2


def test_no_wait_exits_with_one_line_and_readers_never_block(tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    assert analyze_main(["--run", str(run), "--steps", "20", "40", *ANALYSE]) == 0
    capsys.readouterr()
    holder = hold_lock(run, str(tmp_path / "release"))
    try:
        assert analyze_main(["--run", str(run), "--no-wait", *ANALYSE]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run / ANALYSIS_DIR}: its analysis cache is being written by pid {holder.pid}" in err[0]
        assert "not waiting (--no-wait)" in err[0]
        assert len(load_analysis(run)["attention"]) == 2  # a reader, while the lock is held
        assert len(ps.Run(run).analysis().attention) == 2
    finally:
        (tmp_path / "release").touch()
        holder.wait(30)


TASK = '''
from plateauscope.tasks.selector import SelectorTask


class Mine(SelectorTask):
    """The selector task, from a file of one's own."""
'''


def test_an_edited_task_file_recomputes_and_says_so(tmp_path, caplog):
    source = tmp_path / "mine.py"
    source.write_text(TASK)
    cfg = get_preset("tiny")
    out = tmp_path / "run"
    train(dataclasses.replace(cfg, task_name=f"{source}:Mine"), out, device="cpu", progress=False)
    settings = AnalysisSettings(n_examples=16)

    def analyse() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plateauscope.analysis.analyze"):
            analyze_run(out, steps=[20, 40], n_exact=1, settings=settings, progress=False)
        return [r.getMessage() for r in caplog.records]

    computed = []

    def series() -> list[str]:  # the cache of the Hessian and the LLC, with a probe in place of their computation
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="plateauscope.analysis.results"):
            cached_series(rd.Run(out), out / ANALYSIS_DIR / "probe.jsonl", {"probe": 1}, [20, 40],
                          lambda step, model: computed.append(step) or {"n": len(computed)}, "probe", progress=False)
        return [r.getMessage() for r in caplog.records]

    assert analyse() == [] and series() == [] and computed == [20, 40]
    first = rd.read_jsonl(out / ANALYSIS_DIR / "attention.jsonl")
    assert analyse() == [] and rd.read_jsonl(out / ANALYSIS_DIR / "attention.jsonl") == first  # cached
    assert series() == [] and computed == [20, 40]
    source.write_text(TASK + "\n# an edit that could change what the task computes\n")
    assert series() == [f"{out}: the task ({source}:Mine) changed since probe.jsonl was written: recomputing"]
    assert computed == [20, 40, 20, 40]
    assert analyse() == [f"{out}: the task ({source}:Mine) changed since its analysis cache was written: recomputing"]
    after = rd.read_jsonl(out / ANALYSIS_DIR / "attention.jsonl")
    assert len(after) == 2 * len(first) and {r["settings"]["task"] for r in after[len(first):]} != \
        {r["settings"]["task"] for r in first}
    assert analyse() == [] and len(rd.read_jsonl(out / ANALYSIS_DIR / "attention.jsonl")) == len(after)
    assert load_analysis(out)["routing"]["task"] == after[-1]["settings"]["task"]


TRAIN_SLOWLY = """
import sys, time
from plateauscope.runs.presets import get_preset
from plateauscope.training.train import TrainingHooks, train
# a second at each evaluation: the run takes long enough to be seen half-way
train(get_preset("tiny"), sys.argv[1], device="cpu", progress=False,
      hooks=TrainingHooks(on_evaluation=lambda record, seconds: time.sleep(1.0)))
"""


def test_follow_a_run_that_trains_in_another_process(tmp_path):
    """``tiny`` trains in one process (slowed down) while this one follows it; the final cache equals an
    analysis of the finished run after the fact, record for record, and the live pages said so."""
    from plateauscope.analysis.follow import follow
    from plateauscope.cli.analyze import write_pages
    from plateauscope.views.pages import live_status

    out = tmp_path / "run"
    trainer = subprocess.Popen([sys.executable, "-c", TRAIN_SLOWLY, str(out)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    live_pages = []

    def seen(step: int, max_steps: int) -> None:
        write_pages(out, live_status(step, max_steps))
        live_pages.append((step, (out / "report.html").read_text(), (out / "view.html").read_text()))
    settings = AnalysisSettings(n_examples=16)
    try:
        follow(out, settings, n_exact=2, poll_s=0.2, on_refresh=seen, on_complete=lambda: write_pages(out),
               timeout_s=600.0)
    finally:
        assert trainer.wait(600) == 0, trainer.stderr.read()
    max_steps = get_preset("tiny").train.max_steps
    assert live_pages and live_pages[0][0] < max_steps  # seen before the end
    assert all(f"live: last analysed step {step} of {max_steps}" in report and
               f"live: last analysed step {step} of {max_steps}" in view for step, report, view in live_pages)
    assert "live: last analysed" not in (out / "report.html").read_text()
    assert "live: last analysed" not in (out / "view.html").read_text()
    after = copy_run(out, tmp_path / "after")
    analyze_run(after, n_exact=2, settings=settings, progress=False)
    assert cache_lines(out) == cache_lines(after)
    for name in cache_lines(out):
        assert rd.read_jsonl(out / ANALYSIS_DIR / name) == rd.read_jsonl(after / ANALYSIS_DIR / name), name
