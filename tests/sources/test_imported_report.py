"""The report and the time view of an imported run, read as a user reads them: every sentence and label in the
probe's own words (no cue, selector, routing head or t_form, no unfilled template), the phase change drawn with a
caption whose numbers are the probe record's; and a probe that is not a task gets a report of its pass."""

from __future__ import annotations

import html
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from plateauscope.analysis.results import analysis_dir
from plateauscope.cli import main as cli
from plateauscope.sources.importer import import_series
from plateauscope.views.phrases import head_call_text, landmark_text, transition_lines
from plateauscope.views.probe_report import phase_change_caption, sentences

CHOSEN = (0, 100, 200, 300, 400, 440, 480, 520, 560, 800)
"""The checkpoints analysed: enough before the rise for an onset, a few across it (kept small)."""
FORBIDDEN = (re.compile(r"\bcue\b|Δcue", re.IGNORECASE), re.compile(r"selector|routing|t_form", re.IGNORECASE),
             re.compile(r"\bn/a\b|τ = |named when a head is named"), re.compile(r"\bp\d+/r\d+\b"))
"""Selector words and unfilled templates, which an imported run's pages never show."""

COPY_PAIRS = '''
import torch

from plateauscope import Probe


class CopyPairs(Probe):
    """A start token and a random segment twice, scored on the token two back (a probe that is not a task)."""

    probe_name = "copy_pairs"

    def __init__(self, tokens):
        self.tokens = tokens

    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0):
        half = torch.randint(1, d_vocab, (32, 8), generator=torch.Generator().manual_seed(seed))
        return cls(torch.cat([torch.zeros(32, 1, dtype=torch.long), half, half], dim=1))

    def detection_patterns(self, tokens):
        n, seq = tokens.shape
        return {"two_back": torch.diag(torch.ones(seq - 2), -2).expand(n, seq, seq).clone()}
'''


def _strings(value: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """Every string in a JSON value, leaving out the keys ``skip`` (their values are data, not words)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k not in skip for s in _strings(v, skip)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, skip)]
    return []


def words_of(page: Path) -> str:
    """What a reader of a page reads: its text outside scripts and styles, each plotly figure's words (titles, axes,
    annotations, labels, trace names), the names CircuitsVis gives the heads, and the time view's data but for its
    attention patterns."""
    source = page.read_text(encoding="utf-8")
    words = [html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", source, flags=re.S)))]
    decoder = json.JSONDecoder()
    for match in re.finditer(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*", source):
        at = match.end()
        data, at = decoder.raw_decode(source, at)
        layout, _ = decoder.raw_decode(source, source.index("{", at))
        words += _strings(data, ("x", "y", "z", "customdata")) + _strings(layout, ("template",))
    words += re.findall(r'"attentionHeadNames":\s*(\[[^\]]*\])', source)
    view = re.search(r'<script type="application/json" id="view-data">(.*?)</script>', source, re.S)
    if view:
        words += _strings(json.loads(view.group(1)), ("patterns", "edge_scores"))
    return "\n".join(words)


def assert_in_probe_words(text: str) -> None:
    for pattern in FORBIDDEN:
        found = pattern.search(text)
        assert found is None, text[max(0, found.start() - 200): found.end() + 200]


@pytest.fixture(scope="module")
def analysed(llama_induction_series, tmp_path_factory):
    """The Llama series (both layer-1 heads induct) imported and analysed with the induction probe, kept small;
    its report and its time view written by the command line."""
    source, _ = llama_induction_series
    run = import_series(source, tmp_path_factory.mktemp("reported") / "run").path
    assert cli(["analyze", "--run", str(run), "--no-progress", "--steps", *map(str, CHOSEN), "--n-examples", "16",
                "--ablation-groups", "2", "--n-exact", "2", "--circuit-pairs", "8", "--n-exact-edges", "8",
                "--workers", "1"]) == 0
    assert cli(["report", "--run", str(run), "--examples", "1"]) == 0 and cli(["view", "--run", str(run)]) == 0
    return run, json.loads((analysis_dir(run) / "probe_induction.json").read_text())


def test_the_report_and_the_view_speak_the_probes_words(analysed):
    run, record = analysed
    report, view = words_of(run / "report.html"), words_of(run / "view.html")
    assert "The phase change" in report and "attention to the induction target" in view
    assert_in_probe_words(report)
    assert_in_probe_words(view)
    for la, h in record["named_heads"]["induction"]:  # the heads marked are those the probe's rule names
        assert f"L{la}H{h} (induction)" in report
    assert not (run / "overview.svg").exists()  # the routing head's glance is not drawn for an imported run


def test_the_phase_change_caption_states_the_records_numbers(analysed):
    run, record = analysed
    text = (run / "report.html").read_text(encoding="utf-8")
    t = record["transition"]
    assert t["phase_change"] is not None and sorted(map(tuple, record["named_heads"]["induction"])) == [(1, 0), (1, 1)]
    assert 'id="fig-phase_change"' in text
    assert html.escape(phase_change_caption(record)) in text  # the caption, from the record
    assert html.escape(sentences(transition_lines(record))) in text  # the sentences the command line prints
    assert f"phase change (half-rise) {landmark_text(t['phase_change'])}" in text
    for call in record["heads"]["induction"]:
        if call["kind"] == "named":
            assert html.escape(head_call_text(call)) in text
    gap = re.search(r"<th>in_context_loss_gap</th><td>([^<]*)</td>", text).group(1)  # the Measures table
    assert f"phase change (half-rise) {landmark_text(t['phase_change'])}" in gap and "(the probe&#x27;s pass)" in gap
    view = words_of(run / "view.html")
    assert f"the in-context loss gap's phase change (half-rise) at step {landmark_text(t['phase_change'])}" in view
    data = json.loads(re.search(r'id="view-data">(.*?)</script>', (run / "view.html").read_text(), re.S).group(1))
    assert data["selected_head"] == record["named_heads"]["induction"][0] and data["markers"]["t_form"] is None


def test_a_probe_that_is_not_a_task_gets_a_report_of_its_pass(neox_series, tmp_path, capsys):
    source, steps = neox_series
    run = import_series(source, tmp_path / "run", steps=[steps[0], steps[6], steps[-1]]).path
    probe = tmp_path / "my_probe.py"
    probe.write_text(textwrap.dedent(COPY_PAIRS))
    assert cli(["analyze", "--run", str(run), "--no-progress", "--probe", f"{probe}:CopyPairs"]) == 0
    capsys.readouterr()
    assert cli(["report", "--run", str(run)]) == 0, capsys.readouterr().err
    record = json.loads((analysis_dir(run) / "probe_copy_pairs.json").read_text())
    text = (run / "report.html").read_text(encoding="utf-8")
    assert "Heads the probe names (copy_pairs)" in text and "no analysis cache" not in text
    assert html.escape(phase_change_caption(record)) in text
    assert "The probe measures no loss gap: no transition is read." in text  # its note, where it has no gap
    for call in record["heads"]["two_back"]:
        assert f"<th>two-back: {call['head']}</th>" in text
    assert_in_probe_words(words_of(run / "report.html"))
    assert cli(["view", "--run", str(run)]) == 2  # no task, no circuit over its data: one line, pointing at report
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a plateauscope.Task" in err and "plateauscope report" in err
