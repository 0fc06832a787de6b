"""The TransformerLens backend seam (``plateauscope.model.backend``): HookedTransformer (3.x) and TransformerBridge (4.x).

Only one TransformerLens can be installed in an environment (both are the distribution
``transformer-lens``), so the two backends are never compared in one process. What the tests do
instead, in each environment (``make test``: 3.x, the hooked backend; ``make test-tl4``: 4.x,
the bridge), on the session's `ci` run trained with that environment's backend:

* compare the installed backend against :class:`tests.reference_model.ReferenceModel`, a
  plain-torch forward written from the checkpoint's HookedTransformer-layout tensors (no
  TransformerLens model class): logits, and every analysis (attention to z, exact patching of
  heads and resid_pre, attribution patching, zero and mean head ablation) run on both, to 1e-5
  (logits in float32 relative to their scale, and in float64 absolutely; the analyses in float64);
  Hooked == reference in one environment and bridge == reference in the other give
  bridge == hooked (to 2e-5 at worst);
* when ``PLATEAUSCOPE_OTHER_PYTHON`` names the other environment's interpreter (the Makefile sets it
  when that environment exists), open this environment's tiny series with the other backend in
  a subprocess and compare its logits with ours directly, to 1e-5: a series trained on the
  bridge opens in HookedTransformer and the reverse.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from plateauscope.analysis.ablate import ablate_each_head
from plateauscope.analysis.attention import attention_to_z
from plateauscope.analysis.attribution import attribute_all
from plateauscope.analysis.inputs import prompt_pairs
from plateauscope.analysis.patch import patch
from plateauscope.model.backend import (
    BACKENDS,
    available_backends,
    default_backend,
    hook_point,
    hooked_parameters,
    hooked_state_dict,
    hooks_added,
    load_hooked_state_dict,
    shares_prefixes,
)
from plateauscope.model.fused import fused_logits
from plateauscope.model.hooked_forward import SharedPast, run_blocks
from plateauscope.runs.presets import get_preset
from plateauscope.runs.run import Run, load_checkpoint
from plateauscope.training.train import train
from tests.reference_model import ReferenceModel

TOL = 1e-5
INSTALLED = default_backend()
MISSING = [b for b in BACKENDS if b not in available_backends()]
OTHER_PYTHON = os.environ.get("PLATEAUSCOPE_OTHER_PYTHON")
REPO = Path(__file__).resolve().parents[2]


def reference(run: Run, step: int) -> ReferenceModel:
    state, _ = load_checkpoint(run.checkpoint_path(step))
    return ReferenceModel(run.hooked_config, state)


def plateau_and_after(run: Run) -> list[int]:
    """A checkpoint in the middle of the plateau and the last one (after the drop)."""
    summary = run.summary
    assert summary and summary["tau"] is not None and summary["plateau_stretch"], "the ci run must show both phases"
    lo, hi = summary["plateau_stretch"]
    steps = run.steps
    plateau = min((s for s in steps if lo <= s <= hi), key=lambda s: abs(s - (lo + hi) / 2))
    assert steps[-1] > summary["tau"]
    return [plateau, steps[-1]]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| over entries that are not NaN (a NaN in only one of them counts as inf)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if not torch.equal(a.isnan(), b.isnan()):
        return float("inf")
    ok = ~a.isnan()
    return float((a[ok] - b[ok]).abs().max()) if ok.any() else 0.0


@pytest.fixture(scope="module")
def ci(ci_run) -> Run:
    return Run(ci_run)


def test_installed_backend_is_the_default():
    assert INSTALLED in available_backends() and len(available_backends()) == 1


def test_both_backends_share_prefixes(tiny_run):
    """The prefix-sharing fast paths (frozen key/value caches) are taken by both backends (the bridge
    through :mod:`plateauscope.model.hooked_forward`, as its own forward ignores a ``past_kv_cache``);
    the reference forward runs full sequences. test_analyses_equal_on_the_reference compares the
    two paths."""
    run = Run(tiny_run)
    model = run.model(run.steps[-1], backend=INSTALLED)
    assert shares_prefixes(model)
    state, _ = load_checkpoint(run.checkpoint_path(run.steps[-1]))
    assert not shares_prefixes(ReferenceModel(run.hooked_config, state))


def test_fused_training_forward_equals_the_installed_backend(ci):
    """The training step's fused forward (``plateauscope.model.fused``) reads the installed backend's own
    parameters (the bridge's through views in HookedTransformer's layout). Against the backend's
    own forward, after the drop: logits in float32 to 1e-5 of their scale (as the reference forward
    below), and logits and every parameter's gradient in float64 to 1e-5."""
    model = ci.model(ci.steps[-1], backend=INSTALLED).train()
    task = ci.task()
    batch = task.tokens[:64]
    with torch.no_grad():
        want = model(batch[:, : task.input_len])
        got = fused_logits(model.cfg, hooked_parameters(model), batch[:, : task.input_len])
        scale = max(1.0, want.abs().max().item())
        assert max_diff(got, want) <= TOL * scale, f"float32: {max_diff(got, want):.2e} at scale {scale:.1f}"
    model.double()
    grads = []
    for logits_of in (model, lambda t: fused_logits(model.cfg, hooked_parameters(model), t)):
        model.zero_grad(set_to_none=True)
        logits = logits_of(batch[:, : task.input_len])
        task.loss(logits, batch).backward()
        grads.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (want, want_grads), (got, got_grads) = grads
    assert got.dtype == torch.float64 and max_diff(got, want) <= TOL
    assert got_grads.keys() == want_grads.keys() and got_grads
    for name in want_grads:
        assert max_diff(got_grads[name], want_grads[name]) <= TOL, name


