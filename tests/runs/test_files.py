"""Verified checkpoints and what a fault leaves behind (``plateauscope.runs.files``).

Checked against independent facts: each checksum is recomputed here with ``hashlib``; a run that a
fault interrupted and that was resumed is compared file by file with one that ran straight through;
the full disk is a real one (a 512 kB tmpfs) where the machine lets the test mount it, and an injected
ENOSPC at a chosen write everywhere.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from plateauscope.cli.verify import main as verify_main
from plateauscope.runs import files
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.training.train import train


def tiny_config():
    """``tiny`` with a resume state every 10 steps, so a run has a current and a previous one."""
    cfg = get_preset("tiny")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume_every=10))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The reference: the run trained straight through, no fault."""
    out = tmp_path_factory.mktemp("integrity") / "straight"
    train(tiny_config(), out, device="cpu", progress=False)
    return out


def same_run(a: Path, b: Path) -> None:
    """Every checkpoint byte-identical, the same resume-state steps and the same metrics but ``wall_s``."""
    names = sorted(p.name for p in (a / rd.CHECKPOINT_DIR).iterdir())
    assert names == sorted(p.name for p in (b / rd.CHECKPOINT_DIR).iterdir())
    for name in names:
        assert (a / rd.CHECKPOINT_DIR / name).read_bytes() == (b / rd.CHECKPOINT_DIR / name).read_bytes(), name

    def metrics(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rd.read_jsonl(run / rd.METRICS_FILE)]
    assert metrics(a) == metrics(b)
    assert files.verify_run(a) == [] and files.verify_run(b) == []


