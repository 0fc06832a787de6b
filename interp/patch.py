"""Exact activation patching: which components carry the selector z to the answer.

Method. Each prompt pair from :func:`interp.inputs.prompt_pairs` shares the base string B and
differs in the selector: the clean prompt is (B, z), the corrupted one (B, z'). We run the
corrupted prompts and overwrite one component's activation (a head's output ``hook_z``, the
residual stream ``resid_pre``, an ``attn_out`` or ``mlp_out``, at all positions or at one) with
its value from the clean run of the same pair, and measure how far the output moves back
towards the clean answer.

Metric. :func:`interp.inputs.logit_diff`: the logit of the clean first target token A_gj[0]
minus the logit of the corrupted one A_gj'[0], at the prediction position (the last ``<SEP>``),
averaged over pairs. Positive = the model prefers the clean answer.

Normalisation. ``(patched - corrupt) / (clean - corrupt)``, where ``clean`` and ``corrupt`` are
the metric on the unpatched clean and corrupted runs: 1 = the patch restores the clean
behaviour, 0 = no effect (still corrupted), negative = it pushes further towards the corrupted
answer, above 1 = it overshoots. The sign is relative to the clean-corrupt gap, so it keeps
this meaning even if that gap is negative. Normalised values are NaN when
``|clean - corrupt| < 1e-6`` (e.g. on the plateau, where the model ignores z and the clean and
corrupted runs give the same answer); the raw patched metric is always returned as well.

Implementation. One generic function, :func:`patch_sweep`, does every sweep. A component set
is a :class:`PatchSpec`: a hook (``transformer_lens.utilities.get_act_name``, ex ``utils``) and one boolean mask
per patch over ``[layer, *site]`` (site = ``pos`` or ``pos head``) saying which activation
entries come from the clean run. Many patches run in one forward pass: the corrupted batch is
replicated P times along the batch dimension and each replica gets its own mask, applied with
one ``torch.where`` per hooked layer; patches are chunked so a forward holds at most
``max_batch`` rows. The thin wrappers (:func:`patch_head_out_all_pos` and friends) only pick a
spec. :mod:`interp.attribution` uses the same specs for its first-order approximation.

CLI::

    python -m interp.patch --ckpt RUN_OR_FILE [--step N] [--n-examples N]
        [--target heads|heads_by_pos|resid|attn|mlp|attn_layer|mlp_layer]
        [--method exact|attribution|both] [--json FILE] [--top N]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens.utilities import get_act_name

from interp.inputs import PromptPairs, logit_diff, prompt_pairs
from training.backend import Model
from training.layout import Layout

NORMALISE_EPS = 1e-6
"""Below this |clean - corrupt| gap the normalised effects are NaN."""

TARGETS: tuple[str, ...] = ("heads", "heads_by_pos", "resid", "attn", "mlp", "attn_layer", "mlp_layer")
"""Component sets: head outputs over all positions [layer, head] or by position [layer, pos, head];
resid_pre [layer, pos]; attn_out / mlp_out by position [layer, pos] or per layer [layer]."""

_HOOK = {"heads": "z", "heads_by_pos": "z", "resid": "resid_pre", "attn": "attn_out", "mlp": "mlp_out",
         "attn_layer": "attn_out", "mlp_layer": "mlp_out"}


@dataclass(frozen=True)
class PatchSpec:
    """A set of patches: which hook, and for each patch which entries come from the clean run."""

    target: str
    act_name: str
    """Short hook name for ``get_act_name`` ("z", "resid_pre", "attn_out", "mlp_out")."""
    axes: tuple[str, ...]
    """Names of the result's axes, e.g. ("layer", "head")."""
    shape: tuple[int, ...]
    """The result's shape; ``prod(shape) == P``."""
    masks: Bool[Tensor, "P layer ..."]
    """``masks[p, l, *site]``: patch p takes the clean activation at layer l, site ``*site``
    (site = ``pos`` or ``pos head``, the activation's axes between batch and features)."""


@dataclass
class PatchResult:
    """Patched metric per component, raw and normalised, with the unpatched baselines."""

    target: str
    axes: tuple[str, ...]
    raw: Float[Tensor, "*shape"]
    """The metric (mean logit difference) of the patched corrupted run."""
    normalised: Float[Tensor, "*shape"]
    """``(raw - corrupt_metric) / (clean_metric - corrupt_metric)``; NaN when the gap < 1e-6."""
    clean_metric: float
    corrupt_metric: float
    method: str = "exact"
    n_pairs: int = 0

    @property
    def effect(self) -> Float[Tensor, "*shape"]:
        """``raw - corrupt_metric``: the change the patch makes, in logits."""
        return self.raw - self.corrupt_metric

    @property
    def normalisable(self) -> bool:
        return abs(self.clean_metric - self.corrupt_metric) >= NORMALISE_EPS

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "method": self.method,
            "axes": list(self.axes),
            "shape": list(self.raw.shape),
            "n_pairs": self.n_pairs,
            "clean_metric": self.clean_metric,
            "corrupt_metric": self.corrupt_metric,
            "raw": _nested(self.raw),
            "normalised": _nested(self.normalised),
        }