@pytest.mark.parametrize("phase", [0, 1], ids=["plateau", "after_drop"])
def test_logits_equal_the_reference_forward(ci, phase):
    """In float32 (the checkpoints' dtype) to 1e-5 of the logits' scale (two correct float32
    forwards differ by rounding, about 1e-6 of the largest logit), and in float64 (backend and
    reference cast with ``.double()``) to 1e-5 absolute. Measured in float64: about 4e-14 on the
    bridge, about 1e-7 on HookedTransformer (it rounds some intermediates to its cfg.dtype, float32)."""
    step = plateau_and_after(ci)[phase]
    model, ref = ci.model(step, backend=INSTALLED), reference(ci, step)
    tokens = ci.task().tokens[:512, : ci.task().input_len]
    with torch.no_grad():
        got, want = model(tokens), ref(tokens)
        assert got.shape == want.shape and got.dtype == torch.float32
        scale = max(1.0, want.abs().max().item())
        assert max_diff(got, want) <= TOL * scale, f"float32, step {step}: {max_diff(got, want):.2e} at scale {scale:.1f}"
        got, want = model.double()(tokens), ref.double()(tokens)
        assert got.dtype == torch.float64 and max_diff(got, want) <= TOL, f"float64, step {step}: {max_diff(got, want):.2e}"


@pytest.mark.parametrize("phase", [0, 1], ids=["plateau", "after_drop"])
def test_analyses_equal_on_the_reference(ci, phase):
    """Attention to z, exact patching (heads, resid_pre), attribution patching and head ablation:
    the same functions of ``interp`` on the installed backend and on the reference forward, both
    in float64 (so that 1e-5 measures the models, not float32 rounding), to 1e-5 absolute."""
    step = plateau_and_after(ci)[phase]
    task = ci.task()
    pairs = prompt_pairs(task, 48, seed=1)
    diffs: dict[str, float] = {}
    results = []
    for model in (ci.model(step, backend=INSTALLED).double(), reference(ci, step).double()):
        att = attention_to_z(model, task, n_examples=128, seed=1)
        exact = {t: patch(model, pairs, t) for t in ("heads", "resid")}
        attrib = attribute_all(model, pairs, ["heads", "resid"])
        ablation = {k: ablate_each_head(model, task, k, n_groups=3) for k in ("zero", "mean")}
        results.append({
            "attention.to_z_first": att.to_z_first, "attention.to_z_all_targets": att.to_z_all_targets,
            "attention.entropy_first": att.entropy_first,
            **{f"patch.{t}.raw": r.raw for t, r in exact.items()},
            **{f"patch.{t}.normalised": r.normalised for t, r in exact.items()},
            "patch.clean_metric": torch.tensor(exact["heads"].clean_metric),
            "patch.corrupt_metric": torch.tensor(exact["heads"].corrupt_metric),
            **{f"attribution.{t}.raw": r.raw for t, r in attrib.items()},
            **{f"ablation.{k}.candidate_loss": a.candidate_loss for k, a in ablation.items()},
            **{f"ablation.{k}.delta_z": a.delta_z for k, a in ablation.items()},
            **{f"ablation.{k}.base_candidate_loss": torch.tensor(a.base["candidate_loss"]) for k, a in ablation.items()},
        })
    for key in results[0]:
        diffs[key] = max_diff(results[0][key], results[1][key])
    worst = max(diffs, key=diffs.get)
    # the normalised patching effect divides the raw one by the clean - corrupt gap: its error is
    # the raw error over the gap (on the plateau the gap is near 0 and it is NaN on both or neither)
    gap = abs(results[1]["patch.clean_metric"] - results[1]["patch.corrupt_metric"]).item()
    for key, d in diffs.items():
        limit = TOL * max(1.0, 1.0 / gap) if key.endswith("normalised") else TOL
        assert d <= limit, f"{INSTALLED} vs reference at step {step}: {key} differs by {d:.2e} (worst {worst})"


