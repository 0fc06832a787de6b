"""Import plus the probe's cheap pass over a checkpoint series, against the loop a user writes today.

The series: a 4-layer, 256-wide GPT-NeoX (8 heads, vocabulary 1024, context 128), 50 checkpoints of
random weights saved by ``save_pretrained`` as Trainer-style ``checkpoint-N/`` folders in a temporary
folder. Per checkpoint, two ways to the same numbers (the induction probe's prompt pairs, exact
patching of every head's output, normalised by the clean-corrupted logit difference):

* plateauscope: ``plateauscope.sources.importer.import_series`` (hash and check every file), then
  ``plateauscope.analysis.probe_pass.analyze_imported`` (one model per series, each checkpoint's weights
  loaded into it; head scores, loss gap, exact head patching);
* the user's loop: for each checkpoint, ``AutoModelForCausalLM.from_pretrained`` and
  ``TransformerBridge.boot_transformers`` in compatibility mode, ``run_with_cache`` on the clean prompts,
  and ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` with the same metric.

Why the import-and-pass is faster: the model is built once (booting a bridge and a Hugging Face model per
checkpoint is most of a small model's time) and the patching runs batched. Targets: at least 3x faster
per checkpoint, the same numbers (max abs difference of the normalised patching results), and resident
memory that grows by at most 5% from checkpoint 10 to checkpoint 50. Then a longer series (``--long``,
200 checkpoints of the same model; plateauscope alone) holds its memory to the same 5% from checkpoint 10
to its last.

    HF_HUB_OFFLINE=1 python bench/import_series.py [--checkpoints 50] [--long 200] [--device cpu]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from record import against, arguments, print_rows, row, save

from plateauscope.analysis.probe_pass import analyze_imported
from plateauscope.sources.importer import import_series
from plateauscope.tasks.probe import build_probe

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TARGET_SPEEDUP = 3.0
TARGET_RSS_GROWTH = 5.0
TARGET_DIFF = 1e-4
N_PAIRS = 8
"""Prompt pairs both ways patch on."""
SEGMENT = 8
"""The induction probe's copy length."""


def rss_mib() -> float:
    """Resident memory now (``VmRSS``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_series(out: Path, n: int) -> list[int]:
    """``n`` random GPT-NeoX checkpoints, ``checkpoint-{100 i}/``."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                           intermediate_size=1024, max_position_embeddings=128, tie_word_embeddings=False)
    steps = [100 * i for i in range(n)]
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        GPTNeoXForCausalLM(config).save_pretrained(out / f"checkpoint-{step}")
    return steps


def users_loop(source: Path, steps: list[int], device: str) -> tuple[float, list[torch.Tensor]]:
    """Seconds per checkpoint of the loop a user writes, and its normalised head patching per step."""
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    probe = build_probe("induction", 1024, 128, segment_len=SEGMENT)
    pairs = probe.prompt_pairs(N_PAIRS, 0)
    rows = torch.arange(N_PAIRS)
    results = []
    start = time.perf_counter()
    for step in steps:
        folder = str(source / f"checkpoint-{step}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = TransformerBridge.boot_transformers(folder, hf_model=AutoModelForCausalLM.from_pretrained(folder),
                                                        device=device)
            model.enable_compatibility_mode(disable_warnings=True, no_processing=True)

        def logit_diff(logits: torch.Tensor) -> torch.Tensor:
            last = logits[:, pairs.pred_pos]
            return (last[rows, pairs.clean_answer] - last[rows, pairs.corrupt_answer]).mean()

        with torch.no_grad():
            clean_logits, clean_cache = model.run_with_cache(pairs.clean.to(device))
            clean, corrupt = logit_diff(clean_logits), logit_diff(model(pairs.corrupt.to(device)))
        def metric(logits: torch.Tensor, clean: torch.Tensor = clean, corrupt: torch.Tensor = corrupt) -> torch.Tensor:
            return (logit_diff(logits) - corrupt) / (clean - corrupt)

        results.append(patching.get_act_patch_attn_head_out_all_pos(model, pairs.corrupt.to(device), clean_cache,
                                                                    metric).cpu())
        del model, clean_cache
        gc.collect()
    return (time.perf_counter() - start) / len(steps), results


def long_series_rss(n: int, device: str) -> tuple[float, float]:
    """Resident memory (MiB) at the 10th and the last checkpoint of the import and probe pass over ``n``
    checkpoints (written, then imported and analysed; the files deleted after)."""
    rss: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "trainer_out"
        write_series(source, n)
        run = import_series(source, Path(tmp) / "run", device=device).path
        done: list[int] = []

        def on_step(step: int) -> None:
            done.append(step)
            if len(done) in (min(10, n), n):
                rss.append(rss_mib())

        analyze_imported(run, device=device, progress=False, on_step=on_step, n_pairs=N_PAIRS, segment_len=SEGMENT)
    print(f"long series: {n} checkpoints, {rss[0]:.0f} -> {rss[-1]:.0f} MiB", file=sys.stderr)
    return rss[0], rss[-1]


def main() -> int:
    """Build the series, time both ways, compare their numbers and the memory, save the rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=50)
    p.add_argument("--long", type=int, default=200, help="checkpoints of the long series (0: skip it)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "trainer_out"
        steps = write_series(source, args.checkpoints)
        # ours: import, then the probe's pass (RSS at the 10th and the last checkpoint)
        rss: dict[int, float] = {}
        start = time.perf_counter()
        run = import_series(source, Path(tmp) / "run", device=args.device).path
        analyzed = []

        def on_step(step: int) -> None:
            analyzed.append(step)
            if len(analyzed) in (min(10, len(steps)), len(steps)):
                rss[len(analyzed)] = rss_mib()

        result = analyze_imported(run, device=args.device, progress=False, on_step=on_step, n_pairs=N_PAIRS,
                                  segment_len=SEGMENT)
        ours = (time.perf_counter() - start) / len(steps)
        print(f"plateauscope: {ours:.3f} s per checkpoint", file=sys.stderr)
        theirs, loop = users_loop(source, steps, args.device)
        print(f"the user's loop: {theirs:.3f} s per checkpoint", file=sys.stderr)
    long_rss = long_series_rss(args.long, args.device) if args.long else None
    diff = max(float((torch.tensor(r.head_patching) - t).abs().nan_to_num().max()) for r, t in zip(result.steps, loop))
    first = min(10, len(steps))
    growth = 100 * (rss[len(steps)] - rss[first]) / rss[first]
    n = len(steps)
    rows = [
        against(f"import + probe pass vs the user's loop (boot a bridge, run_with_cache, transformer_lens.patching), "
                f"per checkpoint, {n} checkpoints of a 4-layer 256-wide GPT-NeoX ({args.device})",
                theirs / ours, "x", ">=", TARGET_SPEEDUP),
        row("import + probe pass, per checkpoint", ours, "s"),
        row("the user's loop, per checkpoint", theirs, "s"),
        against("largest difference between the two head-patching results (normalised)", diff, "", "<=", TARGET_DIFF),
        against(f"resident memory growth from checkpoint {first} to checkpoint {n}", growth, "%", "<=", TARGET_RSS_GROWTH,
                "%"),
        row(f"resident memory at checkpoint {n}", rss[n], "MiB"),
    ]
    if long_rss is not None:
        rows.append(against(f"resident memory growth from checkpoint 10 to checkpoint {args.long}, import + probe pass",
                            100 * (long_rss[1] - long_rss[0]) / long_rss[0], "%", "<=", TARGET_RSS_GROWTH, "%"))
    print_rows(rows)
    print(f"saved {save('import_series', rows, arguments(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
