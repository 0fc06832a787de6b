"""A probe of one's own in one file (``--probe file.py:Class``) on an imported GPT-NeoX series: its head scores
against Hugging Face's own attention weights and TransformerLens's head_detector, its head patching against
patching done by hand on Hugging Face's model, and every broken probe file in one line."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from transformer_lens.head_detector import detect_head

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.analysis.results import analysis_dir
from plateauscope.cli import main as cli_main
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.importer import import_series

PROBE_FILE = '''
import torch

from plateauscope import Probe, PromptPairs, Task
from plateauscope.tasks.induction_probe import InductionProbe

SEGMENT = 8


def two_back(n, seq):
    """1 at (q, q - 2): a head that reads the token two back."""
    return torch.diag(torch.ones(seq - 2), -2).expand(n, seq, seq).clone()


class CopyPairs(Probe):
    """A start token and a random segment twice; pairs whose answer is the segment's last token (clean) or
    the token swapped in for it in the first copy (corrupted)."""

    probe_name = "copy_pairs"

    def __init__(self, tokens, d_vocab):
        self.tokens = tokens
        self.d_vocab = d_vocab

    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0):
        gen = torch.Generator().manual_seed(seed)
        half = torch.randint(1, d_vocab, (48, SEGMENT), generator=gen)
        return cls(torch.cat([torch.zeros(48, 1, dtype=torch.long), half, half], dim=1), d_vocab)

    def detection_patterns(self, tokens):
        n, seq = tokens.shape
        same = torch.tril((tokens[:, :, None] == tokens[:, None, :]).float(), diagonal=-1)
        return {"two_back": two_back(n, seq), "same_token": same}

    def prompt_pairs(self, n, seed):
        clean = self.tokens[:n, :-1]
        corrupt = clean.clone()
        corrupt[:, SEGMENT] = clean[:, SEGMENT] % (self.d_vocab - 1) + 1
        return PromptPairs(clean, corrupt, self.tokens[:n, -1], corrupt[:, SEGMENT].clone(), torch.arange(len(clean)),
                           clean.shape[1] - 1)


class TwoBackInduction(InductionProbe):
    """The built-in probe (a task and a Probe) with a pattern of its own."""

    probe_name = "two_back_induction"

    def detection_patterns(self, tokens):
        return {"two_back": two_back(*tokens.shape[:2])}


class OutOfVocab(CopyPairs):
    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0):
        probe = CopyPairs.for_model(d_vocab, n_ctx, seed)
        return cls(probe.tokens + d_vocab // 2, d_vocab)


class AnswersOutOfVocab(CopyPairs):
    def prompt_pairs(self, n, seed):
        pairs = super().prompt_pairs(n, seed)
        pairs.corrupt_answer = torch.full_like(pairs.corrupt_answer, self.d_vocab)
        return pairs


class Broken(CopyPairs):
    def detection_patterns(self, tokens):
        return {"two_back": tokens[len(tokens) + 5]}


class NoForModel(Probe):
    def detection_patterns(self, tokens):
        return {}


class NoMeasure(Probe):
    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0):
        return cls()


class HalfATask(Task, Probe):  # the task's abstract members left out
    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0):
        return cls()

    def loss_gap(self, model):
        return 0.0


class NotAProbe:
    pass


class GapFails(CopyPairs):  # builds and checks, then fails on a model at the first checkpoint
    def loss_gap(self, model):
        return 1 / 0
'''


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    """The probe file, written as a user would."""
    path = tmp_path_factory.mktemp("probes") / "my_probes.py"
    path.write_text(textwrap.dedent(PROBE_FILE))
    return path


@pytest.fixture(scope="module")
def imported(neox_series, tmp_path_factory):
    source, steps = neox_series
    chosen = [steps[0], steps[6], steps[-1]]
    return source, chosen, import_series(source, tmp_path_factory.mktemp("run") / "run", steps=chosen).path


def hf_model(source, step):
    """Hugging Face's own model of a checkpoint, attention weights computed explicitly."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{step}", attn_implementation="eager").eval()


def hand_scores(attentions, detection):
    """head_detector's ``mul`` score from Hugging Face's attention weights ``[layer] -> [N, head, q, k]``."""
    return torch.stack([((a * detection[:, None]).sum((-1, -2)) / a.sum((-1, -2))).mean(0) for a in attentions])