def test_models_of_one_config_are_independent_and_follow_their_weights(tiny_run):
    """The bridge's models are copies of one booted per config, with their hook points and parameters
    looked up once per model: two checkpoints' models hold their own weights and hooks, and a model
    loaded with other weights reports those."""
    run = Run(tiny_run)
    first, last = run.steps[0], run.steps[-1]
    a, b = run.model(first, backend=INSTALLED), run.model(last, backend=INSTALLED)
    states = {s: load_checkpoint(run.checkpoint_path(s))[0] for s in (first, last)}

    def holds(model, state) -> bool:
        return all(torch.equal(t.detach(), state[name]) for name, t in hooked_parameters(model).items())

    assert holds(a, states[first]) and holds(b, states[last]) and not holds(a, states[last])
    load_hooked_state_dict(a, states[last])
    assert holds(a, states[last])
    fired = []
    hook_point(a, "blocks.0.attn.hook_pattern").add_hook(lambda t, hook: fired.append(t.shape))
    tokens = torch.zeros(1, 3, dtype=torch.long)
    b(tokens)
    assert fired == []
    torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)
    assert len(fired) == 1
    # a model handed back to Run.model gets that step's weights in place, its hooks removed
    reused = run.model(first, backend=INSTALLED, reuse=a)
    assert reused is a and holds(a, states[first]) and not a.training
    a(tokens)
    assert len(fired) == 1