def _nested(t: Tensor) -> Any:
    """Nested lists with NaN / inf as None (valid JSON)."""
    def clean(x):
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x if math.isfinite(x) else None
    return clean(t.detach().cpu().double().tolist())


def normalise(raw: Float[Tensor, "*shape"], clean: float, corrupt: float) -> Float[Tensor, "*shape"]:
    """``(raw - corrupt) / (clean - corrupt)``; all NaN when ``|clean - corrupt| < 1e-6``."""
    gap = clean - corrupt
    if abs(gap) < NORMALISE_EPS:
        return torch.full_like(raw, float("nan"))
    return (raw - corrupt) / gap


def patch_spec(model: Model, target: str, n_pos: int) -> PatchSpec:
    """The masks of one component set for ``model`` on prompts of ``n_pos`` positions."""
    if target not in _HOOK:
        raise ValueError(f"unknown patch target {target!r}; choose one of {', '.join(TARGETS)}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layer = torch.arange(L)
    if target == "heads":  # [layer, head]: head h of layer l at every position
        m = torch.zeros(L, H, L, n_pos, H, dtype=torch.bool)
        h = torch.arange(H)
        m[layer[:, None], h[None, :], layer[:, None], :, h[None, :]] = True
        axes, shape = ("layer", "head"), (L, H)
    elif target == "heads_by_pos":  # [layer, pos, head]
        m = torch.zeros(L, n_pos, H, L, n_pos, H, dtype=torch.bool)
        lx, px, hx = torch.meshgrid(layer, torch.arange(n_pos), torch.arange(H), indexing="ij")
        m[lx, px, hx, lx, px, hx] = True
        axes, shape = ("layer", "pos", "head"), (L, n_pos, H)
    elif target.endswith("_layer"):  # [layer]: the whole attn_out / mlp_out of a layer
        m = torch.zeros(L, L, n_pos, dtype=torch.bool)
        m[layer, layer] = True
        axes, shape = ("layer",), (L,)
    else:  # resid / attn / mlp: [layer, pos]
        m = torch.zeros(L, n_pos, L, n_pos, dtype=torch.bool)
        lx, px = torch.meshgrid(layer, torch.arange(n_pos), indexing="ij")
        m[lx, px, lx, px] = True
        axes, shape = ("layer", "pos"), (L, n_pos)
    masks = m.reshape(math.prod(shape), *m.shape[len(shape):])
    return PatchSpec(target, _HOOK[target], axes, shape, masks)


def _repeat_pairs(pairs: PromptPairs, p: int) -> PromptPairs:
    """The pairs replicated ``p`` times along the batch (replica-major), for the batched metric."""
    return dataclasses.replace(
        pairs,
        clean=pairs.clean.repeat(p, 1),
        corrupt=pairs.corrupt.repeat(p, 1),
        clean_answer=pairs.clean_answer.repeat(p),
        corrupt_answer=pairs.corrupt_answer.repeat(p),
        examples=pairs.examples.repeat(p),
    )


@torch.no_grad()
def baselines(model: Model, pairs: PromptPairs, act_name: str | None = None
              ) -> tuple[float, float, dict[str, Tensor]]:
    """Clean and corrupted metrics, and the clean activations of ``act_name`` at every layer."""
    device = model.cfg.device
    names = {get_act_name(act_name, layer) for layer in range(model.cfg.n_layers)} if act_name else set()
    clean_logits, cache = model.run_with_cache(pairs.clean.to(device), names_filter=lambda n: n in names)
    corrupt_logits = model(pairs.corrupt.to(device))
    acts = {n: cache[n] for n in names}
    return logit_diff(clean_logits, pairs).item(), logit_diff(corrupt_logits, pairs).item(), acts


@torch.no_grad()
def patch_sweep(
    model: Model,
    pairs: PromptPairs,
    spec: PatchSpec,
    max_batch: int = 4096,
    progress: bool = False,
) -> PatchResult:
    """Run every patch of ``spec`` on the corrupted prompts; the generic engine of this module.

    Patches run ``max(1, max_batch // N)`` at a time (N = number of pairs): the corrupted batch
    is replicated once per patch and, at each layer's hook, ``torch.where(mask, clean, corrupt)``
    writes each replica's clean entries. Returns the metric per patch in ``spec.shape``.
    """
    n = pairs.corrupt.shape[0]
    n_pos = pairs.corrupt.shape[1]
    if spec.masks.shape[2] != n_pos:
        raise ValueError(f"the spec is for {spec.masks.shape[2]} positions, the prompts have {n_pos}")
    device = model.cfg.device
    clean_metric, corrupt_metric, clean_acts = baselines(model, pairs, spec.act_name)
    masks = spec.masks.to(device)
    n_patch = masks.shape[0]
    per_chunk = max(1, max_batch // n)
    corrupt = pairs.corrupt.to(device)
    raw = torch.empty(n_patch, device=device)
    starts = range(0, n_patch, per_chunk)
    for start in tqdm(starts, desc=f"patch {spec.target}", disable=not progress or len(starts) <= 1,
                      dynamic_ncols=True, leave=False):
        chunk = masks[start : start + per_chunk]  # [p, layer, *site]
        p = chunk.shape[0]
        hooks = []
        for layer in range(model.cfg.n_layers):
            m = chunk[:, layer]
            if not m.any():
                continue
            name = get_act_name(spec.act_name, layer)
            hooks.append((name, _make_hook(m, clean_acts[name], p, n)))
        logits = model.run_with_hooks(corrupt.repeat(p, 1), fwd_hooks=hooks)
        diff = logit_diff(logits, _repeat_pairs(pairs, p), reduce=False)  # [p * n], replica-major
        raw[start : start + p] = diff.view(p, n).mean(1)
    raw = raw.reshape(spec.shape).float().cpu()
    return PatchResult(spec.target, spec.axes, raw, normalise(raw, clean_metric, corrupt_metric),
                       clean_metric, corrupt_metric, "exact", n)


def _make_hook(mask: Bool[Tensor, "p ..."], clean: Float[Tensor, "n ..."], p: int, n: int):
    """A hook that gives replica r the clean entries where ``mask[r]`` is set."""
    # mask [p, *site] -> [p, 1, *site, 1]; clean [n, *site, d] -> [1, n, *site, d]
    m = mask.reshape(p, 1, *mask.shape[1:], 1)

    def hook(act: Tensor, hook) -> Tensor:
        rep = act.reshape(p, n, *act.shape[1:])
        return torch.where(m, clean.unsqueeze(0), rep).reshape(act.shape)

    return hook


def patch(model: Model, pairs: PromptPairs, target: str, **kw) -> PatchResult:
    """Exact patching of one component set by name (see :data:`TARGETS`)."""
    return patch_sweep(model, pairs, patch_spec(model, target, pairs.corrupt.shape[1]), **kw)


def patch_head_out_all_pos(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """Each head's output (``hook_z``) at every position; result [layer, head]."""
    return patch(model, pairs, "heads", **kw)


def patch_head_out_by_pos(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """Each head's output at one position; result [layer, pos, head]."""
    return patch(model, pairs, "heads_by_pos", **kw)


def patch_resid_pre(model: Model, pairs: PromptPairs, **kw) -> PatchResult:
    """The residual stream before each block, one position at a time; result [layer, pos]."""
    return patch(model, pairs, "resid", **kw)


def patch_attn_out(model: Model, pairs: PromptPairs, by_pos: bool = True, **kw) -> PatchResult:
    """Each layer's attention output; result [layer, pos] (``by_pos``) or [layer]."""
    return patch(model, pairs, "attn" if by_pos else "attn_layer", **kw)


def patch_mlp_out(model: Model, pairs: PromptPairs, by_pos: bool = True, **kw) -> PatchResult:
    """Each layer's MLP output; result [layer, pos] (``by_pos``) or [layer]."""
    return patch(model, pairs, "mlp" if by_pos else "mlp_layer", **kw)


# ---------------------------------------------------------------------------------------- CLI


def position_labels(layout: Layout, n_pos: int) -> list[str]:
    """Readable names of prompt positions: BOS, b1.., SEP, z1.., a1.. (from the run's layout)."""
    labels = [str(i) for i in range(n_pos)]
    if n_pos:
        labels[0] = "BOS"
    spans = [("b", layout.b_span), ("z", layout.z_span), ("a", layout.a_span)]
    for name, span in spans:
        if span is None:
            continue
        for i, pos in enumerate(range(*span)):
            if pos < n_pos:
                labels[pos] = f"{name}{i + 1}"
    for pos in layout.sep_positions:
        if pos < n_pos:
            labels[pos] = "SEP"
    return labels


def component_label(target: str, index: tuple[int, ...], pos_names: list[str]) -> str:
    """E.g. ``L0H3``, ``L0H3@z1``, ``resid_pre L1@SEP``, ``mlp_out L2``."""
    if target == "heads":
        return f"L{index[0]}H{index[1]}"
    if target == "heads_by_pos":
        return f"L{index[0]}H{index[2]}@{pos_names[index[1]]}"
    hook = _HOOK[target]
    if target.endswith("_layer"):
        return f"{hook} L{index[0]}"
    return f"{hook} L{index[0]}@{pos_names[index[1]]}"


def _score(res: PatchResult) -> Tensor:
    """What tables show: normalised if defined, else the raw effect in logits."""
    return res.normalised if res.normalisable else res.effect


def format_result(res: PatchResult, pos_names: list[str], top: int) -> str:
    """A grid (layers x heads / positions) for 2-D results and the top components by |effect|."""
    from interp.cli import format_table

    unit = "normalised (1 = clean, 0 = corrupted)" if res.normalisable else "raw effect, logits (normalisation undefined)"
    lines = [f"{res.method} patching of {res.target}, {res.n_pairs} pairs: "
             f"clean logit diff {res.clean_metric:+.4f}, corrupted {res.corrupt_metric:+.4f}"]
    if not res.normalisable:
        lines.append(f"|clean - corrupt| < {NORMALISE_EPS:g}: the model ignores z here; showing raw effects")
    score = _score(res)
    if score.dim() == 2:
        cols = [f"H{h}" for h in range(score.shape[1])] if res.axes[1] == "head" else pos_names[: score.shape[1]]
        rows = [[f"L{l}", *map(float, score[l])] for l in range(score.shape[0])]
        lines += ["", f"{unit}:", format_table(rows, ["layer", *cols])]
    flat = score.flatten()
    order = torch.argsort(flat.abs().nan_to_num(-1.0), descending=True)[:top]
    rows = []
    for i in order.tolist():
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), score.shape))
        rows.append([component_label(res.target, idx, pos_names), float(flat[i]),
                     float(res.raw.flatten()[i])])
    col = "normalised" if res.normalisable else "effect (logits)"
    lines += ["", f"top {len(rows)} by |effect|:", format_table(rows, ["component", col, "patched metric"])]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from interp.cli import add_ckpt_args

    p = argparse.ArgumentParser(prog="python -m interp.patch", description=__doc__.split("\n\n")[0])
    add_ckpt_args(p)
    p.add_argument("--target", default="heads", choices=TARGETS, help="component set to patch (default heads)")
    p.add_argument("--method", default="exact", choices=("exact", "attribution", "both"),
                   help="exact patching, attribution patching (first-order, fast), or both and their agreement")
    p.add_argument("--top", type=int, default=10, help="components to list, by |effect| (default 10)")
    p.add_argument("--max-batch", type=int, default=4096, help="rows per forward pass (default 4096)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from interp.cli import CliError, resolve_ckpt, run_cli, write_json

    def body(args: argparse.Namespace) -> None:
        if args.n_examples < 1 or args.top < 0 or args.max_batch < 1:
            raise CliError("--n-examples and --max-batch must be >= 1, --top >= 0")
        run, step = resolve_ckpt(args.ckpt, args.step)
        task = run.task()
        pairs = prompt_pairs(task, args.n_examples, args.seed)
        model = run.load_model(step, device=args.device, backend=args.backend)
        pos_names = position_labels(task.layout, pairs.corrupt.shape[1])
        results: dict[str, PatchResult] = {}
        if args.method in ("exact", "both"):
            results["exact"] = patch(model, pairs, args.target, max_batch=args.max_batch,
                                     progress=not args.no_progress)
        if args.method in ("attribution", "both"):
            from interp.attribution import attribute

            results["attribution"] = attribute(model, pairs, args.target)
        out: dict[str, Any] = {"ckpt": str(args.ckpt), "run": str(run.path), "step": step,
                               "n_examples": pairs.corrupt.shape[0], "seed": args.seed,
                               "positions": pos_names}
        print(f"{run.path} step {step}")
        for name, res in results.items():
            print()
            print(format_result(res, pos_names, args.top))
            out[name] = res.to_dict()
        if len(results) == 2:
            from interp.attribution import agreement

            agree = agreement(results["exact"], results["attribution"])
            print(f"\nattribution vs exact: spearman {agree['spearman']:+.3f}, "
                  f"max |error| {agree['max_abs_err']:.4f} logits")
            out["agreement"] = {k: (v if math.isfinite(v) else None) for k, v in agree.items()}
        write_json(args.json, out)

    return run_cli(body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
