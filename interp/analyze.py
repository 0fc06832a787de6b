"""Run the analyses over a run's checkpoint series, with a cache, and summarise the selector head.

For each chosen checkpoint (lazily, one model in memory at a time):

* attention-to-z (``interp.attention``) and attribution patching of head outputs and the
  residual stream (``interp.attribution``, the fast first-order mode) at every chosen step;
* exact activation patching (``interp.patch``) and zero / mean head ablation
  (``interp.ablate``) at a subset: evenly spaced steps plus those nearest the plateau start,
  tau/2 and tau, and the last step.

Results go to ``RUN/analysis/`` as one JSON-lines file per analysis (names below); a second call
only computes steps that are missing. Where exact and attribution patching both ran, their
agreement (Spearman rank correlation, max error) is reported, so the fast mode can be trusted,
or not, with numbers. ``selector.json`` holds the selector head, t_form, tau and the lead fraction
(``interp.selector``).

    python -m interp.analyze --run checkpoints/demo [--every N | --steps 0 100 200] [--n-exact 12]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from interp import selector as sel
from interp.ablate import ablate_each_head, falls_back_to_marginal
from interp.attention import attention_to_z
from interp.attribution import agreement, attribute_all
from interp.cli import CliError, add_backend_arg, run_cli
from interp.inputs import prompt_pairs
from interp.patch import PatchResult, patch
from training.metrics import compute_tau
from training.run import Run, RunError, read_jsonl, write_json_atomic

log = logging.getLogger(__name__)

ANALYSIS_DIR = "analysis"
ATTENTION_FILE = "attention.jsonl"
ATTRIBUTION_FILE = "attribution.jsonl"
PATCH_FILE = "patch.jsonl"
ABLATION_FILE = "ablation.jsonl"
SELECTOR_FILE = "selector.json"
CACHE_FILES = {"attention": ATTENTION_FILE, "attribution": ATTRIBUTION_FILE, "patch": PATCH_FILE,
               "ablation": ABLATION_FILE}
PATCH_TARGETS = ("heads", "resid")


def analysis_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / ANALYSIS_DIR


def load_analysis(run_dir: str | Path) -> dict[str, Any]:
    """All cached analysis records of a run: ``{name: [record, ...] sorted by step, "selector": dict|None}``."""
    folder = analysis_dir(run_dir)
    out: dict[str, Any] = {}
    for name, file in CACHE_FILES.items():
        path = folder / file
        out[name] = sorted(read_jsonl(path), key=lambda r: r["step"]) if path.exists() else []
    sel_path = folder / SELECTOR_FILE
    out["selector"] = json.loads(sel_path.read_text()) if sel_path.exists() else None
    return out


def pick_steps(available: list[int], every: int = 1, steps: list[int] | None = None) -> list[int]:
    """The checkpoints to analyse: explicit ``steps`` (each must exist) or every ``every``-th one."""
    if steps:
        missing = sorted(set(steps) - set(available))
        if missing:
            raise RunError(f"no checkpoint at step(s) {', '.join(map(str, missing))}")
        return sorted(set(steps))
    chosen = available[::every]
    if available and chosen[-1] != available[-1]:
        chosen.append(available[-1])
    return chosen


def exact_steps(steps: list[int], n: int, landmarks: list[int]) -> list[int]:
    """``n`` evenly spaced steps of ``steps`` plus the step nearest each landmark, and the last."""
    if not steps or n <= 0:
        return []
    idx = set(np.linspace(0, len(steps) - 1, min(n, len(steps))).round().astype(int).tolist())
    arr = np.asarray(steps)
    idx |= {int(np.abs(arr - m).argmin()) for m in landmarks}
    idx.add(len(steps) - 1)
    return sorted(steps[i] for i in idx)


def _append(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, allow_nan=False, default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _clean_nan(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if obj != obj else obj
    if isinstance(obj, dict):
        return {k: _clean_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean_nan(v) for v in obj]
    return obj


def analyze_run(run_dir: str | Path, steps: list[int] | None = None, every: int = 1, n_exact: int = 12,
                n_examples: int = 256, ablation_groups: int = 8, seed: int = 0, device: str = "cpu",
                progress: bool = True, backend: str | None = None) -> dict[str, Any]:
    """Analyse the chosen checkpoints (only what the cache lacks) and return the selector summary.
    ``backend``: hooked or bridge (None: the installed TransformerLens); both give the same numbers."""
    run = Run(run_dir)
    task = run.task()
    if task.cfg.direction != "backward" or task.cfg.K < 2:
        raise RunError(f"{run.path}: the analyses need the backward task with K >= 2")
    chosen = pick_steps(run.steps(), every, steps)
    if not chosen:
        raise RunError(f"{run.path}: the run has no checkpoints")
    records = run.metrics()
    log_k = run.log_k
    tau = compute_tau(records, log_k)
    summary = run.summary() or {}
    plateau_start = (summary.get("plateau_span") or [chosen[0]])[0]
    landmarks = [plateau_start] + ([tau // 2, tau] if tau else [])
    exact = set(exact_steps(chosen, n_exact, landmarks))

    folder = analysis_dir(run.path)
    cache = load_analysis(run.path)
    done = {name: {r["step"] for r in cache[name]} for name in CACHE_FILES}
    pairs = prompt_pairs(task, n_examples, seed)
    todo = [s for s in chosen if s not in done["attention"] or s not in done["attribution"]
            or (s in exact and (s not in done["patch"] or s not in done["ablation"]))]
    for step in tqdm(todo, desc=f"analyse {run.path.name}", disable=not progress, dynamic_ncols=True):
        model = run.load_model(step, device, backend)
        if step not in done["attention"]:
            _append(folder / ATTENTION_FILE, {"step": step, **attention_to_z(model, task, n_examples, seed).to_dict()})
        if step not in done["attribution"]:
            res = attribute_all(model, pairs, PATCH_TARGETS)
            _append(folder / ATTRIBUTION_FILE, _clean_nan({"step": step, **{t: res[t].to_dict() for t in PATCH_TARGETS}}))
        if step in exact and step not in done["patch"]:
            res = {t: patch(model, pairs, t) for t in PATCH_TARGETS}
            _append(folder / PATCH_FILE, _clean_nan({"step": step, **{t: r.to_dict() for t, r in res.items()}}))
        if step in exact and step not in done["ablation"]:
            abl = {k: ablate_each_head(model, task, k, ablation_groups, seed).to_dict() for k in ("zero", "mean")}
            _append(folder / ABLATION_FILE, _clean_nan({"step": step, **abl}))
    result = summarize(run, load_analysis(run.path), tau, records)
    write_json_atomic(folder / SELECTOR_FILE, _clean_nan(result))
    return result


def _previous(values: list[int], x: int) -> int | None:
    before = [v for v in values if v < x]
    return before[-1] if before else None


def summarize(run: Run, cache: dict[str, Any], tau: int | None, records: list[dict]) -> dict[str, Any]:
    """Selector head, t_form, tau, lead fraction, ablation before/mid/after, exact-vs-attribution agreement."""
    attn, patches, ablations = cache["attention"], cache["patch"], cache["ablation"]
    if not attn or not patches:
        raise RunError(f"{run.path}: nothing analysed yet")
    final_patch = patches[-1]
    final_attn = next(r for r in reversed(attn) if r["step"] == final_patch["step"]) if any(
        r["step"] == final_patch["step"] for r in attn) else attn[-1]
    (layer, head), scores = sel.pick_selector_head(final_attn["to_z_first"], final_patch["heads"]["normalised"])
    steps = [r["step"] for r in attn]
    series = [r["to_z_first"][layer][head] for r in attn]
    summary = run.summary() or {}
    plateau_start = (summary.get("plateau_span") or [steps[0]])[0]
    form = sel.formation_step(steps, series, plateau_start)
    eval_steps = [r["step"] for r in records]
    tau_lo = _previous(eval_steps, tau) if tau is not None else None
    t_lo = form["t_form_bracket"][0] if form["t_form_bracket"] else None
    lead = sel.lead_fraction(tau, tau_lo, form["t_form"], t_lo)

    def ablation_at(target: int | None) -> dict | None:
        if target is None or not ablations:
            return None
        rec = min(ablations, key=lambda r: abs(r["step"] - target))
        z = rec["zero"]
        return {"step": rec["step"], "base_candidate_loss": z["base"]["candidate_loss"],
                "zero_candidate_loss": z["candidate_loss"][layer][head],
                "mean_candidate_loss": rec["mean"]["candidate_loss"][layer][head],
                "zero_delta_z": z["delta_z"][layer][head]}

    log_k = run.log_k
    after = ablation_at(steps[-1])
    attribution_by_step = {r["step"]: r for r in cache["attribution"]}
    agree = []
    for p in patches:
        a = attribution_by_step.get(p["step"])
        if a is not None:
            agree.append({"step": p["step"], **_clean_nan(agreement(_result(p["heads"]), _result(a["heads"])))})
    return {
        "head": [layer, head],
        "label": f"L{layer}H{head}",
        "rule": "argmax over heads of attention-to-z x max(normalised head patching effect, 0) at the final analysed step",
        "scores": scores,
        "tau": tau,
        "tau_bracket": [tau_lo, tau] if tau is not None else None,
        "log_k": log_k,
        "plateau_start": plateau_start,
        **form,
        **lead,
        "ablation": {"plateau_start": ablation_at(plateau_start),
                     "tau_half": ablation_at(tau // 2 if tau else None), "end": after},
        "falls_back_to_marginal": (abs(after["zero_candidate_loss"] - log_k) <= 0.25 * log_k) if after else None,
        "agreement": agree,
        "analysed_steps": len(steps),
    }


def _result(d: dict) -> PatchResult:
    """A cached ``PatchResult.to_dict()`` back as a PatchResult (JSON null -> NaN)."""
    def tensor(x: Any) -> torch.Tensor:
        return torch.tensor(np.array(x, dtype=float), dtype=torch.float32)  # None -> nan via dtype=float

    return PatchResult(d["target"], tuple(d["axes"]), tensor(d["raw"]), tensor(d["normalised"]),
                       d["clean_metric"], d["corrupt_metric"], d["method"], d["n_pairs"])


def format_summary(s: dict[str, Any]) -> str:
    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "n/a" if x is None else fmt.format(x)

    lines = [
        f"selector head   {s['label']}  (rule: {s['rule']})",
        f"attention-to-z  {f(s['start_value'])} at plateau start (step {s['plateau_start']}) -> {f(s['final_value'])} at the end",
        f"t_form          {f(s['t_form'], '{}')}  bracket {s['t_form_bracket']}",
        f"tau             {f(s['tau'], '{}')}  bracket {s['tau_bracket']}",
        f"lead fraction   {f(s['lead_fraction'])}  bracket {[round(x, 3) for x in s['lead_bracket']] if s['lead_bracket'] else None}  (paper: ~0.5)",
    ]
    for name, a in s["ablation"].items():
        if a:
            lines.append(f"ablation {name:<12} step {a['step']:>6}: candidate loss {a['base_candidate_loss']:.3f} -> "
                         f"zero {a['zero_candidate_loss']:.3f}, mean {a['mean_candidate_loss']:.3f} (log K = {s['log_k']:.3f})")
    lines.append(f"falls back to the marginal when ablated at the end: {s['falls_back_to_marginal']}")
    if s["agreement"]:
        rho = [a["spearman"] for a in s["agreement"] if a["spearman"] is not None]
        err = [a["max_abs_err"] for a in s["agreement"]]
        lines.append(f"attribution vs exact (heads, {len(s['agreement'])} steps): Spearman median "
                     f"{np.median(rho) if rho else float('nan'):.3f} (min {min(rho) if rho else float('nan'):.3f}), "
                     f"max |error| {max(err):.3f} logits")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m interp.analyze", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("--every", type=int, default=1, help="analyse every N-th checkpoint (default 1: all)")
    p.add_argument("--steps", type=int, nargs="+", help="analyse exactly these steps")
    p.add_argument("--n-exact", type=int, default=12, help="checkpoints that also get exact patching and ablation")
    p.add_argument("--n-examples", type=int, default=256, help="prompt pairs / examples per analysis")
    p.add_argument("--ablation-groups", type=int, default=8, help="eval groups scored per ablation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    add_backend_arg(p)
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> None:
        if args.every < 1:
            raise CliError(f"--every must be at least 1, got {args.every}")
        result = analyze_run(args.run, args.steps, args.every, args.n_exact, args.n_examples,
                             args.ablation_groups, args.seed, args.device, progress=not args.no_progress,
                             backend=args.backend)
        print(format_summary(result))
        print(f"results in {analysis_dir(args.run)}")

    return run_cli(body, argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
