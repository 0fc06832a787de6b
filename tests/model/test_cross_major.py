"""TransformerLens 3 against TransformerLens 4: the same run, the same resume, the same analysis.

One environment holds one TransformerLens, so the other major runs in a subprocess of the other
environment's python (``PLATEAUSCOPE_OTHER_PYTHON``, set by the Makefile when that environment
exists; the tests that need it skip without it). What they check:

* both backends start from HookedTransformer's own draw (:func:`plateauscope.model.backend.initial_hooked_state`,
  checked here against ``HookedTransformer(cfg)`` on 3.x and against the bridge's weights on 4.x);
* the `tiny` preset trained on the other major writes the same checkpoint files, byte for byte;
* a run killed on this major and resumed on the other ends with the uninterrupted run's files;
* the analysis cache of one series, computed on each major, agrees in every number to 1e-5
  (attention, patterns, exact and attribution patching, edges and their exact patches, the edge
  circuit, ablations and the head circuit) and in every other field exactly.
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from plateauscope.analysis.analyze import analyze_run
from plateauscope.analysis.results import ANALYSIS_DIR
from plateauscope.model.backend import build_model, hooked_state_dict, initial_hooked_state, installed_transformer_lens
from plateauscope.runs import run as rd
from plateauscope.runs.presets import get_preset
from plateauscope.tasks.loading import build_task
from plateauscope.training.train import train
from tests.conftest import copy_run

OTHER_PYTHON = os.environ.get("PLATEAUSCOPE_OTHER_PYTHON")
REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
needs_other = pytest.mark.skipif(not OTHER_PYTHON, reason="PLATEAUSCOPE_OTHER_PYTHON (the other TransformerLens "
                                                          "environment's python) is not set")


def in_other(*args: str, timeout: int = 600) -> None:
    """Run ``python -m plateauscope ARGS`` (or ``-c CODE ARGS``) in the other environment; fail with its stderr."""
    cmd = [OTHER_PYTHON, *args] if args[0] == "-c" else [OTHER_PYTHON, "-m", "plateauscope", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    assert proc.returncode == 0, proc.stderr[-3000:]


def differing_checkpoints(a: Path, b: Path) -> list[str]:
    """The checkpoint files that differ between two runs (or exist in one only)."""
    names = sorted({p.name for p in (a / rd.CHECKPOINT_DIR).iterdir()} | {p.name for p in (b / rd.CHECKPOINT_DIR).iterdir()})
    return [n for n in names if not ((a / rd.CHECKPOINT_DIR / n).is_file() and (b / rd.CHECKPOINT_DIR / n).is_file()
                                     and (a / rd.CHECKPOINT_DIR / n).read_bytes() == (b / rd.CHECKPOINT_DIR / n).read_bytes())]


@pytest.mark.parametrize("preset", ["tiny", "ci", "paper", "induction"])
def test_both_backends_start_from_hookedtransformers_draw(preset):
    cfg = get_preset(preset)
    hooked_cfg = build_task(cfg.task_name, cfg.task).hooked_config(cfg.model)
    ours = initial_hooked_state(hooked_cfg, seed=cfg.model.seed)
    if installed_transformer_lens().startswith("3."):
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        torch.manual_seed(cfg.model.seed)
        theirs = HookedTransformer(HookedTransformerConfig(**hooked_cfg)).state_dict()
    else:
        theirs = hooked_state_dict(build_model(hooked_cfg, seed=cfg.model.seed))
    assert ours.keys() == theirs.keys()
    for key in ours:
        if not key.endswith(".mask"):  # HookedTransformer 3.x holds the causal mask filled in
            assert torch.equal(ours[key], theirs[key]), key
    # the draw neither depends on nor moves the global RNG
    before = torch.get_rng_state()
    again = initial_hooked_state(hooked_cfg, seed=cfg.model.seed)
    assert torch.equal(torch.get_rng_state(), before) and all(torch.equal(ours[k], again[k]) for k in ours)


@needs_other
def test_the_same_run_on_both_majors(tiny_run, tmp_path):
    in_other("train", "--preset", "tiny", "--out", str(tmp_path / "other"), "--no-progress")
    assert differing_checkpoints(Path(tiny_run), tmp_path / "other") == []


@needs_other
def test_a_run_killed_on_one_major_resumes_on_the_other(tiny_run, tmp_path):
    cfg = get_preset("tiny")
    train(cfg, tmp_path / "r", device="cpu", progress=False, stop_at_step=23)
    assert not (tmp_path / "r" / rd.SUMMARY_FILE).exists()
    in_other("train", "--preset", "tiny", "--out", str(tmp_path / "r"), "--resume", "--no-progress")
    assert differing_checkpoints(Path(tiny_run), tmp_path / "r") == []
    state = torch.load(tmp_path / "r" / rd.RESUME_FILE, weights_only=True)
    other = "bridge" if installed_transformer_lens().startswith("3.") else "hooked"
    assert state["optimizer_layout"] == "hooked" and state["backend"] == other  # written there


def _numbers_apart(ours, theirs, where: str, out: dict[str, float]) -> None:
    """Record the largest |difference| of every numeric field (by its path); other fields must be equal."""
    if isinstance(ours, dict):
        assert isinstance(theirs, dict) and ours.keys() == theirs.keys(), where
        for key in ours:
            _numbers_apart(ours[key], theirs[key], f"{where}.{key}", out)
    elif isinstance(ours, list):
        assert isinstance(theirs, list) and len(ours) == len(theirs), where
        for a, b in zip(ours, theirs):
            _numbers_apart(a, b, where, out)
    elif isinstance(ours, float) and isinstance(theirs, (int, float)) or isinstance(theirs, float):
        assert isinstance(ours, (int, float)) and isinstance(theirs, (int, float)), where
        d = 0.0 if math.isnan(ours) and math.isnan(theirs) else abs(ours - theirs)
        out[where] = max(out.get(where, 0.0), d)
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


@needs_other
def test_the_analysis_cache_is_the_same_on_both_majors(tiny_run, tmp_path):
    here, there = (copy_run(Path(tiny_run), tmp_path / name) for name in ("here", "there"))
    analyze_run(here, every=4, n_exact=3, progress=False)
    in_other("analyze", "--run", str(there), "--every", "4", "--n-exact", "3", "--no-progress")
    files = sorted(p.name for p in (here / ANALYSIS_DIR).iterdir() if p.suffix in (".json", ".jsonl"))
    assert files == sorted(p.name for p in (there / ANALYSIS_DIR).iterdir() if p.suffix in (".json", ".jsonl"))
    assert {"attention.jsonl", "patch.jsonl", "attribution.jsonl", "edges.jsonl", "edge_exact.jsonl",
            "ablation.jsonl", "circuit.jsonl"} <= set(files)
    apart: dict[str, float] = {}
    for name in files:
        ours, theirs = ((here if side == 0 else there) / ANALYSIS_DIR / name for side in (0, 1))
        read = (lambda p: [json.loads(line) for line in p.read_text().splitlines()]) if name.endswith(".jsonl") else (
            lambda p: [json.loads(p.read_text())])
        a, b = read(ours), read(theirs)
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            if name == "patterns.jsonl":  # weights stored as bytes (weight * 255, rounded): within one step
                x, y = dict(x), dict(y)
                steps = [np.frombuffer(base64.b64decode(r.pop("values")), dtype=np.uint8).astype(int) for r in (x, y)]
                assert steps[0].shape == steps[1].shape and np.abs(steps[0] - steps[1]).max() <= 1, name
            _numbers_apart(x, y, name, apart)
    worst = max(apart, key=apart.get)
    print(f"largest difference across majors: {apart[worst]:.2e} ({worst}); {len(apart)} numeric fields",
          file=sys.stderr)
    assert apart[worst] <= TOL, f"{worst} differs by {apart[worst]:.2e}"
