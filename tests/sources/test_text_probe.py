"""A probe written as text against the series' own tokenizer (saved beside the checkpoints, as the Trainer does):
its token ids against the words it names, its head patching against patching done by hand on Hugging Face's
model, and what goes wrong with text in one line each."""

from __future__ import annotations

import shutil
import textwrap

import pytest
import torch

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.cli import main as cli_main
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.importer import import_series
from plateauscope.tasks.probe import build_probe
from tests.sources.test_user_probe import hand_patching, hf_model

VOCAB = 24

PROBE_FILE = '''
import random

import torch

from plateauscope import Probe, PromptPairs, encode_texts, token_id

SEGMENT = 8


class TextCopy(Probe):
    """A start word and eight random words twice, written as text; the corrupted prompt swaps the first copy's
    last word, so the clean answer is that word and the corrupted answer the one swapped in."""

    probe_name = "text_copy"
    n_words = SEGMENT

    @classmethod
    def texts(cls, d_vocab, seed):
        rng = random.Random(seed)
        clean, corrupt, answers, swapped = [], [], [], []
        for _ in range(16):
            words = [f"w{rng.randrange(1, d_vocab)}" for _ in range(SEGMENT)]
            swap = f"w{int(words[-1][1:]) % (d_vocab - 1) + 1}"
            clean.append(" ".join(["w0", *words, *words[:cls.n_words - 1]]))
            corrupt.append(" ".join(["w0", *words[:-1], swap, *words[:-1]]))
            answers.append(words[-1])
            swapped.append(swap)
        return clean, corrupt, answers, swapped

    @classmethod
    def for_model(cls, d_vocab, n_ctx, seed=0, tokenizer=None):
        clean, corrupt, answers, swapped = cls.texts(d_vocab, seed)
        probe = cls()
        probe.tokens = encode_texts(tokenizer, clean)
        probe.corrupt = encode_texts(tokenizer, corrupt)
        probe.answers = torch.tensor([token_id(tokenizer, w) for w in answers])
        probe.swapped = torch.tensor([token_id(tokenizer, w) for w in swapped])
        return probe

    def prompt_pairs(self, n, seed):
        n = min(n, len(self.tokens))
        return PromptPairs(self.tokens[:n], self.corrupt[:n], self.answers[:n], self.swapped[:n], torch.arange(n),
                           self.tokens.shape[1] - 1)


class Ragged(TextCopy):
    @classmethod
    def texts(cls, d_vocab, seed):
        clean, corrupt, answers, swapped = super().texts(d_vocab, seed)
        return [*clean[:-1], clean[-1] + " w1"], corrupt, answers, swapped


class TwoWordAnswer(TextCopy):
    @classmethod
    def texts(cls, d_vocab, seed):
        clean, corrupt, answers, swapped = super().texts(d_vocab, seed)
        return clean, corrupt, ["w1 w2", *answers[1:]], swapped


class NeedsTokenizer(TextCopy):
    @classmethod
    def for_model(cls, d_vocab, n_ctx, tokenizer, seed=0):
        return super().for_model(d_vocab, n_ctx, seed, tokenizer)
'''


def save_word_tokenizer(folder):
    """A word-level tokenizer over ``w0`` .. ``w23`` (id = the number), saved as a Trainer saves one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(folder)


@pytest.fixture(scope="module")
def with_tokenizer(neox_series, tmp_path_factory):
    """The GPT-NeoX series with its tokenizer's files in every checkpoint folder, imported at three steps."""
    source, steps = neox_series
    copy = tmp_path_factory.mktemp("with_tokenizer") / "trainer_out"
    shutil.copytree(source, copy)
    for folder in copy.glob("checkpoint-*"):
        save_word_tokenizer(folder)
    chosen = [steps[0], steps[6], steps[-1]]
    result = import_series(copy, tmp_path_factory.mktemp("run") / "run", steps=chosen)
    assert result.tokenizer is not None
    return copy, chosen, result.path


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("probes") / "text_probes.py"
    path.write_text(textwrap.dedent(PROBE_FILE))
    return path


def test_text_becomes_the_token_ids_it_names(with_tokenizer, probe_file):
    _, _, run = with_tokenizer
    tokenizer = ImportedSeries(run).loaded_tokenizer
    probe = build_probe(f"{probe_file}:TextCopy", VOCAB, 64, tokenizer=tokenizer)
    clean, _, answers, _ = type(probe).texts(VOCAB, 0)
    named = torch.tensor([[int(w[1:]) for w in text.split()] for text in clean])
    assert torch.equal(probe.tokens, named) and probe.tokens.shape == (16, 16)
    assert probe.answers.tolist() == [int(w[1:]) for w in answers]


def test_a_text_probe_patches_heads_as_done_by_hand(with_tokenizer, probe_file):
    source, chosen, run = with_tokenizer
    result = analyze_imported(run, probe=f"{probe_file}:TextCopy", progress=False, n_pairs=16)
    tokenizer = ImportedSeries(run).loaded_tokenizer
    pairs = build_probe(f"{probe_file}:TextCopy", VOCAB, 64, tokenizer=tokenizer).prompt_pairs(16, 0)
    by_hand, gap = hand_patching(hf_model(source, chosen[-1]), pairs)
    assert gap > 1.0  # the trained model copies: the patching is well posed
    assert torch.allclose(torch.tensor(result.steps[-1].head_patching), by_hand, atol=1e-4)


@pytest.mark.parametrize(("spec", "match"), [
    ("Ragged", "text_probes.py:Ragged: the probe's prompts differ in length: 'w0 "),
    ("TwoWordAnswer", "the probe's token 'w1 w2' is 2 tokens of the model's tokenizer, not one"),
])
def test_text_that_does_not_fit_is_one_line(with_tokenizer, probe_file, capsys, spec, match):
    _, _, run = with_tokenizer
    capsys.readouterr()
    assert cli_main(["analyze", "--run", str(run), "--no-progress", "--probe", f"{probe_file}:{spec}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err


def test_a_series_without_a_tokenizer_is_one_line(neox_series, probe_file, tmp_path, capsys):
    source, steps = neox_series
    run = import_series(source, tmp_path / "run", steps=[steps[-1]]).path
    capsys.readouterr()
    for spec, match in (("NeedsTokenizer", "its for_model needs the model's tokenizer, and the series has none"),
                        ("TextCopy", "the probe writes its prompts as text, and the series has no tokenizer")):
        assert cli_main(["analyze", "--run", str(run), "--no-progress", "--probe", f"{probe_file}:{spec}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err