def hand_target_scores(attentions, detection):
    """The mean attention to the targets over the positions that have one, per sequence, then averaged: by loops
    over Hugging Face's attention weights."""
    out = []
    for a in attentions:
        per_sequence = []
        for i in range(len(detection)):
            rows = [q for q in range(detection.shape[1]) if detection[i, q].sum() > 0]
            per_sequence.append(sum((a[i, :, q] * detection[i, q]).sum(-1) for q in rows) / len(rows))
        out.append(torch.stack(per_sequence).mean(0))
    return torch.stack(out)


@torch.no_grad()
def hand_patching(hf, pairs):
    """Exact patching of each head's output at every position, by hand on Hugging Face's GPT-NeoX: the head's
    slice of the attention output (the input of ``attention.dense``) from the clean run, in the corrupted one."""
    layers = hf.gpt_neox.layers
    n_heads = hf.config.num_attention_heads
    d_head = hf.config.hidden_size // n_heads

    def diff(logits):
        last = logits[:, pairs.pred_pos]
        return (last.gather(-1, pairs.clean_answer[:, None]) - last.gather(-1, pairs.corrupt_answer[:, None])).mean()

    clean_z = {}
    hooks = [layer.attention.dense.register_forward_pre_hook(
        lambda m, args, i=i: clean_z.__setitem__(i, args[0].clone())) for i, layer in enumerate(layers)]
    clean = diff(hf(pairs.clean).logits)
    for h in hooks:
        h.remove()
    corrupt = diff(hf(pairs.corrupt).logits)
    out = torch.zeros(len(layers), n_heads)
    for i, layer in enumerate(layers):
        for head in range(n_heads):
            cols = slice(head * d_head, (head + 1) * d_head)

            def patch_in(m, args, i=i, cols=cols):
                z = args[0].clone()
                z[..., cols] = clean_z[i][..., cols]
                return (z,)

            hook = layer.attention.dense.register_forward_pre_hook(patch_in)
            out[i, head] = (diff(hf(pairs.corrupt).logits) - corrupt) / (clean - corrupt)
            hook.remove()
    return out, float(clean - corrupt)


def test_a_probe_file_scores_heads_as_hugging_face_and_head_detector_do(imported, probe_file):
    from plateauscope.tasks.probe import build_probe

    source, chosen, run = imported
    result = analyze_imported(run, probe=f"{probe_file}:CopyPairs", progress=False)
    written = json.loads((analysis_dir(run) / "probe_copy_pairs.json").read_text())
    assert written["probe"] == result.probe == "copy_pairs" and [r["step"] for r in written["steps"]] == chosen
    probe = build_probe(f"{probe_file}:CopyPairs", 24, 64)
    tokens = probe.tokens
    series = ImportedSeries(run)
    model = None
    for record in result.steps:
        hf = hf_model(source, record.step)
        with torch.no_grad():
            attentions = hf(tokens, output_attentions=True).attentions
        for name, detection in probe.detection_patterns(tokens).items():
            expected = hand_scores(attentions, detection)
            assert torch.allclose(torch.tensor(record.detector_scores[name]), expected, atol=1e-5), (record.step, name)
            by_hand = hand_target_scores(attentions, detection)
            assert torch.allclose(torch.tensor(record.head_scores[name]), by_hand, atol=1e-5), (record.step, name)
        model = series.model(record.step, reuse=model)  # and TransformerLens's own detector, on the bridge
        model.to_tokens = lambda seq: seq if torch.is_tensor(seq) else torch.zeros(1, 2, dtype=torch.long)
        pattern = probe.detection_patterns(tokens[:1])["two_back"][0]
        expected = torch.stack([detect_head(model, row[None], pattern) for row in tokens]).mean(0)  # one at a time
        assert torch.allclose(torch.tensor(record.detector_scores["two_back"]), expected.float(), atol=1e-5)
    assert record.loss_gap is None and result.transition is None  # the probe measures no loss gap


