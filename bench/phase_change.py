"""Benchmark (not a test): the induction probe's answers on Llama series saved by a plain loop, against what is
measured on Hugging Face's own models, per seed, next to issue 71's targets.

For each seed, a 2-layer, 2-head Llama (BOS 1, its tokenizer saved beside it) is trained on copies at several lags
and positions (``tests/sources/series_builders.py``), saved every 20 steps to 800, imported and probed:

* the layer-1 heads named as induction heads against those whose attention to the induction target, computed by
  hand from HF's eager attentions at the last checkpoint, exceeds 0.5 (target: the same heads; where both layer-1
  heads induct, both named), and layer-0 heads called induction heads (target: 0);
* the phase change against the loss gap's half-rise S, measured by hand on HF's logits with linear interpolation
  between checkpoints (target: within 40 steps);
* the phase change's interval with all 41 checkpoints, every 5th and 14 chosen (target: they overlap).

Then one series trained on copies that move but always follow at lag 12: the probe must name no induction head
and report the layer-1 copier with its lag (target: lag 12 among its lags).

    .venv/bin/python bench/phase_change.py [--seeds 0 1 2] [--out /tmp/phase_change]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from record import against, arguments, print_rows, row, save, yes_no

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.sources.series_builders import train_llama_induction_series  # noqa: E402
from tests.sources.test_probe_series import hand_scores, hf_attentions  # noqa: E402

from plateauscope.analysis.probe_pass import analyze_imported  # noqa: E402
from plateauscope.runs.series import ImportedSeries  # noqa: E402
from plateauscope.sources.importer import import_series  # noqa: E402
from plateauscope.tasks.probe import build_probe  # noqa: E402


def half_rise_on_hf(source: Path, steps: list[int], run: Path) -> float:
    """The loss gap's half-rise, by hand: each checkpoint's gap from HF's logits on the probe's sequences (first
    copy's tokens 2..L minus the second's), the least value before the peak and the peak, linear between
    checkpoints."""
    from transformers import AutoModelForCausalLM

    probe = build_probe("induction", 64, 64, tokenizer=ImportedSeries(run).loaded_tokenizer)
    tokens, L, F = probe.scored_tokens(), probe.cfg.segment_len, probe.cfg.max_gap
    gaps = []
    for step in steps:
        with torch.no_grad():
            logprobs = AutoModelForCausalLM.from_pretrained(source / f"step-{step}").eval()(tokens).logits.log_softmax(-1)
        first = [-logprobs[i, p - 1, tokens[i, p]] for i, k in enumerate(probe.gaps[: len(tokens)].tolist())
                 for p in range(k + 2, k + 1 + L)]
        second = [-logprobs[i, p - 1, tokens[i, p]] for i in range(len(tokens)) for p in range(F + L + 2, F + 2 * L + 1)]
        gaps.append(float(torch.stack(first).mean() - torch.stack(second).mean()))
    peak = int(np.argmax(gaps))
    level = (min(gaps[: peak + 1]) + gaps[peak]) / 2
    i = next(i for i, g in enumerate(gaps) if g >= level)
    return steps[i - 1] + (steps[i] - steps[i - 1]) * (level - gaps[i - 1]) / (gaps[i] - gaps[i - 1])


def one_seed(seed: int, out: Path) -> list[dict]:
    """The rows of one seed's series (module docstring)."""
    source = out / f"seed{seed}" / "src"
    shutil.rmtree(source.parent, ignore_errors=True)
    steps = train_llama_induction_series(source, seed=seed)
    run = import_series(source, source.parent / "run").path
    every = {"all": analyze_imported(run, progress=False, patching=False),
             "every 5th": analyze_imported(run, every=5, progress=False, patching=False),
             "14 chosen": analyze_imported(run, progress=False, patching=False,
                                           steps=[steps[i] for i in np.linspace(0, len(steps) - 1, 14).round().astype(int)])}
    result = every["all"]
    calls = result.heads["induction"]
    half = half_rise_on_hf(source, steps, run)
    tokens = build_probe("induction", 64, 64, tokenizer=ImportedSeries(run).loaded_tokenizer).scored_tokens()[:32]
    by_hand = hand_scores(hf_attentions(source / f"step-{steps[-1]}", tokens)[0], tokens)[0][1]
    inducting = {f"L1H{h}" for h in range(len(by_hand)) if by_hand[h] > 0.5}
    named = {c["head"] for c in calls if c["kind"] == "named" and c["layer"] == 1}
    rows = [row(f"seed {seed}: layer-1 heads inducting on HF (by hand, attention to the target > 0.5)",
                len(inducting), "heads"),
            against(f"seed {seed}: layer-1 heads named", len(named), "heads", ">=", len(inducting)),
            yes_no(f"seed {seed}: the named layer-1 heads are the inducting ones", named == inducting),
            against(f"seed {seed}: layer-0 heads called induction heads",
                    sum(c["kind"] == "named" and c["layer"] == 0 for c in calls), "heads", "<=", 0)]
    if result.transition and result.transition["phase_change"]:
        phase = result.transition["phase_change"]["step"]
        rows.append(row(f"seed {seed}: loss gap half-rise S on HF (by hand)", half, "step"))
        rows.append(against(f"seed {seed}: |phase change - S|", abs(phase - half), "steps", "<=", 40))
    intervals = {name: (r.transition or {}).get("phase_change") for name, r in every.items()}
    if all(intervals.values()):
        lo = max(v["interval"][0] for v in intervals.values())
        hi = min(v["interval"][1] for v in intervals.values())
        for name, v in intervals.items():
            rows.append(row(f"seed {seed}: phase change, {name} ({len(every[name].steps)} checkpoints)", v["step"],
                            f"step [{v['interval'][0]:.0f}, {v['interval'][1]:.0f}]"))
        rows.append(yes_no(f"seed {seed}: phase-change intervals of all, every 5th and 14 chosen overlap", lo <= hi))
    else:
        rows.append(yes_no(f"seed {seed}: a phase change with all, every 5th and 14 chosen", False))
    return rows


def fixed_lag(out: Path) -> list[dict]:
    """A series trained at one lag (12): no induction head named, the layer-1 copier reported at lag 12."""
    source = out / "one_lag" / "src"
    shutil.rmtree(source.parent, ignore_errors=True)
    train_llama_induction_series(source, steps=600, save_every=200, one_lag=True)
    run = import_series(source, source.parent / "run").path
    result = analyze_imported(run, progress=False, patching=False)
    copiers = [c for c in result.heads["induction"] if c["kind"] == "fixed_lag" and c["layer"] == 1]
    return [against("one-lag series: heads named induction heads", len(result.named_heads["induction"]), "heads",
                    "<=", 0),
            yes_no("one-lag series: a layer-1 fixed-lag copier reported with lag 12",
                   bool(copiers) and all(12 in c["lags"] for c in copiers))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("/tmp/phase_change"))
    args = p.parse_args()
    rows = [r for seed in args.seeds for r in one_seed(seed, args.out)] + fixed_lag(args.out)
    print_rows(rows, "{:.4g}")
    print(f"saved {save('phase_change', rows, arguments(args))}")


if __name__ == "__main__":
    main()
