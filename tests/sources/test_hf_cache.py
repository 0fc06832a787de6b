"""``plateauscope import hf-cache:ORG/NAME``: step revisions read from a local Hugging Face cache, built here the
way huggingface_hub lays it out (refs/<revision> -> snapshots/<hash>/<file> -> ../../blobs/<sha256>)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

from plateauscope.cli import main as cli_main
from plateauscope.runs.files import SERIES_FILE
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.hf_cache import read_hf_cache, revision_step
from plateauscope.sources.importer import import_series
from tests.sources.series_builders import repeated_tokens


def fake_commit(text: str) -> str:
    """A 40-hex commit hash for a revision (what a ref file holds)."""
    return hashlib.sha1(text.encode()).hexdigest()


def cache_model(cache, repo_id, revisions):
    """Lay ``revisions`` (revision name -> checkpoint folder) out as huggingface_hub's cache does; a folder
    given twice is one snapshot under two refs."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for revision, folder in revisions.items():
        commit = fake_commit(str(folder))
        (repo / "refs" / revision).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in ("config.json", "model.safetensors"):
            data = (folder / file).read_bytes()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            if not (snapshot / file).exists():
                (snapshot / file).symlink_to(os.path.relpath(blob, snapshot))
    return repo


@pytest.fixture
def cache(neox_series, tmp_path, monkeypatch):
    """A cache holding the tiny series under Pythia's names (stepN) and OLMo's (stepN-tokensM), plus ``main``."""
    source, steps = neox_series
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    chosen = [steps[0], steps[6], steps[-1]]
    folders = {s: source / f"checkpoint-{s}" for s in chosen}
    cache_model(root, "EleutherAI/tiny-pythia", {**{f"step{s}": folders[s] for s in chosen},
                                                 "main": folders[chosen[-1]]})
    cache_model(root, "allenai/tiny-olmo", {f"step{s}-tokens{s * 4}M": folders[s] for s in chosen})
    return root, source, chosen


def test_step_revision_names():
    assert [revision_step(r) for r in ("step0", "step1000", "step1000-tokens4B", "stage1-step20-tokens84B",
                                       "main", "step", "steps10", "refs/pr/1")] == [0, 1000, 1000, 20, None, None,
                                                                                     None, None]


@pytest.mark.parametrize("repo_id", ["EleutherAI/tiny-pythia", "allenai/tiny-olmo"])
def test_the_steps_come_from_the_revision_names_and_compute_what_hugging_face_computes(cache, tmp_path, repo_id):
    from transformers import AutoModelForCausalLM

    root, _, chosen = cache
    result = import_series(f"hf-cache:{repo_id}", tmp_path / "run")
    assert result.steps == chosen and result.architecture == "GPTNeoXForCausalLM" and not result.duplicates
    manifest = json.loads((tmp_path / "run" / SERIES_FILE).read_text())
    assert manifest["source"] == f"hf-cache:{repo_id}"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    for entry in manifest["checkpoints"]:  # each file is the blob its revision's snapshot links to
        revision = next(p.name for p in (repo / "refs").iterdir() if revision_step(p.name) == entry["step"])
        snapshot = repo / "snapshots" / (repo / "refs" / revision).read_text()
        assert entry["file"] == str((snapshot / "model.safetensors").resolve())
        assert entry["file"].startswith(str((repo / "blobs").resolve()))
    series = ImportedSeries(result.path)
    tokens = repeated_tokens(4, 24, torch.Generator().manual_seed(5))
    model = None
    for step in (chosen[-1], chosen[1]):
        model = series.model(step, reuse=model)
        revision = next(r for r in os.listdir(repo / "refs") if revision_step(r) == step)
        hf = AutoModelForCausalLM.from_pretrained(  # huggingface_hub's own reading of the cache, offline
            repo_id, revision=revision, cache_dir=root, local_files_only=True).eval()
        with torch.no_grad():
            assert torch.allclose(model(tokens), hf(tokens).logits, atol=1e-5)


def test_revisions_and_steps_choose_among_the_cached_ones(cache, tmp_path, capsys):
    _, _, chosen = cache
    found = read_hf_cache("hf-cache:allenai/tiny-olmo",
                          [f"step{chosen[2]}-tokens{chosen[2] * 4}M", f"step{chosen[0]}-tokens0M"])
    assert [c.step for c in found] == [chosen[0], chosen[2]]
    assert cli_main(["import", "hf-cache:EleutherAI/tiny-pythia", "--out", str(tmp_path / "run"), "--no-progress",
                     "--steps", f"{chosen[0]},{chosen[2]}"]) == 0
    assert f"2 checkpoints of GPTNeoXForCausalLM, steps {chosen[0]}..{chosen[2]}" in capsys.readouterr().out


def _one_line_error(argv, capsys, *matches):
    capsys.readouterr()
    code = cli_main(["import", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for match in matches:
        assert match in err, err


def test_a_missing_revision_or_model_is_one_line_and_writes_nothing(cache, tmp_path, capsys):
    root, _, chosen = cache
    out = tmp_path / "out"
    repo = root / "models--EleutherAI--tiny-pythia"
    have = ", ".join(f"step{s}" for s in chosen)
    _one_line_error(["hf-cache:EleutherAI/tiny-pythia", "--out", str(out), "--revisions", f"step{chosen[0]},step7"],
                    capsys, f"EleutherAI/tiny-pythia: revision step7 is not in the local Hugging Face cache ({repo}); "
                            f"it has: {have}")
    _one_line_error(["hf-cache:EleutherAI/pythia-70m", "--out", str(out)], capsys,
                    f"EleutherAI/pythia-70m: not in the local Hugging Face cache ({root})")
    _one_line_error(["hf-cache:EleutherAI/tiny-pythia", "--out", str(out), "--revisions", "main"], capsys,
                    "revision main has no step in its name")
    _one_line_error(["hf-cache:pythia", "--out", str(out)], capsys, "hf-cache:ORG/NAME")
    _one_line_error([str(tmp_path), "--out", str(out), "--revisions", "step0"], capsys, "--revisions")
    (repo / "snapshots" / (repo / "refs" / f"step{chosen[1]}").read_text() / "model.safetensors").unlink()
    _one_line_error(["hf-cache:EleutherAI/tiny-pythia", "--out", str(out)], capsys,
                    f"revision step{chosen[1]} has no model.safetensors or pytorch_model.bin")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_one_snapshot_under_two_step_revisions_is_named(neox_series, tmp_path, monkeypatch, caplog, capsys):
    source, steps = neox_series
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    first, later = source / f"checkpoint-{steps[1]}", source / f"checkpoint-{steps[2]}"
    cache_model(root, "org/served", {f"step{steps[1]}": first, f"step{steps[2]}": later, f"step{steps[3]}": first})
    result = import_series("hf-cache:org/served", tmp_path / "run")
    assert result.duplicates == [(steps[1], steps[3])]
    assert f"steps {steps[1]} and {steps[3]} have identical weights" in caplog.text
    assert cli_main(["import", "hf-cache:org/served", "--out", str(tmp_path / "run2"), "--no-progress"]) == 0
    assert f"warning: steps {steps[1]} and {steps[3]} have identical weights" in capsys.readouterr().out