def test_a_probe_files_prompt_pairs_patch_heads_as_done_by_hand(imported, probe_file):
    from plateauscope.tasks.probe import build_probe

    source, chosen, run = imported
    result = analyze_imported(run, probe=f"{probe_file}:CopyPairs", progress=False, n_pairs=16)
    pairs = build_probe(f"{probe_file}:CopyPairs", 24, 64).prompt_pairs(16, 0)
    by_hand, gap = hand_patching(hf_model(source, chosen[-1]), pairs)
    assert gap > 1.0  # the trained model copies: the patching is well posed
    assert torch.allclose(torch.tensor(result.steps[-1].head_patching), by_hand, atol=1e-4)


def test_a_probe_that_subclasses_a_task_runs_under_its_own_name(imported, probe_file):
    _, _, run = imported
    result = analyze_imported(run, probe=f"{probe_file}:TwoBackInduction", progress=False, patching=False,
                              segment_len=8)
    assert set(result.steps[0].head_scores) == {"two_back"} and all(r.loss_gap is not None for r in result.steps)
    assert (analysis_dir(run) / "probe_two_back_induction.json").is_file()


@pytest.mark.parametrize(("spec", "extra", "match"), [
    ("OutOfVocab", [], "probe copy_pairs: token ids 12..35 fall outside the model's vocabulary of 24 tokens"),
    ("AnswersOutOfVocab", [], "the prompt pairs' corrupt_answer token ids 24..24 fall outside the model's vocabulary"),
    ("Broken", [], "my_probes.py: detection_patterns() failed at line"),
    ("CopyPairs", ["--probe-length", "5"], "CopyPairs.for_model(segment_len) failed (TypeError"),
    ("NoForModel", [], "my_probes.py:NoForModel: missing for_model (a classmethod"),
    ("NoMeasure", [], "missing a measure: detection_patterns(tokens), loss_gap(model) or prompt_pairs(n, seed)"),
    ("HalfATask", [], "missing build_evalset, evaluate, generate, loss_positions, progress (required by "
                      "plateauscope.Task"),
    ("NotAProbe", [], "my_probes.py:NotAProbe: a probe must subclass plateauscope.Probe"),
    ("Nowhere", [], "my_probes.py: no class 'Nowhere' in it"),
    ("GapFails", [], "my_probes.py: loss_gap() failed at line"),
])
def test_a_broken_probe_file_is_one_line_and_writes_nothing(imported, probe_file, capsys, spec, extra, match):
    _, chosen, run = imported
    before = sorted(analysis_dir(run).glob("*"))
    capsys.readouterr()
    code = cli_main(["analyze", "--run", str(run), "--no-progress", "--probe", f"{probe_file}:{spec}", *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert match in err, err
    assert sorted(analysis_dir(run).glob("*")) == before


def test_a_probe_file_that_is_not_there_is_one_line(imported, tmp_path, capsys):
    capsys.readouterr()
    assert cli_main(["analyze", "--run", str(imported[2]), "--probe", f"{tmp_path}/none.py:P"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}/none.py: no such probe file (--probe" in err, err


def test_the_whole_analysis_runs_on_a_probe_that_is_a_task_and_only_the_pass_on_one_that_is_not(
        imported, probe_file, capsys):
    from plateauscope.runs.run import Run

    _, chosen, run = imported
    capsys.readouterr()
    assert cli_main(["analyze", "--run", str(run), "--no-progress", "--probe", f"{probe_file}:CopyPairs"]) == 0
    assert "is a probe but not a plateauscope.Task" in capsys.readouterr().out
    assert not (analysis_dir(run) / "probe.json").exists()  # nothing later reads a probe it cannot analyse
    spec = f"{probe_file}:TwoBackInduction"
    assert cli_main(["analyze", "--run", str(run), "--no-progress", "--probe", spec, "--probe-length", "8"]) == 0
    assert "results in" in capsys.readouterr().out
    assert json.loads((analysis_dir(run) / "probe.json").read_text())["probe"] == spec
    ran = Run(run)
    assert [r["step"] for r in ran.metrics()] == chosen
    assert [m.name for m in ran.task().measures()] == ["two_back_score", "in_context_loss_gap"]  # its own pattern
    assert cli_main(["report", "--run", str(run)]) == 0 and (run / "report.html").is_file()