def test_every_checkpoint_and_resume_state_has_its_sha256(straight, capsys):
    listed = files.read_checksums(straight)
    on_disk = files.verified_files(straight)
    assert set(listed) == set(on_disk) and rd.PREVIOUS_RESUME_FILE in listed and rd.RESUME_FILE in listed
    for name in on_disk:
        data = (straight / name).read_bytes()
        assert listed[name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}, name
    assert rd.load_resume_state(straight / rd.PREVIOUS_RESUME_FILE)["step"] == 30
    assert verify_main([str(straight)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{len(on_disk)} files, all verified")


def corrupt(run: Path, name: str, how: str) -> None:
    path = run / name
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "altered":
        data = bytearray(path.read_bytes())
        data[-7] ^= 0x01  # one bit of the last tensor's data: still a readable safetensors file
        path.write_bytes(bytes(data))
    else:
        path.unlink()


@pytest.mark.parametrize("how, says", [("truncated", "truncated ("), ("altered", "altered (its SHA-256 differs"),
                                       ("missing", "missing")])
def test_a_bad_checkpoint_is_one_line_naming_it(straight, tmp_path, capsys, how, says):
    run = Path(shutil.copytree(straight, tmp_path / "run"))
    name = f"{rd.CHECKPOINT_DIR}/{rd.checkpoint_name(20)}"
    corrupt(run, name, how)
    with pytest.raises(rd.RunError) as err:
        rd.load_checkpoint(run / name)
    assert str(err.value).startswith(f"{run / name}: {says}")
    assert verify_main([str(run)]) == 1
    out = capsys.readouterr()
    problems = [line for line in out.out.splitlines() if not line.startswith(f"{run}:")]
    assert len(problems) == 1 and problems[0].startswith(f"{run / name}: {says}"), problems
    assert out.err.strip() == "error: 1 file(s) failed verification"
    # the other checkpoints still load
    rd.load_checkpoint(run / rd.CHECKPOINT_DIR / rd.checkpoint_name(25))


def test_an_unlisted_checkpoint_and_bad_paths_are_reported(straight, tmp_path, capsys):
    run = Path(shutil.copytree(straight, tmp_path / "run"))
    shutil.copy(run / rd.CHECKPOINT_DIR / rd.checkpoint_name(20), run / rd.CHECKPOINT_DIR / rd.checkpoint_name(21))
    assert verify_main([str(run)]) == 1
    assert f"{rd.checkpoint_name(21)}: not in {rd.CHECKSUMS_FILE}" in capsys.readouterr().out
    assert verify_main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope: no such run directory" in err[0]


def killed_at_23(out: Path) -> Path:
    train(tiny_config(), out, device="cpu", progress=False, stop_at_step=23)
    assert rd.load_resume_state(out / rd.RESUME_FILE)["step"] == 20
    assert rd.load_resume_state(out / rd.PREVIOUS_RESUME_FILE)["step"] == 10
    return out


@pytest.mark.parametrize("name", [rd.RESUME_FILE, f"{rd.CHECKPOINT_DIR}/{rd.checkpoint_name(20)}"])
def test_a_bad_resume_state_refuses_and_names_the_good_one(straight, tmp_path, name):
    out = killed_at_23(tmp_path / "run")
    corrupt(out, name, "altered")
    with pytest.raises(rd.RunError) as err:
        train(tiny_config(), out, resume=True, device="cpu", progress=False)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{out / name}: altered")
    assert f"refusing to resume from it: {out / rd.PREVIOUS_RESUME_FILE} (step 10) is good; " \
           f"delete {out / rd.RESUME_FILE} to resume from there" in message
    (out / rd.RESUME_FILE).unlink()  # as the message says: the run continues from step 10, exactly
    train(tiny_config(), out, resume=True, device="cpu", progress=False)
    same_run(out, straight)


def test_no_good_resume_state_says_so(tmp_path):
    out = killed_at_23(tmp_path / "run")
    corrupt(out, rd.RESUME_FILE, "truncated")
    corrupt(out, rd.PREVIOUS_RESUME_FILE, "truncated")
    with pytest.raises(rd.RunError, match="no good resume state is left; train again into a new --out"):
        train(tiny_config(), out, resume=True, device="cpu", progress=False)


def test_a_run_without_checksums_loads_with_a_note_and_adopts_them_on_resume(straight, tmp_path, caplog):
    old = Path(shutil.copytree(straight, tmp_path / "old"))
    (old / rd.CHECKSUMS_FILE).unlink()
    with caplog.at_level(logging.INFO, logger="plateauscope.runs.files"):
        rd.Run(old).model(20)
        rd.Run(old).model(25)
    notes = [r.getMessage() for r in caplog.records if "written before checksums" in r.getMessage()]
    assert notes == [f"{old}: no {rd.CHECKSUMS_FILE} (written before checksums were kept): its files are read "
                     "unverified"]
    assert files.verify_run(old) == [(rd.CHECKSUMS_FILE, "missing: the run was written before checksums were kept, "
                                                         "so it cannot be verified")]
    killed = killed_at_23(tmp_path / "killed")
    (killed / rd.CHECKSUMS_FILE).unlink()
    train(tiny_config(), killed, resume=True, device="cpu", progress=False)
    same_run(killed, straight)


def test_a_full_disk_at_any_write_leaves_complete_files_and_the_run_resumes(straight, tmp_path, monkeypatch):
    """ENOSPC injected half-way through the n-th atomic write (a checkpoint, a resume state, the
    checksums, the summary): the error is one line, every file verifies, and a resume finishes the
    run exactly."""
    real = files.atomic_write
    writes = []

    def count(path, write, before_move=None):
        writes.append(Path(path).name)
        return real(path, write, before_move)
    monkeypatch.setattr(files, "atomic_write", count)
    train(tiny_config(), tmp_path / "count", device="cpu", progress=False)
    monkeypatch.undo()
    kinds = {"checkpoint": next(i for i, n in enumerate(writes) if n.endswith(".safetensors") and i > 10),
             "resume state": len(writes) - 1 - writes[::-1].index(rd.RESUME_FILE),
             "checksums": writes.index(rd.CHECKSUMS_FILE, 12), "summary": writes.index(rd.SUMMARY_FILE)}
    for kind, fail_at in kinds.items():
        out, calls = tmp_path / kind.replace(" ", "_"), []

        def filling(path, write, before_move=None):
            calls.append(path)
            if len(calls) != fail_at + 1:
                return real(path, write, before_move)

            def half_then_full(tmp):
                write(tmp)
                data = Path(tmp).read_bytes()
                Path(tmp).write_bytes(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device", tmp)
            return real(path, half_then_full, before_move)
        monkeypatch.setattr(files, "atomic_write", filling)
        with pytest.raises(rd.RunError) as err:
            train(tiny_config(), out, device="cpu", progress=False)
        monkeypatch.undo()
        assert "\n" not in str(err.value) and "the disk is full, so it was not written" in str(err.value), kind
        assert files.verify_run(out) == [], kind
        assert not list(out.rglob("*.tmp")), kind
        train(tiny_config(), out, resume=True, device="cpu", progress=False)
        same_run(out, straight)


def can_mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(path)], capture_output=True).returncode == 0
    return ok


def test_a_real_full_disk_during_training(straight, tmp_path):
    """A 512 kB tmpfs (the run needs about 900 kB) fills during training; with the disk then made larger, the run resumes exactly."""
    mount = tmp_path / "small"
    if shutil.which("mount") is None or os.geteuid() != 0 or not can_mount_tmpfs(mount):
        pytest.skip("cannot mount a tmpfs here (needs root): the injected-ENOSPC test covers the same paths")
    try:
        out = mount / "run"
        with pytest.raises(rd.RunError, match="the disk is full, so it was not written"):
            train(tiny_config(), out, device="cpu", progress=False)
        assert files.verify_run(out) == []
        done = len(list((out / rd.CHECKPOINT_DIR).iterdir()))
        assert 0 < done < len(list((straight / rd.CHECKPOINT_DIR).iterdir()))
        subprocess.run(["mount", "-o", "remount,size=16m", str(mount)], check=True)
        train(tiny_config(), out, resume=True, device="cpu", progress=False)
        same_run(out, straight)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_checksums_file_is_strict_json_in_sorted_order(straight):
    raw = json.loads((straight / rd.CHECKSUMS_FILE).read_text())
    assert raw["format"] == files.CHECKSUMS_FORMAT and list(raw["files"]) == sorted(raw["files"])