@pytest.mark.parametrize("children, tiles", [(4, 1), (1, 3), (2, 2)])
def test_a_shared_past_equals_its_keys_copied_per_row(tiny_run, children, tiles):
    """Attention over a SharedPast (each prefix's keys read by its ``children`` consecutive rows,
    ``tiles`` copies side by side), then each row's own earlier keys, equals the same keys copied
    out per row: the blocks' output and what the score and pattern hooks see, and the output with no
    hook on the scores or the pattern (the softmax taken over the shared and the own keys apart)."""
    run = Run(tiny_run)
    model = run.model(run.steps[-1], backend=INSTALLED)
    cfg, gen = model.cfg, torch.Generator().manual_seed(0)
    prefixes, n_past, n_own, n_new = 3, 5, 2, 3
    rows = tiles * prefixes * children

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    shared = [SharedPast(draw(prefixes, n_past, cfg.n_heads, cfg.d_head), draw(prefixes, n_past, cfg.n_heads, cfg.d_head),
                         children).then(draw(rows, n_own, cfg.n_heads, cfg.d_head), draw(rows, n_own, cfg.n_heads, cfg.d_head))
              for _ in range(cfg.n_layers)]
    resid = draw(rows, n_new, cfg.d_model)
    seen: dict[str, list[torch.Tensor]] = {"shared": [], "per_row": []}
    outs = {}
    for how, past in (("shared", shared), ("per_row", [e.per_row(rows) for e in shared])):
        hooks = [(f"blocks.{layer}.attn.hook_{kind}", lambda t, hook, how=how: seen[how].append(t.clone()))
                 for layer in range(cfg.n_layers) for kind in ("attn_scores", "pattern")]
        with torch.no_grad(), hooks_added(model, hooks):
            outs[how] = run_blocks(model, resid, 0, cfg.n_layers, past)
    with torch.no_grad():
        outs["plain"] = run_blocks(model, resid, 0, cfg.n_layers, shared)
    torch.testing.assert_close(outs["shared"], outs["per_row"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["plain"], outs["per_row"], atol=1e-5, rtol=1e-5)
    assert len(seen["shared"]) == len(seen["per_row"]) == 2 * cfg.n_layers
    for a, b in zip(seen["shared"], seen["per_row"]):
        assert a.shape == (rows, cfg.n_heads, n_new, n_past + n_own + n_new)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_checkpoints_have_hookedtransformer_layout(tiny_run):
    """Whatever backend trained it, a checkpoint holds exactly HookedTransformer's keys, shapes
    (checked by the reference, which reads them) and float32 weights; loading and re-saving
    through the backend gives the same tensors bit for bit; the unembedding bias was trained."""
    run = Run(tiny_run)
    last = run.steps[-1]
    state, _ = load_checkpoint(run.checkpoint_path(last))
    ReferenceModel(run.hooked_config, state)  # raises on any missing or extra key
    assert all(v.dtype == torch.float32 for k, v in state.items() if not k.endswith(".mask"))
    assert state["unembed.b_U"].abs().max() > 0
    again = hooked_state_dict(run.model(last, backend=INSTALLED))
    assert set(again) == set(state)
    for key, value in state.items():
        assert again[key].shape == value.shape and torch.equal(again[key].cpu(), value), key


_OPEN_IN_OTHER = """
import sys, torch
from safetensors.torch import save_file
from plateauscope.runs.run import Run
run = Run(sys.argv[1])
tokens = run.task().tokens[:, : run.task().input_len]
with torch.no_grad():
    out = {str(s): m(tokens).contiguous() for s, m in run.models(backend=sys.argv[2])}
save_file(out, sys.argv[3])
"""


@pytest.mark.skipif(not OTHER_PYTHON, reason="PLATEAUSCOPE_OTHER_PYTHON (the other TransformerLens environment's "
                                              "python) is not set; make test / make test-tl4 set it when it exists")
def test_series_opens_on_the_other_backend(tiny_run, tmp_path):
    """The tiny series trained here (on this environment's backend) opens on the other backend, in
    the other environment, with the same logits at every checkpoint."""
    other = next(b for b in BACKENDS if b != INSTALLED)
    out = tmp_path / "other.safetensors"
    proc = subprocess.run([OTHER_PYTHON, "-c", _OPEN_IN_OTHER, str(tiny_run), other, str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = load_file(str(out))
    run = Run(tiny_run)
    tokens = run.task().tokens[:, : run.task().input_len]
    assert sorted(map(int, theirs)) == run.steps
    for step, model in run.models(backend=INSTALLED):
        with torch.no_grad():
            ours = model(tokens)
        assert max_diff(ours, theirs[str(step)]) <= TOL, f"step {step}: {INSTALLED} vs {other}"


@pytest.mark.skipif(not MISSING, reason="both backends are installed")
@pytest.mark.parametrize("module", ["plateauscope.cli.patch", "plateauscope.cli.attention", "plateauscope.cli.ablate", "plateauscope.cli.analyze",
                                    "plateauscope.cli.train"])
def test_missing_backend_is_one_line_and_exit_2(tiny_run, tmp_path, module, capsys):
    """Asking for the backend whose TransformerLens is not installed: one line naming it, exit 2."""
    missing = MISSING[0]
    if module == "plateauscope.cli.train":
        args = ["--preset", "tiny", "--out", str(tmp_path / "run"), "--backend", missing, "--no-progress"]
    elif module == "plateauscope.cli.analyze":
        copy = shutil.copytree(tiny_run, tmp_path / "copy")  # the analysis may create its cache folder
        args = ["--run", str(copy), "--backend", missing, "--no-progress"]
    else:
        args = ["--ckpt", str(tiny_run), "--backend", missing]
    assert importlib.import_module(module).main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--backend {missing} needs TransformerLens" in err[0], err
    assert not (tmp_path / "run").exists()


def test_kill_and_resume_is_bit_identical_on_the_installed_backend(tmp_path, tiny_run):
    """Killed and resumed on the installed backend (weights through the HookedTransformer layout and
    back), the run ends with the uninterrupted run's weights, bit for bit; the resume state names
    the backend whose parameter order its optimiser state follows."""
    cfg = get_preset("tiny")
    train(cfg, tmp_path / "r", device="cpu", progress=False, stop_at_step=23, backend=INSTALLED)
    train(cfg, tmp_path / "r", resume=True, device="cpu", progress=False, backend=INSTALLED)
    name = Path("checkpoints") / f"step_{cfg.train.max_steps:07d}.safetensors"
    ref, got = load_file(str(Path(tiny_run) / name)), load_file(str(tmp_path / "r" / name))
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert torch.load(tmp_path / "r" / "resume.pt", weights_only=True)["backend"] == INSTALLED


def test_only_the_seam_imports_a_backend_class():
    """No module of the package but ``plateauscope/model/backend.py`` imports HookedTransformer,
    TransformerBridge or their configs (scanned in the source: imports inside functions count too)."""
    import ast

    classes = {"HookedTransformer", "HookedTransformerConfig", "TransformerBridge", "TransformerBridgeConfig"}
    offenders = []
    sources = sorted((REPO / "src").rglob("*.py"))
    assert len(sources) > 50 and REPO / "src" / "plateauscope" / "model" / "backend.py" in sources
    for path in sources:
        if path == REPO / "src" / "plateauscope" / "model" / "backend.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lens"):
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name in classes]
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in classes:
                offenders.append(f"{path.name}: {node.module}")
    assert not offenders, offenders
