"""``plateauscope import``: the manifest, step selection, duplicates, and every bad input in one line."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from plateauscope.cli import main as cli_main
from plateauscope.runs.files import SERIES_FILE
from plateauscope.runs.series import ImportedSeries, is_imported
from plateauscope.sources.found import SourceError
from plateauscope.sources.hf_folder import folder_step, read_hf_folder
from plateauscope.sources.importer import import_series
from plateauscope.sources.selection import log_spaced, parse_steps, select_steps
from tests.sources.series_builders import repeated_tokens


def test_import_writes_a_manifest_of_every_checkpoint(neox_series, tmp_path):
    source, steps = neox_series
    result = import_series(source, tmp_path / "run")
    assert result.steps == steps and result.architecture == "GPTNeoXForCausalLM" and result.tokenizer is None
    manifest = json.loads((tmp_path / "run" / SERIES_FILE).read_text())
    for entry in manifest["checkpoints"]:
        file = source / f"checkpoint-{entry['step']}" / "model.safetensors"
        assert entry["file"] == str(file.resolve())
        assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert entry["architecture"] == "GPTNeoXForCausalLM" and entry["tokenizer"] is None
    assert not list((tmp_path / "run").rglob("*.safetensors"))  # nothing copied
    assert is_imported(tmp_path / "run")


def test_a_loaded_checkpoint_computes_what_hugging_face_computes(neox_series, tmp_path):
    from transformers import AutoModelForCausalLM

    source, steps = neox_series
    series = ImportedSeries(import_series(source, tmp_path / "run").path)
    tokens = repeated_tokens(4, 24, torch.Generator().manual_seed(3))
    model = None
    for step in (steps[-1], steps[2]):  # one model, each checkpoint's weights loaded into it
        model = series.model(step, reuse=model)
        hf = AutoModelForCausalLM.from_pretrained(source / f"checkpoint-{step}").eval()
        with torch.no_grad():
            assert torch.allclose(model(tokens), hf(tokens).logits, atol=1e-5)


def test_steps_come_from_trainer_state_else_the_folder_name(tmp_path):
    (tmp_path / "checkpoint-70").mkdir()
    (tmp_path / "checkpoint-70" / "trainer_state.json").write_text(json.dumps({"global_step": 35}))
    assert folder_step(tmp_path / "checkpoint-70") == 35
    (tmp_path / "step_120").mkdir()
    assert folder_step(tmp_path / "step_120") == 120
    (tmp_path / "final").mkdir()
    with pytest.raises(SourceError, match="cannot read its step"):
        folder_step(tmp_path / "final")


def test_step_selection():
    have = list(range(0, 1001, 10))
    assert select_steps(have, every=30) == list(range(0, 1000, 300)) + [1000]
    assert select_steps(have, steps=[0, 500]) == [0, 500]
    spaced = log_spaced(have, 8)
    assert spaced[0] == 0 and spaced[-1] == 1000 and len(spaced) <= 8
    gaps = [b - a for a, b in itertools.pairwise(spaced)]
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))  # wider apart as steps grow
    with pytest.raises(SourceError, match="no checkpoint at step"):
        select_steps(have, steps=[5])
    with pytest.raises(SourceError, match="--steps"):
        parse_steps("1,x")


def test_identical_weights_under_two_steps_are_named(neox_series, tmp_path, caplog):
    source, steps = neox_series
    copy = tmp_path / "src"
    for step in steps[:3]:
        shutil.copytree(source / f"checkpoint-{step}", copy / f"checkpoint-{step}")
    shutil.copy(copy / f"checkpoint-{steps[0]}" / "model.safetensors", copy / f"checkpoint-{steps[2]}" / "model.safetensors")
    result = import_series(copy, tmp_path / "run")
    assert result.duplicates == [(steps[0], steps[2])]
    assert f"steps {steps[0]} and {steps[2]} have identical weights" in caplog.text


def _one_line_error(argv, capsys, match):
    capsys.readouterr()
    code = cli_main(["import", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert match in err, err


@pytest.fixture
def three_checkpoints(neox_series, tmp_path):
    source, steps = neox_series
    copy = tmp_path / "src"
    for step in steps[:3]:
        shutil.copytree(source / f"checkpoint-{step}", copy / f"checkpoint-{step}")
    return copy, steps[:3]


def test_bad_input_is_one_line_and_leaves_nothing(three_checkpoints, tmp_path, capsys):
    source, steps = three_checkpoints
    out = tmp_path / "out"
    # a truncated safetensors file
    bad = source / f"checkpoint-{steps[1]}" / "model.safetensors"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    _one_line_error([str(source), "--out", str(out)], capsys, "truncated")
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    kept = [str(s) for s in steps if s != steps[1]]  # --steps leaves the truncated file out: the rest imports
    assert cli_main(["import", str(source), "--out", str(tmp_path / "skipped"), "--steps", ",".join(kept)]) == 0
    bad.write_bytes(data)
    # a folder mixing architectures
    config = source / f"checkpoint-{steps[2]}" / "config.json"
    original = config.read_text()
    config.write_text(json.dumps({**json.loads(original), "architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    _one_line_error([str(source), "--out", str(out)], capsys, "mixes architectures")
    assert cli_main(["import", str(source), "--out", str(tmp_path / "foreign"), "--steps", ",".join(map(str, steps[:2]))]) == 0
    config.write_text(original)
    # unreadable steps (two folders of one step)
    shutil.copytree(source / f"checkpoint-{steps[0]}", source / "again" / f"checkpoint-{steps[0]}")
    _one_line_error([str(source), "--out", str(out)], capsys, "the steps cannot be read")
    shutil.rmtree(source / "again")
    # a step that is not there, a bad flag
    _one_line_error([str(source), "--out", str(out), "--steps", "3"], capsys, "no checkpoint at step(s) 3")
    _one_line_error([str(source), "--out", str(out), "--every", "0"], capsys, "--every")
    assert not out.exists()


def test_a_pickle_that_needs_code_is_refused_never_loaded(three_checkpoints, tmp_path, capsys):
    source, steps = three_checkpoints
    folder = source / f"checkpoint-{steps[0]}"
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()

    class Payload:  # unpickling it would run code
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({**state, "extra": Payload()}, folder / "pytorch_model.bin")
    _one_line_error([str(source), "--out", str(tmp_path / "out")], capsys, "needs code to be unpickled")
    assert "ran" not in capsys.readouterr().out
    torch.save(state, folder / "pytorch_model.bin")  # a plain state dict loads with weights_only=True
    assert import_series(source, tmp_path / "out").steps == steps


def test_an_unsupported_architecture_is_named_with_the_families(tmp_path, capsys):
    from transformers import BertConfig, BertForMaskedLM, MambaConfig, MambaForCausalLM

    for name, model in (("bert", BertForMaskedLM(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                             num_attention_heads=2, intermediate_size=32))),
                        ("mamba", MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1)))):
        model.save_pretrained(tmp_path / name / "checkpoint-0")
        arch = type(model).__name__
        _one_line_error([str(tmp_path / name), "--out", str(tmp_path / "out")], capsys, f"architecture {arch} is not supported")
        _one_line_error([str(tmp_path / name), "--out", str(tmp_path / "out")], capsys, "GPT-NeoX")


def test_import_cli_prints_one_line(three_checkpoints, tmp_path, capsys):
    source, steps = three_checkpoints
    assert cli_main(["import", str(source), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"3 checkpoints of GPTNeoXForCausalLM, steps {steps[0]}..{steps[-1]}" in out
    assert read_hf_folder(source)[0].step == steps[0]


def test_verify_checks_an_imported_runs_files_against_its_manifest(three_checkpoints, tmp_path, capsys):
    source, steps = three_checkpoints
    run = tmp_path / "run"
    assert cli_main(["import", str(source), "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert cli_main(["verify", str(run)]) == 0
    assert f"{run}: 3 files, all verified" in capsys.readouterr().out
    weights = source / f"checkpoint-{steps[1]}" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert cli_main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert f"{weights.resolve()}: altered (its SHA-256 differs from the one in series.json)" in out
    weights.write_bytes(bytes(data[: len(data) // 2]))
    assert cli_main(["verify", str(run)]) == 1
    assert "truncated" in capsys.readouterr().out
